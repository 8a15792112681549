"""The log: the ordered segments of one channel folder, their recovery, compression and deletion.

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
  :meth:`Log.repair`.
- No index entry is trusted because it is in a file: entries are checked against the
  frames before a reader or recovery starts from them.
- Compression and garbage collection run only under ``maintenance.lock``; they touch
  sealed segments only, and delete a prefix of them, never a hole.
- With a tier, the listing is the local segments and, below the first of them, the
  segments the tier-2 metadata holds as uploaded (a segment in both is read locally);
  recovery, compression, repair and deletion see the local segments only, and an empty
  folder starts at the tier's end offset, never below what was uploaded.
- With a tier (``tier`` is not None), :meth:`Log.collect_garbage` deletes nothing: only
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
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..config import ChannelConfig
from ..errors import (
    CorruptRecordError,
    LogCorruptedError,
    OffsetOutOfRangeError,
    StorageError,
    file_vanished,
    os_errors,
    storage_error,
)
from . import names
from .compressed import Z_HEADER, CompressedInfo, CompressedSegment, compress_segment, decode_table, table_length
from .files import fsync_dir, fsync_if_exists, unlink_if_exists
from .index import (
    MIN_TIMESTAMP,
    IndexMark,
    OffsetIndex,
    TimeIndex,
    entry_agrees,
    index_agrees,
    index_bytes_match,
    rewrite_index_files,
    write_index_files,
)
from .lock import FileLock
from .readahead import LocalBlocks
from .recovery_point import FILE_NAME as RECOVERY_POINT_FILE
from .recovery_point import read_recovery_point, write_recovery_point
from .segment import (
    SEGMENT_HEADER_SIZE,
    FrameScanner,
    SegmentHeader,
    create_segment,
    find_valid_frame,
    read_segment_header,
)
from .writer_state import WriterState, read_state, write_state

if TYPE_CHECKING:  # the engine never imports tiering at run time: the tier is handed in
    from .compressed import BlockData
    from .tiering.context import TierContext
    from .tiering.layout import SegmentRecord

log = logging.getLogger("filechannel")

MAX_FRAME_PAYLOAD = 0x7FFFFFFF


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
    remote: SegmentRecord | None = None


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

    def __init__(self, path: str, config: ChannelConfig, *, tier: TierContext | None = None, read_only: bool = False) -> None:
        self.path = path
        self.config = config
        self.tier = tier  # tier-2 of this channel, built by FileChannel; None without tiering
        self.read_only = read_only  # then index files that disagree with the frames are rebuilt in memory only
        self.writer_lock = FileLock(os.path.join(path, "writer.lock"))
        self.maintenance_lock = FileLock(os.path.join(path, "maintenance.lock"))
        self._mutex = threading.Lock()
        self._refs: list[SegmentRef] = []
        self._bases: list[int] = []
        self._sealed_index: dict[int, tuple[tuple[int, int, int], OffsetIndex, TimeIndex]] = {}
        self._z_info: dict[int, CompressedInfo] = {}
        self._recovery_point_path = os.path.join(path, RECOVERY_POINT_FILE)
        self._recovered = False  # this process's writer has not checked the log yet

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
        local = self.local_segments()
        refs = self._remote_below(local[0].base_offset if local else None) + local
        with self._mutex:
            self._refs = refs
            self._bases = [r.base_offset for r in refs]
            live = set(self._bases)
            for cache in (self._sealed_index, self._z_info):
                for b in [b for b in cache if b not in live]:
                    del cache[b]
        return refs

    def local_segments(self) -> list[SegmentRef]:
        """The segments in the channel folder, oldest first (what recovery, compression and
        garbage collection work on: they never touch tier-2)."""
        with os_errors("list", self.path):
            files = os.listdir(self.path)
        found: dict[int, bool] = {}
        for f in files:
            parsed = names.parse_segment_file(f)
            if parsed is None:
                continue
            base, suffix = parsed
            if suffix == names.COMPRESSED_SUFFIX:
                found[base] = True
            elif suffix == names.SEGMENT_SUFFIX:
                found.setdefault(base, False)
        return [SegmentRef(b, z, self.compressed_path(b) if z else self.segment_path(b)) for b, z in sorted(found.items())]

    def _remote_below(self, first_local: int | None) -> list[SegmentRef]:
        """The uploaded segments below ``first_local`` (all of them if None), as refs."""
        if self.tier is None:
            return []
        records = self.tier.metadata.segments(self.tier.name)
        return [self._remote_ref(r) for r in records if first_local is None or r.base_offset < first_local]

    def _remote_ref(self, record: SegmentRecord) -> SegmentRef:
        assert self.tier is not None
        return SegmentRef(record.base_offset, True, self.tier.object_url(record.chunks[0].name), record)

    def tier_end_offset(self) -> int:
        """One past the last uploaded offset (0 without tiering or with nothing uploaded):
        where an empty folder of a tiered channel starts, never 0 below uploaded records."""
        if self.tier is None:
            return 0
        records = self.tier.metadata.segments(self.tier.name)
        return records[-1].end_offset if records else 0

    def open_compressed(self, ref: SegmentRef) -> CompressedBlocks:
        """The blocks of compressed segment ``ref``, from its local file or from tier-2."""
        if ref.remote is not None:
            assert self.tier is not None
            return self.tier.reader.open(ref.remote)
        return LocalBlocks(ref.path)

    def segments(self) -> list[SegmentRef]:
        """The cached listing (listing the folder if there is none yet)."""
        with self._mutex:
            refs = self._refs
        return refs or self.list_segments()

    def locate(self, offset: int) -> tuple[SegmentRef, int | None]:
        """The segment that holds (or will hold) ``offset``, and its end offset if sealed.

        Lists the folder afresh. Raises :class:`OffsetOutOfRangeError` if ``offset`` lies
        below the first segment (retention or garbage collection deleted it).
        """
        refs = self.list_segments()
        if not refs or offset < refs[0].base_offset:
            first = refs[0].base_offset if refs else 0
            raise OffsetOutOfRangeError(
                f"offset {offset} is below the first retained offset {first} of channel {self.path!r} "
                "(its segment was deleted by retention or garbage collection); seek to the first offset or later"
            )
        i = bisect.bisect_right([r.base_offset for r in refs], offset) - 1
        end = refs[i + 1].base_offset if i + 1 < len(refs) else None
        return refs[i], end

    def next_segment(self, end_offset: int, remote: bool = False) -> SegmentRef | None:
        """The segment that starts at ``end_offset`` if it exists (one stat per file kind;
        with ``remote``, then a look in the tier-2 metadata: a reader's prefetch, never a
        writer's check)."""
        for z, path in ((True, self.compressed_path(end_offset)), (False, self.segment_path(end_offset))):
            if os.path.exists(path):
                return SegmentRef(end_offset, z, path)
        if remote and self.tier is not None:
            record = self.tier.metadata.segment_for(self.tier.name, end_offset)
            if record is not None and record.base_offset == end_offset:
                return self._remote_ref(record)
        return None

    @property
    def first_offset(self) -> int:
        refs = self.list_segments()
        return refs[0].base_offset if refs else 0

    def end_offset(self) -> int:
        """The next offset to be written, as the files show it now (no lock taken)."""
        refs = self.list_segments()
        if not refs:
            return 0
        last = refs[-1]
        if last.remote is not None:
            return last.remote.end_offset
        if last.compressed:
            return self.compressed_info(last).end_offset
        state = read_state(self.writer_lock.fd, self.writer_lock.path)
        try:
            size = os.path.getsize(last.path)
        except FileNotFoundError:
            return self.end_offset()
        if state is not None and state.segment_base == last.base_offset and state.segment_size == size:
            return state.end_offset
        idx = self.load_offset_index(last.base_offset, valid_end=size)
        offset, pos = idx.last()
        with os_errors("open segment", last.path):
            fd = os.open(last.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            scanner = FrameScanner(fd, last.path, pos, offset, MAX_FRAME_PAYLOAD)
            scanner.scan()
            return scanner.end_offset
        finally:
            os.close(fd)

    # -- indexes ---------------------------------------------------------------------------

    def load_offset_index(self, base_offset: int, valid_end: int | None = None) -> OffsetIndex:
        """The offset index of a raw segment as its file holds it; lookups check the entries
        they use against the frames (see :mod:`filechannel.engine.index`)."""
        return OffsetIndex.load(
            self.file(base_offset, names.OFFSET_INDEX_SUFFIX), base_offset, valid_end, segment_path=self.segment_path(base_offset)
        )

    def sealed_offset_index(self, ref: SegmentRef) -> OffsetIndex:
        """The offset index of a sealed raw segment (see :meth:`_sealed_indexes`)."""
        return self._sealed_indexes(ref)[0]

    def _sealed_indexes(self, ref: SegmentRef) -> tuple[OffsetIndex, TimeIndex]:
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
        try:
            fd = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return OffsetIndex(ref.base_offset, [], []), TimeIndex(ref.base_offset, [], [])
        except OSError as exc:
            raise storage_error(exc, "open segment", ref.path) from exc
        try:
            # One scan of the frames (in C) gives the entries a writer with our interval makes:
            # files that hold exactly those agree. Files made with another interval are checked
            # entry by entry; files that disagree are rebuilt.
            marks, _since, _max, _scanner = self._scan_marks(fd, ref.path, SEGMENT_HEADER_SIZE, ref.base_offset, 0, MIN_TIMESTAMP)
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
        finally:
            os.close(fd)
        with self._mutex:
            self._sealed_index[ref.base_offset] = (signature, idx, tix)
        return idx, tix

    def rebuild_index(self, ref: SegmentRef) -> list[IndexMark]:
        """Write a sealed raw segment's index files anew from its frames (they are derived
        data; a segment with a bad frame gets the entries before it); return the entries."""
        with os_errors("open segment", ref.path):
            fd = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            marks, _since, _max, _scanner = self._scan_marks(fd, ref.path, SEGMENT_HEADER_SIZE, ref.base_offset, 0, MIN_TIMESTAMP)
        finally:
            os.close(fd)
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

    def _scan_marks(
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
            tix = self._sealed_indexes(ref)[1]
            i = bisect.bisect_left(tix.max_before, timestamp) - 1
            return tix.offsets[i] if i >= 0 else ref.base_offset
        tix = TimeIndex.load(self.file(ref.base_offset, names.TIME_INDEX_SUFFIX), ref.base_offset)
        i = bisect.bisect_left(tix.max_before, timestamp) - 1
        if i < 0:
            return ref.base_offset
        idx = self.load_offset_index(ref.base_offset)
        try:
            fd = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return ref.base_offset
        except OSError as exc:
            raise storage_error(exc, "open segment", ref.path) from exc
        try:
            while i >= 0:
                if i < len(idx) and idx.offsets[i] == tix.offsets[i]:
                    start = (idx.offsets[i - 1], idx.positions[i - 1], tix.max_before[i - 1]) if i else idx.start
                    if entry_agrees(fd, ref.path, start, tix.offsets[i], idx.positions[i], tix.max_before[i]):
                        return tix.offsets[i]
                i -= 1
        finally:
            os.close(fd)
        return ref.base_offset

    def compressed_info(self, ref: SegmentRef) -> CompressedInfo:
        with self._mutex:
            info = self._z_info.get(ref.base_offset)
        if info is None:
            if ref.remote is not None:
                assert self.tier is not None
                info = self.tier.reader.info(ref.remote)
            else:
                seg = CompressedSegment.open(ref.path)
                info = seg.info
                seg.close()
            with self._mutex:
                self._z_info[ref.base_offset] = info
        return info

    # -- recovery (under writer.lock) ------------------------------------------------------

    def recover(self) -> WriterState:
        """Find where the log ends, trimming a torn tail; the caller holds ``writer.lock``.

        Only a writer recovers, the first time it takes the lock (see :meth:`current_state`):
        opening a channel to read changes nothing. Every frame of the active segment is
        checked from its first one, whatever its index says. After a restart of the
        machine (see :mod:`filechannel.engine.recovery_point`) the sealed raw segments from the
        recovery point on are checked too. Only a *torn tail* is cut: a partial or bad
        last frame with nothing valid after it anywhere in the log. Damage followed by
        valid data raises :class:`LogCorruptedError` and nothing is cut (see :meth:`repair`).
        """
        self.list_segments()  # the cached listing the writer uses from now on
        refs = self.local_segments()
        never = self.config.fsync == "never"
        rebooted = True
        if not refs:
            state = self._create_active(self.tier_end_offset(), 0, sync_dir=not never)
            self.list_segments()
        else:
            point = read_recovery_point(self._recovery_point_path)
            rebooted = point is None or not point.this_boot
            if rebooted:
                refs = self._check_sealed(refs, point.offset if point is not None else 0)
            last = refs[-1]
            if last.compressed:
                # The active segment is never compressed; a lost roll can leave a sealed one last.
                info = self.compressed_info(last)
                state = self._create_active(info.end_offset, info.segment_id + 1, sync_dir=not never)
                self.list_segments()
            else:
                state = self._recover_active(last, refs)
        self._recovered = True
        if rebooted:
            write_recovery_point(self._recovery_point_path, state.segment_base)
        return state

    def create_first_segment(self) -> None:
        """Create segment 0 of an empty folder, so readers have a segment to wait on; the
        caller holds ``writer.lock``. Does nothing if a writer made one meanwhile."""
        if not self.local_segments():
            base = self.tier_end_offset()
            self._create_active(base, 0, sync_dir=self.config.fsync != "never")
            write_recovery_point(self._recovery_point_path, base)
            self.list_segments()

    def _create_active(self, base_offset: int, segment_id: int, sync_dir: bool) -> WriterState:
        now = int(time.time() * 1000)
        fd = create_segment(self.segment_path(base_offset), SegmentHeader(segment_id, base_offset, now))
        os.close(fd)
        if sync_dir:
            fsync_dir(self.path)
        state = WriterState(base_offset, segment_id, SEGMENT_HEADER_SIZE, base_offset, 0, MIN_TIMESTAMP, now)
        write_state(self.writer_lock.fd, self.writer_lock.path, state)
        return state

    def _recover_active(self, last: SegmentRef, refs: list[SegmentRef]) -> WriterState:
        """Check every frame of the active segment; trim a torn tail, refuse corruption;
        rewrite its index files if they do not hold exactly the entries of its frames."""
        path = last.path
        with os_errors("open segment", path):
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            try:
                header = read_segment_header(fd, path, last.base_offset)
            except CorruptRecordError as exc:
                if size >= SEGMENT_HEADER_SIZE and find_valid_frame(fd, path, SEGMENT_HEADER_SIZE, size) is not None:
                    raise LogCorruptedError(f"{exc} (frames follow it: nothing was cut and appends are refused)") from exc
                # A crash between creating the file and writing its header (or a header block
                # the machine lost), and no record after it: a torn tail. Start it again.
                prev_id = self._segment_id(refs[-2]) if len(refs) > 1 else -1
                log.warning("segment %s has a torn header and no record (%d bytes); rewriting it", path, size)
                header = SegmentHeader(prev_id + 1, last.base_offset, int(time.time() * 1000))
                with os_errors("rewrite the header of", path):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, header.encode(), 0)
                size = SEGMENT_HEADER_SIZE
            marks, since, max_ts, scanner = self._scan_marks(fd, path, SEGMENT_HEADER_SIZE, last.base_offset, 0, MIN_TIMESTAMP)
            if scanner.stop != "end":
                after = find_valid_frame(fd, path, scanner.end_position + 1, size)
                if after is not None:
                    raise self._corruption(path, scanner.end_position, scanner.end_offset, after)
                log.warning(
                    "channel %s: trimmed a torn tail of %d bytes at byte %d of %s (offset %d); records before it are intact",
                    self.path,
                    size - scanner.end_position,
                    scanner.end_position,
                    path,
                    scanner.end_offset,
                )
                with os_errors("truncate", path):
                    os.ftruncate(fd, scanner.end_position)
                    if self.config.fsync != "never":
                        os.fsync(fd)
        finally:
            os.close(fd)
        idx_path = self.file(last.base_offset, names.OFFSET_INDEX_SUFFIX)
        tix_path = self.file(last.base_offset, names.TIME_INDEX_SUFFIX)
        if not index_bytes_match(idx_path, tix_path, last.base_offset, marks):
            rewrite_index_files(idx_path, tix_path, last.base_offset, marks)
            log.info("channel %s: rebuilt the index of the active segment %s (%d entries)", self.path, path, len(marks))
        state = WriterState(
            last.base_offset,
            header.segment_id,
            scanner.end_position,
            scanner.end_offset,
            since,
            max_ts,
            header.created_ms,
        )
        write_state(self.writer_lock.fd, self.writer_lock.path, state)
        return state

    def _corruption(self, path: str, position: int, offset: int, after: int) -> LogCorruptedError:
        """The error for a bad frame that valid data follows: damage, not a torn tail."""
        keep = offset - 1
        return LogCorruptedError(
            f"channel {self.path!r}: segment file {path!r} has a damaged frame at byte {position} (offset {offset}) "
            f"followed by valid data (a frame at byte {after}): not a torn tail, so nothing was cut and appends are "
            f"refused. Read or copy what you need, then run `filechannel repair {self.path} --after {keep}` "
            f"(or FileChannel.repair({keep})) to keep the records up to offset {keep} and delete every later one"
        )

    def _segment_id(self, ref: SegmentRef) -> int:
        if ref.compressed:
            return self.compressed_info(ref).segment_id
        with os_errors("open segment", ref.path):
            fd = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return read_segment_header(fd, ref.path, ref.base_offset).segment_id
        finally:
            os.close(fd)

    def current_state(self) -> WriterState:
        """The writer state, checked against the files; the caller holds ``writer.lock``.

        The first call of this process recovers (:meth:`recover`): that is where a writer
        checks the log before its first append. After it, it costs a read of the state and
        two stats when nothing changed behind our back.
        """
        if not self._recovered:
            return self.recover()
        state = read_state(self.writer_lock.fd, self.writer_lock.path)
        if state is not None:
            try:
                size = os.path.getsize(self.segment_path(state.segment_base))
            except FileNotFoundError:
                size = -1
            rolled = state.end_offset != state.segment_base and self.next_segment(state.end_offset) is not None
            if size == state.segment_size and not rolled:
                return state
        return self.recover()

    def repair(self, after_offset: int) -> WriterState:
        """Cut the log after ``after_offset``: keep every record up to it, delete every later
        one (the later segments, newest first, then the tail of the segment holding it);
        the caller holds ``writer.lock``. The operator's answer to :class:`LogCorruptedError`.

        Raises :class:`OffsetOutOfRangeError` if ``after_offset`` is below ``first_offset - 1``
        or at or past the end the frames allow (damage before it: nothing is cut), and
        :class:`CorruptRecordError` if it lies inside a compressed segment (cut at one of its ends).
        """
        refs = self.local_segments()
        end = after_offset + 1  # the next offset once repaired
        if not refs or end < refs[0].base_offset:
            first = refs[0].base_offset if refs else 0
            raise OffsetOutOfRangeError(
                f"cannot repair channel {self.path!r} after offset {after_offset}: its first offset is {first}"
            )
        i = bisect.bisect_right([r.base_offset for r in refs], end) - 1
        ref = refs[i]
        if ref.base_offset == end and i > 0:
            i, ref = i - 1, refs[i - 1]  # cut at the end of the segment before: no bytes to cut
        cut_at: int | None = None  # where to truncate refs[i]; None: it ends where it should
        if ref.compressed:
            info = self.compressed_info(ref)
            if end != info.end_offset:
                raise CorruptRecordError(
                    f"cannot repair channel {self.path!r} after offset {after_offset}: it lies inside the compressed "
                    f"segment {ref.path!r}; choose {ref.base_offset - 1} or {info.end_offset - 1}"
                )
        else:
            cut_at = self._position_of(ref, end, after_offset)
        later = refs[i + 1 :]
        log.warning(
            "channel %s: repair: keeping the records up to offset %d, deleting %d later segment(s)%s",
            self.path,
            after_offset,
            len(later),
            f" and cutting {ref.path} at byte {cut_at}" if cut_at is not None else "",
        )
        self._delete_segments(later)
        if cut_at is not None:
            with os_errors("truncate", ref.path):
                os.truncate(ref.path, cut_at)
            fsync_if_exists(ref.path)
        fsync_dir(self.path)
        point = read_recovery_point(self._recovery_point_path)
        if point is not None and point.this_boot and point.offset > ref.base_offset:
            write_recovery_point(self._recovery_point_path, ref.base_offset)  # its index files change
        self._recovered = False
        return self.recover()

    def _position_of(self, ref: SegmentRef, end: int, after_offset: int) -> int:
        """The byte where the frame of offset ``end`` starts in raw segment ``ref`` (its end
        if ``end`` is one past its last record); every frame before it must be valid."""
        with os_errors("open segment", ref.path):
            fd = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            read_segment_header(fd, ref.path, ref.base_offset)
            marks, _since, _max, scanner = self._scan_marks(fd, ref.path, SEGMENT_HEADER_SIZE, ref.base_offset, 0, MIN_TIMESTAMP)
            if end > scanner.end_offset:
                raise OffsetOutOfRangeError(
                    f"cannot repair channel {self.path!r} after offset {after_offset}: the valid frames of {ref.path!r} "
                    f"end at offset {scanner.end_offset} (byte {scanner.end_position}); records from there on cannot be "
                    f"numbered: choose an offset below {scanner.end_offset}"
                )
            k = bisect.bisect_right([m.offset for m in marks], end)
            offset, position = (marks[k - 1].offset, marks[k - 1].position) if k else (ref.base_offset, SEGMENT_HEADER_SIZE)
            limit = marks[k].position if k < len(marks) else scanner.end_position
            step = FrameScanner(fd, ref.path, position, offset, MAX_FRAME_PAYLOAD, limit=limit)
            frames, _s, _m = step.scan(1)  # a mark at every frame after the first
            starts = {offset: position, **{o: p for o, p, _t in frames}, step.end_offset: step.end_position}
            return starts[end]
        finally:
            os.close(fd)

    def _delete_segments(self, refs: list[SegmentRef]) -> None:
        """Delete these segments' files, newest first, so a crash midway leaves a shorter log."""
        for ref in reversed(refs):
            for suffix in (names.COMPRESSED_SUFFIX, names.SEGMENT_SUFFIX, names.OFFSET_INDEX_SUFFIX, names.TIME_INDEX_SUFFIX):
                unlink_if_exists(self.file(ref.base_offset, suffix))

    def roll(self, state: WriterState) -> WriterState:
        """Seal the active segment and start a new one at ``state.end_offset`` (under writer.lock).

        Nothing is fsynced here but, with ``fsync="always"``, the folder (so an acknowledged
        record's segment is never lost): :meth:`sync_sealed` does the rest in the background.
        """
        new = self._create_active(state.end_offset, state.segment_id + 1, sync_dir=self.config.fsync == "always")
        self.list_segments()
        return new

    # -- the recovery point ----------------------------------------------------------------

    def sync_sealed(self, upto: int) -> None:
        """fsync the sealed raw segments below ``upto`` not yet known to be on disk (their
        files and the folder), then move the recovery point to ``upto``. Needs no lock:
        sealed segments no longer change, and a concurrent older point only means more
        checking after a machine crash."""
        point = read_recovery_point(self._recovery_point_path)
        start = point.offset if point is not None and point.this_boot else 0
        if start >= upto:
            return
        for ref in self.local_segments():
            if start <= ref.base_offset < upto and not ref.compressed:  # compressed files were fsynced
                for suffix in (names.SEGMENT_SUFFIX, names.OFFSET_INDEX_SUFFIX, names.TIME_INDEX_SUFFIX):
                    fsync_if_exists(self.file(ref.base_offset, suffix))
        fsync_dir(self.path)
        point = read_recovery_point(self._recovery_point_path)
        if point is None or not point.this_boot or point.offset < upto:
            write_recovery_point(self._recovery_point_path, upto)

    def _check_sealed(self, refs: list[SegmentRef], start: int) -> list[SegmentRef]:
        """After a restart of the machine: check every frame of the sealed raw segments from
        ``start`` on. Returns the segments that remain.

        A power loss can lose any page written since the last fsync, in any file: a
        segment's last pages (it ends early, or in zeros), while a later segment's pages
        reached the disk. So a sealed segment that ends early is cut only if no later
        segment holds a record (then it is the log's torn tail); if one does, the lost
        records are a hole in the middle of the log, and a bad frame with valid frames after
        it is damage: both raise :class:`LogCorruptedError`, and nothing is cut.
        """
        for i, ref in enumerate(refs[:-1]):
            if ref.compressed or ref.base_offset < start:  # compressed files are fsynced when made
                continue
            torn_at = self._torn_at(ref, refs[i + 1].base_offset)
            if torn_at is None:
                continue
            holder = self._first_with_records(refs[i + 1 :])
            if holder is not None:
                raise LogCorruptedError(
                    f"channel {self.path!r}: sealed segment {ref.path!r} ends early, at byte {torn_at} (pages the machine "
                    f"lost?), but {holder.path!r} after it holds records: the records between are missing, so nothing was "
                    f"cut and appends are refused. Restore the segment from a copy, or run `filechannel repair {self.path} "
                    f"--after OFFSET` to keep the records up to OFFSET and delete every later one"
                )
            return self._cut_after(refs, i, torn_at)
        return refs

    def _torn_at(self, ref: SegmentRef, end_offset: int) -> int | None:
        """Where the valid frames of a sealed raw segment end if it does not hold exactly its
        records (0: not even its header); None if it is whole. Raises
        :class:`LogCorruptedError` if valid frames follow a bad one. Rebuilds index files
        that do not match a whole segment's frames."""
        with os_errors("open segment", ref.path):
            fd = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with os_errors("stat", ref.path):
                size = os.fstat(fd).st_size
            try:
                read_segment_header(fd, ref.path, ref.base_offset)
            except CorruptRecordError as exc:
                after = find_valid_frame(fd, ref.path, SEGMENT_HEADER_SIZE, size) if size > SEGMENT_HEADER_SIZE else None
                if after is not None:
                    raise LogCorruptedError(f"{exc} (frames follow it: nothing was cut and appends are refused)") from exc
                return 0
            scanner = FrameScanner(fd, ref.path, SEGMENT_HEADER_SIZE, ref.base_offset, MAX_FRAME_PAYLOAD)
            scanner.scan()
            if scanner.stop != "end":
                after = find_valid_frame(fd, ref.path, scanner.end_position + 1, size)
                if after is not None:
                    raise self._corruption(ref.path, scanner.end_position, scanner.end_offset, after)
        finally:
            os.close(fd)
        if scanner.end_offset > end_offset:
            raise LogCorruptedError(
                f"channel {self.path!r}: sealed segment {ref.path!r} holds records up to offset {scanner.end_offset - 1}, "
                f"past the next segment's base offset {end_offset}: nothing was cut and appends are refused; restore it "
                "from a copy, or cut the log with `filechannel repair`"
            )
        if scanner.stop != "end" or scanner.end_offset != end_offset or scanner.end_position != size:
            return scanner.end_position
        with self._mutex:
            self._sealed_index.pop(ref.base_offset, None)
        self._sealed_indexes(ref)  # checks the index files, rebuilds them if they disagree
        return None

    def _first_with_records(self, refs: list[SegmentRef]) -> SegmentRef | None:
        """The first of these segments that holds a valid record (a compressed one that
        cannot be read counts as holding some: nothing is cut on a doubt)."""
        for ref in refs:
            if ref.compressed:
                try:
                    info = self.compressed_info(ref)
                except CorruptRecordError:
                    return ref
                if info.end_offset > info.base_offset:
                    return ref
                continue
            with os_errors("open segment", ref.path):
                fd = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if find_valid_frame(fd, ref.path, SEGMENT_HEADER_SIZE) is not None:
                    return ref
            finally:
                os.close(fd)
        return None

    def _cut_after(self, refs: list[SegmentRef], i: int, torn_at: int) -> list[SegmentRef]:
        """Make ``refs[i]``, torn at byte ``torn_at`` with no record in any later segment, the
        last segment: delete every later segment, newest first, then cut it there (a crash
        midway leaves a shorter log, which the next open cuts again: the point has not moved)."""
        torn, later = refs[i], refs[i + 1 :]
        log.warning(
            "channel %s: sealed segment %s was torn by a crash of the machine at byte %d and no record follows it: "
            "cutting its torn tail and deleting the %d later segment(s) from offset %d on, which hold no record",
            self.path,
            torn.path,
            torn_at,
            len(later),
            later[0].base_offset,
        )
        self._delete_segments(later)
        with os_errors("truncate", torn.path):
            os.truncate(torn.path, torn_at)
        fsync_if_exists(torn.path)
        fsync_dir(self.path)
        self.list_segments()
        return self.local_segments()

    # -- maintenance (under maintenance.lock) ----------------------------------------------

    def finish_interrupted_compressions(self) -> None:
        """Roll back or finish compressions a dead process left behind."""
        with os_errors("list", self.path):
            files = os.listdir(self.path)
        for f in files:
            if f.endswith(names.COMPRESSED_SUFFIX + names.TEMP_SUFFIX):
                log.warning("channel %s: removing %s left by an interrupted compression", self.path, f)
                unlink_if_exists(os.path.join(self.path, f))
        for ref in self.local_segments():
            raw = self.segment_path(ref.base_offset)
            if ref.compressed and os.path.exists(raw):
                if _valid_compressed(ref.path):
                    log.warning("channel %s: finishing the interrupted compression of %s", self.path, raw)
                    self._remove_raw(ref.base_offset)
                else:
                    log.warning("channel %s: rolling back the interrupted compression of %s", self.path, raw)
                    unlink_if_exists(ref.path)
        self.list_segments()

    def compress_sealed(self) -> list[int]:
        """Compress every sealed raw segment; return their base offsets. Caller holds maintenance.lock."""
        if self.config.compression == "none":
            return []
        done = []
        refs = self.local_segments()
        for ref in refs[:-1]:
            if ref.compressed:
                continue
            out = ref.path + ".z" + names.TEMP_SUFFIX
            try:
                compress_segment(
                    ref.path,
                    out,
                    level=self.config.compression_level,
                    block_bytes=self.config.compression_block_bytes,
                    max_payload=MAX_FRAME_PAYLOAD,
                )
            except StorageError as exc:  # os_errors wraps the ENOENT of a segment collected meanwhile
                unlink_if_exists(out)
                if file_vanished(exc):
                    continue
                raise
            except CorruptRecordError as exc:
                unlink_if_exists(out)
                log.error("channel %s: not compressing %s: %s", self.path, ref.path, exc)
                continue
            if not os.path.exists(ref.path):  # collected while we compressed
                unlink_if_exists(out)
                continue
            with os_errors("rename", out):
                os.rename(out, self.compressed_path(ref.base_offset))
            fsync_dir(self.path)
            self._remove_raw(ref.base_offset)
            done.append(ref.base_offset)
        if done:
            self.list_segments()
        return done

    def _remove_raw(self, base_offset: int) -> None:
        for suffix in (names.SEGMENT_SUFFIX, names.OFFSET_INDEX_SUFFIX, names.TIME_INDEX_SUFFIX):
            unlink_if_exists(self.file(base_offset, suffix))
        fsync_dir(self.path)

    def segment_bytes_on_disk(self, ref: SegmentRef) -> int:
        try:
            return os.path.getsize(ref.path)
        except FileNotFoundError:
            return 0

    def segment_max_timestamp(self, ref: SegmentRef, end_offset: int) -> int:
        """The largest timestamp in a sealed segment (from its checked time index and a
        scan of the frames after its last entry)."""
        if ref.compressed:
            return self.compressed_info(ref).max_timestamp
        idx, tix = self._sealed_indexes(ref)
        offset, position, max_ts = (idx.offsets[-1], idx.positions[-1], tix.max_before[-1]) if len(idx) else idx.start
        with os_errors("open segment", ref.path):
            fd = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _marks, _since, max_ts = FrameScanner(fd, ref.path, position, offset, MAX_FRAME_PAYLOAD).scan(max_ts=max_ts)
        finally:
            os.close(fd)
        return max_ts

    def collect_garbage(self, hold: int | None) -> list[int]:
        """Delete the oldest sealed segments that every rule allows; return their base offsets.

        A sealed segment goes when all of its records lie below ``hold`` (the smallest
        durable reader position, None if there is none), or when retention says so.
        Only a prefix of the sealed segments is ever deleted. Caller holds maintenance.lock.
        With a tier it deletes nothing: the tiering daemon deletes, uploaded segments only.
        """
        if self.tier is not None:
            return []
        refs = self.local_segments()
        sealed = refs[:-1]
        if not sealed:
            return []
        ends = [r.base_offset for r in refs[1:]]
        k = 0
        if hold is not None:
            while k < len(sealed) and ends[k] <= hold:
                k += 1
        if self.config.retention_ms is not None:
            cutoff = int(time.time() * 1000) - self.config.retention_ms
            j = 0
            while j < len(sealed) and self.segment_max_timestamp(sealed[j], ends[j]) < cutoff:
                j += 1
            k = max(k, j)
        if self.config.retention_bytes is not None:
            sizes = [self.segment_bytes_on_disk(r) for r in refs]
            total = sum(sizes)
            j = 0
            while j < len(sealed) and total > self.config.retention_bytes:
                total -= sizes[j]
                j += 1
            k = max(k, j)
        return self.delete_sealed_prefix(ends[k - 1]) if k else []

    def delete_sealed_prefix(self, upto: int) -> list[int]:
        """Delete the sealed segments whose records all lie below ``upto``, oldest first (a crash
        midway leaves a shorter prefix, never a hole); never the active segment. Return their
        base offsets. Caller holds maintenance.lock."""
        refs = self.local_segments()  # local files only: with a tier, the listing also holds remote segments
        deleted = []
        for ref, end in zip(refs[:-1], [r.base_offset for r in refs[1:]], strict=True):
            if end > upto:
                break
            for suffix in (names.COMPRESSED_SUFFIX, names.SEGMENT_SUFFIX, names.OFFSET_INDEX_SUFFIX, names.TIME_INDEX_SUFFIX):
                unlink_if_exists(self.file(ref.base_offset, suffix))
            deleted.append(ref.base_offset)
        if deleted:
            fsync_dir(self.path)
            self.list_segments()
            log.info("channel %s: deleted %d sealed segment(s) below offset %d", self.path, len(deleted), upto)
        return deleted

    def close(self) -> None:
        self.writer_lock.close()
        self.maintenance_lock.close()


def _valid_compressed(path: str) -> bool:
    """Whether a ``.seg.z`` file is whole: its table checks out and its last block is all there."""
    try:
        with open(path, "rb") as f:
            head = f.read(Z_HEADER.size)
            if len(head) < Z_HEADER.size:
                return False
            size = os.fstat(f.fileno()).st_size
            length = table_length(head)
            if length > size:  # a damaged block count: never allocate what the file cannot hold
                return False
            f.seek(0)
            info = decode_table(f.read(length), path)
    except (OSError, CorruptRecordError):
        return False
    end = info.blocks[-1].file_position + info.blocks[-1].compressed_length if info.blocks else info.table_size
    return size == end
