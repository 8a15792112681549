"""Where the log ends, as the last writer left it: the content of ``writer.lock``.

Layout (little-endian)::

    4s magic b"FCHW", u16 version, u16 reserved,
    u64 active segment base offset, u32 active segment id, u32 reserved,
    u64 active segment size in bytes, u64 end offset (the next offset to assign),
    u64 bytes since the last index entry, i64 max timestamp in the active segment,
    i64 active segment created (ms), u32 CRC-32C of the preceding bytes

It is a cache, not the truth: the holder of the writer lock checks it against the
active segment's size and the absence of a newer segment, and falls back to tail
recovery (a scan from the last index entry) when it does not match, e.g. after a
writer died between writing frames and updating this state.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import os_errors
from .checksum import crc32c

if TYPE_CHECKING:  # typed as built; the fallback base, object, adds nothing the dataclass does not declare
    from ._codec import StateCore as _Core
else:
    try:  # the counters as C integers, for the appender's C fast path (filechannel/engine/_codec.c)
        from ._codec import StateCore as _Core
    except ImportError:
        _Core = object

_MAGIC = b"FCHW"
_BODY = struct.Struct("<4sHHQIIQQQqq")
_CRC = struct.Struct("<I")
SIZE = _BODY.size + _CRC.size


@dataclass
class WriterState(_Core):
    segment_base: int
    segment_id: int
    segment_size: int
    end_offset: int
    since_index: int
    max_timestamp: int
    created_ms: int

    def encode(self) -> bytes:
        body = _BODY.pack(
            _MAGIC,
            1,
            0,
            self.segment_base,
            self.segment_id,
            0,
            self.segment_size,
            self.end_offset,
            self.since_index,
            self.max_timestamp,
            self.created_ms,
        )
        return body + _CRC.pack(crc32c(body))

    @classmethod
    def decode(cls, data: bytes) -> WriterState | None:
        """The state in ``data``, or None if it is missing, torn or of another version."""
        if len(data) < SIZE or data[:4] != _MAGIC:
            return None
        if crc32c(data[: _BODY.size]) != _CRC.unpack_from(data, _BODY.size)[0]:
            return None
        _m, version, _r, base, seg_id, _r2, size, end, since, max_ts, created = _BODY.unpack_from(data)
        if version != 1:
            return None
        return cls(base, seg_id, size, end, since, max_ts, created)


def read_state(fd: int, path: str) -> WriterState | None:
    with os_errors("read writer state", path):
        return WriterState.decode(os.pread(fd, SIZE, 0))


def write_state(fd: int, path: str, state: WriterState) -> None:
    with os_errors("write writer state", path):
        os.pwrite(fd, state.encode(), 0)
