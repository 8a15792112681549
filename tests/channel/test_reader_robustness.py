"""Readers against damage, holes, concurrent close and a live channel (issue 17, readers).

- a segment missing from the middle of the log is an error naming the missing offsets,
  never a loop back to an earlier segment; check() reports it;
- a damaged frame inside the active segment with valid frames after it is corruption
  (readers deliver the records before it, then raise; check() reports it and writes nothing);
- close() racing reads gives ChannelClosedError, never AssertionError/EBADF, and no fd leaks;
- check() and offset_for_time() on a live channel (another process writing, compressing
  and collecting) never fail;
- every byte of a .seg.z header and table flipped: only CorruptRecordError;
- arguments are checked (ConfigError), timeouts nan/negative rejected at once;
- a process that used receivers prints nothing on a normal close.
"""

import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from filechannel import ChannelClosedError, ConfigError, CorruptRecordError, FileChannel, FileChannelError
from filechannel.client.topics import Admin
from filechannel.engine import readahead as ra
from filechannel.engine.compressed import Z_BLOCK, Z_HEADER, CompressedSegment
from filechannel.engine.segment import SEGMENT_HEADER_SIZE
from filechannel.errors import MissingSegmentError

SMALL: dict[str, Any] = dict(segment_bytes=8 * 1024, compression_block_bytes=2048, maintenance_interval=0)


def values(n):
    return [b"%05d-" % i + b"x" * 60 for i in range(n)]


def fill(path, n=1000, compression="zstd", **extra):
    """A channel of ``n`` records in many small segments; the sealed ones compressed if asked."""
    ch = FileChannel(path, **SMALL, compression=compression, **extra)
    s = ch.sender()
    vals = values(n)
    for i in range(0, n, 10):
        s.send_many(vals[i : i + 10])
    s.flush()
    if compression != "none":
        ch.compress_sealed()
    return ch, vals


def read_until_error(ch, start="earliest", batch=64):
    """Records read from ``start`` until an error (returned too) or until nothing is left."""
    got = []
    try:
        rx = ch.receiver(start)
        while batch_ := rx.recv_many(batch, timeout=0):
            got.extend(batch_)
            assert len(got) <= 10_000, "the reader loops"
        return got, None
    except FileChannelError as exc:
        return got, exc


def segment_files(path, suffix):
    return sorted(str(p) for p in Path(path).glob("*" + suffix) if p.name.endswith(suffix))


def bases(path):
    names = {p.name.split(".")[0] for p in Path(path).iterdir() if p.name.endswith((".seg", ".seg.z"))}
    return sorted(int(n) for n in names)


def remove_segment(path, base):
    for suffix in (".seg", ".seg.z", ".idx", ".tix"):
        f = os.path.join(path, f"{base:020d}{suffix}")
        if os.path.exists(f):
            os.unlink(f)


def snapshot(path):
    return {p.name: p.read_bytes() for p in Path(path).iterdir() if p.is_file() and not p.name.endswith(".lock")}


# -- 1. a hole in the middle of the log ------------------------------------------------------


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_a_reader_from_earliest_stops_at_a_hole_with_an_error_naming_it(tmp_path, compression):
    ch, vals = fill(tmp_path, compression=compression)
    try:
        segs = bases(tmp_path)
        assert len(segs) >= 5
        hole, after = segs[2], segs[3]
        remove_segment(tmp_path, hole)
        got, exc = read_until_error(ch)
        # every record before the hole, once each, in order; then the error
        assert [r.offset for r in got] == list(range(hole))
        assert [r.value for r in got] == vals[:hole]
        assert isinstance(exc, MissingSegmentError) and isinstance(exc, CorruptRecordError)
        assert f"offsets {hole} to {after - 1} are missing" in str(exc)
        assert str(tmp_path) in str(exc)
        # the same with one receiver: it raises, and raises again (nothing skipped, no going back)
        rx = ch.receiver()
        again = []
        with pytest.raises(MissingSegmentError):
            for _ in range(1000):
                again.extend(rx.recv_many(64, timeout=0))
        assert [r.offset for r in again] == list(range(hole))
        with pytest.raises(MissingSegmentError):
            rx.recv_many(10, timeout=0)
        # past the hole, reading goes on
        rx.seek(after)
        assert [r.offset for r in rx.recv_many(5, timeout=0)] == list(range(after, after + 5))
        with pytest.raises(MissingSegmentError, match=f"offsets {hole} to {after - 1}"):
            ch.check()
    finally:
        ch.close()


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_a_reader_seeking_into_a_hole_gets_the_error(tmp_path, compression):
    ch, _vals = fill(tmp_path, compression=compression)
    try:
        segs = bases(tmp_path)
        hole, after = segs[2], segs[3]
        remove_segment(tmp_path, hole)
        for target in (hole, hole + 3, after - 1):
            got, exc = read_until_error(ch, start=target)
            assert got == [] and isinstance(exc, MissingSegmentError), (target, got, exc)
            assert f"offsets {hole} to {after - 1} are missing" in str(exc)
        rx = ch.receiver(after)
        with pytest.raises(MissingSegmentError):
            rx.seek(hole + 1)
            rx.recv_many(10, timeout=0)
    finally:
        ch.close()


def test_a_reader_waiting_at_the_end_of_a_segment_finds_a_hole_after_it(tmp_path):
    """The segment was the active one when the reader reached its end; then rolls came, and
    the segment right after it was lost: the waiting reader raises instead of waiting for ever."""
    with FileChannel(tmp_path, **SMALL, compression="none") as ch:
        s = ch.sender()
        s.send_many(values(10))
        s.flush()
        rx = ch.receiver()
        assert len(rx.recv_many(100, timeout=0)) == 10
        assert rx.recv_many(100, timeout=0) == []  # at the end of the active segment: waits
        vals = values(400)
        for i in range(0, len(vals), 10):
            s.send_many(vals[i : i + 10])
        s.flush()
        segs = bases(tmp_path)
        assert segs[0] == 0 and len(segs) >= 3
        remove_segment(tmp_path, segs[1])
        got = []
        with pytest.raises(MissingSegmentError, match=f"offsets {segs[1]} to {segs[2] - 1} are missing"):
            for _ in range(20):
                got.extend(rx.recv_many(100, timeout=3))
        assert [r.offset for r in got] == list(range(10, segs[1]))  # the rest of the segment, then the error


def test_check_and_readers_pass_a_whole_log(tmp_path):
    ch, vals = fill(tmp_path)
    try:
        got, exc = read_until_error(ch)
        assert exc is None and [r.value for r in got] == vals
        assert ch.check() == len(vals)
    finally:
        ch.close()


# -- 2. damage inside the active segment -----------------------------------------------------


def frame_positions(seg):
    data = Path(seg).read_bytes()
    pos, starts = SEGMENT_HEADER_SIZE, []
    while pos < len(data):
        starts.append(pos)
        pos += 8 + int.from_bytes(data[pos : pos + 4], "little")
    return starts


def write_durable(path, n=100):
    ch = FileChannel(path, fsync="always", compression="none", maintenance_interval=0)
    s = ch.sender()
    for i in range(n):
        s.send(b"record-%03d" % i + b"." * (i % 13))
    return ch


@pytest.mark.parametrize("field_byte", [0, 1, 2, 3, 4, 5, 6, 7])
def test_a_damaged_middle_frame_of_the_active_segment_is_corruption(tmp_path, field_byte):
    """Bytes 0-3 are the frame's length, 4-7 its CRC."""
    ch = write_durable(tmp_path)
    try:
        (seg,) = segment_files(tmp_path, ".seg")
        at = frame_positions(seg)[50] + field_byte
        with open(seg, "r+b") as f:
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ 0x40]))
        before = snapshot(tmp_path)
        rx = ch.receiver()
        got = rx.recv_many(1000, timeout=0)
        assert [r.value[:10] for r in got] == [b"record-%03d" % i for i in range(50)]
        with pytest.raises(CorruptRecordError, match=r"offset 50\b") as info:
            rx.recv_many(1000, timeout=0)
        assert os.path.basename(seg) in str(info.value) and "byte" in str(info.value)
        with pytest.raises(CorruptRecordError, match=r"offset 50\b") as info:
            ch.check()
        assert os.path.basename(seg) in str(info.value)
        assert snapshot(tmp_path) == before  # reading and checking write nothing
    finally:
        ch.close()


def test_a_torn_last_frame_of_the_active_segment_is_waited_on_not_an_error(tmp_path):
    ch = write_durable(tmp_path, n=20)
    try:
        (seg,) = segment_files(tmp_path, ".seg")
        last = frame_positions(seg)[-1]
        for cut in (last + 3, last + 8, last + 12):
            os.truncate(seg, cut)
            rx = ch.receiver()
            assert len(rx.recv_many(1000, timeout=0)) == 19
            assert rx.recv_many(1000, timeout=0) == []  # waits: a writer may still finish or trim it
            assert rx.recv_many(1000, timeout=0) == []
            assert ch.check() == 19
            rx.close()
    finally:
        ch.close()


# -- 3. close racing reads ----------------------------------------------------------------


def open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize("closer", ["channel", "receiver"])
def test_close_racing_reads_raises_only_channel_closed(tmp_path, monkeypatch, compression, closer):
    monkeypatch.setattr(ra, "ENABLED", ra._readahead is not None and ra._readahead.available)
    path = tmp_path / "ch"
    ch, _vals = fill(path, n=3000, compression=compression)
    ch.close()
    fds = open_fds()
    seen: list[BaseException] = []
    context: list[str] = []  # what each reader was doing when it stopped, for a failure's message
    deadline = time.monotonic() + 15
    for iteration in range(25):
        if time.monotonic() > deadline:
            break
        ch = FileChannel(path, **SMALL, compression=compression)
        receivers = [ch.receiver() for _ in range(3)]
        progress = threading.Condition()
        done = [0]
        target = (iteration * 997) % 8000  # vary where the readers are when the close comes
        started = time.monotonic()

        def run(rx, i, progress=progress, done=done, iteration=iteration, target=target, started=started):
            try:
                while True:
                    # at the end both wait for more: the close must wake them
                    n = 1 if rx.recv(timeout=5) and i % 2 else len(rx.recv_many(37, timeout=5))
                    with progress:
                        done[0] += n
                        progress.notify_all()
            except BaseException as exc:  # every kind is recorded and checked
                seen.append(exc)
                context.append(
                    f"{type(exc).__name__} in reader {i} of iteration {iteration} (target {target}, "
                    f"done {done[0]}, {time.monotonic() - started:.2f} s in): {exc}"
                )

        threads = [threading.Thread(target=run, args=(rx, i)) for i, rx in enumerate(receivers)]
        for t in threads:
            t.start()

        def reached(done: list[int] = done, target: int = target) -> bool:
            return done[0] >= target

        with progress:
            progress.wait_for(reached, timeout=10)
        if closer == "channel":
            ch.close()
        else:
            for rx in receivers:
                rx.close()
        for t in threads:
            t.join(timeout=30)
            assert not t.is_alive()
        for rx in receivers:
            rx.close()  # a second close: idempotent
        ch.close()
    assert seen, "no reader was interrupted"
    assert all(type(e) is ChannelClosedError for e in seen), [c for c in context if not c.startswith("ChannelClosedError")]
    assert open_fds() == fds


def test_readahead_block_after_close_is_channel_closed(tmp_path, monkeypatch):
    monkeypatch.setattr(ra, "ENABLED", True)
    ch, _vals = fill(tmp_path)
    ch.close()
    seg = CompressedSegment.open(segment_files(tmp_path, ".seg.z")[0])
    blocks = ra.BlockReadahead(seg)
    blocks.block(0)
    blocks.close()
    blocks.close()
    with pytest.raises(ChannelClosedError):
        blocks.block(1)
    seg.close()
    seg.close()
    with pytest.raises(ChannelClosedError):
        seg.read_block(0)


# -- 4. check() and offset_for_time() on a live channel ---------------------------------------

WRITER = """
import sys, time
from filechannel import FileChannel
path, seconds = sys.argv[1], float(sys.argv[2])
with FileChannel(path, segment_bytes=8192, compression_block_bytes=2048, retention_bytes=60_000,
                 maintenance_interval=0.005) as ch:
    s = ch.sender()
    print("ready", flush=True)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        s.send_many([b"%08d" % (i + k) + b"v" * 80 for k in range(20)])
        i += 20
        time.sleep(0.002)  # pacing, not synchronisation: about 10,000 records/s
"""


def test_check_and_offset_for_time_on_a_live_channel_never_fail(tmp_path):
    path = tmp_path / "live"
    start_ms = int(time.time() * 1000)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), "6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None
    try:
        assert writer.stdout.readline().strip() == "ready"
        failures: list[BaseException] = []
        checks = lookups = 0
        with FileChannel(path, maintenance_interval=0) as ch:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                try:
                    assert ch.check() >= 0
                    checks += 1
                    found = ch.offset_for_time(start_ms)
                    assert found is None or found >= 0
                    lookups += 1
                except FileChannelError as exc:
                    failures.append(exc)
        assert failures == []
        assert checks and lookups
    finally:
        _out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert len(bases(path)) >= 1


# -- 5. a .seg.z header and table, every byte flipped ----------------------------------------


def test_every_flipped_byte_of_a_compressed_table_is_corruption_never_a_crash(tmp_path):
    ch, vals = fill(tmp_path, n=300)
    try:
        z = segment_files(tmp_path, ".seg.z")[1]
        seg = CompressedSegment.open(z)
        info = seg.info
        seg.close()
        table = Z_HEADER.size + Z_BLOCK.size * len(info.blocks) + 4
        original = Path(z).read_bytes()
        assert len(info.blocks) >= 2
        for at in range(table):
            for mask in (0x01, 0x80, 0xFF):
                damaged = bytearray(original)
                damaged[at] ^= mask
                Path(z).write_bytes(damaged)
                got, exc = read_until_error(ch)
                assert isinstance(exc, CorruptRecordError), (at, mask, exc)
                assert os.path.basename(z) in str(exc), (at, mask, exc)
                assert [r.value for r in got] == vals[: len(got)]  # never a wrong record
                with pytest.raises(CorruptRecordError, match=os.path.basename(z)):
                    ch.check()
        Path(z).write_bytes(original)
        assert ch.check() == len(vals)
    finally:
        ch.close()


def test_the_cli_check_reports_a_huge_block_count_without_a_traceback(tmp_path):
    admin = Admin(str(tmp_path))
    admin.create_topic("t", 1, segment_bytes=8 * 1024, compression_block_bytes=2048)
    with admin.open_partition("t", 0, maintenance_interval=0) as ch:
        vals = values(300)
        for i in range(0, len(vals), 10):
            ch.sender().send_many(vals[i : i + 10])
        ch.sender().flush()
        assert ch.compress_sealed()
    z = segment_files(ch.path, ".seg.z")[0]
    data = bytearray(Path(z).read_bytes())
    data[15] ^= 0x40  # the high byte of the block count
    Path(z).write_bytes(data)
    run = subprocess.run(
        [sys.executable, "-m", "filechannel.cli", "--root", str(tmp_path), "check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    assert "Traceback" not in run.stderr and "MemoryError" not in run.stderr
    assert os.path.basename(z) in run.stdout + run.stderr


# -- 6. arguments ------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [math.nan, -1, -0.5, "1", True])
def test_bad_timeouts_are_rejected_at_once(tmp_path, timeout):
    with FileChannel(tmp_path, maintenance_interval=0) as ch:
        rx = ch.receiver()
        t0 = time.monotonic()
        with pytest.raises(ConfigError):
            rx.recv(timeout=timeout)
        with pytest.raises(ConfigError):
            rx.recv_many(10, timeout=timeout)
        assert time.monotonic() - t0 < 1


def test_an_infinite_timeout_waits_for_ever(tmp_path):
    with FileChannel(tmp_path, maintenance_interval=0) as ch:
        rx = ch.receiver()
        timer = threading.Timer(0.2, lambda: ch.sender().send(b"late"))
        timer.start()
        try:
            assert rx.recv(timeout=math.inf).value == b"late"
        finally:
            timer.join()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True, None])
def test_bad_counts_and_offsets_raise_our_errors(tmp_path, bad):
    with FileChannel(tmp_path, maintenance_interval=0) as ch:
        ch.sender().send(b"a")
        rx = ch.receiver()
        ack = ch.ack_receiver("worker")
        with pytest.raises(ConfigError):
            rx.recv_many(bad, timeout=0)
        with pytest.raises(ConfigError):
            ack.ack(bad)
        if bad != 0:
            with pytest.raises(ConfigError):
                rx.seek(bad)


@pytest.mark.parametrize("bad", ["yesterday", 1.5, None, 2**63])
def test_offset_for_time_rejects_what_is_not_a_timestamp(tmp_path, bad):
    with FileChannel(tmp_path, maintenance_interval=0) as ch:
        s = ch.sender()
        s.send(b"a", timestamp=1000)
        s.flush()
        with pytest.raises(FileChannelError):
            ch.offset_for_time(bad)
        assert ch.offset_for_time(999) == 0 and ch.offset_for_time(1001) is None


# -- 7. quiet on a normal close ------------------------------------------------------------

QUIET = """
import sys, threading, time
from filechannel import FileChannel
with FileChannel(sys.argv[1], maintenance_interval=0) as ch:
    rx = ch.receiver()
    got = []
    t = threading.Thread(target=lambda: got.append(rx.recv(timeout=30)))
    t.start()
    deadline = time.monotonic() + 30
    while ch._wakeup._observer is None and time.monotonic() < deadline:
        time.sleep(0.001)  # polls a condition: the receiver waits and has started the observer
    assert ch._wakeup._observer is not None
    ch.sender().send(b"hello")
    t.join()
    assert got[0].value == b"hello"
"""


def test_a_process_that_received_prints_nothing_when_it_closes(tmp_path):
    for i in range(8):
        run = subprocess.run([sys.executable, "-c", QUIET, str(tmp_path / f"q{i}")], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert run.stderr == ""
        assert run.stdout == ""
