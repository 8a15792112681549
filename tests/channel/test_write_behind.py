"""_codec.WriteBehind: one write at a time, submitted by one thread and written by another
without the GIL (the appender's write-behind, DESIGN.md "Writing behind")."""

import errno
import os
import threading

import pytest

from filechannel.engine import files

_codec = pytest.importorskip("filechannel.engine._codec", reason="the C extension did not build here")
LIMITS = files.write_limits()


def _open(path, flags=os.O_WRONLY | os.O_CREAT | os.O_APPEND):
    return os.open(path, flags, 0o644)


def test_each_write_is_its_pieces_then_its_after_writes_in_order_until_close(tmp_path):
    wb = _codec.WriteBehind()
    seg, idx, state = _open(tmp_path / "seg"), _open(tmp_path / "idx"), _open(tmp_path / "state", os.O_WRONLY | os.O_CREAT)
    results: list[int] = []
    writer = threading.Thread(target=lambda: results.append(wb.run(60.0)))
    writer.start()
    try:
        expected = b""
        for i in range(20):
            pieces = [b"h%02d" % i, os.urandom(100), b"tail" * (i % 3)]
            expected += b"".join(pieces)
            wb.submit(seg, pieces, sum(map(len, pieces)), *LIMITS, [(idx, b"i%02d" % i, -1), (state, b"state %02d" % i, 0)])
            with pytest.raises(RuntimeError, match="not collected"):
                wb.submit(seg, [b"x"], 1, *LIMITS, [])  # one at a time: the last must be collected first
            assert wb.wait() == 0  # waited for without the GIL, here in the submitting thread
            assert wb.poll() == 0 and wb.collect() == (0, -1)
            assert wb.poll() is None
        with pytest.raises(RuntimeError, match="no write is done"):
            wb.collect()
    finally:
        wb.close()
        writer.join(10)
        for fd in (seg, idx, state):
            os.close(fd)
    assert results == [-1]  # closed with nothing submitted
    assert (tmp_path / "seg").read_bytes() == expected
    assert (tmp_path / "idx").read_bytes() == b"".join(b"i%02d" % i for i in range(20))
    assert (tmp_path / "state").read_bytes() == b"state 19"  # written at offset 0 each time


def test_a_failed_write_keeps_its_errno_and_skips_its_after_writes(tmp_path):
    wb = _codec.WriteBehind()
    ro = os.open(tmp_path / "seg", os.O_RDONLY | os.O_CREAT, 0o644)
    idx = _open(tmp_path / "idx")
    writer = threading.Thread(target=wb.run, args=(60.0,))
    writer.start()
    try:
        for pieces in ([b"h" * 17, b"v" * 100] * 10, [b"h" * 17, b"v" * 4096] * 10):  # joined, and writev
            wb.submit(ro, pieces, sum(map(len, pieces)), *LIMITS, [(idx, b"entry", -1)])
            assert wb.wait() == errno.EBADF
            assert wb.collect() == (errno.EBADF, -1)  # at the pieces
        good = _open(tmp_path / "good")
        wb.submit(good, [b"records"], 7, *LIMITS, [(idx, b"entry", -1), (ro, b"state", 0)])
        assert wb.wait() == errno.EBADF
        assert wb.collect() == (errno.EBADF, 1)  # at the second after write, the first written
        os.close(good)
    finally:
        wb.close()
        writer.join(10)
        os.close(ro)
        os.close(idx)
    assert (tmp_path / "idx").read_bytes() == b"entry"
    assert (tmp_path / "good").read_bytes() == b"records"


def test_the_writer_thread_returns_a_write_nobody_collects_within_the_linger(tmp_path):
    wb = _codec.WriteBehind()
    fd = _open(tmp_path / "seg")
    try:
        wb.submit(fd, [b"abc"], 3, *LIMITS, [])  # submitted before the writer thread runs: it waits
        assert wb.run(0.01) == 1  # written, not collected in 10 ms: back to its caller
        assert wb.collect() == (0, -1)
        wb.close()
        assert wb.run(0.01) == -1
        with pytest.raises(RuntimeError, match="closed"):
            wb.submit(fd, [b"d"], 1, *LIMITS, [])
    finally:
        os.close(fd)
    assert (tmp_path / "seg").read_bytes() == b"abc"


def test_bad_arguments_are_refused_before_anything_is_submitted(tmp_path):
    wb = _codec.WriteBehind()
    fd = _open(tmp_path / "seg")
    try:
        with pytest.raises(TypeError, match="piece 1 is bytearray"):
            wb.submit(fd, [b"a", bytearray(b"b")], 2, *LIMITS, [])
        with pytest.raises(ValueError, match="hold 2 bytes, not 3"):
            wb.submit(fd, [b"a", b"b"], 3, *LIMITS, [])
        with pytest.raises(TypeError, match="after write 0 is not"):
            wb.submit(fd, [b"a"], 1, *LIMITS, [(fd, "not bytes", -1)])
        with pytest.raises(ValueError, match="limits must be positive"):
            wb.submit(fd, [b"a"], 1, 0, 1, 1, 1, [])
        with pytest.raises(ValueError, match="linger must be positive"):
            wb.run(0.0)
        assert wb.poll() is None  # nothing was submitted
        wb.submit(fd, [b"ok"], 2, *LIMITS, [])  # and a good write still can be
        assert wb.run(0.01) == 1 and wb.collect() == (0, -1)
    finally:
        wb.close()
        os.close(fd)
    assert (tmp_path / "seg").read_bytes() == b"ok"
