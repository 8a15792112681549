"""Spark executors read offloaded ranges straight from tier-2 (a real SeaweedFS), never from the channel's folder.

One SeaweedFS server for the module, and the session's one Spark (local[2]). Credentials reach
the Python workers the way a cluster hands them over: ``spark.executorEnv.*``, which pyspark
keeps in ``SparkContext.environment`` and gives the workers of a data source registered after
it is set (:func:`executor_env`). They are never in the plan, the options or the checkpoint.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pickle
from collections.abc import Iterator

import pytest

import filechannel.spark
from filechannel.bench.seaweed import SeaweedServer, running_seaweed
from filechannel.client import Admin, Producer
from filechannel.spark.options import SourceOptions
from filechannel.spark.ranges import OffsetRange
from filechannel.spark.source import FileChannelBatchReader
from filechannel.spark.tier import TierRange
from filechannel.tiering.daemon import TieringDaemon

from .helpers import read, stream

pytestmark = [pytest.mark.spark, pytest.mark.s3]

N = 6000  # records per partition


@pytest.fixture(scope="module")
def seaweed() -> Iterator[SeaweedServer]:
    with running_seaweed() as server:
        yield server


@contextlib.contextmanager
def executor_env(spark, env: dict[str, str]) -> Iterator[None]:
    """The Python workers of format("filechannel") run with ``env`` (what spark.executorEnv.* sets)."""
    sc = spark.sparkContext
    saved = dict(sc.environment)
    sc.environment.update(env)
    filechannel.spark.register(spark)  # the workers' environment is taken when the source is registered
    try:
        yield
    finally:
        sc.environment.clear()
        sc.environment.update(saved)
        filechannel.spark.register(spark)


def credentials(server: SeaweedServer) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}


# Workers without credentials: empty variables hide any the JVM inherited, and boto3's other sources are off.
NO_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "",
    "AWS_SECRET_ACCESS_KEY": "",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
    "AWS_CONFIG_FILE": "/nonexistent/config",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def offloaded_topic(root, server: SeaweedServer, monkeypatch, partitions: int = 1) -> str:
    """Topic "t" in a new bucket: N records a partition, every sealed segment uploaded, all but the last few deleted locally."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)  # the daemon's, on the channel's machine
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    bucket = server.new_bucket()
    Admin(root).create_topic(
        "t",
        partitions=partitions,
        tier=f"s3://{bucket}/fc",
        tier_options={"endpoint_url": server.endpoint, "region_name": "us-east-1"},
        segment_bytes=16384,
        compression_block_bytes=2048,
        tier_chunk_bytes=3000,  # blocks span chunks
        local_retention_bytes=20000,
    )
    with Producer(root) as p:
        for i in range(N * partitions):
            p.send("t", f"row-{i:06d}".encode() * 3, partition=i % partitions)
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert report.failures == [] and report.deleted_local > 0
    return f"s3://{bucket}/fc"


def expected(partitions: int = 1, n: int = N) -> list[tuple[int, int, bytes]]:
    return sorted((i % partitions, i // partitions, f"row-{i:06d}".encode() * 3) for i in range(n * partitions))


def rows(df) -> list[tuple[int, int, bytes]]:
    return sorted((r.partition, r.offset, bytes(r.value)) for r in df.select("partition", "offset", "value").collect())


def plan(root, **options) -> list:
    opts = SourceOptions.parse({"root": str(root), "subscribe": "t", **options}, batch=True)
    return FileChannelBatchReader(opts).partitions()


def test_executors_read_offloaded_ranges_without_the_channel_folder(spark, tmp_path, seaweed, monkeypatch):
    root = tmp_path / "root"
    url = offloaded_topic(root, seaweed, monkeypatch, partitions=2)
    tasks = plan(root)
    tier = [t for t in tasks if isinstance(t, TierRange)]
    local = [t for t in tasks if isinstance(t, OffsetRange)]
    assert {t.partition for t in tier} == {t.partition for t in local} == {0, 1}
    uploaded_end = {t.partition: t.end for t in tier}
    assert all(t.start == uploaded_end[t.partition] and t.end == N for t in local)  # the tail alone goes through the channel
    for t in tier:  # what an executor gets: no root, no credential
        shipped = pickle.dumps(t)
        assert str(root).encode() not in shipped and seaweed.secret_key.encode() not in shipped
        assert t.storage_url == url and not hasattr(t, "root")
    with executor_env(spark, credentials(seaweed)):
        ends = filechannel.spark.uploaded_end_offsets(str(root), ["t"])
        assert ends == {"t": {str(p): off for p, off in uploaded_end.items()}}
        df = read(spark, root, "t", endingOffsets=json.dumps(ends))
        assert df.rdd.getNumPartitions() == len(tier)  # planned now, on the driver, with the root there
        # What guarantees the workers never touched the folder: it is gone before any task
        # runs. A task that opened the channel (or a plan made again) would fail: no root, no topic.
        hidden = tmp_path / "elsewhere"
        os.rename(root, hidden)
        try:
            offloaded = rows(df)
        finally:
            os.rename(hidden, root)
        assert offloaded == [r for r in expected(2) if r[1] < uploaded_end[r[0]]]
        # The whole topic: tier-2 by the executors, the tail through the channel; as without tiering.
        assert rows(read(spark, root, "t")) == expected(2)
        assert rows(read(spark, root, "t", tierDirectReads="false")) == expected(2)


def test_several_tasks_over_one_offloaded_partition_keep_order_and_never_repeat(spark, tmp_path, seaweed, monkeypatch):
    root = tmp_path / "root"
    offloaded_topic(root, seaweed, monkeypatch)
    with executor_env(spark, credentials(seaweed)):
        for options in ({"minPartitions": "5"}, {"minPartitions": "40"}, {"maxRecordsPerPartition": "700"}):
            tasks = plan(root, **options)
            tier = [t for t in tasks if isinstance(t, TierRange)]
            assert len(tasks) >= 5 and len(tasks) == len(tier) + 1  # the local tail stays one task
            assert all(a.end == b.start for a, b in itertools.pairwise(tasks))
            segments = {s.base_offset for t in tier for s in t.segments}
            if options.get("minPartitions") == "40":  # more than the segments: cut at block bounds too
                assert len(tier) > len(segments) and any(t.start not in segments for t in tier)
            df = read(spark, root, "t", **options)
            parts = df.select("offset", "value").rdd.glom().collect()
            assert len(parts) >= len(tier)
            for part in parts:  # each task yields its rows in offset order
                assert [r.offset for r in part] == sorted(r.offset for r in part)
            offsets = [r.offset for part in parts for r in part]
            assert sorted(offsets) == list(range(N))  # complete, no duplicates at the cuts
            values = {r.offset: bytes(r.value) for part in parts for r in part}
            assert all(values[o] == f"row-{o:06d}".encode() * 3 for o in (0, 1, N // 2, N - 1))


def test_an_executor_without_credentials_fails_naming_the_storage(spark, tmp_path, seaweed, monkeypatch):
    root = tmp_path / "root"
    url = offloaded_topic(root, seaweed, monkeypatch)
    with executor_env(spark, NO_CREDENTIALS), pytest.raises(Exception) as failed:
        read(spark, root, "t").collect()
    message = str(failed.value)
    assert "AccessDeniedError" in message and f"cannot read tier-2 storage {url}" in message
    assert "spark.executorEnv.AWS_ACCESS_KEY_ID" in message and "no usable credentials" in message


def test_available_now_backfill_then_live_batches_from_the_local_tail(spark, tmp_path, seaweed, monkeypatch):
    root = tmp_path / "root"
    offloaded_topic(root, seaweed, monkeypatch)
    out, ck = tmp_path / "out", tmp_path / "ck"

    def query(**trigger):
        return (
            stream(spark, root, "t", startingOffsets="earliest", maxOffsetsPerTrigger="2500")
            .select("partition", "offset", "value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ck))
            .trigger(**trigger)
            .start()
        )

    with executor_env(spark, credentials(seaweed)):
        backfill = query(availableNow=True)
        backfill.awaitTermination()
        assert rows(spark.read.parquet(str(out))) == expected()
        live = query(processingTime="200 milliseconds")
        try:
            with Producer(root) as p:
                for i in range(N, N + 300):
                    p.send("t", f"row-{i:06d}".encode() * 3, partition=0)
            live.processAllAvailable()
        finally:
            live.stop()
    assert rows(spark.read.parquet(str(out))) == expected(n=N + 300)  # every offset once, as without tiering
    logs = [name for name in os.listdir(ck / "offsets") if not name.startswith(".")]  # not Hadoop's .crc files
    assert logs
    for name in logs:  # the checkpoint holds offsets, never a plan or a storage
        text = (ck / "offsets" / name).read_text()
        assert "s3://" not in text and seaweed.access_key not in text and "segments" not in text
