"""A write that fails (file-size limit: EFBIG, the same path as a full disk) fails loudly
and leaves the log readable up to its last whole record."""

import subprocess
import sys
from pathlib import Path

import pytest

from filechannel import FileChannel

PROCS = Path(__file__).parent / "procs"


@pytest.mark.parametrize(
    ("limit", "pad"),
    [(64 * 1024 + 100, 200), (1024 * 1024 + 100, 100_000)],
    ids=["small records, joined writes", "large records, writev"],
)
def test_write_failure_is_loud_and_the_log_stays_whole(tmp_path, limit, pad):
    path = tmp_path / "ch"
    proc = subprocess.run(
        [sys.executable, str(PROCS / "limited_writer.py"), str(path), str(limit), str(pad)],
        capture_output=True,
        timeout=120,
    )
    out = proc.stdout.decode()
    # The send that meets the error raises DiskFullError; if the background flusher met it
    # first, the next send raises SenderFailedError carrying the same message.
    assert "failed DiskFullError" in out or "failed SenderFailedError" in out, out + proc.stderr.decode()
    assert str(path) in out  # the message names the file
    assert "File too large. Free some space" in out  # and says what to do
    assert "then SenderFailedError" in out
    good = int(out.split("good ")[1].split()[0])
    assert good > 0
    with FileChannel(path, maintenance_interval=0) as ch:
        rx = ch.receiver()
        records = []
        while batch := rx.recv_many(10_000, timeout=0):
            records.extend(batch)
        assert [r.offset for r in records] == list(range(len(records)))
        assert len(records) >= good + 1
        assert all(r.value == b"record-%06d" % r.offset + b"." * pad for r in records)
        assert ch.check() == len(records)
        assert ch.sender().send(b"after reopen") == len(records)
