"""Reads with ``nowait=True`` (the async consumer's reads on its event loop): only bytes already
in the page cache, never file work that could wait; :class:`WouldBlock` where a read would,
with nothing lost or skipped and the cursor where it was.

Pages are made cold with ``fsync`` and ``POSIX_FADV_DONTNEED`` (Linux drops clean pages of
a file on it), and ``mincore`` shows that none is left before a test relies on it. A
``RWF_NOWAIT`` read that finds a page cold starts a readahead from it before it fails
(``filemap_get_pages``), so a test evicts again after any read that stopped on a cold page
before it relies on that page being cold.
"""

import ctypes
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from filechannel import FileChannel
from filechannel.engine import cursor as cursor_module
from filechannel.engine.cursor import READ_CHUNK, READ_CHUNK_MAX, WouldBlock

T = TypeVar("T")

SMALL: dict[str, Any] = dict(segment_bytes=8 * 1024, compression_block_bytes=2048, maintenance_interval=0)


@pytest.fixture(autouse=True, params=["c", "python"])
def reader(request, monkeypatch):
    """Every test with the C read (``_codec.pread_nowait``, no zeroed buffer) and without it."""
    if request.param == "python":
        monkeypatch.setattr(cursor_module, "_pread_nowait", cursor_module._pread_nowait_py)
    elif cursor_module._pread_nowait is cursor_module._pread_nowait_py:
        pytest.skip("the C extension is not built")
    return cursor_module._pread_nowait


def test_the_c_read_and_its_python_fallback_read_the_same(tmp_path, reader):
    path = tmp_path / "f"
    data = os.urandom(300_000)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        for size, at in [
            (0, 0),
            (1, 0),
            (4096, 5),
            (READ_CHUNK, 1000),
            (500_000, 0),
            (10, 299_995),
            (10, 300_000),
            (10, 400_000),
        ]:
            got = reader(fd, size, at)
            assert bytes(got) == data[at : at + size] == bytes(cursor_module._pread_nowait_py(fd, size, at))
        raises_when_cold(path, lambda: read_fresh(reader, path, 100, 8192), BlockingIOError)
        with pytest.raises(ValueError):
            reader(fd, -1, 0)
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        reader(fd, 10, 0)  # closed


def values(n, size=100):
    return [b"%06d-" % i + b"x" * (size - 7) for i in range(n)]


def write(ch, vals, batch=1000):
    """``vals`` sent ``batch`` at a time (a segment rolls between batches)."""
    s = ch.sender()
    for i in range(0, len(vals), batch):
        s.send_many(vals[i : i + batch])
    s.flush()


def drain(cursor, batch=5000):
    got = []
    while b := cursor.read(batch):
        got += b
    return got


_libc = ctypes.CDLL(None, use_errno=True)
PAGE = mmap.PAGESIZE


def resident_pages(path: Path) -> int:
    """How many of ``path``'s pages are in the page cache (``mincore`` of a mapping of it, which
    reads nothing and starts no readahead)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapping:
        start = ctypes.c_char.from_buffer(mapping)  # the mapping's address (a private one: never written)
        vec = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
        failed = _libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), vec)
        del start  # the mapping closes only without it
    if failed:
        raise OSError(ctypes.get_errno(), f"mincore of {path}")
    return sum(v & 1 for v in vec)


def evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache (written back first), and wait until none is left.

    Pages under I/O when it drops them (a readahead a failed ``nowait`` read just started, slower
    on a loaded machine) stay cached: it drops them again until ``mincore`` shows none. (It once
    checked only the file's last page, with a ``RWF_NOWAIT`` read of it, since such a read starts
    a readahead itself: the pages of an earlier readahead still in flight then stayed cached at
    the cursor's place, and all ten tries of :func:`raises_when_cold` read them.)
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        for _ in range(200):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if resident_pages(path) == 0:
                return
            time.sleep(0.01)
        pytest.fail(f"the pages of {path} stayed in the page cache")
    finally:
        os.close(fd)


def read_fresh(reader: Callable[[int, int, int], object], path: Path, size: int, at: int) -> object:
    """``reader`` on a file description of its own (its readahead state fresh)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return reader(fd, size, at)
    finally:
        os.close(fd)


def raises_when_cold(path: Path, read: Callable[[], object], error: type[BaseException]) -> None:
    """``read()`` of ``path``'s pages made cold raises ``error``.

    The failed read itself starts a readahead of the page it found cold, and on a loaded
    machine that I/O can finish before the kernel looks at the page again (the reading thread
    descheduled in between; 7 of 300 such reads beside two CPU burners, the page shown not
    resident by ``mincore`` just before): the read then returns the cached bytes, which is no
    wait either. So evict and read again until one raises, for up to 200 tries and 10 ms apart
    after the first ten: such reads come in bursts (all of 10 tries in a row, in two tests of
    one worker, in one run of the suite with four workers on two CPUs). A read on a file
    description of its own (``read_fresh``) where it can: on one file description all 10
    tries once returned the bytes (1 of 25 runs of the test), its readahead state kept.
    """

    def raised() -> bool | None:
        evict(path)
        try:
            read()
        except error:
            return True
        return None

    tried_in_bursts(raised, f"reads of {path}'s evicted pages never raised {error.__name__}")


def tried_in_bursts(attempt: Callable[[], T | None], failing: str) -> T:
    """``attempt()`` until it returns something other than None: up to 200 tries, 10 ms apart
    after the first ten (reads of evicted pages that find them back in time come in bursts:
    :func:`raises_when_cold`). Fails saying ``failing`` if none did."""
    for n in range(200):
        result = attempt()
        if result is not None:
            return result
        if n >= 10:
            time.sleep(0.01)
    pytest.fail(f"{failing} in 200 tries")


def test_nowait_reads_cached_records_as_a_read_does_and_finds_the_end(tmp_path):
    vals = values(10_000)  # about 1 MB: several read chunks
    with FileChannel(tmp_path, compression="none", maintenance_interval=0) as ch:
        write(ch, vals)
        cursor = ch.receiver("earliest")._cursor
        got = []
        while batch := cursor.read(700, nowait=True):
            got += batch
        assert [r.value for r in got] == vals
        assert [r.offset for r in got] == list(range(len(vals)))
        assert cursor.read(10, nowait=True) == []  # the end of the log: nothing, as a read, not WouldBlock
        ch.sender().send(b"late")
        ch.sender().flush()
        assert [(r.offset, r.value) for r in cursor.read(10, nowait=True)] == [(len(vals), b"late")]


def test_nowait_never_reads_from_disk_and_loses_nothing(tmp_path):
    vals = values(20_000)  # about 2 MB
    with FileChannel(tmp_path, compression="none", maintenance_interval=0) as ch:
        write(ch, vals)
        (segment,) = tmp_path.glob("*.seg")

        def stopped_then_blocked():
            """A new receiver's ordinary read, then a nowait one that reads the rest of the chunk
            in hand and stops at the evicted pages, then a nowait one with nothing in hand that
            raises: the receiver and what it read, or None if a page came back in time
            (raises_when_cold says how) and the receiver read on from it.

            Each try starts again with a receiver of its own: a read that found its pages back
            moved the cursor a whole chunk on (up to a mebibyte, 9,000 of these records, then
            90 tries of 100 served from memory), so tries on one cursor could carry it to the
            end of the segment, where nothing is left to raise (once in a run of the suite
            beside two CPU burners: 200 tries, none raised)."""
            receiver = ch.receiver("earliest")
            cursor = receiver._cursor
            got = cursor.read(10)  # an ordinary read: the cursor now holds its first chunk
            evict(segment)
            got += cursor.read(100_000, nowait=True)
            if 10 < len(got) < len(vals):
                assert cursor.position == len(got)
                # (evicted again: the read that stopped started a readahead of the pages it found cold)
                evict(segment)
                try:
                    cursor.read(100, nowait=True)
                except WouldBlock:
                    return receiver, got
            receiver.close()
            return None

        receiver, got = tried_in_bursts(stopped_then_blocked, "a nowait read never stopped at an evicted page")
        cursor = receiver._cursor
        assert cursor.position == len(got)  # where it was
        got += drain(cursor)  # an ordinary read goes to the disk
        assert [r.value for r in got] == vals


def test_nowait_leaves_compressed_segments_to_a_read(tmp_path):
    vals = values(1000, 60)
    with FileChannel(tmp_path, **SMALL, compression="zstd") as ch:
        write(ch, vals, batch=10)
        assert ch.compress_sealed()
        cursor = ch.receiver("earliest")._cursor
        with pytest.raises(WouldBlock):  # decompressing (or a tier-2 fetch) is work for a worker
            cursor.read(100, nowait=True)
        assert cursor.position == 0
        assert [r.value for r in drain(cursor)] == vals


def test_nowait_stops_at_the_end_of_a_sealed_segment_and_a_read_moves_on(tmp_path):
    vals = values(1000, 60)
    with FileChannel(tmp_path, **SMALL, compression="none") as ch:
        write(ch, vals, batch=10)
        assert len(list(tmp_path.glob("*.seg"))) > 2
        cursor = ch.receiver("earliest")._cursor
        got = cursor.read(100_000, nowait=True)  # the first segment's records
        assert 0 < len(got) < len(vals)
        with pytest.raises(WouldBlock):  # opening the next segment is file work
            cursor.read(100, nowait=True)
        got += cursor.read(1)
        while len(got) < len(vals):  # nowait reads each segment once a read has opened it
            try:
                got += cursor.read(100_000, nowait=True)
            except WouldBlock:
                got += cursor.read(1)
        assert [r.value for r in got] == vals


def test_nowait_leaves_a_record_longer_than_a_read_chunk_to_a_read(tmp_path):
    big = os.urandom(READ_CHUNK_MAX + 1000)
    with FileChannel(tmp_path, compression="none", maintenance_interval=0, max_record_bytes=2 << 20) as ch:
        write(ch, [b"small", big, b"after"])
        cursor = ch.receiver("earliest")._cursor
        assert [r.value for r in cursor.read(10, nowait=True)] == [b"small"]
        with pytest.raises(WouldBlock):
            cursor.read(10, nowait=True)
        assert [r.value for r in cursor.read(10)] == [big, b"after"]


def test_nowait_leaves_a_partial_last_frame_to_a_read(tmp_path):
    with FileChannel(tmp_path, compression="none", maintenance_interval=0) as ch:
        write(ch, [b"whole"])
        (segment,) = tmp_path.glob("*.seg")
        with open(segment, "ab") as f:  # a frame's first bytes: a writer mid-write, or one that died
            f.write(b"\x40\x00\x00\x00\x01")
        cursor = ch.receiver("earliest")._cursor
        assert [r.value for r in cursor.read(10, nowait=True)] == [b"whole"]
        with pytest.raises(WouldBlock):  # telling a torn tail from damage scans the file
            cursor.read(10, nowait=True)
        assert cursor.read(10) == []  # a read waits on it, as ever
        assert cursor.position == 1
