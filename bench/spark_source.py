"""Spark workload: a streaming availableNow query over 1 M records of 100 B into a count.

Each query runs three times, alternating with the ceiling; the fastest run of each counts.

Measured against the ceiling of pyspark's Python Data Source API: a source that yields
the same rows, with the same schema, as prebuilt Arrow batches from memory. Both run in
the same Spark session, one after the other, into the ``noop`` sink.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

from .measure import Row, in_child

ROWS_PER_BATCH = 8192


def _memory_source() -> Any:
    """A streaming source of N rows as Arrow batches built once (the API's ceiling)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    from filechannel import Record
    from filechannel.spark.schema import SCHEMA, records_to_batch

    class Part(InputPartition):
        def __init__(self, start: int, end: int) -> None:
            self.start, self.end = start, end

    class MemoryReader(DataSourceStreamReader):
        def __init__(self, n: int) -> None:
            self.n = n

        def initialOffset(self) -> dict:
            return {"offset": 0}

        def latestOffset(self) -> dict:
            return {"offset": self.n}

        def partitions(self, start: dict, end: dict) -> list:
            a, b = start["offset"], end["offset"]
            mid = (a + b) // 2
            return [Part(a, mid), Part(mid, b)] if b > a else []

        def read(self, partition: Any) -> Any:
            template = records_to_batch("t", 0, [Record(i, 1_700_000_000_000, None, b"x" * 100) for i in range(ROWS_PER_BATCH)])
            left = partition.end - partition.start
            while left > 0:
                yield template if left >= ROWS_PER_BATCH else template.slice(0, left)
                left -= ROWS_PER_BATCH

    class MemorySource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "fcbench_memory"

        def schema(self) -> Any:
            return SCHEMA

        def streamReader(self, schema: Any) -> Any:
            return MemoryReader(int(self.options["rows"]))

    return MemorySource


def _timed_query(df: Any) -> tuple[int, float]:
    t0 = time.perf_counter()
    q = (
        df.writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="fc-bench-ck-"))  # under in_child's scratch folder
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    secs = time.perf_counter() - t0
    return sum(p["numInputRows"] for p in q.recentProgress), secs


def _spark_run(n: int) -> list[dict[str, Any]]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import filechannel.spark
    from filechannel.client import Admin

    with tempfile.TemporaryDirectory(prefix="fc-bench-") as root:
        Admin(root).create_topic("t", partitions=2)
        for p in range(2):
            with Admin(root).open_partition("t", p, maintenance_interval=0) as ch:
                s = ch.sender()
                for i in range(0, n // 2, 10_000):
                    s.send_many([b"x" * 100] * min(10_000, n // 2 - i))
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("filechannel-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.local.dir", os.path.join(root, ".spark"))
            .getOrCreate()
        )
        try:
            spark.sparkContext.setLogLevel("ERROR")
            filechannel.spark.register(spark)
            spark.dataSource.register(_memory_source())
            # warm-up: start the Python workers once, so neither run pays for it
            _timed_query(spark.readStream.format("fcbench_memory").option("rows", "10000").load())
            ours = spark.readStream.format("filechannel").option("root", root).option("subscribe", "t")
            ceiling = spark.readStream.format("fcbench_memory").option("rows", str(n))
            # Best of three, alternating: single runs on a shared 2-core machine vary by 20%.
            ours_runs, mem_runs = [], []
            for _ in range(3):
                ours_runs.append(_timed_query(ours.option("startingOffsets", "earliest").load()))
                mem_runs.append(_timed_query(ceiling.load()))
            ours_n, ours_s = min(ours_runs, key=lambda r: r[1])
            mem_n, mem_s = min(mem_runs, key=lambda r: r[1])
        finally:
            spark.stop()
    return [
        Row(
            "spark streaming availableNow -> noop",
            'format("filechannel")',
            "source reads the channel files",
            100,
            ours_n,
            ours_n / ours_s,
            ours_n * 100 / ours_s / 1e6,
            ours=True,
        ).to_json(),
        Row(
            "spark streaming availableNow -> noop",
            "in-memory Arrow source (API ceiling)",
            "none",
            100,
            mem_n,
            mem_n / mem_s,
            mem_n * 100 / mem_s / 1e6,
        ).to_json(),
    ]


def run(quick: bool) -> list[Row]:
    n = 100_000 if quick else 1_000_000
    try:
        return [Row(**r) for r in in_child(_spark_run, n, timeout=900)]
    except Exception as exc:
        return [
            Row(
                "spark streaming availableNow -> noop",
                'format("filechannel")',
                "",
                100,
                ours=True,
                error=str(exc).splitlines()[0],
            )
        ]
