"""write_pieces writes every byte in order, whichever way it splits and batches the calls."""

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from filechannel.engine import files

pieces_st = st.lists(st.binary(min_size=0, max_size=3000), max_size=40)


@settings(max_examples=200, deadline=None)
@given(pieces=pieces_st, write_bytes=st.integers(1, 5000), iov_max=st.integers(1, 8))
def test_write_pieces_writes_all_in_order(tmp_path_factory, pieces, write_bytes, iov_max):
    path = tmp_path_factory.mktemp("w") / "f"
    saved = files._WRITE_BYTES, files._IOV_MAX
    files._WRITE_BYTES, files._IOV_MAX = write_bytes, iov_max  # small, to split often
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd, b"head")
            files.write_pieces(fd, pieces, sum(map(len, pieces)))
        finally:
            os.close(fd)
    finally:
        files._WRITE_BYTES, files._IOV_MAX = saved
    assert path.read_bytes() == b"head" + b"".join(pieces)
