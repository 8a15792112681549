"""The record codec: what a frame's payload holds, and the batch encode/decode hot paths.

A frame on disk is ``[u32 length][u32 CRC-32C of payload][payload]`` (little-endian).
The payload of every frame is one record::

    u8   attributes   bit 0: a key follows, bit 1: headers follow, bit 2: no value (a tombstone)
    i64  timestamp    milliseconds since the epoch
    [u32 key length][key bytes]                          if bit 0
    [u16 count]{[u16 name length][name utf-8][u32 value length][value]}*  if bit 1
    value bytes       the rest of the payload

The offset is not stored: offsets are dense sequence numbers, so a record's
offset is its segment's base offset plus its position in the segment.

The batch functions here are the hot paths of send and receive; they avoid
per-record copies and calls where they can (the CRC of the shared record
prefix is computed once per batch, a value is sliced out of the read buffer
exactly once).
"""

from __future__ import annotations

import operator
import struct
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate, repeat
from operator import add
from typing import Any, NamedTuple, Protocol, SupportsIndex, TypeVar, cast

from ..errors import CorruptRecordError, MessageTooLargeError, RecordTypeError
from .checksum import crc32c


class _Codec(Protocol):
    """What this module and segment.py use of the C module (see _codec.pyi): ``_codec`` is it, or None."""

    def encode_batch(
        self,
        values: list[bytes],
        timestamp: int,
        index_interval: int,
        since_index: int,
        rel_start: int,
        pos0: int,
        max_before: int,
        /,
    ) -> tuple[list[bytes], bytes, bytes, int, int]: ...

    def shaped(
        self,
        record_type: type[T],
        template: tuple[object, ...],
        records: list[F],
        slots: tuple[int, ...],
        size_slots: tuple[int, ...] = ...,
        headers_type: type[list[Any]] | type[tuple[Any, ...]] | None = None,
        /,
    ) -> list[T]: ...

    def decode_plain(
        self,
        buf: bytes | bytearray | memoryview,
        pos: int,
        offset: int,
        max_records: int,
        out: list[Any],
        record_type: type[tuple[Any, ...]],
        template: tuple[object, ...],
        slots: tuple[int, int, int, int, int],
        /,
    ) -> tuple[int, int, int]: ...

    def decode_columns(
        self,
        buf: bytes | bytearray | memoryview,
        pos: int,
        offset: int,
        max_records: int,
        columns: list[bytearray],
        keep_from: int,
        keep_to: int,
        /,
    ) -> tuple[int, int, int]: ...
    def scan_frames(
        self,
        buf: bytes,
        pos: int,
        offset: int,
        max_payload: int,
        interval: int,
        since: int,
        max_ts: int,
        marks: list[tuple[int, int, int]],
        /,
    ) -> tuple[int, int, int, int, bool]: ...


_codec: _Codec | None
try:  # the two hot loops below in C (filechannel/engine/_codec.c), when it was built and loads
    from . import _codec
except ImportError:  # no compiler at install time, or no SSE4.2: the pure-Python loops
    _codec = None
NATIVE = _codec is not None  # whether the C codec loaded (filechannel.native_extensions())


FRAME_HEADER = struct.Struct("<II")
FRAME_HEADER_SIZE = FRAME_HEADER.size
RECORD_PREFIX = struct.Struct("<Bq")
RECORD_PREFIX_SIZE = RECORD_PREFIX.size
FRAME_AND_PREFIX = struct.Struct("<IIBq")
# A send_many batch stays in one segment: its frames may not pass 2 GiB, so that with a
# segment under 2 GiB (config.MAX_SEGMENT_BYTES) every byte position fits an index's u32.
MAX_BATCH_BYTES = 2**31
# Sparse index entries (see filechannel.engine.index): .idx [u32 offset - base][u32 position],
# .tix [i64 max timestamp before][u32 offset - base]. Here since the batch path makes them.
OFFSET_ENTRY = struct.Struct("<II")
TIME_ENTRY = struct.Struct("<qI")
_KEY_LEN = struct.Struct("<I")
_HEADER_COUNT = struct.Struct("<H")
_HEADER_NAME_LEN = struct.Struct("<H")
_HEADER_VALUE_LEN = struct.Struct("<I")

ATTR_KEY = 0x01
ATTR_HEADERS = 0x02
ATTR_NULL_VALUE = 0x04  # the value is absent (a tombstone), not empty: no value bytes follow
ATTR_KNOWN = ATTR_KEY | ATTR_HEADERS | ATTR_NULL_VALUE  # every bit a record may set (the resync scan looks for these)

Headers = Sequence[tuple[str, bytes]]
_NO_HEADERS: tuple[tuple[str, bytes], ...] = ()


class Record(NamedTuple):
    """One record as delivered by a receiver.

    ``headers`` is a sequence of ``(name, value)`` pairs, empty when the record has none.
    A named tuple: cheap to create on the read hot path, immutable, and unpacks like
    kafka-python's records.
    """

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None  # None: a tombstone (sent with value=None), distinct from b""
    headers: Headers = ()

    def __repr__(self) -> str:
        value = None if self.value is None else self.value[:32] + (b"..." if len(self.value) > 32 else b"")
        return (
            f"Record(offset={self.offset}, timestamp={self.timestamp}, key={self.key!r}, "
            f"value={value!r}, headers={list(self.headers)!r})"
        )


_new_record = tuple.__new__
T = TypeVar("T", bound=tuple[Any, ...])
F = TypeVar("F", bound=tuple[Any, ...])  # the fields shaped copies: a Record's, or any tuple of as many as ``slots`` names


class RecordLayout(NamedTuple):
    """The type records are decoded into: a reader can hand out its caller's records (a Kafka-like
    consumer's 13-field ``ConsumerRecord``) without making a :class:`Record` of each first.

    A plain record (no key, no headers: the hot path, in C) becomes ``record_type`` made of
    ``template`` with the offset, timestamp and value at ``slots[0:3]``, the value's length
    at ``slots[3]`` and a new empty list at ``slots[4]`` (-1: left out). Any other record is
    decoded as a :class:`Record` and passed, in a list, through ``convert`` (None: kept as
    it is), which must give the same as the plain path would for a plain record.
    """

    record_type: type[tuple[Any, ...]]
    template: tuple[Any, ...]
    slots: tuple[int, int, int, int, int]
    convert: Callable[[list[Record]], list[Any]] | None = None


RECORDS = RecordLayout(Record, (None, None, None, None, _NO_HEADERS), (0, 1, 3, -1, -1))


def _as_bytes(obj: object, what: str) -> bytes:
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    raise RecordTypeError(f"{what} must be bytes, bytearray or memoryview, not {type(obj).__name__}")


def encode_payload(value: bytes | None, key: bytes | None, headers: Headers | None, timestamp: int) -> bytes:
    """Encode one record's payload (the general form: key, headers, or an absent value).

    Raises :class:`RecordTypeError` for a value, key or header of the wrong type.
    """
    attrs = 0 if value is not None else ATTR_NULL_VALUE
    parts: list[bytes] = [b""]
    if key is not None:
        attrs |= ATTR_KEY
        key = _as_bytes(key, "key")
        parts.append(_KEY_LEN.pack(len(key)))
        parts.append(key)
    pairs = _header_pairs(headers)
    if pairs:
        attrs |= ATTR_HEADERS
        if len(pairs) > 0xFFFF:
            raise RecordTypeError(f"a record may carry at most 65535 headers, not {len(pairs)}")
        parts.append(_HEADER_COUNT.pack(len(pairs)))
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise RecordTypeError(f"each header must be a (str, bytes) pair, not {pair!r:.80}")
            name, hvalue = pair
            if not isinstance(name, str):
                raise RecordTypeError(f"header names must be str, not {type(name).__name__}")
            try:
                bname = name.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RecordTypeError(f"header name {name[:40]!r} is not valid Unicode text: {exc.reason}") from None
            if len(bname) > 0xFFFF:
                raise RecordTypeError(f"header name {name[:40]!r}... is longer than 65535 bytes")
            hvalue = _as_bytes(hvalue, f"header {name!r}")
            parts.append(_HEADER_NAME_LEN.pack(len(bname)))
            parts.append(bname)
            parts.append(_HEADER_VALUE_LEN.pack(len(hvalue)))
            parts.append(hvalue)
    parts[0] = RECORD_PREFIX.pack(attrs, timestamp)
    if value is not None:
        parts.append(_as_bytes(value, "value"))
    return b"".join(parts)


def _header_pairs(headers: object) -> Sequence[object]:
    """``headers`` as a sequence of what should be (name, value) pairs; empty for None."""
    if headers is None:
        return _NO_HEADERS
    if isinstance(headers, (list, tuple)):
        return headers
    if isinstance(headers, (str, bytes, bytearray, memoryview, Mapping)) or not isinstance(headers, Iterable):
        hint = " (for a dict d, pass list(d.items()))" if isinstance(headers, Mapping) else ""
        raise RecordTypeError(f"headers must be a list of (str, bytes) pairs, not {type(headers).__name__}{hint}")
    return list(headers)


def encode_frame(payload: bytes) -> bytes:
    """Wrap a payload in its frame header."""
    return FRAME_HEADER.pack(len(payload), crc32c(payload)) + payload


def encode_record_frames(
    out: list[bytes],
    value: bytes | None,
    key: bytes | None,
    headers: Headers | None,
    timestamp: int,
    max_record_bytes: int,
) -> int:
    """Append the frame of one record to ``out``; return the frame's size in bytes.

    Raises :class:`MessageTooLargeError` before touching ``out`` if the payload is too large.
    """
    if key is None and (headers is None or (type(headers) in (list, tuple) and not headers)) and type(value) is bytes:
        n = len(value) + RECORD_PREFIX_SIZE
        if n > max_record_bytes:
            raise too_large(n, max_record_bytes)
        prefix = RECORD_PREFIX.pack(0, timestamp)
        out.append(FRAME_AND_PREFIX.pack(n, crc32c(value, crc32c(prefix)), 0, timestamp))
        out.append(value)
        return n + FRAME_HEADER_SIZE
    payload = encode_payload(value, key, headers, timestamp)
    if len(payload) > max_record_bytes:
        raise too_large(len(payload), max_record_bytes)
    out.append(FRAME_HEADER.pack(len(payload), crc32c(payload)))
    out.append(payload)
    return len(payload) + FRAME_HEADER_SIZE


class Batch(NamedTuple):
    """What :func:`encode_value_frames` made of a batch, besides its frames."""

    records: int  # how many (not `count`, which would hide tuple.count)
    nbytes: int  # frame bytes
    idx: bytes  # entries to append to the .idx file
    tix: bytes  # entries to append to the .tix file
    since_index: int  # frame bytes since the last index entry, after the batch


def encode_value_frames(
    out: list[bytes],
    values: Iterable[bytes],
    timestamp: int,
    max_record_bytes: int,
    index_interval: int,
    since_index: int,
    rel_start: int,
    pos0: int,
    max_before: int,
) -> Batch:
    """Append frames of key-less, header-less records sharing one timestamp (the batch hot path).

    Every record is checked against ``max_record_bytes`` before anything is appended, so a
    too-large record rejects the whole batch. A record gets a sparse index entry when it
    starts ``index_interval`` bytes or more after the last one (made ``since_index`` bytes
    before the batch); ``rel_start`` is the first record's offset minus its segment's base,
    ``pos0`` its byte position in the segment, ``max_before`` the largest timestamp before it.
    """
    items = values if type(values) is list else _listed(values)
    if not items:
        return Batch(0, 0, b"", b"", since_index)
    if set(map(type, items)) != {bytes}:
        bad = next(v for v in items if type(v) is not bytes)
        raise RecordTypeError(f"values must be bytes, not {type(bad).__name__}")
    vals = cast(list[bytes], items)  # every item's type is bytes: checked just above
    longest = max(map(len, vals))
    if longest + RECORD_PREFIX_SIZE > max_record_bytes:
        raise too_large(longest + RECORD_PREFIX_SIZE, max_record_bytes)
    head = FRAME_AND_PREFIX.size
    # The exact sum only when the bound says it may matter: no second pass over a normal batch.
    if (longest + head) * len(vals) > MAX_BATCH_BYTES and sum(map(len, vals)) + head * len(vals) > MAX_BATCH_BYTES:
        raise MessageTooLargeError(
            f"a send_many batch of {len(vals)} records is more than {MAX_BATCH_BYTES} bytes of frames; send it in smaller batches"
        )
    args = (timestamp, index_interval, since_index, rel_start, pos0, max_before)
    heads, idx, tix, nbytes, since = _codec.encode_batch(vals, *args) if _codec is not None else encode_batch_py(vals, *args)
    frames: list[bytes] = [b""] * (2 * len(vals))
    frames[::2] = heads
    frames[1::2] = vals
    out.extend(frames)
    return Batch(len(vals), nbytes, idx, tix, since)


def _listed(values: Iterable[object]) -> list[object]:
    if isinstance(values, (str, bytes, bytearray, memoryview)):
        raise RecordTypeError(
            f"send_many takes an iterable of bytes values, not a single {type(values).__name__}; use send for one record"
        )
    try:
        it = iter(values)
    except TypeError:
        raise RecordTypeError(f"send_many takes an iterable of bytes values, not {type(values).__name__}") from None
    return list(it)


def encode_batch_py(
    vals: list[bytes], timestamp: int, index_interval: int, since_index: int, rel_start: int, pos0: int, max_before: int
) -> tuple[list[bytes], bytes, bytes, int, int]:
    """Frame heads and index entries of a batch: ``_codec.encode_batch`` in Python (its reference).

    map() over C functions for the heads; a loop per index entry, not per record.
    """
    lengths = list(map(len, vals))
    crcs = map(crc32c, vals, repeat(crc32c(RECORD_PREFIX.pack(0, timestamp))))
    sizes = map(add, lengths, repeat(RECORD_PREFIX_SIZE))
    heads = list(map(FRAME_AND_PREFIX.pack, sizes, crcs, repeat(0), repeat(timestamp)))
    # Record i starts at ends[i - 1] (0 for i = 0) bytes into the batch.
    ends = list(accumulate(map(add, lengths, repeat(FRAME_HEADER_SIZE + RECORD_PREFIX_SIZE))))
    idx, tix = [], []
    last_mark = -since_index
    max_after = max(max_before, timestamp)
    while True:
        target = last_mark + index_interval
        i = 0 if target <= 0 else bisect_left(ends, target) + 1
        if i >= len(vals):
            break
        last_mark = ends[i - 1] if i else 0
        idx.append(OFFSET_ENTRY.pack(rel_start + i, pos0 + last_mark))
        tix.append(TIME_ENTRY.pack(max_after if i else max_before, rel_start + i))
    return heads, b"".join(idx), b"".join(tix), ends[-1], ends[-1] - last_mark if idx else since_index + ends[-1]


def checked_timestamp(timestamp: SupportsIndex) -> int:
    """A record timestamp given by the caller, as an int, or RecordTypeError."""
    if type(timestamp) is bool:
        raise RecordTypeError("timestamp must be an int of milliseconds since the epoch, not bool")
    try:
        ts = operator.index(timestamp)
    except TypeError:
        raise RecordTypeError(
            f"timestamp must be an int of milliseconds since the epoch, not {type(timestamp).__name__}"
        ) from None
    if not -(2**63) <= ts < 2**63:
        raise RecordTypeError(f"timestamp {ts} does not fit in 64 bits (milliseconds since the epoch)")
    return ts


def too_large(size: int, limit: int) -> MessageTooLargeError:
    return MessageTooLargeError(
        f"record payload is {size} bytes, more than max_record_bytes={limit}; "
        "split the value or raise max_record_bytes when opening the channel"
    )


def decode_payload(payload: bytes | memoryview, offset: int) -> Record:
    """Decode one payload (the general form). Raises :class:`CorruptRecordError` if malformed."""
    attrs, timestamp = RECORD_PREFIX.unpack_from(payload, 0)
    if attrs & ~ATTR_KNOWN:
        raise CorruptRecordError(f"record at offset {offset} has unknown attribute bits {attrs:#x}")
    p = RECORD_PREFIX_SIZE
    key = None
    headers: Headers = _NO_HEADERS
    try:
        if attrs & ATTR_KEY:
            (klen,) = _KEY_LEN.unpack_from(payload, p)
            p += 4
            key = bytes(payload[p : p + klen])
            p += klen
        if attrs & ATTR_HEADERS:
            (count,) = _HEADER_COUNT.unpack_from(payload, p)
            p += 2
            hs = []
            for _ in range(count):
                (nlen,) = _HEADER_NAME_LEN.unpack_from(payload, p)
                p += 2
                name = bytes(payload[p : p + nlen]).decode("utf-8")
                p += nlen
                (vlen,) = _HEADER_VALUE_LEN.unpack_from(payload, p)
                p += 4
                hs.append((name, bytes(payload[p : p + vlen])))
                p += vlen
            headers = hs
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"record at offset {offset} is malformed: {exc}") from exc
    if p > len(payload):
        raise CorruptRecordError(f"record at offset {offset} is malformed: fields run past its payload")
    if attrs & ATTR_NULL_VALUE and p != len(payload):
        raise CorruptRecordError(f"record at offset {offset} is malformed: it has no value, yet {len(payload) - p} bytes follow")
    value = None if attrs & ATTR_NULL_VALUE else bytes(payload[p:])
    return _new_record(Record, (offset, timestamp, key, value, headers))


def decode_records(
    buf: bytes | bytearray | memoryview,
    pos: int,
    offset: int,
    max_records: int,
    out: list[Any],
    layout: RecordLayout = RECORDS,
) -> tuple[int, int]:
    """Decode whole, CRC-valid frames from ``buf`` starting at ``pos`` (the read hot path),
    appending them to ``out`` as ``layout`` says (:class:`Record` by default).

    Stops at ``max_records``, at the end of ``buf``, or before an incomplete frame.
    Returns ``(new position, records decoded)``. A frame whose CRC does not match raises
    :class:`CorruptRecordError` with the ``position`` attribute set to the frame's position
    in ``buf``, after the records before it were appended; the caller decides whether that
    is a torn tail or real corruption. With the C codec, plain records are decoded there and
    the others here, one at a time.
    """
    if _codec is None:
        return _decode_converted(buf, pos, offset, max_records, out, layout.convert)
    first = offset
    record_type, template, slots, convert = layout
    while True:
        pos, n, status = _codec.decode_plain(buf, pos, offset, max_records, out, record_type, template, slots)
        offset += n
        max_records -= n
        if status == 2:
            raise _crc_mismatch(pos, offset)
        if status == 0:
            return pos, offset - first
        pos, n = _decode_converted(buf, pos, offset, 1, out, convert)  # a record with key or headers
        offset += n
        max_records -= n
        if max_records == 0:
            return pos, offset - first


def _decode_converted(
    buf: bytes | bytearray | memoryview,
    pos: int,
    offset: int,
    max_records: int,
    out: list[Any],
    convert: Callable[[list[Record]], list[Any]] | None,
) -> tuple[int, int]:
    """:func:`decode_records_py`, its records passed through ``convert``, even those before a bad frame."""
    if convert is None:
        return decode_records_py(buf, pos, offset, max_records, out)
    records: list[Record] = []
    try:
        return decode_records_py(buf, pos, offset, max_records, records)
    finally:
        out.extend(convert(records))


def serialized_sizes(
    key: bytes | bytearray | memoryview | None, value: bytes | bytearray | memoryview | None, headers: Headers | None
) -> tuple[int, int, int]:
    """Kafka's serialized key, value and header sizes of a record: bytes, -1 for none."""
    hsize = sum(len(name.encode()) + (0 if v is None else len(v)) for name, v in headers) if headers else -1
    return (-1 if key is None else len(key), -1 if value is None else len(value), hsize)


def shaped(
    record_type: type[T],
    template: tuple[Any, ...],
    records: list[Record],
    slots: tuple[int, ...],
    size_slots: tuple[int, ...] = (),
    headers_type: type[list[Any]] | type[tuple[Any, ...]] | None = None,
) -> list[T]:
    """For each record, ``template`` as a ``record_type`` with the record's k-th field at
    ``slots[k]``: a consumer's records are a receiver's with their topic and partition and
    the imitated library's other fields around them, in that library's order (kafka-python
    puts ``leader_epoch`` before the offset). With ``size_slots``, Kafka's serialized key,
    value and header sizes (-1: none) go at those positions (-1: left out); with
    ``headers_type``, the headers as a new list (kafka-python's type) or a tuple (aiokafka's). In C when it is built
    (the Python loop took two thirds of a Kafka-like consumer's time at 100 B)."""
    if _codec is not None:
        return _codec.shaped(record_type, template, records, slots, size_slots, headers_type)
    return shaped_py(record_type, template, records, slots, size_slots, headers_type)


def shaped_py(
    record_type: type[T],
    template: tuple[Any, ...],
    records: list[F],
    slots: tuple[int, ...],
    size_slots: tuple[int, ...] = (),
    headers_type: type[list[Any]] | type[tuple[Any, ...]] | None = None,
) -> list[T]:
    """:func:`shaped` in Python: the reference the C version is tested against."""
    out = []
    for r in records:
        fields = list(template)
        for pos, item in zip(slots, r, strict=True):
            if pos >= 0:
                fields[pos] = item
        if headers_type is not None and slots[4] >= 0:
            fields[slots[4]] = headers_type(r[4])
        for pos, size in zip(size_slots, serialized_sizes(r[2], r[3], r[4]) if size_slots else (), strict=True):
            if pos >= 0:
                fields[pos] = size
        out.append(_new_record(record_type, tuple(fields)))
    return out


def decode_records_py(
    buf: bytes | bytearray | memoryview, pos: int, offset: int, max_records: int, out: list[Record]
) -> tuple[int, int]:
    """:func:`decode_records` in Python only: the reference the C codec is tested against."""
    end = len(buf)
    mv = memoryview(buf)
    unpack = FRAME_AND_PREFIX.unpack_from
    prefix = RECORD_PREFIX.pack
    append = out.append
    hsize = FRAME_HEADER_SIZE
    vstart = FRAME_HEADER_SIZE + RECORD_PREFIX_SIZE
    # Records of a batch share their timestamp: the CRC of the 9-byte prefix is computed
    # once per timestamp and the value's CRC continues from it (no per-record slice of it).
    last_ts: int | None = None
    prefix_crc = 0
    off, stop_at = offset, offset + max_records
    while off < stop_at and pos + vstart <= end:
        length, crc, attrs, ts = unpack(buf, pos)
        stop = pos + hsize + length
        if stop > end:
            break
        if attrs == 0 and length >= RECORD_PREFIX_SIZE:
            value = buf[pos + vstart : stop]
            if type(value) is not bytes:  # buf is a block read ahead (a memoryview)
                value = bytes(value)
            if ts != last_ts:
                last_ts, prefix_crc = ts, crc32c(prefix(0, ts))
            if crc32c(value, prefix_crc) != crc:
                raise _crc_mismatch(pos, off)
            append(_new_record(Record, (off, ts, None, value, _NO_HEADERS)))
        elif length < RECORD_PREFIX_SIZE or crc32c(mv[pos + hsize : stop]) != crc:
            raise _crc_mismatch(pos, off)
        else:
            append(decode_payload(mv[pos + hsize : stop], off))
        pos = stop
        off += 1
    return pos, off - offset


def _crc_mismatch(position: int, offset: int) -> CorruptRecordError:
    err = CorruptRecordError(f"CRC-32C mismatch in the frame of offset {offset}")
    err.position = position
    err.offset = offset
    return err
