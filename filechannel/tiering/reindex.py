"""The local tier-2 index (``metadata.db``) kept true to the bucket: checked cheaply, healed on its own.

The bucket is the truth (manifests, channel heads, the claim and epoch marks, see
:mod:`.layout`, :mod:`.heads`, :mod:`.ownership`); ``metadata.db`` is an index derived
from it, for point lookups. Rules:

- **Damaged is rebuilt.** An index SQLite calls damaged (not a database, malformed) is
  moved aside (``metadata.db.damaged-<ms>``, with its ``-wal`` and ``-shm``) under
  ``index.lock`` beside it, and a new one is made; a line on the log says so.
- **Behind is brought up.** When a channel is first used, its head (one GET) is compared
  with the index's bounds (two probes): an index that lists less than the head's end, or
  lists offsets below the head's first (retention happened since), is brought up to the
  bucket from the channel's manifests (one listing of the channel, one GET per manifest),
  and a line on the log says so. A bucket from before heads, under an index that holds no
  epoch at all (new, emptied), is read the same way.
- **Never in the way of Tier-1.** A storage that cannot be reached leaves the index as it
  is, with a warning: local sends, rolls and reads of local segments go on.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from ..engine.clock import now_ms
from ..engine.lock import FileLock
from ..errors import CorruptRecordError, MetadataDamagedError, ObjectNotFoundError, TierError
from .heads import ChannelHead, read_head
from .layout import (
    ChunkRecord,
    MergedObjectName,
    ObjectName,
    SegmentRecord,
    decode_manifest,
    manifest_name,
    object_extents,
    parse_object_name,
)
from .metadata import EpochRecord, TierMetadata
from .ownership import epoch_marks, read_claim
from .storage import ChunkStorage, ObjectInfo

log = logging.getLogger("filechannel")

INDEX_LOCK = "index.lock"
_MANIFEST_MAX_BYTES = 1 << 24  # a manifest is a few KiB; a larger object is not one


def read_manifest(storage: ChunkStorage, name: str) -> SegmentRecord:
    """The segment record manifest ``name`` holds (ObjectNotFoundError if it is gone, CorruptRecordError if damaged)."""
    return decode_manifest(storage.read(name, 0, _MANIFEST_MAX_BYTES), name)


def own_chunks(record: SegmentRecord, found: list[tuple[int, str, int]]) -> tuple[ChunkRecord, ...] | None:
    """The chunks segment ``record`` was uploaded in (``found``: ``(start, name, length)`` of the
    objects named :func:`~.layout.chunk_name` of its channel, base offset and epoch), if they hold
    all its bytes, back to back (an object may be longer than its chunk); else None.

    A defragmenter rewrites a segment's manifest to name the merged object before it commits,
    and deletes the segment's own chunks only once the merge is committed and their garbage
    delay has passed. So when a manifest names a merged object that is gone (a merge abandoned,
    its late manifest left by a defragmenter killed before it wrote the manifest back), the
    segment's own chunks are still whole: the records are there, and readers check every
    table and record CRC against them."""
    ordered = sorted(found)
    ends = [start for start, _, _ in ordered[1:]] + [record.size]
    if not ordered or ordered[0][0] != 0:
        return None
    chunks = []
    for (start, name, length), end in zip(ordered, ends, strict=True):
        if not start < end <= record.size or length < end - start:
            return None
        chunks.append(ChunkRecord(name, start, end - start))
    return tuple(chunks)


def usable_segments(
    storage: ChunkStorage,
    listing: list[ObjectInfo],
    problems: list[str],
    notes: list[str],
    counted: Callable[[int, int], None] | None = None,
) -> dict[str, list[SegmentRecord]]:
    """Per channel, the segments the bucket describes: manifests that decode, whose objects are all
    listed and long enough, the newest epoch winning an overlap; by base offset. Holes and unusable
    manifests are added to ``problems``, the rest (superseded attempts, retention in progress) to ``notes``.
    ``counted(done, total)``, a progress bar's, is called before each manifest is read and at the end."""
    sizes = {o.name: o.length for o in listing}
    chunks_of: dict[tuple[str, int, int], list[tuple[int, str, int]]] = defaultdict(list)  # a segment's own chunks
    for o in listing:
        p = parse_object_name(o.name)
        if isinstance(p, ObjectName) and p.start is not None:
            chunks_of[(p.channel, p.base_offset, p.epoch)].append((p.start, o.name, o.length))
    candidates: dict[str, list[SegmentRecord]] = defaultdict(list)
    broken: dict[str, list[SegmentRecord]] = defaultdict(list)  # manifests whose chunks are not whole
    manifests = [o.name for o in listing if (p := parse_object_name(o.name)) is not None and p.kind == "manifest"]
    for i, name in enumerate(manifests):
        if counted is not None:
            counted(i, len(manifests))
        try:
            record = read_manifest(storage, name)
        except ObjectNotFoundError:
            notes.append(f"{name}: deleted since the listing (retention, or a superseded attempt swept)")
            continue
        except CorruptRecordError as exc:
            problems.append(f"{name}: unusable manifest, its segment is left out: {exc}")
            continue
        missing = [name for name, extent in object_extents([record]).items() if sizes.get(name, -1) < extent]
        own = own_chunks(record, chunks_of[(record.channel, record.base_offset, record.epoch)]) if missing else None
        if own is not None:
            notes.append(
                f"{name}: names merged object(s) no longer in the bucket ({', '.join(missing[:3])}); the segment's own "
                "chunks are whole and are used (a merge that never committed; 'tier fsck --repair' writes the manifest again)"
            )
            record, missing = replace(record, chunks=own), []
        if missing:
            what = ", ".join(f"{n} ({'missing' if n not in sizes else f'{sizes[n]} bytes'})" for n in missing[:3])
            broken[record.channel].append(record)
            notes.append(f"{name}: offsets [{record.base_offset}, {record.end_offset}) left out, chunks not whole: {what}")
            continue
        candidates[record.channel].append(record)
    if counted is not None:
        counted(len(manifests), len(manifests))
    used: dict[str, list[SegmentRecord]] = {}
    for channel, records in candidates.items():
        kept: list[SegmentRecord] = []  # never overlapping, by base offset: only neighbours can clash
        bases: list[int] = []
        for record in sorted(records, key=lambda r: -r.epoch):  # the newest epoch wins an overlap
            i = bisect.bisect_right(bases, record.base_offset)
            near = kept[max(0, i - 1) : i + 1]
            clash = next((k for k in near if k.base_offset < record.end_offset and record.base_offset < k.end_offset), None)
            if clash is not None:
                notes.append(
                    f"{record.manifest}: superseded by {clash.manifest} (an older upload attempt; an orphan for the next daemon)"
                )
                continue
            bases.insert(i, record.base_offset)
            kept.insert(i, record)
        used[channel] = kept
    for channel, records in broken.items():
        for record in records:
            if any(r.base_offset >= record.end_offset for r in used.get(channel, [])):
                problems.append(
                    f"{channel}: offsets [{record.base_offset}, {record.end_offset}) are lost: their chunks are not whole "
                    "and later offsets are there (a hole readers will report)"
                )
    for channel, records in used.items():
        for a, b in itertools.pairwise(records):
            if a.end_offset != b.base_offset:
                problems.append(f"{channel}: offsets [{a.end_offset}, {b.base_offset}) are in no usable manifest (a hole)")
    return used


def open_index(path: str) -> TierMetadata:
    """Open the index at ``path``; a damaged one is moved aside and replaced by a new, empty one
    (see the module docstring), which the channels' checks then fill from the bucket."""
    try:
        return TierMetadata(path)
    except MetadataDamagedError as exc:
        first_error = exc
    with _index_lock(path):
        try:
            return TierMetadata(path)  # another process may have replaced it meanwhile
        except MetadataDamagedError:
            _move_aside(path, first_error)
    return TierMetadata(path)


def quarantine(metadata: TierMetadata, error: Exception) -> None:
    """Close ``metadata``, found damaged in use, and move its file aside unless another process
    already replaced it (the next open makes a new index)."""
    metadata.close()
    with _index_lock(metadata.path):
        if not metadata.replaced():
            _move_aside(metadata.path, error)


@contextmanager
def _index_lock(path: str) -> Iterator[None]:
    lock = FileLock(os.path.join(os.path.dirname(path) or ".", INDEX_LOCK))
    try:
        lock.acquire()
        yield
    finally:
        lock.close()


def _move_aside(path: str, error: Exception) -> None:
    aside = f"{path}.damaged-{now_ms()}"
    for suffix in ("", "-wal", "-shm"):
        try:
            os.replace(path + suffix, aside + suffix)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise TierError(f"cannot move the damaged tier index {path} aside ({err}); move it yourself") from error
    log.warning("tier: the index %s was damaged (%s); moved aside to %s, rebuilt from the bucket", path, error, aside)


def bring_up(
    storage: ChunkStorage, metadata: TierMetadata, channel: str, root_id: str | None, *, fresh: bool = False
) -> str | None:
    """Compare ``channel``'s index with its head in the bucket and bring it up if it is behind;
    return a line saying what was done, or None if the index was current. ``fresh``: the index
    was just made (missing, moved aside): the manifests are read even where no head is.

    Only a root that owns the prefix (``root_id`` is the claim's) adopts what the bucket
    holds: another root's uploads are never read as this root's records. Raises TierError if
    the storage cannot be read (the caller decides whether to go on).
    """
    if root_id is None:
        return None  # no daemon of this root ever ran: nothing in the bucket is its own
    claim = read_claim(storage)
    if claim is None and metadata.current_epoch() == 0:
        # this root's daemon claimed the prefix once (it has an identity), its index is new: the
        # bucket should say what was uploaded, and says nothing. Never read that as "nothing".
        raise TierError(
            f"{storage.url} holds no claim although a daemon of this root tiered to it: is the URL right, "
            "or was the bucket emptied? (the local index is new, so it cannot say what was uploaded either)"
        )
    if claim is None or claim.root_id != root_id:
        return None
    head = read_head(storage, channel)
    bounds = metadata.bounds(channel)
    if head is None:
        # a bucket from before heads, under an index in use, is trusted until a pass writes the head;
        # an index with no epoch at all (new, emptied) is filled from the manifests if there are any
        fresh = fresh or metadata.current_epoch() == 0
        if bounds is not None or not fresh or not _has_manifests(storage, channel):
            return None
    elif not _behind(head, bounds):
        return None
    added, dropped = reindex_channel(storage, metadata, channel, head)
    return (
        f"the tier index of {channel} was behind the bucket (index {bounds or 'empty'}, bucket "
        f"{(head.first_offset, head.end_offset) if head else 'manifests only'}): {added} segment(s) added from manifests, "
        f"{dropped} deleted by retention dropped"
    )


def _behind(head: ChannelHead, bounds: tuple[int, int] | None) -> bool:
    """Whether an index listing ``bounds`` lacks uploads the head records, or lists what retention deleted."""
    if bounds is None:
        return head.end_offset > head.first_offset
    return bounds[1] < head.end_offset or bounds[0] < head.first_offset


def _has_manifests(storage: ChunkStorage, channel: str) -> bool:
    return any((p := parse_object_name(o.name)) is not None and p.kind == "manifest" for o in storage.list(channel + "/"))


def reindex_channel(storage: ChunkStorage, metadata: TierMetadata, channel: str, head: ChannelHead | None) -> tuple[int, int]:
    """Bring the index of ``channel`` up to the bucket's manifests (see :meth:`TierMetadata.add_from_bucket`);
    return (segments added, rows dropped)."""
    problems: list[str] = []
    notes: list[str] = []
    listing = storage.list(channel + "/")
    segments = usable_segments(storage, listing, problems, notes).get(channel, [])
    for line in problems:
        log.warning("tier: reindex of %s: %s", channel, line)
    now = now_ms()
    epochs = {r.epoch: EpochRecord(r.epoch, "reindex: uploader of segments of this epoch", now) for r in segments}
    for mark in epoch_marks(storage):
        epochs[mark.epoch] = EpochRecord(mark.epoch, mark.owner, mark.taken_at_ms or now)
    first = head.first_offset if head is not None else 0
    return metadata.add_from_bucket(channel, segments, sorted(epochs.values(), key=lambda e: e.epoch), first)


class _Manifests:
    """The manifests of one channel in a listing, read and decoded when first asked for."""

    def __init__(
        self, storage: ChunkStorage, listing: Sequence[ObjectInfo], channel: str, decoded: dict[str, SegmentRecord | None]
    ) -> None:
        self.storage, self.channel, self.decoded = storage, channel, decoded
        self.sizes = {o.name: o.length for o in listing}
        self.by_base: dict[int, list[str]] = {}
        for o in listing:
            p = parse_object_name(o.name)
            if p is not None and p.kind == "manifest" and p.channel == channel:
                self.by_base.setdefault(p.base_offset, []).append(o.name)
        self.bases = sorted(self.by_base)
        self._superseded: dict[tuple[int, int], bool] = {}  # (base offset, epoch) -> superseded

    def get(self, name: str) -> SegmentRecord | None:
        """The segment manifest ``name`` describes; None if it is not listed, vanished since, or does not decode."""
        if name not in self.decoded:
            record = None
            if name in self.sizes:
                try:
                    record = read_manifest(self.storage, name)
                except (CorruptRecordError, ObjectNotFoundError):
                    record = None
            self.decoded[name] = record
        return self.decoded[name]

    def from_bases(self, low: int, high: int) -> list[SegmentRecord]:
        """The decodable manifests of segments whose base offset is in ``[low, high)``."""
        found = []
        for base in self.bases[bisect.bisect_left(self.bases, low) : bisect.bisect_left(self.bases, high)]:
            found += [r for r in map(self.get, self.by_base[base]) if r is not None]
        return found

    def whole(self, record: SegmentRecord) -> bool:
        """Whether every object ``record`` names is listed, at least as long as the furthest chunk in it."""
        return all(self.sizes.get(name, -1) >= extent for name, extent in object_extents([record]).items())

    def superseded(self, record: SegmentRecord) -> bool:
        """Whether whole manifests of newer epochs, themselves not superseded, cover all of
        ``record``'s offsets: an upload attempt that died or was fenced, then done again (rebuild
        uses the newer ones too). Only the manifests nearest to it are read: those with a base in
        its offsets, and those with the greatest base below them."""
        key = (record.base_offset, record.epoch)
        if key not in self._superseded:
            i = bisect.bisect_left(self.bases, record.base_offset)
            below = self.from_bases(self.bases[i - 1], record.base_offset) if i else []
            newer = sorted(
                (
                    r
                    for r in below + self.from_bases(record.base_offset, record.end_offset)
                    if r.epoch > record.epoch and self.whole(r) and not self.superseded(r)
                ),
                key=lambda r: r.base_offset,
            )
            covered = record.base_offset
            for r in newer:
                if r.base_offset <= covered:
                    covered = max(covered, r.end_offset)
            self._superseded[key] = covered >= record.end_offset
        return self._superseded[key]

    def keeps(self, name: str) -> bool:
        """Whether the manifests keep object ``name`` (see :func:`referenced_by_manifests`)."""
        p = parse_object_name(name)
        if p is None or p.channel != self.channel:
            return False
        if p.kind == "manifest":
            record = self.get(name)
            return record is not None and self.whole(record) and not self.superseded(record)
        if isinstance(p, MergedObjectName):  # held by segments of [base, end) only
            candidates = self.from_bases(p.base_offset, p.start)
        else:  # a chunk: named only by the manifest of its own segment and epoch
            record = self.get(manifest_name(p.channel, p.base_offset, p.epoch))
            candidates = [record] if record is not None else []
        return any(name in {c.name for c in r.chunks} and not self.superseded(r) for r in candidates)


def referenced_by_manifests(
    storage: ChunkStorage,
    listing: Sequence[ObjectInfo],
    channel: str,
    names: Iterable[str] | None = None,
    *,
    decoded: dict[str, SegmentRecord | None] | None = None,
) -> set[str]:
    """Which of ``names`` (default: every object of ``channel`` in ``listing``) the manifests in
    the bucket keep: objects that no orphan sweep may delete, whatever the metadata store says.

    The bucket is the truth and the metadata store only its index: a lost, empty or stale
    ``metadata.db`` must never turn the only copy of acknowledged records into orphans. The
    rule reads the bucket alone (``listing`` is ``storage.list(channel + "/")``):

    - a chunk ``<base>.E<e>.<start>.chunk`` is kept if the manifest ``<base>.E<e>.manifest``
      of the channel (the only one that can name it) is listed, decodes and lists it among
      its chunks;
    - a merged object ``<base>.E<e>.<end>.<token>.merged`` is kept if a listed manifest of a
      segment of the channel with its base offset in ``[base, end)`` decodes and lists it;
    - a manifest is kept if it decodes and every object it names is listed, at least as long
      as the furthest chunk in it: it describes a readable segment (rebuild would use it);
    - except that a manifest *superseded* (its offsets covered by whole manifests of newer
      epochs: an upload attempt that died or was fenced, then done again, the rule rebuild
      follows) keeps nothing, itself included.

    So a manifest that does not decode keeps nothing, and one with an object missing or short
    keeps the objects it names but not itself. Only the manifests the ``names`` need are read
    (none for no names); ``decoded`` caches them (name -> segment, None if it does not decode
    or vanished since the listing). A storage that fails raises TierError: an unreadable
    manifest is never taken for an absent one.
    """
    manifests = _Manifests(storage, listing, channel, {} if decoded is None else decoded)
    if names is None:
        names = [o.name for o in listing if (p := parse_object_name(o.name)) is not None and p.channel == channel]
    return {name for name in names if manifests.keeps(name)}
