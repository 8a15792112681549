"""Batches of values freed without glibc giving its heap back (filechannel/engine/heap.py).

In a fresh process glibc gave back the top of its heap whenever a freed batch exceeded
its trim threshold (128 KiB there), and the next batch faulted every page in again: 64 KiB
records read 16 at a time took 17.7 page faults a record (a quarter of the read rate), a
worker thread's batches as many. Faults are counted, not timed: they do not depend on the
machine's speed.
"""

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from filechannel import FileChannel

PROCS = Path(__file__).parent / "procs"

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc thresholds")


@pytest.mark.parametrize("size, batch", [(65536, 16), (65536, 100), (1024, 2000)])
def test_a_fresh_process_reads_batches_without_faulting_their_pages_in_again(tmp_path, size, batch):
    n = 4 * (8 << 20) // size  # the bytes of several fills, whatever the size
    with FileChannel(tmp_path, compression="none", maintenance_interval=0) as ch:
        ch.sender().send_many([bytes([i % 251]) * size for i in range(n)])
    out = subprocess.run(
        [sys.executable, str(PROCS / "batch_reader.py"), str(tmp_path), str(batch)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    main_thread, worker = map(float, out.split())
    # A page of a record is 4096 bytes: without the room, size / 4096 faults or more a record.
    assert main_thread < 0.1 * max(1, size / 4096)
    assert worker < 0.1 * max(1, size / 4096)
