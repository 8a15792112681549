"""Sparse indexes of a raw segment: offset -> byte position, and timestamp -> offset.

Both are derived data: an entry is added every ``index_interval_bytes`` of frames, at
the first frame past the interval, and the files can always be rebuilt from the segment.

``B.idx`` holds entries ``[u32 offset - B][u32 byte position]``: a lookup bisects to the
last entry at or before the wanted offset, then scans forward from that position.

``B.tix`` holds entries ``[i64 max timestamp before][u32 offset - B]``: the largest
timestamp of every record *before* that offset, so the entries never decrease even
when timestamps do. To find the first record with timestamp >= T, bisect to the last
entry whose max is < T (no record before it can qualify) and scan from there.

The start of the segment is an implicit entry of both (offset B, position 32, max -inf).

Nothing trusts an entry because it is in a file: a flipped or zeroed byte, a block a
power loss left stale, would otherwise make a reader start at the wrong place or number
records wrongly. An entry is used only once it *agrees with the frames*
(:func:`entry_agrees`): scanning the frames from the entry before it (or the segment
start) lands exactly on its position at its offset, with the right max timestamp, and a
valid frame starts there. A lookup that finds an entry that disagrees drops it and every
entry after it and falls back to the one before (or the segment start), which is always
right, only slower; ``damaged`` then says the files should be rebuilt.
"""

from __future__ import annotations

import bisect
import os
import struct

from ..errors import os_errors
from .files import opened, opened_if_exists, read_if_exists, write_atomically
from .record import FRAME_HEADER, FRAME_HEADER_SIZE, OFFSET_ENTRY, RECORD_PREFIX_SIZE, TIME_ENTRY
from .segment import SEGMENT_HEADER_SIZE, FrameScanner, frame_is_valid

MIN_TIMESTAMP = -(2**63)


class IndexMark:
    """One index entry as the writer produces it: written to both index files."""

    __slots__ = ("max_timestamp_before", "offset", "position")

    def __init__(self, offset: int, position: int, max_timestamp_before: int) -> None:
        self.offset = offset
        self.position = position
        self.max_timestamp_before = max_timestamp_before


def encode_marks(base_offset: int, marks: list[IndexMark]) -> tuple[bytes, bytes]:
    """The bytes to append to the ``.idx`` and ``.tix`` files for these marks."""
    idx = b"".join(OFFSET_ENTRY.pack(m.offset - base_offset, m.position) for m in marks)
    tix = b"".join(TIME_ENTRY.pack(m.max_timestamp_before, m.offset - base_offset) for m in marks)
    return idx, tix


def _read_entries(path: str, entry: struct.Struct) -> tuple[list[tuple[int, int]], bool]:
    """The whole entries of ``path`` and whether the file ends in a partial one."""
    data = read_if_exists(path, "index") or b""
    whole = len(data) - len(data) % entry.size
    return list(entry.iter_unpack(data[:whole])), whole != len(data)


def entry_agrees(
    fd: int,
    path: str,
    start: tuple[int, int, int],
    offset: int,
    position: int,
    max_before: int | None = None,
    max_payload: int = 0x7FFFFFFF,
) -> bool:
    """Whether an index entry agrees with the frames of the segment open as ``fd``.

    ``start`` is ``(offset, position, max timestamp before)`` of the entry before it (or
    the segment start): the frames from there must end exactly at ``position`` with
    ``offset`` records counted (and ``max_before`` the largest timestamp, if given), and a
    valid frame must start at ``position``. Reads about one index interval of frames.
    """
    scanner = FrameScanner(fd, path, start[1], start[0], max_payload, limit=position)
    _marks, _since, max_ts = scanner.scan(max_ts=start[2])
    if scanner.stop != "end" or scanner.end_position != position or scanner.end_offset != offset:
        return False
    if max_before is not None and max_ts != max_before:
        return False
    with os_errors("read", path):
        head = os.pread(fd, FRAME_HEADER_SIZE, position)
    if len(head) < FRAME_HEADER_SIZE:
        return False
    length = FRAME_HEADER.unpack(head)[0]
    if not RECORD_PREFIX_SIZE <= length <= max_payload:
        return False
    with os_errors("read", path):
        frame = os.pread(fd, FRAME_HEADER_SIZE + length, position)
    return len(frame) == FRAME_HEADER_SIZE + length and frame_is_valid(frame)


def index_agrees(fd: int, path: str, idx: OffsetIndex, tix: TimeIndex) -> bool:
    """Whether every entry of both index files agrees with the frames (checked in a chain
    from the segment start, each entry from the one before it: one read of the segment up
    to the last entry), and the files held nothing else."""
    if idx.damaged or tix.damaged or idx.offsets != tix.offsets:
        return False
    start = idx.start
    for offset, position, max_before in zip(idx.offsets, idx.positions, tix.max_before, strict=True):
        if not entry_agrees(fd, path, start, offset, position, max_before):
            return False
        start = (offset, position, max_before)
    return True


class OffsetIndex:
    """The sparse offset index of one raw segment (see the module docstring).

    With ``segment_path``, :meth:`lookup` and :meth:`last` return only entries that agree
    with the segment's frames (checked once each, then remembered); without it (an index
    just built from the frames) every entry is trusted. Thread-safe: a check that fails
    only lowers ``_usable``, an int, and one that passes adds to a set, so concurrent
    lookups never see the lists change.
    """

    def __init__(
        self, base_offset: int, offsets: list[int], positions: list[int], segment_path: str | None = None, damaged: bool = False
    ) -> None:
        self.base_offset = base_offset
        self.offsets = offsets
        self.positions = positions
        self.segment_path = segment_path
        self.damaged = damaged  # the file held entries that were dropped: rebuild it
        self._usable = len(offsets)  # entries from here on disagree with the frames
        self._agreeing: set[int] = set()  # entries found to agree with the frames

    @classmethod
    def load(cls, path: str, base_offset: int, valid_end: int | None = None, segment_path: str | None = None) -> OffsetIndex:
        """Read ``path``, keeping only the increasing prefix of entries before ``valid_end``."""
        offsets: list[int] = []
        positions: list[int] = []
        last_off, last_pos = -1, SEGMENT_HEADER_SIZE - 1
        entries, partial = _read_entries(path, OFFSET_ENTRY)
        for rel, pos in entries:
            if rel <= last_off or pos <= last_pos or (valid_end is not None and pos >= valid_end):
                break
            offsets.append(base_offset + rel)
            positions.append(pos)
            last_off, last_pos = rel, pos
        return cls(base_offset, offsets, positions, segment_path, damaged=partial or len(offsets) != len(entries))

    def lookup(self, offset: int) -> tuple[int, int]:
        """``(offset, position)`` of the last good entry at or before ``offset`` (the segment start if none)."""
        return self._good(bisect.bisect_right(self.offsets, offset, 0, self._usable) - 1)

    def last(self) -> tuple[int, int]:
        """The last good entry, or the segment start."""
        return self._good(self._usable - 1)

    def _good(self, i: int) -> tuple[int, int]:
        """Entry ``i`` if it agrees with the frames, else the last one before it that does."""
        while i >= 0 and self.segment_path is not None and i not in self._agreeing:
            agrees = self._agrees(i)
            if agrees is None:  # the segment is gone (compressed or collected)
                return self.base_offset, SEGMENT_HEADER_SIZE  # the caller's open file, read from its start
            if agrees:
                self._agreeing.add(i)
                break
            self.damaged = True
            self._usable = min(self._usable, i)
            i -= 1
        if i < 0:
            return self.base_offset, SEGMENT_HEADER_SIZE
        return self.offsets[i], self.positions[i]

    def _agrees(self, i: int) -> bool | None:
        """Whether entry ``i`` agrees with the frames; None if the segment is gone."""
        path = self.segment_path
        assert path is not None
        start = (self.offsets[i - 1], self.positions[i - 1], MIN_TIMESTAMP) if i else self.start
        with opened_if_exists(path, os.O_RDONLY, action="open segment") as fd:
            return None if fd is None else entry_agrees(fd, path, start, self.offsets[i], self.positions[i])

    @property
    def start(self) -> tuple[int, int, int]:
        """The implicit entry at the segment start: (offset, position, max timestamp before)."""
        return self.base_offset, SEGMENT_HEADER_SIZE, MIN_TIMESTAMP

    def __len__(self) -> int:
        return len(self.offsets)


class TimeIndex:
    """The sparse time index of one raw segment (see the module docstring)."""

    def __init__(self, base_offset: int, max_before: list[int], offsets: list[int]) -> None:
        self.base_offset = base_offset
        self.max_before = max_before
        self.offsets = offsets
        self.damaged = False  # the file held entries that were dropped: rebuild it

    @classmethod
    def load(cls, path: str, base_offset: int) -> TimeIndex:
        """Read ``path``, keeping the non-decreasing prefix of entries.

        Entries are not checked against the frames here: a sealed segment's are checked
        whole on first use, and an active segment's one by one as a lookup uses them
        (:meth:`filechannel.engine.log.Log.time_start`, with :func:`entry_agrees`).
        """
        max_before: list[int] = []
        offsets: list[int] = []
        last_ts, last_off = MIN_TIMESTAMP, -1
        entries, partial = _read_entries(path, TIME_ENTRY)
        for ts, rel in entries:
            if ts < last_ts or rel <= last_off:
                break
            max_before.append(ts)
            offsets.append(base_offset + rel)
            last_ts, last_off = ts, rel
        index = cls(base_offset, max_before, offsets)
        index.damaged = partial or len(offsets) != len(entries)
        return index

    def __len__(self) -> int:
        return len(self.offsets)


def index_bytes_match(idx_path: str, tix_path: str, base_offset: int, marks: list[IndexMark]) -> bool:
    """Whether both index files hold exactly the entries of ``marks`` (those of the frames)."""
    idx, tix = encode_marks(base_offset, marks)
    return read_if_exists(idx_path, "index") == idx and read_if_exists(tix_path, "index") == tix


def write_index_files(idx_path: str, tix_path: str, base_offset: int, marks: list[IndexMark]) -> None:
    """Write both index files of a sealed segment whole (:func:`files.write_atomically`: a
    temp file of this writer's own, as readers of several processes may rebuild the same
    index at once, then a rename), so a reader never sees a half-written file."""
    idx, tix = encode_marks(base_offset, marks)
    for path, data in ((idx_path, idx), (tix_path, tix)):
        write_atomically(path, data)


def rewrite_index_files(idx_path: str, tix_path: str, base_offset: int, marks: list[IndexMark]) -> None:
    """Rewrite both index files of the active segment in place (the appender keeps them
    open for appending; a rename would leave it writing to the old files). Only the holder
    of ``writer.lock`` calls this; a crash midway leaves entries that lookups reject."""
    idx, tix = encode_marks(base_offset, marks)
    for path, data in ((idx_path, idx), (tix_path, tix)):
        with os_errors("write index", path), opened(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as fd:
            os.write(fd, data)
