"""The C codec (filechannel/engine/_codec.c) against the pure-Python reference in record.py.

Both run in every test run: the C loops through ``decode_records``/``encode_value_frames``,
the Python ones called directly. They must agree on every byte, record, position and
error, including on torn and corrupted buffers.
"""

import gc
import os
import platform
import random
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple
from unittest.mock import patch

import pytest
from crc32c import crc32c as crc32c_package
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filechannel.client.records import AIOKAFKA_RECORDS, KAFKA_PYTHON_RECORDS
from filechannel.engine import record, segment
from filechannel.engine.record import Record, decode_records, decode_records_py, encode_batch_py, encode_record_frames
from filechannel.engine.segment import scan_frames_py
from filechannel.errors import CorruptRecordError

if TYPE_CHECKING:  # the C module's own types (_codec.pyi): these tests call more of it than record.py's _Codec names
    from filechannel.engine import _codec as native
else:
    native = record._codec  # None where it is not built: the tests that use it are marked needs_c
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
        assert record._codec is not None, "filechannel.engine._codec did not build or load: reinstall with a C compiler"
    else:
        assert record._codec is None


def _frames(records) -> bytes:
    frames: list[bytes] = []
    for value, key, hdrs, ts in records:
        encode_record_frames(frames, value, key, hdrs, ts, 1 << 20)
    return b"".join(frames)


def _damaged(data: bytes, cut: int, flip) -> bytes:
    buf = bytearray(data[:cut])
    if flip is not None and buf:
        buf[flip[0] % len(buf)] ^= flip[1]
    return bytes(buf)


# Frames of random records, cut short and with a byte flipped or not: whole, torn, corrupted.
damaged_frames = st.builds(
    lambda records, cut, flip: _damaged(_frames(records), cut, flip),
    st.lists(plain_heavy, max_size=40),
    st.integers(0, 20_000),
    st.none() | st.tuples(st.integers(0, 20_000), st.integers(1, 255)),
)


def _decode(fn, buf, max_records):
    out: list[Record] = []
    try:
        pos, n = fn(buf, 0, 1000, max_records, out)
    except CorruptRecordError as exc:
        return ("corrupt", exc.position, exc.offset, out)
    return ("ok", pos, n, out)


@settings(max_examples=300, deadline=None)
@given(
    buf=damaged_frames,
    max_records=st.integers(1, 50),
)
def test_c_and_python_decode_agree_on_whole_torn_and_corrupted_buffers(buf, max_records):
    c, py = _decode(decode_records, buf, max_records), _decode(decode_records_py, buf, max_records)
    assert c == py
    assert all(type(r) is Record for r in c[3])
    # Blocks of compressed segments come as memoryviews; values still come out as bytes.
    for decode in (decode_records, decode_records_py):
        from_view = _decode(decode, memoryview(buf), max_records)
        assert from_view == c
        assert all(type(r.value) is bytes and type(r.key) in (bytes, type(None)) for r in from_view[3])
        assert all(type(v) is bytes for r in from_view[3] for _k, v in r.headers)


@pytest.fixture(params=["fold", "no fold"])
def crc_fold(request):
    """Both ways C computes a long buffer's CRC: folded (AVX-512 VPCLMULQDQ, where the CPU has
    it) and three interleaved crc32 streams (every other x86-64 CPU)."""
    if record._codec is None:
        yield request.param
        return
    fold = request.param == "fold"
    before = native.set_fold(fold)
    try:
        if fold and not native.set_fold(fold):  # set_fold answers the setting it replaces
            with open("/proc/cpuinfo") as f:
                flags = f.read()
            if " vpclmulqdq" in flags and " avx512f" in flags:
                pytest.fail("this CPU has AVX-512F and VPCLMULQDQ, yet the C codec does not fold")
        yield request.param
    finally:
        native.set_fold(before)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(900, 70_000), min_size=1, max_size=4),
    flip=st.none() | st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
    cut=st.integers(0, 64),
)
def test_long_values_copied_while_their_crc_is_checked_agree_with_python(crc_fold, sizes, flip, cut):
    # From 1 KiB on, C copies a value into its bytes in the same pass that checks its CRC
    # (folded, or three interleaved streams, then a tail): a flipped byte anywhere in it, or in
    # its frame's head, is found at the same frame as Python finds it, and whole values are exact.
    frames: list[bytes] = []
    for i, size in enumerate(sizes):
        encode_record_frames(frames, random.Random(i).randbytes(size), None, None, 7, 1 << 20)
    whole = b"".join(frames)
    buf = _damaged(whole, len(whole) - cut, None if flip is None else (int(flip[0] * len(whole)), flip[1]))
    c, py = _decode(decode_records, buf, 10), _decode(decode_records_py, buf, 10)
    assert c == py
    if flip is None and cut == 0:
        assert c[0] == "ok" and [len(r.value) for r in c[3]] == sizes


@settings(max_examples=200, deadline=None)
@given(buf=damaged_frames, max_records=st.integers(1, 50), shape=st.sampled_from([KAFKA_PYTHON_RECORDS, AIOKAFKA_RECORDS]))
def test_decoding_into_a_client_layout_equals_decoding_records_then_shaping_them(buf, max_records, shape):
    # What a consumer's receiver hands out, decoded straight into kafka-python's or aiokafka's
    # record, is what building those from Records gives: fields, types, sizes, new headers lists,
    # the records before a bad frame, the error; with the C codec and without it.
    layout = shape.layout("topic", 7)
    status, pos, n, records = _decode(decode_records, buf, max_records)
    expected = (status, pos, n, shape.build("topic", 7, records))
    for codec in (record._codec, None):
        with patch.object(record, "_codec", codec):
            got = _decode(partial(decode_records, layout=layout), buf, max_records)
        assert got == expected
        assert all(type(r) is shape.record_type for r in got[3])
        headers = [r.headers for r in got[3]]
        assert all(type(h) is shape.headers_type for h in headers)
        assert len({id(h) for h in headers if type(h) is list}) == sum(type(h) is list for h in headers)


# Off x86-64 there is no C codec to compare (the first test checks which case this is).
needs_c = pytest.mark.skipif(record._codec is None, reason="no C codec on this CPU")


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=6000) | st.integers(0, 70_000).map(lambda n: random.Random(n).randbytes(n)),
    start=st.integers(0, 63),
    previous=st.integers(0, 2**32 - 1),
)
def test_c_crc32c_equals_the_crc32c_package_folded_or_not(data, start, previous):
    # Every length (the fold takes whole 256-byte rounds from 512 bytes on, a tail follows),
    # every alignment of the start, every state to continue from.
    view = memoryview(data)[start:]
    want = crc32c_package(view, previous)
    for fold in (True, False):
        before = native.set_fold(fold)
        try:
            assert native.crc32c(view, previous) == want
        finally:
            native.set_fold(before)


@needs_c
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(st.binary(max_size=2000), max_size=50),
    ts=timestamps,
    interval=st.integers(1, 5000),
    since=st.integers(0, 6000),
    rel_start=st.integers(0, 2**31),
    pos0=st.integers(32, 2**31),
    max_before=timestamps,
)
def test_c_and_python_batch_heads_and_index_entries_agree(crc_fold, values, ts, interval, since, rel_start, pos0, max_before):
    args = (ts, interval, since, rel_start, pos0, max_before)
    c = native.encode_batch(values, *args)
    if values:
        assert c == encode_batch_py(values, *args)
    else:
        assert c == ([], b"", b"", 0, since)


@needs_c
def test_c_codec_rejects_bad_input():
    with pytest.raises(TypeError, match="values must be bytes, not str"):
        native.encode_batch([b"ok", "text"], 0, 4096, 0, 0, 32, 0)  # type: ignore[list-item]
    with pytest.raises(OverflowError, match="over 4 GiB"):
        native.encode_batch([b"x"], 0, 1, 1, 2**32, 32, 0)
    plain = (*record.RECORDS[:3],)
    with pytest.raises(TypeError):
        native.decode_plain("x" * 40, 0, 0, 1, [], *plain)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pos must be >= 0"):
        native.decode_plain(b"x" * 40, -1, 0, 1, [], *plain)
    with pytest.raises(ValueError, match="outside the template"):
        native.decode_plain(b"x" * 40, 0, 0, 1, [], Record, (None,) * 5, (0, 1, 5, -1, -1))
    with pytest.raises(ValueError, match="positions of the offset, timestamp and value"):
        native.decode_plain(b"x" * 40, 0, 0, 1, [], Record, (None,) * 5, (0, -1, 3, -1, -1))
    with pytest.raises(ValueError, match="at most 5 positions"):
        native.decode_plain(b"x" * 40, 0, 0, 1, [], Record, (None,) * 5, (0, 1, 3, -1, -1, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tuple subclass"):
        native.decode_plain(b"x" * 40, 0, 0, 1, [], list, (None,) * 5, (0, 1, 3, -1, -1))  # type: ignore[arg-type]
    # Each slot is written once into a record left empty there: two fields in one slot
    # would leak the first.
    with pytest.raises(ValueError, match="position 1 is given twice"):
        native.decode_plain(b"x" * 40, 0, 0, 1, [], Record, (None,) * 5, (0, 1, 3, 1, -1))
    with pytest.raises(ValueError, match="template: at most 32 items"):
        native.decode_plain(b"x" * 40, 0, 0, 1, [], Record, (None,) * 33, (0, 1, 3, -1, -1))


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    buf=damaged_frames,
    max_payload=st.integers(9, 400),
    interval=st.integers(1, 3000),
    since=st.integers(0, 4000),
    max_ts=timestamps,
)
def test_c_and_python_frame_scans_agree(buf, max_payload, interval, since, max_ts):
    args = (buf, 32, 1000, max_payload, interval, since, max_ts)
    c_marks: list = []
    py_marks: list = []
    assert native.scan_frames(*args, c_marks) == scan_frames_py(*args, py_marks)
    assert c_marks == py_marks


@settings(max_examples=150, deadline=None)
@given(
    data=damaged_frames,
    chunk=st.integers(8, 700),
)
def test_scanning_a_file_in_chunks_matches_one_scan_of_it_all(tmp_path_factory, data, chunk):
    # Small read chunks make frames straddle reads and outgrow them.
    path = tmp_path_factory.mktemp("scan") / "f"
    path.write_bytes(b"h" * 32 + data)
    marks: list = []
    p, end_offset, since, max_ts, invalid = scan_frames_py(data, 32, 0, 1 << 20, 500, 0, -(2**63), marks)
    fd = os.open(path, os.O_RDONLY)
    try:
        with patch.object(segment, "_SCAN_CHUNK", chunk):
            scanner = segment.FrameScanner(fd, str(path), 32, 0, 1 << 20)
            assert scanner.scan(500) == (marks, since, max_ts)
    finally:
        os.close(fd)
    assert (scanner.end_position, scanner.end_offset) == (32 + p, end_offset)
    assert scanner.stop == ("invalid" if invalid else "end" if p == len(data) else "incomplete")


@needs_c
@pytest.mark.parametrize("size", [0, 1, 7, 8, 1007, 1008, 1009, 2015, 2016, 2017, 3030, 65_539])
def test_c_crc_of_long_values_matches_the_crc32c_package(size):
    # The C CRC runs long values in rounds of three interleaved blocks of 336 bytes and joins
    # them; sizes around one and two rounds, and many rounds, against the reference.
    value = random.Random(size).randbytes(size)
    heads, *_ = native.encode_batch([value], 12345, 1 << 30, 0, 0, 32, 0)
    assert heads == encode_batch_py([value], 12345, 1 << 30, 0, 0, 32, 0)[0]


records_of_two_fields = st.lists(st.tuples(st.integers(), st.none() | st.binary(max_size=8)))


@needs_c
@given(
    records_of_two_fields,
    st.tuples(st.text(max_size=5), st.integers(min_value=0, max_value=99)),
    st.permutations([0, 1, 2, 3]).map(lambda p: tuple(p[:2])),
)
def test_c_and_python_shaped_records_agree(records, prefix, slots):
    class Tagged(tuple):
        pass

    template = (*prefix, None, None)
    c = native.shaped(Tagged, template, records, slots)
    assert c == record.shaped_py(Tagged, template, records, slots)
    assert all(type(t) is Tagged for t in c)


@needs_c
def test_c_shaped_rejects_what_does_not_fit():
    with pytest.raises(TypeError, match="tuple subclass"):
        native.shaped(list, ("t", 0, None, None), [(1, 2)], (2, 3))  # type: ignore[type-var]
    with pytest.raises(TypeError, match="records must be tuples of 2 fields, not list"):
        native.shaped(tuple, ("t", 0, None, None), [(1, 2), [3, 4]], (2, 3))  # type: ignore[type-var]
    with pytest.raises(TypeError, match="records must be tuples of 2 fields"):
        native.shaped(tuple, ("t", 0, None, None), [(1, 2, 3)], (2, 3))
    with pytest.raises(ValueError, match="outside the template"):
        native.shaped(tuple, ("t", 0, None, None), [(1, 2)], (2, 4))
    with pytest.raises(TypeError, match="headers_type must be list, tuple or None"):
        native.shaped(tuple, (None,) * 5, [(1, 2, None, b"", ())], (0, 1, 2, 3, 4), (), dict)  # type: ignore[arg-type]


class Tagged(tuple):
    """A tuple subclass with an instance ``__dict__`` (made by ``tp_alloc``)."""


class Named(NamedTuple):
    """A tuple's layout (made untracked, tracked only when it may cycle)."""

    a: Any
    b: Any
    c: Any
    d: Any
    e: Any
    f: Any
    g: Any


@needs_c
@pytest.mark.parametrize("Tagged", [Tagged, Named])
def test_decoded_and_shaped_records_are_left_out_of_cycle_collection_only_when_they_cannot_cycle(Tagged):
    # A million new records per second each set off collections that walk every tracked
    # young object; records of ints, bytes, None and () cannot be part of a cycle.
    frames: list[bytes] = []
    for i in range(3):
        encode_record_frames(frames, b"value-%d" % i, None, None, 5, 1 << 20)
    buf = b"".join(frames)
    out: list = []
    decode_records(buf, 0, 0, 10, out)
    assert [r.value for r in out] == [b"value-0", b"value-1", b"value-2"]
    assert not any(gc.is_tracked(r) for r in out)
    layout = record.RecordLayout(Tagged, ("topic", 3, None, None, None, None, None), (2, 3, 5, 6, 4))
    direct: list = []
    decode_records(buf, 0, 0, 10, direct, layout)
    assert [(r[2], r[5], r[6], r[4]) for r in direct] == [(i, b"value-%d" % i, 7, []) for i in range(3)]
    assert not any(gc.is_tracked(r) or gc.is_tracked(r[4]) for r in direct)

    template, slots = ("topic", 3, None, None, None, None, None), (2, 3, 4, 5, 6)
    plain = native.shaped(Tagged, template, out, slots)
    assert plain == record.shaped_py(Tagged, template, out, slots)
    assert not any(gc.is_tracked(t) for t in plain)

    # A tracked object inside (in the prefix or a record) keeps the tuple tracked, so a
    # cycle through it is still found and freed.
    class Holder:
        me: tuple[Any, ...]

    holder = Holder()
    direct = []
    decode_records(buf, 0, 0, 10, direct, layout._replace(template=(holder, *layout.template[1:])))
    assert all(gc.is_tracked(r) for r in direct)
    del direct
    looped = native.shaped(Tagged, (holder, None, None, None, None, None, None), out[:1], (1, 2, 3, 4, 5))[0]
    assert gc.is_tracked(looped)
    holder.me = looped
    ref = weakref.ref(holder)
    del holder, looped
    gc.collect()
    assert ref() is None
    assert all(gc.is_tracked(t) for t in native.shaped(Tagged, ("t", None, None), [(1, [2])], (1, 2)))
