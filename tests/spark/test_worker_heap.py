"""A reused Spark Python worker freezes its long-lived heap (filechannel/spark/worker_heap.py).

The rules run in a fresh interpreter of their own (``gc.freeze()`` in a test worker would hold
its heap for the rest of the session); the wiring runs in the session's Spark.
"""

import os
import subprocess
import sys

from .helpers import make_topic, read

# settle() as tasks call it, in a process that says whether each call froze anything.
RULES = r"""
import gc, os, sys
from filechannel.spark import worker_heap
from filechannel.spark.storages import PROCESS_STORAGES

def froze():
    before = gc.get_freeze_count()
    worker_heap.settle()
    return gc.get_freeze_count() > before

first = froze()
made_by_a_task = [[i] for i in range(1000)]  # a task's objects, not long-lived state
again = froze()
import colorsys  # a module first imported by a task (a stdlib one nothing here imported)
after_import = froze()
PROCESS_STORAGES.get("file://" + sys.argv[1])  # a storage client made by a task
after_client = froze()
print(first, again, after_import, after_client)
"""


def _settle_calls(tmp_path, reused: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REUSE_WORKER"}
    if reused:
        env["SPARK_REUSE_WORKER"] = "1"  # as Spark sets it for its reused Python workers
    proc = subprocess.run(
        [sys.executable, "-c", RULES, str(tmp_path / "tier")], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_reused_worker_freezes_at_its_first_task_and_when_its_long_lived_state_grows_never_per_task(tmp_path):
    assert _settle_calls(tmp_path, reused=True) == "True False True True"


def test_outside_a_reused_worker_nothing_is_frozen(tmp_path):
    assert _settle_calls(tmp_path, reused=False) == "False False False False"


# The first thing a read task and a sink task do in a reused worker (nothing to read, nothing to stage).
TASK_STARTS = r"""
import gc, sys
from pyspark.sql.datasource import InputPartition
from filechannel.spark.sink import SinkSpec, stage
from filechannel.spark.source import read_partition

list(read_partition(InputPartition(None)))  # pyspark's empty partition of a batch
after_read = gc.get_freeze_count()
import colorsys  # the heap grew: the next task start freezes again
stage(SinkSpec(sys.argv[1], "t", None), iter(()))
print(after_read > 0, gc.get_freeze_count() > after_read)
"""


def test_read_and_sink_tasks_settle_the_heap_when_they_start(tmp_path):
    env = {**os.environ, "SPARK_REUSE_WORKER": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", TASK_STARTS, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True True"


def test_the_workers_that_read_a_topic_keep_their_heap_frozen(spark, tmp_path):
    """After a read of many tasks, the workers that ran them hold most of their objects frozen,
    so the collection pyspark runs after each task walks only what that task made. The probe is
    a data source too: Spark runs its tasks in the same pool of Python workers as ours."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    root = tmp_path / "root"
    make_topic(root, "t", partitions=2, n=2000)
    assert read(spark, root, "t", minPartitions="16").count() == 2000

    class HeapReader(DataSourceReader):
        def partitions(self):
            return [InputPartition(i) for i in range(4)]

        def read(self, partition):
            import gc
            import os

            yield os.getpid(), gc.get_freeze_count(), len(gc.get_objects())

    class HeapProbe(DataSource):
        @classmethod
        def name(cls):
            return "fc_heap_probe"

        def schema(self):
            return "pid int, frozen long, tracked long"

        def reader(self, schema):
            return HeapReader()

    spark.dataSource.register(HeapProbe)
    seen = [tuple(r) for r in spark.read.format("fc_heap_probe").load().collect()]
    assert any(frozen > tracked for _, frozen, tracked in seen), seen
