"""Who owns a tier-2 prefix and which uploader epochs were taken on it: both recorded in the bucket.

Layout (names relative to the storage URL, beside the channels' objects)::

    .claim.json                  the owner: {"by","claimed_at_ms","root_id","took_over_from"}
    .epochs/E<epoch:010d>.json   one per uploader epoch used on the prefix: {"epoch","owner","root_id","taken_at_ms"}

and, on the local side, ``ROOT/.tier/identity.json`` (``CHANNEL/tier/`` for a standalone
channel): ``{"root_id": UUID}``, written once with ``O_EXCL`` and never changed. It is kept
apart from ``metadata.db`` so that losing or moving the index never changes who the root is.

Invariants:

- **One owner per prefix.** The first daemon pass claims the prefix with a conditional
  create (:meth:`~.storage.ChunkStorage.create_new`: S3 ``IfNoneMatch``, ``O_EXCL``-like
  link on a folder). A root whose identity is not the claim's uploads, sweeps and deletes
  nothing there: :class:`~filechannel.errors.NotOwnerError` names the owner. ``tier
  rebuild`` (disaster recovery: the old root is gone) takes the claim over with a plain
  write read back; the old root, should it come back, then refuses to tier.
- **Epochs are unique and increasing per prefix, whatever happened to the local index.**
  An uploader's epoch is above every epoch recorded here (:func:`newest_epoch`) and is
  recorded with a conditional create before the uploader writes anything there; two
  uploaders can never both create the same epoch's mark.
- **An overtaken uploader publishes nothing.** After writing a manifest and before
  committing it, the uploader reads the claim and the epoch marks again
  (:meth:`PrefixGuard.verify`, a write then a verify): another owner or a newer epoch
  stops it before its commit, so the local copy stays and the newer owner decides.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..engine.clock import now_ms
from ..engine.files import opened, read_if_exists
from ..errors import FencedError, NotOwnerError, TierError, os_errors
from .layout import MAX_EPOCH, parse_object_name
from .storage import ChunkStorage, redact_url

CLAIM = ".claim.json"
EPOCHS = ".epochs/"
IDENTITY_FILE = "identity.json"
KEEP_EPOCH_MARKS = 8  # older marks are deleted: the newest is what every check reads


def _canonical(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def root_identity(tier_dir: str) -> str:
    """The identity of the root whose tier folder is ``tier_dir`` (``ROOT/.tier``), made on first use.

    Created with ``O_EXCL`` so two processes making it at once agree on one; a damaged file
    raises TierError naming it (it is never silently replaced: a new identity would lose the claim).
    """
    path = os.path.join(tier_dir, IDENTITY_FILE)
    raw = read_if_exists(path, "root identity")
    if raw is None:
        with os_errors("create tier folder", tier_dir):
            os.makedirs(tier_dir, exist_ok=True)
        data = _canonical({"root_id": uuid.uuid4().hex})
        with os_errors("write", path):
            try:
                with opened(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644) as fd:
                    os.write(fd, data)
                    os.fsync(fd)
            except FileExistsError:
                pass  # made by another process meanwhile: read theirs
        raw = read_if_exists(path, "root identity")
    try:
        root_id = json.loads(raw or b"")["root_id"]
        if not isinstance(root_id, str) or not root_id:
            raise ValueError(root_id)
    except (ValueError, KeyError, TypeError):
        raise TierError(
            f"the root identity {path} is damaged; it names the owner of this root's tier-2 prefix: restore it "
            "(or run `filechannel tier rebuild` into a new root to take the prefix over)"
        ) from None
    return root_id


@dataclass(frozen=True)
class Claim:
    """The owner of a prefix: a root's identity, who claimed it (host:pid) and when."""

    root_id: str
    by: str
    claimed_at_ms: int
    took_over_from: str | None = None

    def encode(self) -> bytes:
        return _canonical(
            {"root_id": self.root_id, "by": self.by, "claimed_at_ms": self.claimed_at_ms, "took_over_from": self.took_over_from}
        )


def read_claim(storage: ChunkStorage) -> Claim | None:
    """The prefix's claim, or None if nobody claimed it yet; a damaged claim raises TierError."""
    try:
        raw = storage.read(CLAIM, 0, 1 << 16)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
        return Claim(str(doc["root_id"]), str(doc["by"]), int(doc["claimed_at_ms"]), doc.get("took_over_from"))
    except (ValueError, KeyError, TypeError):
        raise TierError(
            f"the claim {redact_url(storage.url).rstrip('/')}/{CLAIM} is damaged: run `filechannel tier rebuild` "
            "from this prefix to take it over, or restore the object"
        ) from None


def not_owner(storage: ChunkStorage, claim: Claim) -> NotOwnerError:
    return NotOwnerError(
        f"{redact_url(storage.url)} is owned by another root (root {claim.root_id}, claimed by {claim.by} at "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(claim.claimed_at_ms / 1000))}): this root uploads, sweeps "
        "and deletes nothing there; give this root its own prefix, or, if that root is gone for good, "
        "`filechannel tier rebuild` a new root from the prefix"
    )


def claim_prefix(storage: ChunkStorage, root_id: str, by: str) -> Claim:
    """Claim the prefix for ``root_id`` if nobody has (a conditional create), and return the claim;
    :class:`NotOwnerError` if another root holds it."""
    claim = Claim(root_id, by, now_ms())
    if not storage.create_new(CLAIM, claim.encode()):
        found = read_claim(storage)
        if found is None:  # deleted between the two calls: claim again
            return claim_prefix(storage, root_id, by)
        claim = found
    if claim.root_id != root_id:
        raise not_owner(storage, claim)
    return claim


def take_over(storage: ChunkStorage, root_id: str, by: str) -> Claim | None:
    """Make ``root_id`` the owner of the prefix whatever the claim says (``tier rebuild``); return the
    previous claim. Read back: a concurrent take-over that won makes this one raise NotOwnerError."""
    previous = read_claim(storage)
    claim = Claim(root_id, by, now_ms(), previous.root_id if previous else None)
    storage.write(CLAIM, claim.encode())
    found = read_claim(storage)
    if found is None or found.root_id != root_id:
        raise not_owner(storage, found or claim)
    return previous


def epoch_mark(epoch: int) -> str:
    return f"{EPOCHS}E{epoch:010d}.json"


def _marked_epochs(storage: ChunkStorage) -> list[int]:
    found = []
    for info in storage.list(EPOCHS):
        tail = info.name[len(EPOCHS) :]
        if tail.startswith("E") and tail.endswith(".json") and tail[1:-5].isdigit():
            found.append(int(tail[1:-5]))
    return sorted(found)


def newest_epoch(storage: ChunkStorage) -> int:
    """The newest uploader epoch the prefix records (0 if none). A prefix written before epoch
    marks existed has none: then the newest epoch any object name carries (one listing)."""
    marked = _marked_epochs(storage)
    if marked:
        return marked[-1]
    return max((p.epoch for o in storage.list("") if (p := parse_object_name(o.name)) is not None), default=0)


@dataclass(frozen=True)
class EpochMark:
    epoch: int
    owner: str
    taken_at_ms: int


def epoch_marks(storage: ChunkStorage) -> list[EpochMark]:
    """The epoch marks of the prefix (the newest few), oldest first; a mark that cannot be read
    keeps its epoch with an owner saying so."""
    marks = []
    for epoch in _marked_epochs(storage):
        try:
            doc = json.loads(storage.read(epoch_mark(epoch), 0, 1 << 16))
            marks.append(EpochMark(epoch, str(doc.get("owner", "?")), int(doc.get("taken_at_ms", 0))))
        except (FileNotFoundError, ValueError, TypeError, AttributeError):
            marks.append(EpochMark(epoch, "an epoch mark of the bucket", 0))
    return marks


class PrefixGuard:
    """An uploader's standing on one prefix: :meth:`enter` once (claim, epoch mark), :meth:`verify`
    before each commit that publishes (see the module docstring)."""

    def __init__(self, storage: ChunkStorage, root_id: str, owner: str, epoch: int) -> None:
        if not 1 <= epoch <= MAX_EPOCH:
            raise TierError(f"epoch {epoch} is out of range")
        self.storage = storage
        self.root_id = root_id
        self.owner = owner
        self.epoch = epoch

    def enter(self) -> None:
        """Claim the prefix (or find it ours), then record this epoch in it; NotOwnerError if
        another root owns it, FencedError if the prefix holds this epoch or a newer one already."""
        claim_prefix(self.storage, self.root_id, self.owner)
        newest = newest_epoch(self.storage)
        mark = {"epoch": self.epoch, "owner": self.owner, "root_id": self.root_id, "taken_at_ms": now_ms()}
        if newest >= self.epoch or not self.storage.create_new(epoch_mark(self.epoch), _canonical(mark)):
            raise FencedError(
                f"uploader epoch {self.epoch} is fenced in {redact_url(self.storage.url)}: the prefix already records epoch "
                f"{max(newest, self.epoch)}; another uploader took over (restart this daemon to take a newer epoch)"
            )
        for old in _marked_epochs(self.storage)[:-KEEP_EPOCH_MARKS]:
            self.storage.delete(epoch_mark(old))

    def verify(self) -> None:
        """Raise unless this root still owns the prefix and no newer epoch was recorded there."""
        claim = read_claim(self.storage)
        if claim is None or claim.root_id != self.root_id:
            raise not_owner(self.storage, claim or Claim("(none: the claim was deleted)", "?", 0))
        marked = _marked_epochs(self.storage)
        if marked and marked[-1] > self.epoch:
            raise FencedError(
                f"uploader epoch {self.epoch} was overtaken in {redact_url(self.storage.url)} by epoch {marked[-1]}: "
                "this one stops before publishing; the newer one cleans up what it left"
            )
