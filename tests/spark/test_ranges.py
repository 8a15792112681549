"""Reading one offset range into Arrow batches (no Spark session: this is the executor's half)."""

import os
import subprocess
import sys

import pyarrow as pa
import pytest

from filechannel.client import Admin
from filechannel.spark.ranges import OffsetRange, read_range
from filechannel.spark.schema import arrow_schema

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("batch_rows", [1, 100, 512, 1000, 8192])
def test_batches_hold_every_record_of_the_range_in_order(tmp_path, batch_rows):
    root = tmp_path / "root"
    Admin(root).create_topic("t", partitions=1, segment_bytes=64 * 1024)
    with Admin(root).open_partition("t", 0, maintenance_interval=0) as ch:
        s = ch.sender()
        for i in range(3000):
            s.send(b"v%d" % i, key=b"k%d" % i if i % 3 == 0 else None, headers=[("h", b"%d" % i)] if i % 7 == 0 else None)
    batches = list(read_range(OffsetRange(str(root), "t", 0, 250, 2750, include_headers=True), batch_rows))
    assert all(b.schema == arrow_schema(True) for b in batches)
    assert all(b.num_rows == batch_rows for b in batches[:-1]) and 0 < batches[-1].num_rows <= batch_rows
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(250, 2750))
    assert table.column("value").to_pylist() == [b"v%d" % i for i in range(250, 2750)]
    assert table.column("key").to_pylist() == [b"k%d" % i if i % 3 == 0 else None for i in range(250, 2750)]
    headers = table.column("headers").to_pylist()
    assert headers == [[{"key": "h", "value": b"%d" % i}] if i % 7 == 0 else None for i in range(250, 2750)]
    assert set(table.column("topic").to_pylist()) == {"t"} and set(table.column("partition").to_pylist()) == {0}


def test_batch_builder_keeps_offsets_that_are_not_dense():
    from filechannel.engine.record import Record
    from filechannel.spark.schema import records_to_batch

    batch = records_to_batch("t", 2, [Record(5, 1, None, b"a"), Record(7, 2, b"k", b"b"), Record(8, 3, None, b"c")])
    assert batch.column("offset").to_pylist() == [5, 7, 8]
    assert batch.column("key").to_pylist() == [None, b"k", None]
    assert records_to_batch("t", 2, []).num_rows == 0
    assert batch.schema == arrow_schema(False) and batch.column("timestampType").to_pylist() == [0, 0, 0]


def test_batches_are_bounded_in_bytes_as_well_as_rows(tmp_path):
    """8,192 rows of 1 MB records would be an 8 GB batch (and over 2 GiB does not fit one
    Arrow binary array): a batch ends once its keys and values reach ``batch_bytes``."""
    root = tmp_path / "root"
    Admin(root).create_topic("t", partitions=1, compression="none")
    values = [bytes([i]) * (100 << 10) for i in range(40)]  # 4 MB
    with Admin(root).open_partition("t", 0, maintenance_interval=0) as ch, ch.sender() as s:
        s.send_many(values)
    batches = list(read_range(OffsetRange(str(root), "t", 0, 0, 40), batch_bytes=2 << 20))
    assert pa.Table.from_batches(batches).column("value").to_pylist() == values
    # each decode ends at the record that reaches 1 MiB (the 11th here): two reach 2 MiB
    assert [b.num_rows for b in batches] == [22, 18]


_EXECUTOR = """
import sys
from filechannel.spark.ranges import OffsetRange, read_range
try:
    list(read_range(OffsetRange(sys.argv[1], "t", 0, 0, 10)))
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_an_executor_that_cannot_see_the_root_says_so(tmp_path):
    """An executor of a cluster whose root is an empty mount point there (a real tmpfs mounted over
    it, in a mount namespace of its own): one error naming the root and what to do, not a
    missing topic."""
    root = tmp_path / "root"
    Admin(root).create_topic("t", partitions=1)
    with Admin(root).open_partition("t", 0) as ch, ch.sender() as tx:
        for i in range(10):
            tx.send(b"v%d" % i)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    unshare = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    script = f'mount -t tmpfs tmpfs {root} && exec {sys.executable} -c "$0" {root}'
    proc = subprocess.run([*unshare, "sh", "-c", script, _EXECUTOR], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"RootUnavailableError this Spark task ({os.uname().nodename}) cannot see the root")
    assert "mount the root on the executors" in proc.stdout
    assert len(list(read_range(OffsetRange(str(root), "t", 0, 0, 10)))) == 1  # where the root is, the same task reads
