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
- **Errors are the reader's.** A damaged head or manifest, a bucket that refuses the
  reader, raise at the read that needed them (:class:`~filechannel.errors.TierError`,
  :class:`~filechannel.errors.CorruptRecordError`, naming the object): nothing advanced,
  the same read later tries again. A bucket that cannot be reached *for a while*
  (:class:`~filechannel.errors.StorageUnavailableError`, after the binding's retries) while
  the index already holds the channel is not an error of the read: what is indexed is
  served, a warning is logged once, and the head is tried again every ``follow_s`` (as a
  Kafka consumer's poll goes on while a broker is away). An index that knows nothing of
  the channel raises instead: "nothing" would be a silent answer.
- **A segment follows its manifest.** ``tier defrag`` rewrites a segment's manifest in place
  when it moves its chunks into a merged object, and deletes the old chunks after its
  garbage delay. A read that finds a chunk gone reads the segment's manifest again: moved,
  the index takes the new chunks (:meth:`~.metadata.TierMetadata.relocate`) and the read
  goes on from there; gone, retention deleted the segment (the read raises
  :class:`~filechannel.errors.OffsetOutOfRangeError`).
"""

from __future__ import annotations

import logging
import time

from ..errors import CorruptRecordError, ObjectNotFoundError, StorageUnavailableError
from .context import TierContext
from .heads import head_name, read_head
from .layout import SegmentRecord, parse_object_name
from .metadata import EpochRecord, TierMetadata
from .reindex import read_manifest, usable_segments
from .storage import ChunkStorage, redact_url

log = logging.getLogger("filechannel")


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
        try:
            follow_head(self.storage, metadata, self.name)  # (the binding's errors name the storage and the object)
        except StorageUnavailableError as exc:
            if metadata.bounds(self.name) is None:
                raise  # an index that knows nothing of the channel must not answer "nothing"
            if self._unchecked is None:
                log.warning(
                    "tier: cannot follow %s in %s (%s); reading what was indexed, trying again every %.1f s",
                    self.name,
                    redact_url(self.url),
                    exc,
                    self.follow_s,
                )
            self._unchecked = exc
            return
        if self._unchecked is not None:
            log.warning("tier: following %s in %s again", self.name, redact_url(self.url))
            self._unchecked = None

    def _checked(self, metadata: TierMetadata) -> None:
        if time.monotonic() - self._checked_at >= self.follow_s:
            self._bring_up(metadata)

    def _current(self, record: SegmentRecord) -> SegmentRecord | None:
        """Where the segment of ``record`` (a chunk of which is gone) is now: the index's row if it
        already moved; otherwise its manifest, read again, moved into the index (None: the manifest
        is gone with the segment, deleted by retention)."""
        now = super()._current(record)
        if now is None or now.chunks != record.chunks or record.manifest is None:
            return now
        try:
            moved = read_manifest(self.storage, record.manifest)
        except ObjectNotFoundError:
            return None
        same = (moved.channel, moved.base_offset, moved.end_offset, moved.size, moved.epoch)
        if same != (record.channel, record.base_offset, record.end_offset, record.size, record.epoch):
            return now
        if moved.chunks != record.chunks and self.metadata.relocate(moved):
            return super()._current(record)
        return now
