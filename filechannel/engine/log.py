"""The log: the ordered segments of one channel folder, as one listing across both tiers.

The Log is the folder's one API: names, the listing and its caches, locating an offset,
the checked indexes of sealed segments. Each operation that changes the folder has its
own module, above this one: it takes the Log and works through it, and the Log never
calls it: :mod:`.recovery` (where the log ends, torn tails, repair), :mod:`.roll`
(starting a segment, the first or at a roll, and the later fsync of the sealed ones),
:mod:`.compression` (compression of sealed segments), :mod:`.retention` (garbage
collection and what it weighs: a segment's bytes and newest timestamp).

Invariants (every process that opens the folder keeps them):

- Segments are named by base offset; base offsets increase with the names, and a
  segment's records are exactly the offsets from its base to the next segment's base.
- The segment with the largest base offset is the *active* one, always raw (``.seg``);
  only it is appended to, and only by a holder of ``writer.lock``. Every other segment is
  sealed, raw or compressed (``.seg.z``, preferred when both exist).
- Recovery runs only in a writer, under ``writer.lock``, before its first append: it never
  cuts a frame another process is still writing, and opening a channel to read writes
  nothing. It cuts only a torn tail (a partial or bad last frame with nothing valid after
  it); damage followed by valid data is kept, reported, and blocks appends until
  :func:`.recovery.repair`.
- No index entry is trusted because it is in a file: entries are checked against the
  frames before a reader or recovery starts from them.
- Compression and garbage collection run only under ``maintenance.lock``; they touch
  sealed segments only, and delete a prefix of them, never a hole.
- With a tier, the listing is the local segments and, below the first of them, the
  segments the tier-2 metadata holds as uploaded (a segment in both is read locally);
  recovery, compression, repair and deletion see the local segments only, and an empty
  folder starts at the tier's end offset, never below what was uploaded.
- With a tier (``tier`` is not None), :func:`.retention.collect_garbage` deletes nothing: only
  the tiering daemon deletes segments, and only once they are uploaded (see
  filechannel/tiering/daemon.py), so no retention rule or reader position can delete a
  segment that exists nowhere else.

This class keeps an in-process cache of the listing and of sealed segments' indexes; it
is shared by the channel's senders and receivers and is thread-safe.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..config import ChannelConfig
from ..errors import (
    OffsetOutOfRangeError,
    StorageError,
    file_vanished,
    os_errors,
    storage_error,
)
from . import names
from .compressed import CompressedInfo, CompressedSegment
from .files import opened, opened_if_exists, unlink_if_exists
from .index import (
    MIN_TIMESTAMP,
    IndexMark,
    OffsetIndex,
    TimeIndex,
    entry_agrees,
    index_agrees,
    index_bytes_match,
    write_index_files,
)
from .lock import FileLock
from .log_start import read_log_start
from .readahead import LocalBlocks
from .recovery_point import FILE_NAME as RECOVERY_POINT_FILE
from .segment import (
    MAX_FRAME_PAYLOAD,
    SEGMENT_HEADER_SIZE,
    FrameScanner,
)
from .writer_state import read_state

if TYPE_CHECKING:
    from .compressed import BlockData

log = logging.getLogger("filechannel")


@dataclass(frozen=True)
class SegmentRef:
    """One segment as the listing shows it.

    ``remote`` is its tier-2 record when the segment is read from tier-2 (it is uploaded
    and has no local copy); ``path`` then names its first chunk object, for messages only.
    A remote segment is always ``compressed`` (tier-2 holds the ``.seg.z`` form).
    """

    base_offset: int
    compressed: bool
    path: str
    remote: RemoteSegment | None = None


def vanished(ref: SegmentRef, exc: BaseException) -> bool:
    """Whether ``exc`` says ``ref`` went away under a reader by maintenance: a local file
    compressed or collected, or a segment only in tier-2 deleted by retention (OffsetOutOfRangeError)."""
    return file_vanished(exc) or (ref.remote is not None and isinstance(exc, OffsetOutOfRangeError))


class RemoteSegment(Protocol):
    """What the engine reads of a tier-2 segment's record (``tiering.layout.SegmentRecord``)."""

    @property
    def base_offset(self) -> int: ...
    @property
    def end_offset(self) -> int: ...
    @property
    def size(self) -> int: ...


class TierView(Protocol):
    """The engine's seam to tier-2: point questions only, none of which lists the catalogue.

    Implemented by ``tiering.context.TierContext`` (the engine never imports tiering: the
    tier is handed in by :class:`~filechannel.channel.FileChannel`). Every answer comes
    from the local index, kept true to the bucket by tiering.
    """

    name: str

    def uploaded_segments(self) -> list[Any]: ...
    def segment_at(self, offset: int) -> Any | None: ...
    def floor_segment(self, offset: int) -> Any | None: ...
    def segment_after(self, base_offset: int) -> Any | None: ...
    def segment_at_time(self, timestamp: int) -> Any | None: ...
    def bounds(self) -> tuple[int, int] | None: ...
    def end_offset(self) -> int: ...
    def where(self, record: Any) -> str: ...
    def open_blocks(self, record: Any) -> CompressedBlocks: ...
    def info(self, record: Any) -> CompressedInfo: ...


class CompressedBlocks(Protocol):
    """The blocks of a compressed segment, local (:class:`LocalBlocks`) or in tier-2."""

    info: CompressedInfo
    path: str

    def block(self, i: int) -> BlockData: ...
    def start(self) -> None: ...
    def where(self, i: int) -> str: ...
    def close(self) -> None: ...


class Log:
    """The segments of one channel folder (see the module docstring)."""

    def __init__(self, path: str, config: ChannelConfig, *, tier: TierView | None = None, read_only: bool = False) -> None:
        self.path = path
        self.config = config
        self.tier = tier  # tier-2 of this channel, built by FileChannel; None without tiering
        self.read_only = read_only  # then index files that disagree with the frames are rebuilt in memory only
        # A read-only log opens the lock files for reading, never creates them and never takes
        # them (a read-only mount, an executor's view of a root): it reads the writer state only.
        self.writer_lock = FileLock(os.path.join(path, "writer.lock"), read_only=read_only)
        self.maintenance_lock = FileLock(os.path.join(path, "maintenance.lock"), read_only=read_only)
        self._mutex = threading.Lock()
        self._bases: list[int] = []  # the local segments' base offsets, as last listed
        # What the last listing's names parse to, and its refs by (base, compressed): a listing
        # parses only names it has not seen (every read lists the folder; most names stay).
        # Each listing keeps only its own names, so neither grows with the log's history.
        self._parsed: dict[str, tuple[int, str] | None] = {}
        self._refs: dict[tuple[int, bool], SegmentRef] = {}
        self._sealed_index: dict[int, tuple[tuple[int, int, int], OffsetIndex, TimeIndex]] = {}
        # (file identity, table) by base offset: the cleaner replaces a .seg.z by one of the same name
        self._z_info: dict[int, tuple[tuple[int, int], CompressedInfo]] = {}
        self.recovery_point_path = os.path.join(path, RECOVERY_POINT_FILE)
        self.recovered = False  # this process's writer has not checked the log yet

    # -- names -----------------------------------------------------------------------------

    def file(self, base_offset: int, suffix: str) -> str:
        return os.path.join(self.path, names.segment_stem(base_offset) + suffix)

    def segment_path(self, base_offset: int) -> str:
        return self.file(base_offset, names.SEGMENT_SUFFIX)

    def compressed_path(self, base_offset: int) -> str:
        return self.file(base_offset, names.COMPRESSED_SUFFIX)

    # -- listing ---------------------------------------------------------------------------

    def list_segments(self) -> list[SegmentRef]:
        """List the segments again, oldest first: the local folder's, and below the first of
        them the uploaded segments only in tier-2 (a segment both local and uploaded is read
        locally). Where the tiers do not meet, the gap is a hole, as between local files."""
        local = self.refresh_local()
        return self._remote_below(local[0].base_offset if local else None) + local

    def segments_from_time(self, timestamp: int) -> list[SegmentRef]:
        """The segments a search for the first record at or after ``timestamp`` reads, oldest
        first: the local ones and, below them, the one uploaded segment that holds such a
        record first (one question to tier-2's index: the segments before it hold none, as
        their newest records say, so no table of theirs is fetched)."""
        local = self.refresh_local()
        record = None if self.tier is None else self.tier.segment_at_time(timestamp)
        if record is None or (local and record.base_offset >= local[0].base_offset):
            return local
        return [self._remote_ref(record), *local]

    def relisted(self, ref: SegmentRef, exc: BaseException, refs: list[SegmentRef] | None = None) -> tuple[list[SegmentRef], int]:
        """After ``ref`` vanished (:func:`vanished`) under a walk of the listing: the new
        listing (``refs`` if given, a walk's own listing made again, else :meth:`list_segments`),
        and where to go on in it (at the ``.seg.z`` that replaced it, or at the first segment
        after it if garbage collection deleted it). Re-raises ``exc`` if ``ref`` is listed
        unchanged: then it did not vanish by maintenance."""
        refs = self.list_segments() if refs is None else refs
        i = bisect.bisect_left([r.base_offset for r in refs], ref.base_offset)
        if i < len(refs) and refs[i] == ref:
            raise exc
        return refs, i

    def refresh_local(self) -> list[SegmentRef]:
        """List the local folder again, and drop the cached indexes of segments no longer in it:
        what the writer and maintenance (recovery, rolls, compression, garbage collection) and
        every read use. Tier-1 never waits on tier-2, and a damaged or unreachable tier-2 index
        never stops local sends."""
        local = self.local_segments()
        with self._mutex:
            self._bases = [r.base_offset for r in local]
            live = set(self._bases)
            for cache in (self._sealed_index, self._z_info):
                for b in [b for b in cache if b not in live]:
                    del cache[b]
        return local

    def local_segments(self) -> list[SegmentRef]:
        """The segments in the channel folder, oldest first (what recovery, compression and
        garbage collection work on: they never touch tier-2)."""
        with os_errors("list", self.path):
            files = os.listdir(self.path)
        seen, parsed = self._parsed, {}
        found: dict[int, bool] = {}
        for f in files:
            name = parsed[f] = seen[f] if f in seen else names.parse_segment_file(f)
            if name is None:
                continue
            base, suffix = name
            if suffix == names.COMPRESSED_SUFFIX:
                found[base] = True
            elif suffix == names.SEGMENT_SUFFIX:
                found.setdefault(base, False)
        known, refs = self._refs, {}
        for base, z in sorted(found.items()):
            ref = known.get((base, z))
            if ref is None:
                ref = SegmentRef(base, z, self.compressed_path(base) if z else self.segment_path(base))
            refs[base, z] = ref
        self._parsed, self._refs = parsed, refs  # replaced whole: readers on other threads see one or the other
        return list(refs.values())

    def _remote_below(self, first_local: int | None) -> list[SegmentRef]:
        """The uploaded segments below ``first_local`` (all of them if None), as refs."""
        if self.tier is None:
            return []
        records = self.tier.uploaded_segments()
        return [self._remote_ref(r) for r in records if first_local is None or r.base_offset < first_local]

    def _remote_ref(self, record: RemoteSegment) -> SegmentRef:
        assert self.tier is not None
        return SegmentRef(record.base_offset, True, self.tier.where(record), record)

    def tier_end_offset(self) -> int:
        """One past the last uploaded offset (0 without tiering or with nothing uploaded):
        where an empty folder of a tiered channel starts, never 0 below uploaded records."""
        return 0 if self.tier is None else self.tier.end_offset()

    def open_compressed(self, ref: SegmentRef) -> CompressedBlocks:
        """The blocks of compressed segment ``ref``, from its local file or from tier-2."""
        if ref.remote is not None:
            assert self.tier is not None
            return self.tier.open_blocks(ref.remote)
        return LocalBlocks(ref.path)

    def locate(self, offset: int) -> tuple[SegmentRef, int | None]:
        """The segment that holds (or will hold) ``offset``, and where the next segment starts
        (None for the last one).

        Lists the local folder afresh; below its first segment, asks tier-2 two point
        questions (the segment at or before ``offset``, the one after it), never its whole
        catalogue. Raises :class:`OffsetOutOfRangeError` if ``offset`` lies below the first
        segment (retention or garbage collection deleted it).
        """
        start = read_log_start(self.path)
        if offset < start:
            raise OffsetOutOfRangeError(
                f"offset {offset} is below the log start offset {start} of channel {self.path!r} (records before it "
                "were deleted by delete_records); seek to the first offset or later"
            )
        local = self.refresh_local()
        if local and offset >= local[0].base_offset:
            i = bisect.bisect_right([r.base_offset for r in local], offset) - 1
            return local[i], local[i + 1].base_offset if i + 1 < len(local) else None
        record = None if self.tier is None else self.tier.floor_segment(offset)
        if record is None:
            first = self.first_offset
            raise OffsetOutOfRangeError(
                f"offset {offset} is below the first retained offset {first} of channel {self.path!r} "
                "(its segment was deleted by retention or garbage collection); seek to the first offset or later"
            )
        assert self.tier is not None
        after = self.tier.segment_after(record.base_offset)
        ends = [b for b in (after.base_offset if after else None, local[0].base_offset if local else None) if b is not None]
        return self._remote_ref(record), min(ends) if ends else None

    def next_segment(self, end_offset: int, remote: bool = False) -> SegmentRef | None:
        """The segment that starts at ``end_offset`` if it exists (one stat per file kind;
        with ``remote``, then a look in the tier-2 metadata: a reader's prefetch, never a
        writer's check)."""
        for z, path in ((True, self.compressed_path(end_offset)), (False, self.segment_path(end_offset))):
            if os.path.exists(path):
                return SegmentRef(end_offset, z, path)
        if remote and self.tier is not None:
            record = self.tier.segment_at(end_offset)
            if record is not None and record.base_offset == end_offset:
                return self._remote_ref(record)
        return None

    def following(self, base_offset: int) -> int | None:
        """Where the segment after the one based at ``base_offset`` starts, in either tier, or None
        (a listing of the folder; below it, one probe of tier-2's index)."""
        local = self.refresh_local()
        first_local = local[0].base_offset if local else None
        if self.tier is not None and (first_local is None or base_offset < first_local):
            after: RemoteSegment | None = self.tier.segment_after(base_offset)
            if after is not None and (first_local is None or after.base_offset < first_local):
                return after.base_offset
        return next((r.base_offset for r in local if r.base_offset > base_offset), None)

    @property
    def first_offset(self) -> int:
        """The first offset held, in either tier, or the log start offset if that is higher
        (:mod:`.log_start`; a listing of the folder, two probes of tier-2's index, one small read)."""
        local = self.refresh_local()
        bounds = None if self.tier is None else self.tier.bounds()
        firsts = [b for b in (local[0].base_offset if local else None, bounds[0] if bounds else None) if b is not None]
        return max(min(firsts) if firsts else 0, read_log_start(self.path))

    def end_offset(self) -> int:
        """The next offset to be written, as the files show it now (no lock taken); with no local
        segment, tier-2's end."""
        refs = self.refresh_local()
        if not refs:
            return 0 if self.tier is None else self.tier.end_offset()
        last = refs[-1]
        if last.compressed:
            return self.compressed_info(last).end_offset
        state = read_state(self.writer_lock.fd, self.writer_lock.path) if self.writer_lock.fd >= 0 else None
        try:
            size = os.path.getsize(last.path)
        except FileNotFoundError:
            return self.end_offset()
        if state is not None and state.segment_base == last.base_offset and state.segment_size == size:
            return state.end_offset
        idx = self.load_offset_index(last.base_offset, valid_end=size)
        offset, pos = idx.last()
        with opened(last.path, os.O_RDONLY, action="open segment") as fd:
            scanner = FrameScanner(fd, last.path, pos, offset, MAX_FRAME_PAYLOAD)
            scanner.scan()
            return scanner.end_offset

    def record_count(self) -> int:
        """The records held, in either tier, from the log start offset: each segment's offsets
        less the holes the cleaner left in it (a cleaned ``.seg.z``'s runs).

        Reads the table of each local compressed segment (cached), never tier-2's: the
        cleaner alone makes holes, and a compacted topic is never tiered (its history in
        tier-2 would not be compacted), so an uploaded segment's offsets are its records. A
        segment compressed or collected meanwhile is counted again from a new listing."""
        while True:
            try:
                return self._count_records()
            except StorageError as exc:
                if not file_vanished(exc):
                    raise

    def _count_records(self) -> int:
        start = read_log_start(self.path)
        refs = self.list_segments()
        end = self.end_offset()
        count = 0
        for i, ref in enumerate(refs):
            stop = refs[i + 1].base_offset if i + 1 < len(refs) else end
            if ref.compressed and ref.remote is None:
                runs = self.compressed_info(ref).runs
                count += sum(max(0, min(r.end_offset, stop) - max(r.first_offset, start)) for r in runs)
            else:
                count += max(0, stop - max(ref.base_offset, start))
        return count

    # -- indexes ---------------------------------------------------------------------------

    def load_offset_index(self, base_offset: int, valid_end: int | None = None) -> OffsetIndex:
        """The offset index of a raw segment as its file holds it; lookups check the entries
        they use against the frames (see :mod:`filechannel.engine.index`)."""
        return OffsetIndex.load(
            self.file(base_offset, names.OFFSET_INDEX_SUFFIX), base_offset, valid_end, segment_path=self.segment_path(base_offset)
        )

    def sealed_offset_index(self, ref: SegmentRef) -> OffsetIndex:
        """The offset index of a sealed raw segment (see :meth:`sealed_indexes`)."""
        return self.sealed_indexes(ref)[0]

    def sealed_indexes(self, ref: SegmentRef) -> tuple[OffsetIndex, TimeIndex]:
        """Both indexes of a sealed raw segment, checked whole against its frames on first
        use in this process and cached. A sealed segment no longer changes, so one check
        serves every later lookup; it costs one scan of the segment (in C), and a check of
        each entry if the files were made with another index interval. Index files that are
        missing, torn, or hold an entry that disagrees with the frames are rebuilt."""
        try:
            st = os.stat(ref.path)
        except FileNotFoundError:  # compressed or collected meanwhile: a caller holding it open reads from its start
            return OffsetIndex(ref.base_offset, [], []), TimeIndex(ref.base_offset, [], [])
        except OSError as exc:
            raise storage_error(exc, "stat", ref.path) from exc
        # A repair may cut a sealed segment, which then grows again as the active one and is
        # sealed anew: the file's identity, size and mtime tell a cached index it is stale.
        signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._mutex:
            cached = self._sealed_index.get(ref.base_offset)
        if cached is not None and cached[0] == signature:
            return cached[1], cached[2]
        idx_path = self.file(ref.base_offset, names.OFFSET_INDEX_SUFFIX)
        tix_path = self.file(ref.base_offset, names.TIME_INDEX_SUFFIX)
        with opened_if_exists(ref.path, os.O_RDONLY, action="open segment") as fd:
            if fd is None:
                return OffsetIndex(ref.base_offset, [], []), TimeIndex(ref.base_offset, [], [])
            # One scan of the frames (in C) gives the entries a writer with our interval makes:
            # files that hold exactly those agree. Files made with another interval are checked
            # entry by entry; files that disagree are rebuilt.
            marks, _since, _max, _scanner = self.scan_marks(fd, ref.path, SEGMENT_HEADER_SIZE, ref.base_offset, 0, MIN_TIMESTAMP)
            offsets = [m.offset for m in marks]
            idx = OffsetIndex(ref.base_offset, offsets, [m.position for m in marks])
            tix = TimeIndex(ref.base_offset, [m.max_timestamp_before for m in marks], offsets)
            if not index_bytes_match(idx_path, tix_path, ref.base_offset, marks):
                in_files = OffsetIndex.load(idx_path, ref.base_offset), TimeIndex.load(tix_path, ref.base_offset)
                if os.path.exists(idx_path) and os.path.exists(tix_path) and index_agrees(fd, ref.path, *in_files):
                    idx, tix = in_files
                else:
                    log.warning("channel %s: the index of %s did not match its frames; rebuilding it", self.path, ref.path)
                    self._write_index(ref, marks)
        with self._mutex:
            self._sealed_index[ref.base_offset] = (signature, idx, tix)
        return idx, tix

    def rebuild_index(self, ref: SegmentRef) -> list[IndexMark]:
        """Write a sealed raw segment's index files anew from its frames (they are derived
        data; a segment with a bad frame gets the entries before it); return the entries."""
        with opened(ref.path, os.O_RDONLY, action="open segment") as fd:
            marks, _since, _max, _scanner = self.scan_marks(fd, ref.path, SEGMENT_HEADER_SIZE, ref.base_offset, 0, MIN_TIMESTAMP)
        self._write_index(ref, marks)
        return marks

    def _write_index(self, ref: SegmentRef, marks: list[IndexMark]) -> None:
        """Replace a sealed segment's index files with ``marks``. Needs no lock: compression
        and GC delete the segment file before its index files, so if the segment is still
        there after our renames, they delete ours too; if it is gone, we delete ours."""
        if self.read_only:
            return
        idx_path = self.file(ref.base_offset, names.OFFSET_INDEX_SUFFIX)
        tix_path = self.file(ref.base_offset, names.TIME_INDEX_SUFFIX)
        write_index_files(idx_path, tix_path, ref.base_offset, marks)
        if not os.path.exists(ref.path):
            unlink_if_exists(idx_path)
            unlink_if_exists(tix_path)

    def scan_marks(
        self, fd: int, path: str, position: int, offset: int, since_index: int, max_ts: int
    ) -> tuple[list[IndexMark], int, int, FrameScanner]:
        """Scan frames from ``position``, producing the index marks the writer would have made."""
        scanner = FrameScanner(fd, path, position, offset, MAX_FRAME_PAYLOAD)
        marks, since_index, max_ts = scanner.scan(self.config.index_interval_bytes, since_index, max_ts)
        return [IndexMark(*mark) for mark in marks], since_index, max_ts, scanner

    def _is_sealed(self, ref: SegmentRef) -> bool:
        with self._mutex:
            return bool(self._bases) and self._bases[-1] > ref.base_offset

    def time_start(self, ref: SegmentRef, timestamp: int) -> int | None:
        """Where to start scanning ``ref`` for the first record with timestamp >= ``timestamp``.

        None when the segment certainly holds no such record. In the active segment the
        time entry used is checked against the frames first (a damaged one falls back to
        the entry before it, or the segment start: a later start could skip the answer).
        """
        if ref.compressed:
            info = self.compressed_info(ref)
            i = info.block_for_time(timestamp)
            return None if i is None else info.blocks[i].first_offset
        if self._is_sealed(ref):
            tix = self.sealed_indexes(ref)[1]
            i = bisect.bisect_left(tix.max_before, timestamp) - 1
            return tix.offsets[i] if i >= 0 else ref.base_offset
        tix = TimeIndex.load(self.file(ref.base_offset, names.TIME_INDEX_SUFFIX), ref.base_offset)
        i = bisect.bisect_left(tix.max_before, timestamp) - 1
        if i < 0:
            return ref.base_offset
        idx = self.load_offset_index(ref.base_offset)
        with opened_if_exists(ref.path, os.O_RDONLY, action="open segment") as fd:
            while fd is not None and i >= 0:
                if i < len(idx) and idx.offsets[i] == tix.offsets[i]:
                    start = (idx.offsets[i - 1], idx.positions[i - 1], tix.max_before[i - 1]) if i else idx.start
                    if entry_agrees(fd, ref.path, start, tix.offsets[i], idx.positions[i], tix.max_before[i]):
                        return tix.offsets[i]
                i -= 1
        return ref.base_offset

    def compressed_info(self, ref: SegmentRef) -> CompressedInfo:
        if ref.remote is not None:  # tier-2 keeps its own bounded cache of tables: history is unbounded
            assert self.tier is not None
            return self.tier.info(ref.remote)
        with os_errors("stat", ref.path):
            st = os.stat(ref.path)
        identity = (st.st_ino, st.st_mtime_ns)
        with self._mutex:
            cached = self._z_info.get(ref.base_offset)
        if cached is not None and cached[0] == identity:
            return cached[1]
        seg = CompressedSegment.open(ref.path)
        info = seg.info
        seg.close()
        with self._mutex:
            self._z_info[ref.base_offset] = (identity, info)
        return info

    def forget_sealed_index(self, base_offset: int) -> None:
        """Drop the cached indexes of a sealed segment (its files were checked or rewritten)."""
        with self._mutex:
            self._sealed_index.pop(base_offset, None)

    def close(self) -> None:
        self.writer_lock.close()
        self.maintenance_lock.close()
