"""Readahead of compressed segments: the C worker threads against the Python reference
(CompressedSegment.read_block), errors surfacing at the block that has them, closing with
blocks in flight, and a forked child (a real process) reading with its own threads."""

import itertools
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from filechannel import CorruptRecordError, FileChannel
from filechannel.engine import readahead as ra
from filechannel.engine.compressed import CompressedSegment

# Small segments of several small blocks, so a read crosses blocks and segments.
BLOCKY: dict[str, Any] = dict(segment_bytes=64 * 1024, compression_block_bytes=4096, maintenance_interval=0)


@pytest.fixture(autouse=True)
def readahead_on(monkeypatch):
    """Readahead is off with one CPU; these tests want it whatever the machine."""
    monkeypatch.setattr(ra, "ENABLED", True)


def fill(path, values, **config):
    """Send values in small batches (a batch stays in one segment) and compress the sealed segments."""
    with FileChannel(path, **{**BLOCKY, **config}) as ch:
        s = ch.sender()
        for i in range(0, len(values), 10):
            s.send_many(values[i : i + 10])
        s.flush()
        return ch.compress_sealed()


def z_files(path):
    return sorted(str(p) for p in Path(path).glob("*.seg.z"))


def read_all(ch, start="earliest", batch=100):
    rx = ch.receiver(start)
    out = []
    while got := rx.recv_many(batch, timeout=0):
        out.extend(got)
    rx.close()
    return out


def test_the_c_readahead_is_built_and_found_libzstd():
    # Without it readers fall back to decompressing on their own thread: correct, but slow.
    assert ra._readahead is not None and ra._readahead.available, getattr(ra._readahead, "unavailable_reason", None)


@given(
    sizes=st.lists(st.integers(0, 3000), max_size=300),
    block_bytes=st.sampled_from([1024, 4096, 20_000]),
    order=st.randoms(use_true_random=False),
)
def test_blocks_read_ahead_equal_the_python_reference(sizes, block_bytes, order):
    # random bytes and runs of one byte, after 100 records that seal a few segments whatever sizes is
    values = [b"%05d" % i * 20 for i in range(100)]
    values += [order.randbytes(n) if n % 2 else bytes([n % 256]) * n for n in sizes]
    with tempfile.TemporaryDirectory() as d:
        fill(d, values, segment_bytes=4096, compression_block_bytes=block_bytes)
        blocks = 0
        for path in z_files(d):
            seg = CompressedSegment.open(path)
            try:
                n = len(seg.info.blocks)
                blocks += n
                want = [seg.read_block(i) for i in range(n)]
                # sequential (reads ahead), then jumping about (drops what it read ahead)
                jumps = list(range(n)) * 2
                order.shuffle(jumps)
                ahead = ra.BlockReadahead(seg, enabled=True)
                try:
                    assert [ahead.block(i) for i in range(n)] == want
                    assert [ahead.block(i) for i in jumps] == [want[i] for i in jumps]
                finally:
                    ahead.close()
            finally:
                seg.close()
        assert blocks >= 1


def base_offset(path):
    seg = CompressedSegment.open(path)
    seg.close()
    return seg.info.base_offset


def block_count(path):
    seg = CompressedSegment.open(path)
    seg.close()
    return len(seg.info.blocks)


def corrupt_block(path, k):
    """Garble the middle of block k's compressed bytes; return the block."""
    seg = CompressedSegment.open(path)
    b = seg.info.blocks[k]
    seg.close()
    data = bytearray(Path(path).read_bytes())
    mid = b.file_position + b.compressed_length // 2
    data[mid : mid + 16] = bytes(x ^ 0xA5 for x in data[mid : mid + 16])
    Path(path).write_bytes(bytes(data))
    return b


@pytest.mark.parametrize("enabled, batch", [(True, 7), (True, 1000), (False, 7), (False, 1000)])
def test_a_bad_block_read_ahead_raises_only_when_the_reader_reaches_it(tmp_path, monkeypatch, enabled, batch):
    monkeypatch.setattr(ra, "ENABLED", enabled)
    values = [b"record-%05d " % i + os.urandom(200).hex().encode() for i in range(2000)]
    assert fill(tmp_path, values)
    victim = z_files(tmp_path)[1]
    bad = corrupt_block(victim, 5)
    with FileChannel(tmp_path, **BLOCKY) as ch:
        rx = ch.receiver("earliest")
        got = []
        with pytest.raises(CorruptRecordError) as info:
            while batch_ := rx.recv_many(batch, timeout=0):
                got.extend(batch_)
        assert os.path.basename(victim) in str(info.value)
        # Everything before the bad block came through, in order, intact, even the records
        # decoded in the same call that reached the damage (that call returns them, the next
        # one raises). Frames of the bad block before the garbled bytes may pass their CRC.
        assert len(got) >= bad.first_offset
        assert [r.value for r in got] == values[: len(got)]
        with pytest.raises(CorruptRecordError):
            rx.recv_many(batch, timeout=0)  # raises again: nothing was skipped
        rx.close()
        with pytest.raises(CorruptRecordError, match=os.path.basename(victim)):
            ch.check()


def test_a_segment_cut_short_inside_a_block_is_corrupt_not_short(tmp_path):
    values = [os.urandom(300) for _ in range(1000)]
    assert fill(tmp_path, values)
    victim = z_files(tmp_path)[0]
    seg = CompressedSegment.open(victim)
    last = seg.info.blocks[-1]
    seg.close()
    os.truncate(victim, last.file_position + last.compressed_length // 2)
    with FileChannel(tmp_path, **BLOCKY) as ch, pytest.raises(CorruptRecordError, match="file ends inside the block"):
        read_all(ch)


def test_a_reader_near_a_segments_end_reads_the_next_segment_ahead(tmp_path, monkeypatch):
    values = [b"%06d" % i + os.urandom(300) for i in range(3000)]
    assert fill(tmp_path, values)
    events: list[tuple[str, str, Any]] = []  # the block index, None for a start
    start, block = ra.BlockReadahead.start, ra.BlockReadahead.block

    def spy_start(self):
        events.append(("start", self.seg.path, None))
        start(self)

    def spy_block(self, i):
        events.append(("block", self.seg.path, i))
        return block(self, i)

    monkeypatch.setattr(ra.BlockReadahead, "start", spy_start)
    monkeypatch.setattr(ra.BlockReadahead, "block", spy_block)
    with FileChannel(tmp_path, **BLOCKY) as ch:
        assert [r.value for r in read_all(ch, batch=9)] == values
    files = z_files(tmp_path)
    assert len(files) >= 3
    for before, after in itertools.pairwise(files):
        started = events.index(("start", after, None))
        # started while the reader was on the last blocks of the segment before, before
        # the reader asked for the first block of this one
        n = block_count(before)
        assert events[started - 1][:2] == ("block", before) and events[started - 1][2] >= n - ra.READAHEAD_BLOCKS
        assert started < events.index(("block", after, 0))


def test_a_seek_away_from_a_segment_read_ahead_closes_it(tmp_path):
    values = [b"%06d" % i + os.urandom(300) for i in range(3000)]
    assert fill(tmp_path, values)
    with FileChannel(tmp_path, **BLOCKY) as ch:
        read_all(ch)  # the channel's own files are open from here on
        before = open_fds()
        first_next = base_offset(z_files(tmp_path)[1])
        rx = ch.receiver("earliest")
        got = rx.recv_many(first_next - 3, timeout=0)  # on the last block: the next segment is open
        assert len(open_fds()) == len(before) + 2
        rx.seek(10)
        assert [r.value for r in rx.recv_many(5, timeout=0)] == values[10:15]
        rx.seek(2500)
        assert [r.value for r in got + read_rest(rx)] == values[: first_next - 3] + values[2500:]
        rx.close()
        assert open_fds() == before


def test_a_corrupt_next_segment_raises_when_the_reader_gets_there(tmp_path):
    values = [b"%06d" % i + os.urandom(300) for i in range(3000)]
    assert fill(tmp_path, values)
    victim = z_files(tmp_path)[1]
    first_bad = base_offset(victim)
    with open(victim, "r+b") as f:
        f.write(b"garbage!")  # its header: it cannot be opened, so it cannot be read ahead
    with FileChannel(tmp_path, **BLOCKY) as ch:
        rx = ch.receiver("earliest")
        got = []
        with pytest.raises(CorruptRecordError, match=os.path.basename(victim)):
            while batch := rx.recv_many(50, timeout=0):
                got.extend(batch)
        assert [r.value for r in got] == values[:first_bad]
        rx.close()


def test_readers_on_several_threads_share_the_workers(tmp_path):
    values = [os.urandom(700) for _ in range(3000)]
    assert fill(tmp_path, values)
    with FileChannel(tmp_path, **BLOCKY) as ch:
        results = [None] * 4

        def reader(k):
            results[k] = [r.value for r in read_all(ch, start=k * 100, batch=13 + k)]

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [values[k * 100 :] for k in range(4)]


def open_fds():
    return set(os.listdir("/proc/self/fd"))


def test_closing_a_reader_with_blocks_in_flight_leaves_nothing_open(tmp_path):
    values = [os.urandom(500) for _ in range(3000)]
    assert fill(tmp_path, values)
    with FileChannel(tmp_path, **BLOCKY) as ch:
        read_all(ch)  # the channel's own files are open from here on
        before = open_fds()
        for start in range(0, 3000, 250):
            rx = ch.receiver(start)
            assert [r.value for r in rx.recv_many(20, timeout=0)] == values[start : start + 20]
            rx.close()  # blocks after these 20 are being read ahead now
        assert open_fds() == before
        assert [r.value for r in read_all(ch)] == values


def test_a_forked_child_reads_with_its_own_threads(tmp_path):
    values = [b"%06d" % i + os.urandom(400) for i in range(4000)]
    assert fill(tmp_path, values)
    with FileChannel(tmp_path, **BLOCKY) as ch:
        rx = ch.receiver("earliest")
        first = rx.recv_many(100, timeout=0)  # the parent's workers have blocks in flight
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: finish the inherited reader, then read everything afresh
            try:
                ok = [x.value for x in first + read_rest(rx)] == values
                ok = ok and [x.value for x in read_all(ch)] == values
                os.write(w, b"ok" if ok else b"different")
            except BaseException as exc:
                os.write(w, repr(exc).encode()[:500])
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            said = f.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and said == b"ok", said
        assert [x.value for x in first + read_rest(rx)] == values  # the parent's reader goes on
        rx.close()


def read_rest(rx):
    out = []
    while got := rx.recv_many(100, timeout=0):
        out.extend(got)
    return out


def test_bad_arguments_to_the_c_module_are_refused():
    assert ra._readahead is not None
    with pytest.raises(ValueError):
        ra._readahead.submit(0, -1, 10, 10)
    with pytest.raises(ValueError):
        ra._readahead.set_threads(0)
    with pytest.raises(TypeError):  # fetched bytes must be immutable: a worker reads them without the GIL
        ra._readahead.submit_bytes(bytearray(b"x"), 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ra._readahead.submit_bytes(b"x", -1)


@given(values=st.lists(st.binary(max_size=3000), max_size=200), cut=st.integers(0, 40), flip=st.integers(0, 10**6))
def test_fetched_bytes_decompress_on_the_c_workers_exactly_as_the_python_reference(values, cut, flip):
    """Tier-2 blocks arrive as bytes; decompress_fetched queues them to the C workers. Each
    block decodes to the reference's bytes; a cut body is refused; a damaged one is refused
    or decompresses to the block's length (zstd frames carry no checksum here: the records'
    CRCs catch the rest, see test_remote_reads.py)."""
    with tempfile.TemporaryDirectory() as d:
        fill(d, values)
        for path in z_files(d):
            seg = CompressedSegment.open(path)
            try:
                for i, b in enumerate(seg.info.blocks):
                    body = os.pread(seg.fd, b.compressed_length, b.file_position)
                    assert bytes(ra.decompress_fetched(body, b)()) == seg.read_block(i)
                    with pytest.raises(ValueError):  # a cut frame never passes as the block
                        ra.decompress_fetched(body[: max(0, len(body) - cut - 1)], b)()
                    damaged = bytearray(body)
                    damaged[flip % len(body)] ^= 0xFF
                    try:
                        got = bytes(ra.decompress_fetched(bytes(damaged), b)())
                    except ValueError:
                        continue
                    # zstd's frame checksum is off: a flipped literal byte may decompress; the record CRCs catch it
                    assert len(got) == b.raw_length
            finally:
                seg.close()
