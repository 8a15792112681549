"""The record codec: round trips, the batch hot paths, and rejection of bad input."""

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from filechannel.engine.record import (
    FRAME_HEADER,
    OFFSET_ENTRY,
    TIME_ENTRY,
    Record,
    decode_payload,
    decode_records,
    encode_frame,
    encode_payload,
    encode_record_frames,
    encode_value_frames,
)
from filechannel.errors import CorruptRecordError, MessageTooLargeError, RecordTypeError

keys = st.none() | st.binary(max_size=64)
headers = st.none() | st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=40)), max_size=5)
timestamps = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(value=st.binary(max_size=2000), key=keys, hdrs=headers, ts=timestamps, offset=st.integers(0, 2**40))
def test_payload_round_trip(value, key, hdrs, ts, offset):
    rec = decode_payload(encode_payload(value, key, hdrs, ts), offset)
    assert rec == Record(offset, ts, key, value, hdrs or ())


@given(records=st.lists(st.tuples(st.binary(max_size=300), keys, headers, timestamps), max_size=30), cut=st.integers(0, 10_000))
def test_frames_decode_in_order_and_stop_at_a_partial_frame(records, cut):
    out: list[bytes] = []
    sizes = [encode_record_frames(out, v, k, h, ts, 1 << 20) for v, k, h, ts in records]
    buf = b"".join(out)
    assert len(buf) == sum(sizes)
    decoded: list[Record] = []
    pos, n = decode_records(buf, 0, 7, len(records) + 1, decoded)
    assert (pos, n) == (len(buf), len(records))
    assert decoded == [Record(7 + i, ts, k, v, h or ()) for i, (v, k, h, ts) in enumerate(records)]
    # A buffer cut anywhere yields exactly the whole frames before the cut.
    cut = min(cut, len(buf))
    partial: list[Record] = []
    pos, n = decode_records(buf[:cut], 0, 7, 1 << 30, partial)
    whole = 0
    acc = 0
    for s in sizes:
        if acc + s > cut:
            break
        acc += s
        whole += 1
    assert (pos, n) == (acc, whole)


@given(
    values=st.lists(st.binary(max_size=500), max_size=200),
    ts=timestamps,
    interval=st.integers(1, 2000),
    since=st.integers(0, 3000),
    max_before=timestamps,
)
def test_value_batch_matches_single_encoding_and_indexes_every_interval(values, ts, interval, since, max_before):
    batch: list[bytes] = []
    got = encode_value_frames(batch, values, ts, 1 << 20, interval, since, 7, 1000, max_before)
    single: list[bytes] = []
    for v in values:
        encode_record_frames(single, v, None, None, ts, 1 << 20)
    assert b"".join(batch) == b"".join(single)
    assert (got.records, got.nbytes) == (len(values), len(b"".join(single)))
    # A record starts a new index entry once `interval` bytes passed since the last.
    idx, tix, pos = [], [], 0
    for i, v in enumerate(values):
        if since >= interval:
            idx.append(OFFSET_ENTRY.pack(7 + i, 1000 + pos))
            tix.append(TIME_ENTRY.pack(max_before if i == 0 else max(max_before, ts), 7 + i))
            since = 0
        size = len(v) + 17
        pos += size
        since += size
    assert (got.idx, got.tix) == (b"".join(idx), b"".join(tix))
    assert got.since_index == since


def test_too_large_record_is_rejected_before_anything_is_buffered():
    out: list[bytes] = []
    with pytest.raises(MessageTooLargeError, match="max_record_bytes=100"):
        encode_record_frames(out, b"x" * 100, None, None, 0, 100)
    with pytest.raises(MessageTooLargeError):
        encode_value_frames(out, [b"ok", b"x" * 200], 0, 100, 4096, 0, 0, 32, 0)
    assert out == []


@pytest.mark.parametrize(
    "value,key,hdrs",
    [("text", None, None), (b"v", "key", None), (b"v", None, [(b"name", b"v")]), (b"v", None, [("n", "not bytes")])],
)
def test_wrong_types_are_rejected(value, key, hdrs):
    with pytest.raises(RecordTypeError):
        encode_record_frames([], value, key, hdrs, 0, 1 << 20)


def test_bytearray_and_memoryview_values_are_accepted():
    out: list[bytes] = []
    encode_record_frames(out, bytearray(b"abc"), memoryview(b"k"), None, 5, 1 << 20)  # type: ignore[arg-type]
    got: list[Record] = []
    decode_records(b"".join(out), 0, 0, 10, got)
    assert (got[0].value, got[0].key) == (b"abc", b"k")


def test_crc_mismatch_is_reported_with_its_position_and_offset():
    good = encode_frame(encode_payload(b"a", None, None, 1))
    bad = bytearray(encode_frame(encode_payload(b"b", None, None, 2)))
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError) as info:
        decode_records(good + bytes(bad), 0, 10, 10, [])
    assert info.value.position == len(good)
    assert info.value.offset == 11


def test_frame_header_is_length_then_crc32c_little_endian():
    payload = encode_payload(b"hello", None, None, 1234)
    frame = encode_frame(payload)
    assert frame[:8] == struct.pack("<II", len(payload), crc32c(payload))
    assert FRAME_HEADER.unpack_from(frame) == (len(payload), crc32c(payload))
    assert payload[:9] == struct.pack("<Bq", 0, 1234)


def test_unknown_attribute_bits_are_corruption():
    payload = bytearray(encode_payload(b"x", None, None, 0))
    payload[0] = 0x80
    with pytest.raises(CorruptRecordError, match="unknown attribute"):
        decode_payload(bytes(payload), 3)
