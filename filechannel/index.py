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
"""

from __future__ import annotations

import bisect
import os
import struct

from .errors import os_errors
from .files import read_if_exists
from .record import OFFSET_ENTRY, TIME_ENTRY
from .segment import SEGMENT_HEADER_SIZE

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


def _read_entries(path: str, entry: struct.Struct) -> list[tuple[int, int]]:
    data = read_if_exists(path, "index") or b""
    whole = len(data) - len(data) % entry.size
    return list(entry.iter_unpack(data[:whole]))


class OffsetIndex:
    """The sparse offset index of one raw segment (see the module docstring)."""

    def __init__(self, base_offset: int, offsets: list[int], positions: list[int]) -> None:
        self.base_offset = base_offset
        self.offsets = offsets
        self.positions = positions

    @classmethod
    def load(cls, path: str, base_offset: int, valid_end: int | None = None) -> OffsetIndex:
        """Read ``path``, keeping only the increasing prefix of entries before ``valid_end``."""
        offsets: list[int] = []
        positions: list[int] = []
        last_off, last_pos = -1, SEGMENT_HEADER_SIZE - 1
        for rel, pos in _read_entries(path, OFFSET_ENTRY):
            if rel <= last_off or pos <= last_pos or (valid_end is not None and pos >= valid_end):
                break
            offsets.append(base_offset + rel)
            positions.append(pos)
            last_off, last_pos = rel, pos
        return cls(base_offset, offsets, positions)

    def lookup(self, offset: int) -> tuple[int, int]:
        """``(offset, position)`` of the last entry at or before ``offset`` (the segment start if none)."""
        i = bisect.bisect_right(self.offsets, offset) - 1
        if i < 0:
            return self.base_offset, SEGMENT_HEADER_SIZE
        return self.offsets[i], self.positions[i]

    def last(self) -> tuple[int, int]:
        """The last entry, or the segment start."""
        if not self.offsets:
            return self.base_offset, SEGMENT_HEADER_SIZE
        return self.offsets[-1], self.positions[-1]

    def __len__(self) -> int:
        return len(self.offsets)


class TimeIndex:
    """The sparse time index of one raw segment (see the module docstring)."""

    def __init__(self, base_offset: int, max_before: list[int], offsets: list[int]) -> None:
        self.base_offset = base_offset
        self.max_before = max_before
        self.offsets = offsets

    @classmethod
    def load(cls, path: str, base_offset: int, count: int | None = None) -> TimeIndex:
        """Read ``path``, keeping the non-decreasing prefix (at most ``count`` entries)."""
        max_before: list[int] = []
        offsets: list[int] = []
        last_ts, last_off = MIN_TIMESTAMP, -1
        for ts, rel in _read_entries(path, TIME_ENTRY):
            if ts < last_ts or rel <= last_off or (count is not None and len(offsets) >= count):
                break
            max_before.append(ts)
            offsets.append(base_offset + rel)
            last_ts, last_off = ts, rel
        return cls(base_offset, max_before, offsets)

    def lookup(self, timestamp: int) -> int:
        """The offset to scan from for the first record with timestamp >= ``timestamp``."""
        i = bisect.bisect_left(self.max_before, timestamp) - 1
        return self.base_offset if i < 0 else self.offsets[i]

    def __len__(self) -> int:
        return len(self.offsets)


def write_index_files(idx_path: str, tix_path: str, base_offset: int, marks: list[IndexMark]) -> None:
    """Write both index files whole (temp file, then rename), e.g. after a rebuild."""
    idx, tix = encode_marks(base_offset, marks)
    for path, data in ((idx_path, idx), (tix_path, tix)):
        tmp = path + ".tmp"
        with os_errors("write index", tmp):
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)


def truncate_index_files(idx_path: str, tix_path: str, count: int) -> None:
    """Cut both index files to their first ``count`` entries (dropping stale or torn ones)."""
    for path, entry in ((idx_path, OFFSET_ENTRY), (tix_path, TIME_ENTRY)):
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            continue
        if size != count * entry.size:
            with os_errors("truncate index", path):
                os.truncate(path, min(size, count * entry.size))
