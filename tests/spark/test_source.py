"""format("filechannel") as a source: schema, batch ranges, streaming, limits, data loss."""

import datetime as dt
import json

import pytest

from filechannel import FileChannel
from filechannel.client import Admin, Producer

from ..client.test_transactions import crashed_commit
from .helpers import make_topic, produce, read, stream

pytestmark = pytest.mark.spark


def test_schema_and_a_binary_round_trip(spark, tmp_path):
    Admin(tmp_path).create_topic("bin", partitions=1)
    values = [bytes(range(256)), b"", b"\x00" * 10, bytes(range(255, -1, -1))]
    ts = 1_700_000_000_123
    with Producer(tmp_path) as p:
        p.send("bin", value=values[0], key=b"\xff\x00", headers=[("h1", b"\x00\x01"), ("h2", b"")], timestamp_ms=ts)
        for v in values[1:]:
            p.send("bin", value=v, timestamp_ms=ts + 1)
    df = read(spark, tmp_path, "bin", includeHeaders="true")
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
        "timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [bytes(r.value) for r in rows] == values
    assert bytes(rows[0].key) == b"\xff\x00" and rows[1].key is None
    assert [(h.key, bytes(h.value)) for h in rows[0].headers] == [("h1", b"\x00\x01"), ("h2", b"")]
    assert rows[1].headers is None
    assert [r.topic for r in rows] == ["bin"] * 4 and [r.partition for r in rows] == [0] * 4
    assert [r.offset for r in rows] == [0, 1, 2, 3]
    utc = rows[0].timestamp.replace(tzinfo=None)
    spark_tz = dt.datetime.fromtimestamp(ts / 1000).replace(tzinfo=None)  # Spark shows session-local time
    assert utc == spark_tz


def test_batch_read_of_offset_ranges(spark, tmp_path):
    make_topic(tmp_path, "r", partitions=3, n=3000)
    all_rows = read(spark, tmp_path, "r").select("partition", "offset").collect()
    assert len(all_rows) == 3000
    ends = {p: max(r.offset for r in all_rows if r.partition == p) + 1 for p in range(3)}
    start = {"r": {"0": 10, "1": -2, "2": 5}}
    end = {"r": {"0": 20, "1": 7, "2": -1}}
    got = read(spark, tmp_path, "r", startingOffsets=json.dumps(start), endingOffsets=json.dumps(end))
    got = sorted((r.partition, r.offset) for r in got.select("partition", "offset").collect())
    want = [(0, o) for o in range(10, 20)] + [(1, o) for o in range(0, 7)] + [(2, o) for o in range(5, ends[2])]
    assert got == want


def test_min_partitions_splits_large_ranges_into_tasks(spark, tmp_path):
    make_topic(tmp_path, "m", partitions=2, n=1000)
    df = read(spark, tmp_path, "m", minPartitions="7")
    assert df.rdd.getNumPartitions() >= 7
    offsets = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert len(offsets) == 1000 and len(set(offsets)) == 1000
    assert read(spark, tmp_path, "m").rdd.getNumPartitions() == 2


def _offsets(spark, path):
    return sorted((r.partition, r.offset) for r in spark.read.parquet(str(path)).select("partition", "offset").collect())


def _run(df, out, checkpoint, **trigger):
    q = (
        df.select("partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(**(trigger or {"availableNow": True}))
        .start()
    )
    q.awaitTermination()
    return q


def test_streaming_resumes_from_its_checkpoint_with_nothing_lost_or_repeated(spark, tmp_path):
    root = tmp_path / "root"
    make_topic(root, "s", partitions=3, n=1500)
    out, ck = tmp_path / "out", tmp_path / "ck"
    _run(stream(spark, root, "s", startingOffsets="earliest"), out, ck)
    first = _offsets(spark, out)
    assert len(first) == 1500
    produce(root, "s", range(1500, 2700))
    _run(stream(spark, root, "s", startingOffsets="earliest"), out, ck)  # options ignored on restart
    second = _offsets(spark, out)
    assert len(second) == 2700 and len(set(second)) == 2700
    with FileChannel(root / "s" / "0", maintenance_interval=0) as ch0:
        assert max(o for p, o in second if p == 0) == ch0.end_offset - 1
    _run(stream(spark, root, "s"), out, ck)  # nothing new: nothing added
    assert _offsets(spark, out) == second


def test_streaming_from_latest_sees_only_new_records(spark, tmp_path):
    root = tmp_path / "root"
    make_topic(root, "l", n=100)
    out, ck = tmp_path / "out", tmp_path / "ck"
    _run(stream(spark, root, "l"), out, ck)
    produce(root, "l", range(100, 130))
    _run(stream(spark, root, "l"), out, ck)
    assert _offsets(spark, out) == [(0, o) for o in range(100, 130)]


def test_max_offsets_per_trigger_bounds_each_batch(spark, tmp_path):
    root = tmp_path / "root"
    make_topic(root, "b", partitions=2, n=2500)
    q = _run(stream(spark, root, "b", startingOffsets="earliest", maxOffsetsPerTrigger="600"), tmp_path / "o", tmp_path / "c")
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 2500 and max(sizes) <= 600 and len(sizes) == 5
    assert len(set(_offsets(spark, tmp_path / "o"))) == 2500


def test_a_consumer_group_named_by_groupid_follows_the_query(spark, tmp_path):
    from filechannel.client.group import read_group

    root = tmp_path / "root"
    make_topic(root, "g", partitions=2, n=400)
    df = stream(spark, root, "g", startingOffsets="earliest", groupId="spark-etl", maxOffsetsPerTrigger="150")
    _run(df, tmp_path / "o", tmp_path / "c")
    _, committed = read_group(str(root), "spark-etl")
    # commit() runs one batch late: the last batch's end may not be committed, an earlier one is.
    assert committed and all(0 < off <= 200 for off in (committed[tp] for tp in committed))


def _shrink(root, topic):
    """Write enough into a 4 KiB-segment topic with retention that its first segments go."""
    produce(root, topic, range(3000), partition=0)
    with Admin(root).open_partition(topic, 0, maintenance_interval=0) as ch:
        ch.collect_garbage()
        return ch.first_offset


def test_fail_on_data_loss_stops_a_query_naming_the_partition_and_offsets(spark, tmp_path):
    root = tmp_path / "root"
    Admin(root).create_topic("d", partitions=1, segment_bytes=4096, retention_bytes=16384)
    first = _shrink(root, "d")
    assert first > 0
    with pytest.raises(Exception, match=rf"d\[0\]: offset 0 is no longer there, the first offset is {first}"):
        read(spark, root, "d", startingOffsets='{"d":{"0":0}}').count()
    with pytest.raises(Exception, match=r"failOnDataLoss"):
        _run(stream(spark, root, "d", startingOffsets='{"d":{"0":0}}'), tmp_path / "o", tmp_path / "c")


def test_without_fail_on_data_loss_a_query_goes_on_from_the_first_offset(spark, tmp_path):
    root = tmp_path / "root"
    Admin(root).create_topic("d", partitions=1, segment_bytes=4096, retention_bytes=16384)
    first = _shrink(root, "d")
    got = read(spark, root, "d", startingOffsets='{"d":{"0":0}}', failOnDataLoss="false").select("offset").collect()
    assert sorted(r.offset for r in got) == list(range(first, 3000))
    _run(stream(spark, root, "d", startingOffsets='{"d":{"0":0}}', failOnDataLoss="false"), tmp_path / "o", tmp_path / "c")
    assert _offsets(spark, tmp_path / "o") == [(0, o) for o in range(first, 3000)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "nope"}, "unknown topic 'nope'"),
        ({"subscribe": "t", "startingOffsets": "{not json"}, "neither earliest, latest nor JSON"),
        ({"subscribe": "t", "startingOffsets": '{"t":{"0":1}}'}, "must give every partition of 't'"),
        ({"subscribe": "t", "maxOffsetsPerTrigger": "-3"}, "must be a positive integer"),
        ({"subscribe": "t", "failOnDataLoss": "maybe"}, "must be true or false"),
        ({"subscribe": "t", "startingOffset": "earliest"}, "unknown option"),
        ({}, '"subscribe" is required'),
    ],
)
def test_bad_options_fail_before_the_query_starts(spark, tmp_path, options, message):
    Admin(tmp_path).create_topic("t", partitions=2)
    for make in (spark.read, spark.readStream):
        reader = make.format("filechannel").option("root", str(tmp_path))
        for k, v in options.items():
            reader = reader.option(k, v)
        with pytest.raises(Exception, match=message):
            reader.load()


@pytest.mark.crash
def test_read_committed_finishes_a_dead_producers_commit_before_it_plans(spark, tmp_path):
    """kafka.isolation.level=read_committed: a transaction whose producer died after its commit
    record, before its records reached the partitions, is read whole; read_uncommitted (Kafka's
    default) reads the partitions as they are. A bad level is refused naming the two."""
    root = str(tmp_path / "root")
    for topic in ("a", "b", "c", "in"):
        Admin(root).create_topic(topic, partitions=2)
    crashed_commit(root, tmp_path, "txn-record-written", 3)
    assert read(spark, root, "a", **{"kafka.isolation.level": "read_uncommitted"}).count() == 0
    rows = read(spark, root, "a", **{"kafka.isolation.level": "read_committed"}).collect()
    assert sorted(bytes(r.value) for r in rows) == [b"a-0", b"a-1", b"a-2"]
    with pytest.raises(Exception, match=r'kafka\.isolation\.level must be "read_committed" or "read_uncommitted"'):
        read(spark, root, "a", **{"kafka.isolation.level": "serializable"}).collect()
