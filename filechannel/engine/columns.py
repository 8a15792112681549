"""Records decoded into columns, for readers that hand records on in batches (Spark's source).

:class:`RecordColumns` holds the offsets, timestamps, keys and values of decoded records in
eight buffers laid out as Arrow lays out a record batch's columns (native byte order):

    offsets       int64 per record
    timestamps    int64 per record (milliseconds)
    key ends      int32 per record, after a leading 0: record i's key is keys[ends[i]:ends[i + 1]]
    keys          the keys' bytes, one after the other
    key validity  a bitmap, bit i set when record i has a key
    value ends, values, value validity   the same for the values (a tombstone's bit is clear)

Headers are not kept (a reader that wants them decodes records), nor records whose offsets
lie outside ``keep`` (a reader's range: they are checked and counted all the same). The C
codec appends each frame's fields to the buffers directly: no Python object per record,
where a ``Record`` and its ``bytes`` cost more than the rest of a Spark read of tier-2
(DESIGN.md, "Spark"). Invariant: the eight buffers always describe the same records, whole;
a decode that fails leaves them as they were before the frame that failed.
"""

from __future__ import annotations

import struct

from .record import Record, _codec, decode_records_py

_INT64 = struct.Struct("=q")
_INT32 = struct.Struct("=i")
EVERY_OFFSET = (-(2**63), 2**63 - 1)


class RecordColumns:
    """Decoded records as Arrow-shaped column buffers (see the module docstring); filled by
    :func:`decode_columns`, handed over whole by :meth:`take`."""

    __slots__ = ("buffers", "keep")

    def __init__(self) -> None:
        self.buffers = _empty()
        self.keep = EVERY_OFFSET  # [first, end): the offsets of the records kept

    def __len__(self) -> int:
        return len(self.buffers[0]) >> 3

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values held."""
        return len(self.buffers[3]) + len(self.buffers[6])

    def append(self, record: Record) -> None:
        """Add one decoded record (the path of records the C codec leaves to Python, and of
        every record without it)."""
        if not self.keep[0] <= record.offset < self.keep[1]:
            return
        b = self.buffers
        row = len(self)
        if row % 8 == 0:
            b[4].append(0)
            b[7].append(0)
        b[0] += _INT64.pack(record.offset)
        b[1] += _INT64.pack(record.timestamp)
        for valid, data, ends, field in ((4, 3, 2, record.key), (7, 6, 5, record.value)):
            if field is not None:
                b[data] += field
                b[valid][row >> 3] |= 1 << (row & 7)
            b[ends] += _INT32.pack(len(b[data]))

    def take(self) -> list[bytearray]:
        """The buffers, handed over (they are never written again: Arrow may wrap them without a
        copy); this object is empty after."""
        taken, self.buffers = self.buffers, _empty()
        return taken


def _empty() -> list[bytearray]:
    zero = bytes(_INT32.size)
    return [bytearray(), bytearray(), bytearray(zero), bytearray(), bytearray(), bytearray(zero), bytearray(), bytearray()]


def decode_columns(
    buf: bytes | bytearray | memoryview, pos: int, offset: int, max_records: int, out: RecordColumns
) -> tuple[int, int]:
    """:func:`~.record.decode_records` into columns: the whole, CRC-valid frames of ``buf`` from
    ``pos`` (records ``offset`` on, at most ``max_records``) appended to ``out``. Returns ``(new
    position, records decoded)``; a bad frame raises what ``decode_records`` raises for it, the
    records before it appended."""
    first = offset
    while True:
        if _codec is not None:
            pos, n, status = _codec.decode_columns(buf, pos, offset, max_records, out.buffers, *out.keep)
            offset += n
            max_records -= n
            if status == 0 or max_records <= 0:
                return pos, offset - first
        # Without the C codec every record, with it the one frame it left to Python: the CRC
        # mismatch or the malformed field is raised here, in the record decoder's words.
        records: list[Record] = []
        try:
            pos, n = decode_records_py(buf, pos, offset, max_records if _codec is None else 1, records)
        finally:  # the records before a bad frame too
            for r in records:
                out.append(r)
        offset += n
        max_records -= n
        if _codec is None or n == 0 or max_records <= 0:
            return pos, offset - first
