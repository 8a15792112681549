"""write_pieces writes every byte in order, whichever way it splits and batches the calls, in C
(the GIL released for the batch) and in its Python reference."""

import errno
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filechannel.engine import files

WRITERS = [pytest.param(files.write_pieces_py, id="python")]
if files._native_write is not None:
    WRITERS.append(pytest.param(files.write_pieces, id="c"))

pieces_st = st.lists(st.binary(min_size=0, max_size=3000), max_size=40)


@pytest.mark.parametrize("write_pieces", WRITERS)
@settings(max_examples=200, deadline=None)
@given(pieces=pieces_st, write_bytes=st.integers(1, 5000), writev_bytes=st.integers(1, 5000), iov_max=st.integers(1, 8))
def test_write_pieces_writes_all_in_order(tmp_path_factory, write_pieces, pieces, write_bytes, writev_bytes, iov_max):
    path = tmp_path_factory.mktemp("w") / "f"
    saved = files._WRITE_BYTES, files._WRITEV_BYTES, files._IOV_MAX
    files._WRITE_BYTES, files._WRITEV_BYTES, files._IOV_MAX = write_bytes, writev_bytes, iov_max  # small, to split often
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd, b"head")
            write_pieces(fd, pieces, sum(map(len, pieces)))
        finally:
            os.close(fd)
    finally:
        files._WRITE_BYTES, files._WRITEV_BYTES, files._IOV_MAX = saved
    assert path.read_bytes() == b"head" + b"".join(pieces)


def test_large_records_go_to_writev_about_a_mebibyte_at_a_time_small_ones_joined(tmp_path, monkeypatch):
    # (The Python reference's calls, counted; the C version makes the same ones from the same limits.)
    # A send_many of 65 MB of 64 KiB records written in 4 MiB writevs ran at a fifth to the
    # whole of the rate of 1 MiB ones here (files._WRITEV_BYTES): the bound must hold.
    calls = []
    real_writev, real_write = os.writev, os.write
    monkeypatch.setattr(os, "writev", lambda fd, bufs: calls.append(("writev", sum(map(len, bufs)))) or real_writev(fd, bufs))
    monkeypatch.setattr(os, "write", lambda fd, data: calls.append(("write", len(data))) or real_write(fd, data))
    value = os.urandom(65536)
    large = [b"h" * 17, value] * 100  # 6.5 MB of frames of 64 KiB records
    small = [b"h" * 17, value[:100]] * 30_000  # 3.5 MB of frames of 100 B records
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        files.write_pieces_py(fd, large, sum(map(len, large)))
        large_calls, calls[:] = list(calls), []
        files.write_pieces_py(fd, small, sum(map(len, small)))
    finally:
        os.close(fd)
    assert {kind for kind, _ in large_calls} == {"writev"}
    assert sum(n for _, n in large_calls) == sum(map(len, large))
    assert max(n for _, n in large_calls) <= files._WRITEV_BYTES + 65536 + 17  # the limit, then one frame
    assert calls == [("write", sum(map(len, small)))]  # joined: one buffer under _WRITE_BYTES
    assert (tmp_path / "f").read_bytes() == b"".join(large + small)


@pytest.mark.parametrize("write_pieces", WRITERS)
def test_a_failed_write_raises_oserror_with_its_errno(tmp_path, write_pieces):
    fd = os.open(tmp_path / "f", os.O_RDONLY | os.O_CREAT)
    try:
        for pieces in ([b"h" * 17, b"v" * 100] * 10, [b"h" * 17, b"v" * 4096] * 10):  # joined, and writev
            with pytest.raises(OSError) as caught:
                write_pieces(fd, pieces, sum(map(len, pieces)))
            assert caught.value.errno == errno.EBADF
    finally:
        os.close(fd)


@pytest.mark.skipif(files._native_write is None, reason="the C extension did not build here")
def test_the_c_writer_refuses_pieces_that_are_not_bytes_or_a_wrong_total(tmp_path):
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(TypeError, match="piece 1 is bytearray"):
            files.write_pieces(fd, [b"a", bytearray(b"b")], 2)  # type: ignore[list-item]
        with pytest.raises(ValueError, match="hold 2 bytes, not 3"):
            files.write_pieces(fd, [b"a", b"b"], 3)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b""
