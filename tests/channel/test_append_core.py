"""The per-message append in C (``AppendCore.append`` in filechannel/engine/_codec.c) against
``Appender._append``, the whole path in Python that it falls back to and mirrors.

The same records sent both ways, with limits small enough that rolls, index entries,
full buffers and drains happen every few records, must leave the same bytes on disk.
"""

import os
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filechannel import FileChannel
from filechannel.engine import appender
from filechannel.engine.names import OFFSET_INDEX_SUFFIX, SEGMENT_SUFFIX, TIME_INDEX_SUFFIX
from filechannel.engine.segment import SEGMENT_HEADER_SIZE
from filechannel.errors import MessageTooLargeError, RecordTypeError

needs_c = pytest.mark.skipif(
    appender.Appender.__base__ is object, reason="filechannel.engine._codec is not built (see test_codec.py)"
)

plain = st.tuples(st.binary(max_size=400), st.none(), st.none(), st.sampled_from([None, 5, 1_700_000_000_000]))
mixed = st.tuples(
    st.binary(max_size=400),
    st.none() | st.binary(max_size=20),
    st.none() | st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=10)), max_size=2),
    st.none() | st.integers(-(2**63), 2**63 - 1),
)


def _files(path: str) -> dict[str, bytes]:
    """Every segment (without its header, which holds its creation time) and index file."""
    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith((SEGMENT_SUFFIX, OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX)):
            with open(os.path.join(path, name), "rb") as f:
                data = f.read()
            out[name] = data[SEGMENT_HEADER_SIZE:] if name.endswith(SEGMENT_SUFFIX) else data
    return out


def _send_all(path: str, records, config: dict, python_path: bool) -> list[int]:
    with FileChannel(path, **config) as ch:
        sender = ch.sender()
        send = sender._appender._append if python_path else sender.send
        return [send(value, key=key, headers=headers, timestamp=ts) for value, key, headers, ts in records]


@needs_c
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(plain | mixed, max_size=120),
    buffer_bytes=st.integers(1, 3000),
    index_interval=st.integers(1, 2000),
)
def test_c_and_python_append_write_the_same_bytes(tmp_path_factory, records, buffer_bytes, index_interval):
    # Timestamps given explicitly (None means "now", which differs between the two runs).
    records = [(v, k, h, 7 if ts is None else ts) for v, k, h, ts in records]
    config = dict(
        segment_bytes=4096,
        buffer_bytes=buffer_bytes,
        index_interval_bytes=index_interval,
        flush_interval=60.0,
        maintenance_interval=0,
        compression="none",
    )
    root = tmp_path_factory.mktemp("append")
    c_offsets = _send_all(str(root / "c"), records, config, python_path=False)
    py_offsets = _send_all(str(root / "py"), records, config, python_path=True)
    assert c_offsets == py_offsets == list(range(len(records)))
    c_files = _files(str(root / "c"))
    assert any(name.endswith(SEGMENT_SUFFIX) for name in c_files)
    assert c_files == _files(str(root / "py"))


@needs_c
def test_c_append_stamps_the_current_time_and_reads_back(tmp_path):
    values = [os.urandom(i % 200) for i in range(20_000)]
    with FileChannel(str(tmp_path / "ch"), segment_bytes=65536, maintenance_interval=0) as ch:
        sender = ch.sender()
        send = sender.send
        before = int(time.time() * 1000)
        offsets = [send(v) for v in values]
        after = int(time.time() * 1000)
        sender.flush()  # recv_many returns what it sees: the tail may still be in the sender's buffer
        records = ch.receiver("earliest").recv_many(len(values), timeout=5)
    assert offsets == list(range(len(values)))
    assert [r.value for r in records] == values
    assert all(before <= r.timestamp <= after for r in records)


@needs_c
def test_c_append_leaves_errors_to_the_python_path(tmp_path):
    with FileChannel(str(tmp_path / "ch"), max_record_bytes=100, maintenance_interval=0) as ch:
        send = ch.sender().send
        send(b"first")  # the buffer is not empty: the next sends take the C path if they can
        with pytest.raises(MessageTooLargeError):
            send(b"x" * 200)
        with pytest.raises(TypeError):
            send(b"x", colour="red")  # type: ignore[call-arg]
        with pytest.raises(RecordTypeError, match="timestamp must be an int"):
            send(b"x", timestamp=1.5)  # type: ignore[arg-type]
        with pytest.raises(RecordTypeError, match="64 bits"):
            send(b"x", timestamp=2**63)
        assert send(b"x", timestamp=2**62) == 1
        assert send(bytearray(b"y")) == 2  # type: ignore[arg-type]  # not bytes: the Python path


@needs_c
def test_an_appender_locked_by_a_threading_lock_sends_through_python(tmp_path, monkeypatch):
    # The C path takes only the extension's Mutex; given any other lock it leaves every send to
    # Appender._append_stamped, which takes the lock itself.
    monkeypatch.setattr(appender, "_Mutex", threading.Lock)
    values = [os.urandom(i % 50) for i in range(2_000)]
    with FileChannel(str(tmp_path / "ch"), maintenance_interval=0) as ch:
        sender = ch.sender()
        assert type(sender.appender._mutex) is type(threading.Lock())
        assert [sender.send(v) for v in values] == list(range(len(values)))
        assert not sender.appender._mutex.locked()
        sender.flush()
        records = ch.receiver("earliest").recv_many(len(values), timeout=5)
    assert [r.value for r in records] == values
