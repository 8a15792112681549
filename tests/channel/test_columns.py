"""Records decoded into Arrow-shaped columns (filechannel/engine/columns.py and the C codec's
``decode_columns``) against the reference: the Python decoder's records, appended one by one.

They must agree on every buffer, position and error, on whole, torn and corrupted buffers and on
frames whose CRC is right but whose fields are not (which the C code leaves to Python).
"""

import struct
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filechannel.engine import columns
from filechannel.engine.columns import EVERY_OFFSET, RecordColumns, decode_columns
from filechannel.engine.record import Record, decode_records_py, encode_frame, encode_payload
from filechannel.errors import CorruptRecordError

from .test_codec import damaged_frames, needs_c, plain_heavy


def _reference(buf, max_records, keep=EVERY_OFFSET):
    records: list[Record] = []
    result: tuple[Any, ...]
    try:
        result = ("ok", *decode_records_py(buf, 0, 1000, max_records, records))
    except CorruptRecordError as exc:
        result = ("corrupt", str(exc), getattr(exc, "position", None))
    out = RecordColumns()
    for r in records:
        if keep[0] <= r.offset < keep[1]:
            out.append(r)
    return result, out.buffers


def _columns(buf, max_records, out=None, keep=EVERY_OFFSET):
    out = RecordColumns() if out is None else out
    out.keep = keep
    result: tuple[Any, ...]
    try:
        result = ("ok", *decode_columns(buf, 0, 1000, max_records, out))
    except CorruptRecordError as exc:
        result = ("corrupt", str(exc), getattr(exc, "position", None))
    return result, out.buffers


def _python_only():
    return patch.object(columns, "_codec", None)


@settings(max_examples=300, deadline=None)
@given(
    buf=damaged_frames,
    max_records=st.integers(1, 50),
    keep=st.just(EVERY_OFFSET) | st.tuples(st.integers(995, 1030), st.integers(995, 1030)),
)
def test_columns_agree_with_records_on_whole_torn_and_corrupted_buffers(buf, max_records, keep):
    """Records outside ``keep`` (a reader's range) are decoded, checked and counted, not kept."""
    expected = _reference(buf, max_records, keep)
    assert _columns(buf, max_records, keep=keep) == expected
    assert _columns(memoryview(buf), max_records, keep=keep) == expected
    with _python_only():
        assert _columns(buf, max_records, keep=keep) == expected


# Payloads of random bytes after a valid attributes byte or any byte, in frames with a right
# CRC: keys, headers and tombstones whose lengths run past the payload, unknown attribute bits,
# header names that are not UTF-8. The C code decodes none of those itself.
_prefix = st.builds(lambda attrs, ts: struct.pack("<Bq", attrs, ts), st.integers(0, 255) | st.integers(0, 7), st.integers(-5, 5))
_odd_payloads = st.builds(lambda p, rest: p + rest, _prefix, st.binary(max_size=40)) | st.binary(max_size=12)
_payloads = st.lists(st.builds(lambda r: encode_payload(r[0], r[1], r[2], r[3]), plain_heavy) | _odd_payloads, max_size=12)


@settings(max_examples=400, deadline=None)
@given(payloads=_payloads, max_records=st.integers(1, 20))
def test_frames_with_a_right_crc_and_wrong_fields_raise_what_the_record_decoder_raises(payloads, max_records):
    buf = b"".join(encode_frame(p) for p in payloads)
    expected = _reference(buf, max_records)
    assert _columns(buf, max_records) == expected
    with _python_only():
        assert _columns(buf, max_records) == expected


def test_a_header_name_that_is_not_utf8_is_the_record_decoders_error():
    good = encode_payload(b"v", None, [("h", b"x")], 7)
    bad = good.replace(b"\x01\x00h", b"\x01\x00\xff")  # the name's length, then a byte that is not UTF-8
    assert bad != good
    buf = encode_frame(good) + encode_frame(bad)
    out = RecordColumns()
    with pytest.raises(CorruptRecordError, match=r"offset 1001 is malformed"):
        decode_columns(buf, 0, 1000, 10, out)
    assert len(out) == 1  # the record before it


@settings(max_examples=100, deadline=None)
@given(records=st.lists(plain_heavy, max_size=30), cuts=st.lists(st.integers(1, 8), max_size=6))
def test_columns_filled_in_several_calls_equal_one_call(records, cuts):
    frames = [encode_frame(encode_payload(r[0], r[1], r[2], r[3])) for r in records]
    buf = b"".join(frames)
    out, pos, offset = RecordColumns(), 0, 1000
    for n in [*cuts, len(records)]:
        pos, got = decode_columns(buf, pos, offset, n, out)
        offset += got
    assert offset - 1000 == len(records) == len(out)
    assert out.buffers == _reference(buf, len(records) + 1)[1]


def test_the_columns_hold_offsets_timestamps_keys_values_and_their_validity():
    buf = b"".join(
        encode_frame(encode_payload(value, key, headers, ts))
        for value, key, headers, ts in [(b"a", None, None, 5), (None, b"k", [("h", b"v")], 6), (b"", b"", None, -1)]
    )
    out = RecordColumns()
    assert decode_columns(buf, 0, 40, 10, out) == (len(buf), 3)
    assert out.nbytes == 2
    offsets, timestamps, key_ends, keys, key_valid, value_ends, values, value_valid = out.take()
    assert list(memoryview(offsets).cast("q")) == [40, 41, 42]
    assert list(memoryview(timestamps).cast("q")) == [5, 6, -1]
    assert list(memoryview(key_ends).cast("i")) == [0, 0, 1, 1] and keys == b"k"
    assert list(memoryview(value_ends).cast("i")) == [0, 1, 1, 1] and values == b"a"
    assert key_valid == bytes([0b110]) and value_valid == bytes([0b101])  # no key; a tombstone
    assert len(out) == 0 and out.nbytes == 0  # taken


@needs_c
def test_the_c_decoder_refuses_columns_it_cannot_append_to_and_leaves_them_as_they_were():
    from filechannel.engine import _codec

    buf = encode_frame(encode_payload(b"v", None, None, 1))
    with pytest.raises(ValueError, match="a list of 8 bytearrays"):
        _codec.decode_columns(buf, 0, 0, 1, [bytearray()] * 7, *EVERY_OFFSET)
    with pytest.raises(TypeError, match="a list of 8 bytearrays"):
        _codec.decode_columns(buf, 0, 0, 1, [b""] * 8, *EVERY_OFFSET)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="different row counts"):
        _codec.decode_columns(buf, 0, 0, 1, [bytearray()] * 8, *EVERY_OFFSET)  # the ends lack their leading 0
    out = RecordColumns()
    decode_columns(buf, 0, 0, 1, out)
    before = [bytes(b) for b in out.buffers]
    held = memoryview(out.buffers[6])  # an export (Arrow's, say): the buffer cannot grow
    with pytest.raises(BufferError):
        decode_columns(buf, 0, 1, 1, out)
    held.release()
    assert [bytes(b) for b in out.buffers] == before
