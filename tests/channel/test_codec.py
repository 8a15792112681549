"""The C codec (filechannel/_codec.c) against the pure-Python reference in record.py.

Both run in every test run: the C loops through ``decode_records``/``encode_value_frames``,
the Python ones called directly. They must agree on every byte, record, position and
error, including on torn and corrupted buffers.
"""

import platform

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filechannel import record
from filechannel.errors import CorruptRecordError
from filechannel.record import Record, decode_records, decode_records_py, encode_batch_py, encode_record_frames

keys = st.none() | st.binary(max_size=40)
headers = st.none() | st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=20)), max_size=3)
timestamps = st.integers(min_value=-(2**63), max_value=2**63 - 1)
plain_heavy = st.tuples(st.binary(max_size=300), keys, headers, timestamps) | st.tuples(
    st.binary(max_size=300), st.none(), st.none(), st.sampled_from([0, 1_700_000_000_000])
)


def test_the_c_codec_is_built_and_used_on_x86_64():
    with open("/proc/cpuinfo") as f:
        sse42 = " sse4_2" in f.read()
    if platform.machine() == "x86_64" and sse42:
        assert record._codec is not None, "filechannel._codec did not build or load: reinstall with a C compiler"
    else:
        assert record._codec is None


def _decode(fn, buf, max_records):
    out: list[Record] = []
    try:
        pos, n = fn(buf, 0, 1000, max_records, out)
    except CorruptRecordError as exc:
        return ("corrupt", exc.position, exc.offset, out)  # type: ignore[attr-defined]
    return ("ok", pos, n, out)


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(plain_heavy, max_size=40),
    cut=st.integers(0, 20_000),
    flip=st.none() | st.tuples(st.integers(0, 20_000), st.integers(1, 255)),
    max_records=st.integers(1, 50),
)
def test_c_and_python_decode_agree_on_whole_torn_and_corrupted_buffers(records, cut, flip, max_records):
    frames: list[bytes] = []
    for value, key, hdrs, ts in records:
        encode_record_frames(frames, value, key, hdrs, ts, 1 << 20)
    data = bytearray(b"".join(frames)[:cut])
    if flip is not None and data:
        data[flip[0] % len(data)] ^= flip[1]
    buf = bytes(data)
    c, py = _decode(decode_records, buf, max_records), _decode(decode_records_py, buf, max_records)
    assert c == py
    assert all(type(r) is Record for r in c[3])


# Off x86-64 there is no C codec to compare (the first test checks which case this is).
needs_c = pytest.mark.skipif(record._codec is None, reason="no C codec on this CPU")


@needs_c
@given(
    values=st.lists(st.binary(max_size=2000), max_size=50),
    ts=timestamps,
    interval=st.integers(1, 5000),
    since=st.integers(0, 6000),
    rel_start=st.integers(0, 2**31),
    pos0=st.integers(32, 2**31),
    max_before=timestamps,
)
def test_c_and_python_batch_heads_and_index_entries_agree(values, ts, interval, since, rel_start, pos0, max_before):
    args = (ts, interval, since, rel_start, pos0, max_before)
    c = record._codec.encode_batch(values, *args)
    if values:
        assert c == encode_batch_py(values, *args)
    else:
        assert c == ([], b"", b"", 0, since)


@needs_c
def test_c_codec_rejects_bad_input():
    with pytest.raises(TypeError, match="values must be bytes, not str"):
        record._codec.encode_batch([b"ok", "text"], 0, 4096, 0, 0, 32, 0)
    with pytest.raises(OverflowError, match="over 4 GiB"):
        record._codec.encode_batch([b"x"], 0, 1, 1, 2**32, 32, 0)
    with pytest.raises(TypeError):
        record._codec.decode_plain(bytearray(b"x" * 40), 0, 0, 1, [], Record, ())
