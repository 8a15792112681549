"""The writer under bad input and failures (issue 17, "the writer and the locks").

- A send rejected for its arguments must not leave ``writer.lock`` held: another process
  (and another ``FileChannel`` of this process) then writes at once.
- So must a send whose roll fails.
- A failure of the background flusher reaches the log as an error.
- Settings: non-finite or out-of-range values, and bools for numbers, raise ConfigError.
- Bad producer input raises FileChannelError subclasses, never a raw Python error.
"""

import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from filechannel import ChannelConfig, FileChannel
from filechannel.errors import ConfigError, DiskFullError, FileChannelError, MessageTooLargeError, RecordTypeError

PROCS = Path(__file__).parent / "procs"
LIMIT = 1024  # max_record_bytes of the channels below
DEADLINE = 20  # seconds another process gets to open the channel and send


def _raising_values():
    yield b"fine"
    raise KeyError("the caller's own iterable failed")


# Each rejected the same way through send / send_many, whichever path (C or Python) takes it.
REJECTED = {
    "str value": (lambda s: s.send("text"), RecordTypeError),
    "int value": (lambda s: s.send(5), RecordTypeError),
    "str key": (lambda s: s.send(b"v", key="k"), RecordTypeError),
    "int key": (lambda s: s.send(b"v", key=5), RecordTypeError),
    "headers a str": (lambda s: s.send(b"v", headers="name"), RecordTypeError),
    "headers an int": (lambda s: s.send(b"v", headers=3), RecordTypeError),
    "headers a dict": (lambda s: s.send(b"v", headers={"name": b"v"}), RecordTypeError),
    "header not a pair": (lambda s: s.send(b"v", headers=[("name",)]), RecordTypeError),
    "header name bytes": (lambda s: s.send(b"v", headers=[(b"name", b"v")]), RecordTypeError),
    "header value str": (lambda s: s.send(b"v", headers=[("name", "v")]), RecordTypeError),
    "header name not encodable": (lambda s: s.send(b"v", headers=[("\ud800", b"v")]), RecordTypeError),
    "value too large": (lambda s: s.send(b"x" * (LIMIT + 1)), MessageTooLargeError),
    "key makes it too large": (lambda s: s.send(b"v", key=b"k" * LIMIT), MessageTooLargeError),
    "timestamp 2**63": (lambda s: s.send(b"v", timestamp=2**63), RecordTypeError),
    "timestamp a float": (lambda s: s.send(b"v", timestamp=1.5), RecordTypeError),
    "send_many a str item": (lambda s: s.send_many([b"ok", "bad"]), RecordTypeError),
    "send_many an item too large": (lambda s: s.send_many([b"ok", b"x" * (LIMIT + 1)]), MessageTooLargeError),
    "send_many not iterable": (lambda s: s.send_many(5), RecordTypeError),
    "send_many one bytes": (lambda s: s.send_many(b"abc"), RecordTypeError),
    "send_many timestamp -2**63-1": (lambda s: s.send_many([b"ok"], timestamp=-(2**63) - 1), RecordTypeError),
    "send_many iterable raises": (lambda s: s.send_many(_raising_values()), KeyError),
}


def _send_from_another_process(path, value: str) -> int:
    """Run procs/writer_send.py; it must open the channel and send within DEADLINE."""
    try:
        done = subprocess.run(
            [sys.executable, str(PROCS / "writer_send.py"), str(path), value],
            capture_output=True,
            timeout=DEADLINE,
        )
    except subprocess.TimeoutExpired:  # run() killed it
        pytest.fail(f"another process could not send within {DEADLINE} s: writer.lock is still held")
    assert done.returncode == 0, done.stderr.decode()
    return int(done.stdout)


def _values(path) -> list[bytes | None]:
    with FileChannel(path, maintenance_interval=0) as ch:
        return [r.value for r in ch.receiver("earliest").recv_many(100, timeout=0)]


@pytest.mark.parametrize("buffered_first", [False, True], ids=["empty buffer", "records buffered"])
@pytest.mark.parametrize("case", list(REJECTED))
def test_a_rejected_send_lets_another_process_write_at_once(tmp_path, case, buffered_first):
    call, error = REJECTED[case]
    path = tmp_path / "ch"
    with FileChannel(path, max_record_bytes=LIMIT, maintenance_interval=0) as ch:
        sender = ch.sender()
        if buffered_first:
            sender.send(b"mine")  # the writer lock is held until the flusher writes it
        with pytest.raises(error):
            call(sender)
        assert _send_from_another_process(path, "theirs") == (1 if buffered_first else 0)
        assert sender.send(b"mine again") == (2 if buffered_first else 1)  # and this process goes on
    assert _values(path) == ([b"mine"] if buffered_first else []) + [b"theirs", b"mine again"]


def test_an_empty_send_many_lets_another_process_write_at_once(tmp_path):
    path = tmp_path / "ch"
    with FileChannel(path, maintenance_interval=0) as ch:
        assert ch.sender().send_many([]) == range(0, 0)
        assert _send_from_another_process(path, "theirs") == 0
    assert _values(path) == [b"theirs"]


@pytest.mark.parametrize("case", ["str value", "header not a pair", "value too large", "send_many an item too large"])
def test_a_rejected_send_lets_a_second_channel_of_this_process_write(tmp_path, case):
    call, error = REJECTED[case]
    path = tmp_path / "ch"
    got: list[int] = []

    def other() -> None:
        with FileChannel(path, maintenance_interval=0) as second:
            got.append(second.sender().send(b"second"))

    with FileChannel(path, max_record_bytes=LIMIT, maintenance_interval=0) as ch:
        with pytest.raises(error):
            call(ch.sender())
        thread = threading.Thread(target=other, daemon=True)
        thread.start()
        thread.join(DEADLINE)
        blocked = thread.is_alive()
    thread.join(DEADLINE)  # closing the first channel frees a blocked one
    assert not blocked, "a second FileChannel of this process blocked on writer.lock"
    assert got == [0]
    assert _values(path) == [b"second"]


def test_a_failed_roll_lets_another_process_write(tmp_path):
    # The child's roll fails for real (EMFILE creating the next segment) and the child stays
    # alive with the channel open; another process must still be able to write.
    path = tmp_path / "ch"
    child = subprocess.Popen(
        [sys.executable, str(PROCS / "writer_roll_fails.py"), str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    try:
        line = child.stdout.readline().decode()
        assert line == "failed StorageError\n", line or child.stderr.read().decode()
        assert _send_from_another_process(path, "theirs") == 1
        out, err = child.communicate(b"go on\n", timeout=DEADLINE)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err.decode()
    assert int(out) == 2
    assert _values(path) == [b"f" * 4096, b"theirs", b"after"]


# -- the flusher's failures reach the log -------------------------------------------------------


def test_a_failed_background_flush_is_logged_as_an_error(tmp_path, caplog):
    # A real write failure in the flusher thread: the file-size limit (RLIMIT_FSIZE; Python
    # ignores SIGXFSZ, so write() fails with EFBIG) is below the record's end. The limit is
    # this process's, so it is lowered only around the send and restored at once.
    caplog.set_level("DEBUG", logger="filechannel")
    ch = FileChannel(tmp_path / "ch", maintenance_interval=0, max_record_bytes=4 << 20, buffer_bytes=8 << 20)
    sender = ch.sender()
    flusher = sender._appender._flusher
    assert flusher is not None
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        sender.send(os.urandom(2 << 20))  # the idle flusher writes it at once, and fails
        flusher.join(DEADLINE)  # after a failed write the flusher has nothing left to do
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    try:
        assert not flusher.is_alive()
        from_flusher = [r for r in caplog.records if r.threadName == "filechannel-flusher"]
        errors = [r for r in from_flusher if r.levelname == "ERROR" and r.exc_info is not None]
        assert errors and isinstance(errors[-1].exc_info[1], DiskFullError), [r.getMessage() for r in from_flusher]
        assert "background flush failed" in errors[-1].getMessage()
        assert not [r for r in from_flusher if r.levelname == "DEBUG"]
    finally:
        ch.close()


# -- settings --------------------------------------------------------------------------------

FLOAT_SETTINGS = ["flush_interval", "fsync_interval", "maintenance_interval"]
INT_SETTINGS = [
    "segment_bytes",
    "segment_ms",
    "max_record_bytes",
    "index_interval_bytes",
    "buffer_bytes",
    "compression_level",
    "compression_block_bytes",
    "retention_bytes",
    "retention_ms",
]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, False, 1e300, 10**400, -1, "1", None])
@pytest.mark.parametrize("name", FLOAT_SETTINGS)
def test_time_settings_must_be_finite_seconds_in_range(name, value):
    with pytest.raises(ConfigError, match=f"{name} must be a finite number of seconds"):
        ChannelConfig(**{name: value})


@pytest.mark.parametrize("value", [True, False, 1.0, math.nan, math.inf, 2**63, "4096"])
@pytest.mark.parametrize("name", INT_SETTINGS)
def test_int_settings_must_be_ints_in_range(name, value):
    with pytest.raises(ConfigError, match=f"{name} must be an int from"):
        ChannelConfig(**{name: value})


def test_segments_stay_small_enough_for_their_index_positions():
    ChannelConfig(segment_bytes=2**31)
    with pytest.raises(ConfigError, match="segment_bytes must be an int from 4096 to 2147483648"):
        ChannelConfig(segment_bytes=2**31 + 1)


_junk = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([-1, 2**31 + 1, 2**63, 10**400])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["", "5", "never", "zstd"])
)
_max_i64 = 2**63 - 1
_valid = {
    "segment_bytes": st.integers(4096, 2**31),
    "segment_ms": st.none() | st.integers(1, _max_i64),
    "max_record_bytes": st.integers(16, 2**31 - 1),
    "index_interval_bytes": st.integers(1, 2**31),
    "buffer_bytes": st.integers(1, _max_i64),
    "compression_level": st.integers(1, 22),
    "compression_block_bytes": st.integers(1024, 2**31 - 1),
    "retention_bytes": st.none() | st.integers(0, _max_i64),
    "retention_ms": st.none() | st.integers(0, _max_i64),
    "flush_interval": st.floats(0, 3600) | st.integers(0, 3600),
    "fsync_interval": st.floats(0, 86400) | st.integers(0, 86400),
    "maintenance_interval": st.floats(0, 86400) | st.integers(0, 86400),
    "fsync": st.sampled_from(["never", "interval", "always"]),
    "compression": st.sampled_from(["zstd", "none"]),
}


def _junk_or(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.integers(0, 7).flatmap(lambda k: _junk if k == 0 else valid)


# Each setting given or not, and if given junk one time in eight: about half the examples
# are accepted, so a channel really runs with extreme but accepted values.
_settings = st.fixed_dictionaries({}, optional={name: _junk_or(valid) for name, valid in _valid.items()})


@given(_settings)
def test_any_accepted_config_is_finite_and_in_range_and_a_channel_works_with_it(kwargs):
    try:
        config = ChannelConfig.from_kwargs(**kwargs)
    except ConfigError:
        event("rejected")
        return  # the only exception allowed
    event("accepted")
    for name in FLOAT_SETTINGS:
        value = getattr(config, name)
        assert type(value) in (int, float) and math.isfinite(value) and value >= 0
    for name in INT_SETTINGS:
        value = getattr(config, name)
        assert value is None or (type(value) is int and 0 <= value < 2**63)
    assert config.segment_bytes <= 2**31 and config.max_record_bytes < 2**31
    # And a channel opened with it sends and reads back (every value fits what uses it).
    with tempfile.TemporaryDirectory() as root, FileChannel(os.path.join(root, "ch"), **kwargs) as ch:
        assert ch.sender().send(b"record") == 0
        assert [r.value for r in ch.receiver("earliest").recv_many(10, timeout=5)] == [b"record"]


# -- bad producer input ----------------------------------------------------------------------

BAD_INPUT = {
    "timestamp 2**63": (lambda s: s.send(b"v", timestamp=2**63), RecordTypeError),
    "timestamp 2**64": (lambda s: s.send(b"v", timestamp=2**64), RecordTypeError),
    "timestamp -2**63-1": (lambda s: s.send(b"v", timestamp=-(2**63) - 1), RecordTypeError),
    "timestamp a bool": (lambda s: s.send(b"v", timestamp=True), RecordTypeError),
    "timestamp a str": (lambda s: s.send(b"v", timestamp="5"), RecordTypeError),
    "send_many timestamp 2**63": (lambda s: s.send_many([b"v"], timestamp=2**63), RecordTypeError),
    "value a str": (lambda s: s.send("v"), RecordTypeError),
    "value an int": (lambda s: s.send(7), RecordTypeError),
    "key a str": (lambda s: s.send(b"v", key="k"), RecordTypeError),
    "key an int": (lambda s: s.send(b"v", key=7), RecordTypeError),
    "headers a str": (lambda s: s.send(b"v", headers="ab"), RecordTypeError),
    "headers a str count": (lambda s: s.send(b"v", headers="2"), RecordTypeError),
    "headers an int": (lambda s: s.send(b"v", headers=2), RecordTypeError),
    "headers of None": (lambda s: s.send(b"v", headers=[None]), RecordTypeError),
    "header a triple": (lambda s: s.send(b"v", headers=[("n", b"v", b"x")]), RecordTypeError),
    "header name an int": (lambda s: s.send(b"v", headers=[(1, b"v")]), RecordTypeError),
    "header value an int": (lambda s: s.send(b"v", headers=[("n", 1)]), RecordTypeError),
    "header name a lone surrogate": (lambda s: s.send(b"v", headers=[("\udcff", b"v")]), RecordTypeError),
    "too many headers": (lambda s: s.send(b"v", headers=[("n", b"")] * 65536), RecordTypeError),
    "value too large": (lambda s: s.send(b"x" * LIMIT), MessageTooLargeError),
    "send_many values a str": (lambda s: s.send_many("abc"), RecordTypeError),
    "send_many values an int": (lambda s: s.send_many(3), RecordTypeError),
    "send_many of ints": (lambda s: s.send_many([1, 2]), RecordTypeError),
    "send_many of str": (lambda s: s.send_many(["a"]), RecordTypeError),
    "send_many item too large": (lambda s: s.send_many([b"x" * LIMIT]), MessageTooLargeError),
    # 4 GiB of frames without 4 GiB of memory: one 1 MiB value, 4,100 times.
    "send_many over 2 GiB": (lambda s: s.send_many([b"x" * ((1 << 20) - 9)] * 4100), MessageTooLargeError),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_producer_input_raises_a_filechannel_error_and_nothing_is_written(tmp_path, case):
    call, error = BAD_INPUT[case]
    limit = (1 << 20) if case == "send_many over 2 GiB" else LIMIT
    with FileChannel(tmp_path / "ch", max_record_bytes=limit, maintenance_interval=0) as ch:
        sender = ch.sender()
        with pytest.raises(error) as raised:
            call(sender)
        assert isinstance(raised.value, FileChannelError)
        assert sender.send(b"good") == 0
    assert _values(tmp_path / "ch") == [b"good"]


def test_the_writer_deadlines_are_on_the_monotonic_clock(tmp_path):
    # The C path compares these with CLOCK_MONOTONIC; on the wall clock (about 1.7e9 s)
    # they were never reached by it, and a step back of the wall clock kept writer.lock
    # held far past the hold limit. Timestamps stay wall-clock (checked below and in
    # test_append_core.py).
    with FileChannel(tmp_path / "ch", maintenance_interval=0, segment_ms=60_000) as ch:
        sender = ch.sender()
        before_ms = int(time.time() * 1000)
        before = time.monotonic()
        sender.send(b"first")
        appender = sender._appender
        after = time.monotonic()
        assert before <= appender._hold_until - appender._hold_limit <= after
        assert before <= appender._check_at <= after + appender._hold_limit
        sender.flush()
        record = ch.receiver("earliest").recv(timeout=5)
        assert before_ms <= record.timestamp <= int(time.time() * 1000)


def test_a_first_record_is_written_at_once_even_with_a_long_flush_interval(tmp_path):
    # The flusher rate-limits itself from its last drain, which started at monotonic 0.0:
    # on a machine up for less than flush_interval, the first record waited a whole interval
    # (and held writer.lock meanwhile). Another process must read it within the deadline.
    path = tmp_path / "ch"
    with FileChannel(path, maintenance_interval=0, flush_interval=3600) as ch:
        ch.sender().send(b"first")
        try:
            done = subprocess.run(
                [sys.executable, str(PROCS / "waiting_receiver.py"), str(path), "1"],
                capture_output=True,
                timeout=DEADLINE,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"the record was not written within {DEADLINE} s")
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().splitlines()[1].split()[:2] == ["0", "first"]
