"""A channel read from the bucket alone: its tier-2 index derived locally, following the channel's head.

A bucket reader (the client's ``Consumer(tier=...)``) has no root: no local segment, no
uploader, no claim. Its :class:`FollowingTierContext` answers the engine's point questions
(:class:`~filechannel.engine.log.TierView`) from an index of its own, ``metadata.db`` under
the reader's state folder, which it fills from the bucket and never writes back to it.

Invariants:

- **Nothing is written to the bucket, nothing deleted.** The reader reads heads, manifests,
  chunks; it takes no epoch and no claim.
- **The index follows the head.** At most once per ``follow_s`` while the channel is read,
  one GET of ``<channel>/head.json``; only when the head is past the index (new uploads) or
  its first offset moved up (retention) are manifests read: those of the new offsets only,
  listed under the longest key prefix their base offsets share (names are zero-padded
  offsets), so a step costs what was uploaded since, not the channel's history. Rows below
  the head's first offset are dropped.
- **Derived, so rebuilt at will.** The index is only a cache of manifests: deleted or
  damaged, it is made anew from the bucket (the base class's healing).
- **Errors are the reader's.** A bucket that cannot be read, a damaged head or manifest
  raise at the read that needed them (:class:`~filechannel.errors.TierError`,
  :class:`~filechannel.errors.CorruptRecordError`, naming the object): nothing advanced,
  the same read later tries again.

Not followed: a manifest rewritten in place by ``tier defrag`` (its segment's chunks moved into
a merged object) after this index took the segment in; the old chunks stay readable for
the defragmenter's garbage delay, after which the index must be deleted to be made anew.
"""

from __future__ import annotations

import time

from ..errors import CorruptRecordError
from .context import TierContext
from .heads import head_name, read_head
from .layout import parse_object_name
from .metadata import EpochRecord, TierMetadata
from .reindex import usable_segments
from .storage import ChunkStorage, redact_url


def follow_head(storage: ChunkStorage, metadata: TierMetadata, channel: str) -> bool:
    """Bring ``channel``'s rows in ``metadata`` up to its head in ``storage`` (see the module
    docstring); whether anything changed. A channel without a head (nothing uploaded yet)
    changes nothing."""
    try:
        head = read_head(storage, channel)
    except CorruptRecordError as exc:
        raise CorruptRecordError(
            f"{redact_url(storage.url).rstrip('/')}/{head_name(channel)}: {exc} (by the writing root's daemon); until "
            "then new uploads of this partition are not seen; the records read so far stand"
        ) from None
    if head is None:
        return False
    bounds = metadata.bounds(channel)
    if bounds is not None and bounds[0] >= head.first_offset and bounds[1] >= head.end_offset:
        return False
    low = max(bounds[1] if bounds else 0, head.first_offset)
    segments = []
    if low < head.end_offset:
        first, last = f"{low:020d}", f"{head.end_offset - 1:020d}"
        shared = first[: next((i for i, (a, b) in enumerate(zip(first, last, strict=True)) if a != b), len(first))]
        listing = [
            o
            for o in storage.list(f"{channel}/{shared}")
            if (p := parse_object_name(o.name)) is not None and p.channel == channel and p.base_offset >= low
        ]
        problems: list[str] = []
        segments = usable_segments(storage, listing, problems, []).get(channel, [])
        if problems:
            raise CorruptRecordError(
                f"{redact_url(storage.url).rstrip('/')}: the manifests of {channel} past offset {low} cannot all be used: "
                f"{'; '.join(problems[:3])}; run `filechannel tier fsck` on the writing root"
            )
    epochs = [EpochRecord(e, "a bucket reader's copy of the segments of this epoch", 0) for e in {s.epoch for s in segments}]
    added, dropped = metadata.add_from_bucket(channel, segments, sorted(epochs, key=lambda e: e.epoch), head.first_offset)
    return bool(added or dropped)


class FollowingTierContext(TierContext):
    """A :class:`TierContext` of a bucket reader: no root, an index that follows the channel's head
    (:func:`follow_head`) at most once per ``follow_s`` seconds, checked before answering.

    ``storage`` is the origin's, opened by the reader and shared by all its partitions (a
    boto3 client costs about a quarter of a second to make): this context never closes it."""

    def __init__(self, storage: ChunkStorage, url: str, metadata_path: str, name: str, *, follow_s: float) -> None:
        super().__init__(url, {}, metadata_path, name)
        self._storage = storage
        self.follow_s = follow_s

    def close(self) -> None:
        with self._lock:
            self._storage = None  # the reader's, closed by it
        super().close()

    def _root_id(self) -> str | None:
        return None  # no root: nothing in the bucket is this reader's own

    def _bring_up(self, metadata: TierMetadata) -> None:
        self._checked_at = time.monotonic()
        follow_head(self.storage, metadata, self.name)  # (the binding's errors name the storage and the object)

    def _checked(self, metadata: TierMetadata) -> None:
        if time.monotonic() - self._checked_at >= self.follow_s:
            self._bring_up(metadata)
