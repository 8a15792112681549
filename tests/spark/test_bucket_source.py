"""Spark reads a tier URL alone (``option("tier")``, issue 37): nothing mounted, only the bucket.

Real roots with origins tier into one SeaweedFS bucket (the session's server) and are then
deleted, so whatever Spark reads comes from the bucket alone; the session's Spark (local[2])
reads the union by batch, by ``availableNow`` streams and by a running stream, every record once
per origin with its bytes and its ``origin`` column. The option errors are checked against a
folder URL and a port nothing listens on.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from filechannel.bench.seaweed import SeaweedServer, wait_for
from filechannel.client import Admin
from filechannel.errors import ConfigError, StorageUnavailableError, UnknownTopicError
from filechannel.spark.bucket import STATE_PREFIX, BucketCatalog
from filechannel.spark.errors import DataLossError
from filechannel.spark.options import SourceOptions
from filechannel.spark.source import FileChannelBatchReader, FileChannelStreamReader, read_partition
from filechannel.spark.tier import TierRange
from filechannel.tiering.daemon import TieringDaemon

from ..tiering.test_origins import edge_root, listing, produce, upload_all, value
from .helpers import available_now_to_parquet
from .test_tier_executors import credentials, executor_env

pytestmark = pytest.mark.spark

Row = tuple[str, str, int, int, bytes]


@pytest.fixture
def s3(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict]:
    """A new bucket's tier URL and its non-secret options; the keys in this process's environment
    (the edge daemons' and the driver's planning in the tests that call the readers directly)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    return f"s3://{seaweed.new_bucket()}/fc", {"endpoint_url": seaweed.endpoint, "region_name": "us-east-1"}


def edge(tmp_path: Path, origin: str, url: str, options: dict, count: int) -> None:
    """A root of ``origin`` whose ``count`` records of topic clicks (2 partitions) are all
    uploaded to ``url``, then deleted: what is read afterwards is in the bucket alone."""
    root = edge_root(tmp_path, origin, url, options)
    produce(root, origin, count)
    upload_all(root)
    shutil.rmtree(root)


def expected(*origins: tuple[str, int]) -> list[Row]:
    """Every record of each (origin, count), as :func:`rows` sorts them."""
    return sorted((o, "clicks", i % 2, i // 2, value(o, i)) for o, count in origins for i in range(count))


def rows(df) -> list[Row]:
    got = df.select("origin", "topic", "partition", "offset", "value").collect()
    return sorted((r.origin, r.topic, r.partition, r.offset, bytes(r.value)) for r in got)


def dead_catalog_folders() -> list[str]:
    """The state folders of bucket catalogs (spark/bucket.py) whose process no longer runs."""
    dead = []
    for name in os.listdir(tempfile.gettempdir()):
        if name.startswith(STATE_PREFIX):
            try:
                os.kill(int(name[len(STATE_PREFIX) :].split("-")[0]), 0)
            except ProcessLookupError:
                dead.append(name)
    return dead


def bucket_source(reader, url: str, options: dict, **extra: str):
    reader = reader.format("filechannel").option("tier", url).option("tierOptions", json.dumps(options))
    for k, v in extra.items():
        reader = reader.option(k, v)
    return reader.load()


@pytest.mark.s3
def test_two_origins_read_from_the_bucket_alone_by_a_batch_and_available_now_streams_once_each(
    spark, seaweed: SeaweedServer, s3: tuple[str, dict], tmp_path: Path
) -> None:
    url, options = s3
    edge(tmp_path, "edge-1", url, options, 120)
    edge(tmp_path, "edge-2", url, options, 90)
    before = listing(url, options)

    # The driver's plan: tier tasks only, at each origin's prefix, labelled, with no secret and no root.
    opts = SourceOptions.parse(
        {"tier": url, "tierOptions": json.dumps(options), "origins": "edge-*", "subscribe": "clicks", "minPartitions": "6"},
        batch=True,
    )
    tasks = [t for t in FileChannelBatchReader(opts).partitions() if isinstance(t, TierRange)]
    assert len(tasks) >= 6 and tasks == FileChannelBatchReader(opts).partitions()  # tier tasks only
    assert {(t.origin, t.topic, t.storage_url) for t in tasks} == {(o, "clicks", f"{url}/{o}") for o in ("edge-1", "edge-2")}
    assert seaweed.secret_key.encode() not in pickle.dumps(tasks) and str(tmp_path).encode() not in pickle.dumps(tasks)
    read = sorted((b["origin"][0].as_py(), b["offset"][0].as_py()) for t in tasks for b in read_partition(t))
    assert read and {o for o, _ in read} == {"edge-1", "edge-2"}

    with executor_env(spark, credentials(seaweed)):
        df = bucket_source(spark.read, url, options, origins="edge-*", subscribe="clicks", includeHeaders="true")
        assert df.columns[-2:] == ["headers", "origin"]  # Kafka's columns, then the origin
        assert rows(df) == expected(("edge-1", 120), ("edge-2", 90))

        out, ck = tmp_path / "out", tmp_path / "ck"

        def available_now() -> list[Row]:
            stream = bucket_source(
                spark.readStream, url, options, origins="edge-*", subscribe="clicks", startingOffsets="earliest"
            )
            available_now_to_parquet(stream.select("origin", "topic", "partition", "offset", "value"), out, ck)
            return rows(spark.read.parquet(str(out)))

        assert available_now() == expected(("edge-1", 120), ("edge-2", 90))
        assert listing(url, options) == before  # the queries wrote, rewrote and deleted nothing

        # A new origin the glob matches is picked up by the next trigger, from its first offset;
        # one it does not match is not read.
        edge(tmp_path, "edge-3", url, options, 60)
        edge(tmp_path, "other", url, options, 10)
        assert available_now() == expected(("edge-1", 120), ("edge-2", 90), ("edge-3", 60))


@pytest.mark.s3
def test_a_running_stream_follows_new_uploads_and_picks_up_new_origins(
    spark, seaweed: SeaweedServer, s3: tuple[str, dict], tmp_path: Path
) -> None:
    url, options = s3
    root = edge_root(tmp_path, "edge-1", url, options)
    produce(root, "edge-1", 40)
    upload_all(root)
    with executor_env(spark, credentials(seaweed)):
        stream = bucket_source(
            spark.readStream, url, options, subscribePattern="cl.*", **{"kafka.metadata.max.age.ms": "1"}
        )  # startingOffsets latest (a stream's default): what edge-1 uploaded before is not read
        query = (
            stream.select("origin", "topic", "partition", "offset", "value")
            .writeStream.format("memory")
            .queryName("bucket_rows")
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            query.processAllAvailable()
            assert rows(spark.table("bucket_rows")) == []
            produce(root, "edge-1", 30, start=40)  # new uploads of a known origin: read from where it was
            upload_all(root)
            edge(tmp_path, "edge-2", url, options, 50)  # a new origin: read from its first offset
            want = sorted([r for r in expected(("edge-1", 70)) if r[3] >= 20] + expected(("edge-2", 50)))

            def caught_up() -> bool:
                # (a trigger that listed the bucket just before the upload may end processAllAvailable early)
                query.processAllAvailable()
                return len(rows(spark.table("bucket_rows"))) >= len(want)

            wait_for(caught_up, 120, f"{len(want)} rows")
            got = rows(spark.table("bucket_rows"))
        finally:
            query.stop()
    assert got == want
    # Spark ends the reader's process without its stop(): the next catalog removes what it left. (Spark
    # may still be ending it when stop() returns, and other workers' Spark processes end too: a catalog
    # made before a process is gone leaves that one's folder to the next catalog.)

    def next_catalog_cleaned_up() -> bool:
        BucketCatalog(url, options, None, max_age_s=1).close()
        return dead_catalog_folders() == []

    wait_for(next_catalog_cleaned_up, 60, "a new catalog to find no folder of an ended process left")


def test_a_stream_of_origins_not_there_yet_waits_and_a_batch_says_what_is_there(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    opts = {"tier": url, "origins": "edge-*", "subscribe": "clicks", "kafka.metadata.max.age.ms": "1"}
    reader = FileChannelStreamReader(SourceOptions.parse(opts, batch=False))  # nothing claimed at the URL yet
    try:
        start = reader.initialOffset()
        assert start == {} and reader.latestOffset(start, ReadAllAvailable()) == {}
        edge(tmp_path, "other", url, {}, 10)
        assert reader.latestOffset(start, ReadAllAvailable()) == {}  # an origin the glob does not match
        with pytest.raises(
            UnknownTopicError, match=r"no topic of origins edge-\* matches subscribe clicks .*origins there: other"
        ):
            SourceOptions.parse(opts, batch=True)
        edge(tmp_path, "edge-1", url, {}, 10)
        assert reader.latestOffset(start, ReadAllAvailable()) == {"edge-1.clicks": {"0": 5, "1": 5}}
        tasks = reader.partitions(start, {"edge-1.clicks": {"0": 5, "1": 5}})
        assert [(t.origin, t.topic, t.start, t.end) for t in tasks if isinstance(t, TierRange)] == [
            ("edge-1", "clicks", 0, 5),
            ("edge-1", "clicks", 0, 5),
        ]
    finally:
        reader.stop()


def test_bounds_by_timestamp_and_by_json_offsets_of_origin_partitions(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    root = edge_root(tmp_path, "edge-1", url, {}, partitions=1)
    produce(root, "edge-1", 100, partitions=1, timestamp=1_000_000)
    produce(root, "edge-1", 100, start=100, partitions=1, timestamp=2_000_000)
    upload_all(root)
    shutil.rmtree(root)

    def read(**bounds: str) -> list[tuple[str, str, int, bytes]]:
        opts = SourceOptions.parse({"tier": url, "subscribe": "clicks", **bounds}, batch=True)
        return [
            (r["origin"], r["topic"], r["offset"], r["value"])
            for t in FileChannelBatchReader(opts).partitions()
            for b in read_partition(t)
            for r in b.to_pylist()
        ]

    assert read(startingTimestamp="1500000", endingOffsetsByTimestamp='{"edge-1.clicks":{"0":3000000}}') == [
        ("edge-1", "clicks", i, value("edge-1", i)) for i in range(100, 200)
    ]
    assert [r[2] for r in read(startingOffsets='{"edge-1.clicks":{"0":150}}', endingOffsets="uploaded")] == list(range(150, 200))
    with pytest.raises(ConfigError, match=r'"startingOffsets" has no entry for topic \'edge-1.clicks\''):
        read(startingOffsets='{"clicks":{"0":150}}')


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"root": "ROOT"}, ConfigError, r'"root" .* or "tier" .*, not both'),
        ({"tier": None}, ConfigError, r'option "root" is required: .*or option "tier"'),
        ({"tier": "bucket/fc"}, ConfigError, r'option "tier" must be a storage URL'),
        (
            {"tierOptions": '{"aws_secret_access_key": "s3cr3t"}'},
            ConfigError,
            r"must not hold credentials \(aws_secret_access_key\)",
        ),
        ({"groupId": "g"}, ConfigError, r'"groupId" .* a bucket, which has none'),
        ({"tierDirectReads": "false"}, ConfigError, r'"tierDirectReads" cannot be false with option "tier"'),
        ({"origins": "edge.1"}, ValueError, r"origin name 'edge.1' is not allowed"),
        ({"origins": "edge-1, edge.*"}, ConfigError, r"'edge.\*' is not a glob of origin names"),
    ],
)
def test_tier_options_errors_say_what_to_do(tmp_path: Path, options: dict, error: type, message: str) -> None:
    given = {"tier": f"file://{tmp_path}/bucket", "subscribe": "clicks", **options}
    given = {k: str(tmp_path) if v == "ROOT" else v for k, v in given.items() if v is not None}
    with pytest.raises(error, match=message) as info:
        SourceOptions.parse(given, batch=None)
    assert "s3cr3t" not in str(info.value)


def test_origins_go_with_tier_and_an_unreachable_bucket_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unused_port: int
) -> None:
    with pytest.raises(ConfigError, match=r'"origins" goes with option "tier"'):
        SourceOptions.parse({"root": str(tmp_path), "subscribe": "clicks", "origins": "a"}, batch=None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "reader")  # (no server answers: any key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "reader")
    port = unused_port
    dead = {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1", "max_attempts": 1}
    with pytest.raises(StorageUnavailableError, match=f"127.0.0.1:{port}"):
        SourceOptions.parse({"tier": "s3://nowhere/fc", "tierOptions": json.dumps(dead), "subscribe": "clicks"}, batch=None)


def test_errors_reach_spark_s_error_path(spark, tmp_path: Path) -> None:
    df = spark.read.format("filechannel").option("root", str(tmp_path)).option("tier", f"file://{tmp_path}/b")
    with pytest.raises(Exception, match=r'give option "root" .* or "tier" .*, not both'):
        df.option("subscribe", "clicks").load()
    nothing = spark.read.format("filechannel").option("tier", f"file://{tmp_path}/b").option("subscribe", "clicks").load()
    with pytest.raises(Exception, match=r"no topic of every origin matches subscribe clicks \(origins there: none"):
        nothing.collect()  # (a batch is known to be one only when planned)


@pytest.mark.s3
def test_a_start_retention_deleted_is_data_loss_and_skipped_with_fail_on_data_loss_false(tmp_path: Path) -> None:
    """Retention deleting a partition's first segments between the bounds a query was given and
    its plan: the range starts where the bucket now starts, or the query fails saying how."""
    url = f"file://{tmp_path}/bucket"
    root = edge_root(tmp_path, "edge-1", url, {}, partitions=1)
    produce(root, "edge-1", 300, partitions=1)
    upload_all(root)
    Admin(root).alter_topic("clicks", {"retention_bytes": 4096})
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []

    def offsets(**options: str) -> list[Any]:
        bounds = {"startingOffsets": '{"edge-1.clicks":{"0":0}}', **options}
        opts = SourceOptions.parse({"tier": url, "subscribe": "clicks", **bounds}, batch=True)
        return [o for t in FileChannelBatchReader(opts).partitions() for b in read_partition(t) for o in b["offset"].to_pylist()]

    with pytest.raises(DataLossError, match=r"clicks\[0\]: offset 0 is no longer there, the first offset is (\d+)") as lost:
        offsets()
    first = int(lost.value.args[0].split("the first offset is ")[1].split(" ")[0])
    assert 0 < first < 300
    assert offsets(failOnDataLoss="false") == list(range(first, 300))
