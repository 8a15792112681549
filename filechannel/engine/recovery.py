"""Recovery of a channel folder: where its log ends, what a crash left torn, and the cuts
(:func:`repair`). Starting a segment, the first one or at a roll, is :mod:`.roll`'s.

Invariants:

- Recovery runs only in a writer, under ``writer.lock``, before its first append
  (:func:`current_state`): it never cuts a frame another process is still writing, and
  opening a channel to read writes nothing.
- It cuts only a *torn tail*: a partial or bad last frame with nothing valid after it
  anywhere in the log. Damage followed by valid data raises :class:`LogCorruptedError`,
  cuts nothing, and blocks appends until the operator's :func:`repair`.
- No index entry is trusted because it is in a file: the active segment is scanned from
  its first frame, and index files that disagree with the frames are rewritten.
- After a restart of the machine, the sealed raw segments from the recovery point on are
  checked too (:mod:`.recovery_point`); deletions go newest first, so a crash midway
  leaves a shorter log, never a hole.
- An empty folder of a tiered channel starts at the tier's end offset, never below
  what was uploaded.
"""

from __future__ import annotations

import bisect
import logging
import os
from typing import TYPE_CHECKING

from ..errors import (
    CorruptRecordError,
    LogCorruptedError,
    OffsetOutOfRangeError,
    os_errors,
)
from . import names
from .clock import now_ms
from .files import fsync_dir, fsync_if_exists, opened, unlink_if_exists
from .index import MIN_TIMESTAMP, index_bytes_match, rewrite_index_files
from .recovery_point import read_recovery_point, write_recovery_point
from .roll import start_segment
from .segment import (
    MAX_FRAME_PAYLOAD,
    SEGMENT_HEADER_SIZE,
    FrameScanner,
    SegmentHeader,
    find_valid_frame,
    read_segment_header,
)
from .writer_state import WriterState, read_state, write_state

if TYPE_CHECKING:
    from .log import Log, SegmentRef

logger = logging.getLogger("filechannel")


def recover(log: Log) -> WriterState:
    """Find where the log ends, trimming a torn tail; the caller holds ``writer.lock``.

    Only a writer recovers, the first time it takes the lock (see :func:`current_state`):
    opening a channel to read changes nothing. Every frame of the active segment is
    checked from its first one, whatever its index says. After a restart of the
    machine (see :mod:`filechannel.engine.recovery_point`) the sealed raw segments from the
    recovery point on are checked too. Only a *torn tail* is cut: a partial or bad
    last frame with nothing valid after it anywhere in the log. Damage followed by
    valid data raises :class:`LogCorruptedError` and nothing is cut (see :func:`repair`).
    """
    refs = log.refresh_local()  # local files only: recovery never waits on tier-2
    never = log.config.fsync == "never"
    rebooted = True
    if not refs:
        state = start_segment(log, log.tier_end_offset(), 0, sync_dir=not never)
        log.refresh_local()
    else:
        point = read_recovery_point(log.recovery_point_path)
        rebooted = point is None or not point.this_boot
        if rebooted:
            refs = _check_sealed(log, refs, point.offset if point is not None else 0)
        last = refs[-1]
        if last.compressed:
            # The active segment is never compressed; a lost roll can leave a sealed one last.
            info = log.compressed_info(last)
            state = start_segment(log, info.end_offset, info.segment_id + 1, sync_dir=not never)
            log.refresh_local()
        else:
            state = _recover_active(log, last, refs)
    log.recovered = True
    if rebooted:
        write_recovery_point(log.recovery_point_path, state.segment_base)
    return state


def _recover_active(log: Log, last: SegmentRef, refs: list[SegmentRef]) -> WriterState:
    """Check every frame of the active segment; trim a torn tail, refuse corruption;
    rewrite its index files if they do not hold exactly the entries of its frames."""
    path = last.path
    with opened(path, os.O_RDWR, action="open segment") as fd:
        size = os.fstat(fd).st_size
        try:
            header = read_segment_header(fd, path, last.base_offset)
        except CorruptRecordError as exc:
            if size >= SEGMENT_HEADER_SIZE and find_valid_frame(fd, path, SEGMENT_HEADER_SIZE, size) is not None:
                raise LogCorruptedError(f"{exc} (frames follow it: nothing was cut and appends are refused)") from exc
            # A crash between creating the file and writing its header (or a header block
            # the machine lost), and no record after it: a torn tail. Start it again.
            prev_id = _segment_id(log, refs[-2]) if len(refs) > 1 else -1
            logger.warning("segment %s has a torn header and no record (%d bytes); rewriting it", path, size)
            header = SegmentHeader(prev_id + 1, last.base_offset, now_ms())
            with os_errors("rewrite the header of", path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, header.encode(), 0)
            size = SEGMENT_HEADER_SIZE
        marks, since, max_ts, scanner = log.scan_marks(fd, path, SEGMENT_HEADER_SIZE, last.base_offset, 0, MIN_TIMESTAMP)
        if scanner.stop != "end":
            after = find_valid_frame(fd, path, scanner.end_position + 1, size)
            if after is not None:
                raise _corruption(log, path, scanner.end_position, scanner.end_offset, after)
            logger.warning(
                "channel %s: trimmed a torn tail of %d bytes at byte %d of %s (offset %d); records before it are intact",
                log.path,
                size - scanner.end_position,
                scanner.end_position,
                path,
                scanner.end_offset,
            )
            with os_errors("truncate", path):
                os.ftruncate(fd, scanner.end_position)
                if log.config.fsync != "never":
                    os.fsync(fd)
    idx_path = log.file(last.base_offset, names.OFFSET_INDEX_SUFFIX)
    tix_path = log.file(last.base_offset, names.TIME_INDEX_SUFFIX)
    if not index_bytes_match(idx_path, tix_path, last.base_offset, marks):
        rewrite_index_files(idx_path, tix_path, last.base_offset, marks)
        logger.info("channel %s: rebuilt the index of the active segment %s (%d entries)", log.path, path, len(marks))
    state = WriterState(
        last.base_offset,
        header.segment_id,
        scanner.end_position,
        scanner.end_offset,
        since,
        max_ts,
        header.created_ms,
    )
    write_state(log.writer_lock.fd, log.writer_lock.path, state)
    return state


def _corruption(log: Log, path: str, position: int, offset: int, after: int) -> LogCorruptedError:
    """The error for a bad frame that valid data follows: damage, not a torn tail."""
    keep = offset - 1
    return LogCorruptedError(
        f"channel {log.path!r}: segment file {path!r} has a damaged frame at byte {position} (offset {offset}) "
        f"followed by valid data (a frame at byte {after}): not a torn tail, so nothing was cut and appends are "
        f"refused. Read or copy what you need, then run `filechannel repair {log.path} --after {keep}` "
        f"(or FileChannel.repair({keep})) to keep the records up to offset {keep} and delete every later one"
    )


def _segment_id(log: Log, ref: SegmentRef) -> int:
    if ref.compressed:
        return log.compressed_info(ref).segment_id
    with opened(ref.path, os.O_RDONLY, action="open segment") as fd:
        return read_segment_header(fd, ref.path, ref.base_offset).segment_id


def current_state(log: Log) -> WriterState:
    """The writer state, checked against the files; the caller holds ``writer.lock``.

    The first call of this process recovers (:func:`recover`): that is where a writer
    checks the log before its first append. After it, it costs a read of the state and
    two stats when nothing changed behind our back.
    """
    if not log.recovered:
        return recover(log)
    state = read_state(log.writer_lock.fd, log.writer_lock.path)
    if state is not None:
        try:
            size = os.path.getsize(log.segment_path(state.segment_base))
        except FileNotFoundError:
            size = -1
        rolled = state.end_offset != state.segment_base and log.next_segment(state.end_offset) is not None
        if size == state.segment_size and not rolled:
            return state
    return recover(log)


def repair(log: Log, after_offset: int) -> WriterState:
    """Cut the log after ``after_offset``: keep every record up to it, delete every later
    one (the later segments, newest first, then the tail of the segment holding it);
    the caller holds ``writer.lock``. The operator's answer to :class:`LogCorruptedError`.

    Raises :class:`OffsetOutOfRangeError` if ``after_offset`` is below ``first_offset - 1``
    or at or past the end the frames allow (damage before it: nothing is cut), and
    :class:`CorruptRecordError` if it lies inside a compressed segment (cut at one of its ends).
    """
    refs = log.local_segments()
    end = after_offset + 1  # the next offset once repaired
    if not refs or end < refs[0].base_offset:
        first = refs[0].base_offset if refs else 0
        raise OffsetOutOfRangeError(
            f"cannot repair channel {log.path!r} after offset {after_offset}: its first offset is {first}"
        )
    i = bisect.bisect_right([r.base_offset for r in refs], end) - 1
    ref = refs[i]
    if ref.base_offset == end and i > 0:
        i, ref = i - 1, refs[i - 1]  # cut at the end of the segment before: no bytes to cut
    cut_at: int | None = None  # where to truncate refs[i]; None: it ends where it should
    if ref.compressed:
        info = log.compressed_info(ref)
        if end != info.end_offset:
            raise CorruptRecordError(
                f"cannot repair channel {log.path!r} after offset {after_offset}: it lies inside the compressed "
                f"segment {ref.path!r}; choose {ref.base_offset - 1} or {info.end_offset - 1}"
            )
    else:
        cut_at = _position_of(log, ref, end, after_offset)
    later = refs[i + 1 :]
    logger.warning(
        "channel %s: repair: keeping the records up to offset %d, deleting %d later segment(s)%s",
        log.path,
        after_offset,
        len(later),
        f" and cutting {ref.path} at byte {cut_at}" if cut_at is not None else "",
    )
    _delete_segments(log, later)
    if cut_at is not None:
        with os_errors("truncate", ref.path):
            os.truncate(ref.path, cut_at)
        fsync_if_exists(ref.path)
    fsync_dir(log.path)
    point = read_recovery_point(log.recovery_point_path)
    if point is not None and point.this_boot and point.offset > ref.base_offset:
        write_recovery_point(log.recovery_point_path, ref.base_offset)  # its index files change
    log.recovered = False
    return recover(log)


def _position_of(log: Log, ref: SegmentRef, end: int, after_offset: int) -> int:
    """The byte where the frame of offset ``end`` starts in raw segment ``ref`` (its end
    if ``end`` is one past its last record); every frame before it must be valid."""
    with opened(ref.path, os.O_RDONLY, action="open segment") as fd:
        read_segment_header(fd, ref.path, ref.base_offset)
        marks, _since, _max, scanner = log.scan_marks(fd, ref.path, SEGMENT_HEADER_SIZE, ref.base_offset, 0, MIN_TIMESTAMP)
        if end > scanner.end_offset:
            raise OffsetOutOfRangeError(
                f"cannot repair channel {log.path!r} after offset {after_offset}: the valid frames of {ref.path!r} "
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


def _delete_segments(log: Log, refs: list[SegmentRef]) -> None:
    """Delete these segments' files, newest first, so a crash midway leaves a shorter log."""
    for ref in reversed(refs):
        for suffix in (names.COMPRESSED_SUFFIX, names.SEGMENT_SUFFIX, names.OFFSET_INDEX_SUFFIX, names.TIME_INDEX_SUFFIX):
            unlink_if_exists(log.file(ref.base_offset, suffix))


def _check_sealed(log: Log, refs: list[SegmentRef], start: int) -> list[SegmentRef]:
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
        torn_at = _torn_at(log, ref, refs[i + 1].base_offset)
        if torn_at is None:
            continue
        holder = _first_with_records(log, refs[i + 1 :])
        if holder is not None:
            raise LogCorruptedError(
                f"channel {log.path!r}: sealed segment {ref.path!r} ends early, at byte {torn_at} (pages the machine "
                f"lost?), but {holder.path!r} after it holds records: the records between are missing, so nothing was "
                f"cut and appends are refused. Restore the segment from a copy, or run `filechannel repair {log.path} "
                f"--after OFFSET` to keep the records up to OFFSET and delete every later one"
            )
        return _cut_after(log, refs, i, torn_at)
    return refs


def _torn_at(log: Log, ref: SegmentRef, end_offset: int) -> int | None:
    """Where the valid frames of a sealed raw segment end if it does not hold exactly its
    records (0: not even its header); None if it is whole. Raises
    :class:`LogCorruptedError` if valid frames follow a bad one. Rebuilds index files
    that do not match a whole segment's frames."""
    with opened(ref.path, os.O_RDONLY, action="open segment") as fd:
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
                raise _corruption(log, ref.path, scanner.end_position, scanner.end_offset, after)
    if scanner.end_offset > end_offset:
        raise LogCorruptedError(
            f"channel {log.path!r}: sealed segment {ref.path!r} holds records up to offset {scanner.end_offset - 1}, "
            f"past the next segment's base offset {end_offset}: nothing was cut and appends are refused; restore it "
            "from a copy, or cut the log with `filechannel repair`"
        )
    if scanner.stop != "end" or scanner.end_offset != end_offset or scanner.end_position != size:
        return scanner.end_position
    log.forget_sealed_index(ref.base_offset)
    log.sealed_indexes(ref)  # checks the index files, rebuilds them if they disagree
    return None


def _first_with_records(log: Log, refs: list[SegmentRef]) -> SegmentRef | None:
    """The first of these segments that holds a valid record (a compressed one that
    cannot be read counts as holding some: nothing is cut on a doubt)."""
    for ref in refs:
        if ref.compressed:
            try:
                info = log.compressed_info(ref)
            except CorruptRecordError:
                return ref
            if info.end_offset > info.base_offset:
                return ref
            continue
        with opened(ref.path, os.O_RDONLY, action="open segment") as fd:
            if find_valid_frame(fd, ref.path, SEGMENT_HEADER_SIZE) is not None:
                return ref
    return None


def _cut_after(log: Log, refs: list[SegmentRef], i: int, torn_at: int) -> list[SegmentRef]:
    """Make ``refs[i]``, torn at byte ``torn_at`` with no record in any later segment, the
    last segment: delete every later segment, newest first, then cut it there (a crash
    midway leaves a shorter log, which the next open cuts again: the point has not moved)."""
    torn, later = refs[i], refs[i + 1 :]
    logger.warning(
        "channel %s: sealed segment %s was torn by a crash of the machine at byte %d and no record follows it: "
        "cutting its torn tail and deleting the %d later segment(s) from offset %d on, which hold no record",
        log.path,
        torn.path,
        torn_at,
        len(later),
        later[0].base_offset,
    )
    _delete_segments(log, later)
    with os_errors("truncate", torn.path):
        os.truncate(torn.path, torn_at)
    fsync_if_exists(torn.path)
    fsync_dir(log.path)
    log.refresh_local()
    return log.local_segments()
