"""A write that fails (file-size limit: EFBIG, the same path as a full disk) fails loudly
and leaves the log readable up to its last whole record."""

import subprocess
import sys
from pathlib import Path

import pytest

from filechannel import FileChannel

PROCS = Path(__file__).parent / "procs"


@pytest.mark.parametrize(
    ("limit", "pad", "flush_every"),
    [(64 * 1024 + 100, 200, 10), (1024 * 1024 + 100, 100_000, 10), (4 * 1024 * 1024 + 100, 200, 0)],
    ids=["small records, joined writes", "large records, writev", "full buffers written behind, no flush"],
)
def test_write_failure_is_loud_and_the_log_stays_whole(tmp_path, limit, pad, flush_every):
    path = tmp_path / "ch"
    proc = subprocess.run(
        [sys.executable, str(PROCS / "limited_writer.py"), str(path), str(limit), str(pad), str(flush_every)],
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
    assert good > 0 or not flush_every
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
