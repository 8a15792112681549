"""Spark's Kafka source options and sink behaviours, checked as Spark's own Kafka suites check them.

Modelled on KafkaRelationSuite / KafkaMicroBatchSourceSuite / KafkaSinkSuite: assign and
subscribePattern, includeHeaders, timestampType, the timestamp options and their order of
preference, maxRecordsPerPartition, minOffsetsPerTrigger with maxTriggerDelay, kafka.* options,
the offset combinations Kafka's source refuses, and the sink's topic option.
"""

import json

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from filechannel import FileChannel
from filechannel.client import Admin, Producer
from filechannel.spark.options import SourceOptions
from filechannel.spark.source import FileChannelStreamReader

from .helpers import available_now_to_parquet, make_topic, produce

pytestmark = pytest.mark.spark


def _reader(spark, root, stream=False, **options):
    reader = (spark.readStream if stream else spark.read).format("filechannel").option("root", str(root))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader


def _pairs(df):
    return sorted((r.topic, r.partition, r.offset) for r in df.select("topic", "partition", "offset").collect())


def test_headers_column_only_with_include_headers_and_timestamp_type(spark, tmp_path):
    Admin(tmp_path).create_topic("h", partitions=1)
    with Producer(tmp_path) as p:
        p.send("h", value=b"a", headers=[("x", b"1")])
        p.send("h", value=b"b")
    plain = _reader(spark, tmp_path, subscribe="h").load()
    assert plain.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert [r.timestampType for r in plain.collect()] == [0, 0]  # CreateTime, as Kafka's
    with_headers = _reader(spark, tmp_path, subscribe="h", includeHeaders="true").load()
    assert with_headers.columns[-1] == "headers"
    rows = sorted(with_headers.collect(), key=lambda r: r.offset)
    assert [(h.key, bytes(h.value)) for h in rows[0].headers] == [("x", b"1")] and rows[1].headers is None
    stream = _reader(spark, tmp_path, stream=True, subscribe="h", includeHeaders="true").load()
    assert stream.columns[-1] == "headers"


def test_assign_reads_only_the_partitions_it_names(spark, tmp_path):
    make_topic(tmp_path, "a", partitions=3, n=300)
    make_topic(tmp_path, "b", partitions=2, n=100)
    df = _reader(spark, tmp_path, assign=json.dumps({"a": [0, 2], "b": [1]})).load()
    got = _pairs(df)
    assert {(t, p) for t, p, _ in got} <= {("a", 0), ("a", 2), ("b", 1)}
    every = _pairs(_reader(spark, tmp_path, subscribe="a,b").load())
    assert got == [x for x in every if (x[0], x[1]) in {("a", 0), ("a", 2), ("b", 1)}]
    # Offsets given as JSON must cover exactly the assigned partitions.
    start = json.dumps({"a": {"0": 5, "2": -2}, "b": {"1": -2}})
    got = _pairs(_reader(spark, tmp_path, assign=json.dumps({"a": [0, 2], "b": [1]}), startingOffsets=start).load())
    assert min(o for t, p, o in got if (t, p) == ("a", 0)) == 5
    with pytest.raises(Exception, match="has partitions 0 to 1, not 5"):
        _reader(spark, tmp_path, assign='{"b":[5]}').load()
    with pytest.raises(Exception, match="no partitions to assign"):
        _reader(spark, tmp_path, assign="a").load()


def test_subscribe_pattern_matches_whole_names_and_picks_up_topics_created_later(spark, tmp_path):
    root = tmp_path / "root"
    make_topic(root, "events", n=10)
    make_topic(root, "xevents", n=10)  # Kafka matches the whole name: not "ev.*"
    make_topic(root, "ev2", partitions=2, n=20)
    got = _pairs(_reader(spark, root, subscribePattern="ev.*").load())
    assert sorted({t for t, _, _ in got}) == ["ev2", "events"] and len(got) == 30
    out, ck = tmp_path / "out", tmp_path / "ck"

    def run():
        df = _reader(spark, root, stream=True, subscribePattern="ev.*", startingOffsets="earliest").load()
        available_now_to_parquet(df.select("topic", "partition", "offset"), out, ck)
        return sorted((r.topic, r.offset) for r in spark.read.parquet(str(out)).collect())

    assert len(run()) == 30
    make_topic(root, "ev3", n=7)  # a new topic matching: read from its first offset
    produce(root, "events", range(10, 15))
    seen = run()
    assert [o for t, o in seen if t == "ev3"] == list(range(7)) and len(seen) == 42


def _timed_topic(root):
    """Topic "t", 2 partitions, records at timestamps 1000, 1100, ... (offset i has 1000 + 100 i)."""
    Admin(root).create_topic("t", partitions=2)
    with Producer(root) as p:
        for i in range(10):
            for part in (0, 1):
                p.send("t", value=b"%d" % i, partition=part, timestamp_ms=1000 + 100 * i)


def test_starting_and_ending_by_timestamp_in_kafkas_order_of_preference(spark, tmp_path):
    _timed_topic(tmp_path)

    def offsets(**options):
        return sorted((r.partition, r.offset) for r in _reader(spark, tmp_path, subscribe="t", **options).load().collect())

    assert offsets(startingTimestamp="1250") == [(p, o) for p in (0, 1) for o in range(3, 10)]
    by_partition = json.dumps({"t": {"0": 1500, "1": 1000}})
    assert offsets(startingOffsetsByTimestamp=by_partition, endingTimestamp="1700") == [(0, o) for o in range(5, 7)] + [
        (1, o) for o in range(0, 7)
    ]
    ending = json.dumps({"t": {"0": 1200, "1": 99999}})  # no record that late: up to the end
    assert offsets(endingOffsetsByTimestamp=ending) == [(0, 0), (0, 1)] + [(1, o) for o in range(10)]
    # The global timestamp wins over per-partition timestamps, which win over offsets.
    assert offsets(startingTimestamp="1800", startingOffsetsByTimestamp=by_partition, startingOffsets="earliest") == [
        (p, o) for p in (0, 1) for o in (8, 9)
    ]
    assert offsets(startingOffsetsByTimestamp=by_partition, startingOffsets="earliest")[0] == (0, 5)
    # No record at or after the starting timestamp: an error by default, the end with strategy "latest".
    with pytest.raises(Exception, match=r"no record of t\[0\] has a timestamp >= 5000"):
        offsets(startingTimestamp="5000")
    assert offsets(startingTimestamp="5000", startingOffsetsByTimestampStrategy="latest") == []
    with pytest.raises(Exception, match="expected a single long value"):
        _reader(spark, tmp_path, subscribe="t", startingTimestamp="yesterday").load()
    with pytest.raises(Exception, match="must be error or latest"):
        _reader(spark, tmp_path, subscribe="t", startingTimestamp="1", startingOffsetsByTimestampStrategy="maybe").load()


def test_max_records_per_partition_splits_tasks(spark, tmp_path):
    make_topic(tmp_path, "m", partitions=2, n=1000)
    df = _reader(spark, tmp_path, subscribe="m", maxRecordsPerPartition="100").load()
    assert df.rdd.getNumPartitions() >= 10
    assert df.rdd.glom().map(len).max() <= 100
    got = _pairs(df)
    assert len(got) == 1000 and len(set(got)) == 1000
    with pytest.raises(Exception, match='"maxRecordsPerPartition" must be a positive integer'):
        _reader(spark, tmp_path, subscribe="m", maxRecordsPerPartition="0").load()


def test_min_offsets_per_trigger_waits_for_enough_records_or_max_trigger_delay(tmp_path):
    # Kafka's source: the first trigger fires; later ones wait until minOffsetsPerTrigger records
    # are there or maxTriggerDelay has passed since the last one. The reader keeps that time.
    make_topic(tmp_path, "w", partitions=2, n=10)
    now = [100.0]
    opts = SourceOptions.parse(
        {"root": str(tmp_path), "subscribe": "w", "minOffsetsPerTrigger": "50", "maxTriggerDelay": "30s"}, batch=False
    )
    reader = FileChannelStreamReader(opts, clock=lambda: now[0])
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMinRows(50)
    start = {"w": {"0": 0, "1": 0}}
    first = reader.latestOffset(start, limit)
    assert sum(first["w"].values()) == 10  # the first batch is never held back
    produce(tmp_path, "w", range(10, 30))
    now[0] += 10
    assert reader.latestOffset(first, limit) == first  # 20 waiting < 50, 10 s < 30 s: no batch
    now[0] += 25
    second = reader.latestOffset(first, limit)  # 35 s since the last batch: it fires
    assert sum(second["w"].values()) == 30
    produce(tmp_path, "w", range(30, 90))
    now[0] += 1
    assert sum(reader.latestOffset(second, limit)["w"].values()) == 90  # 60 waiting >= 50: at once
    # With maxOffsetsPerTrigger too, the cap applies to a batch let through; ReadAllAvailable reads all.
    capped = FileChannelStreamReader(
        SourceOptions.parse(
            {"root": str(tmp_path), "subscribe": "w", "minOffsetsPerTrigger": "5", "maxOffsetsPerTrigger": "40"}, batch=False
        )
    )
    assert capped.getDefaultReadLimit() == ReadMaxRows(40)
    assert sum(capped.latestOffset(start, ReadMaxRows(40))["w"].values()) == 40
    assert sum(capped.latestOffset(start, ReadAllAvailable())["w"].values()) == 90
    with pytest.raises(Exception, match=r"minOffsetsPerTrigger \(50\) is higher than maxOffsetsPerTrigger \(40\)"):
        SourceOptions.parse(
            {"root": str(tmp_path), "subscribe": "w", "minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "40"}, batch=False
        )
    with pytest.raises(Exception, match='"maxTriggerDelay" must be a duration'):
        SourceOptions.parse({"root": str(tmp_path), "subscribe": "w", "maxTriggerDelay": "soon"}, batch=False)


def test_the_progress_reports_the_ends_its_trigger_read_and_reads_them_again_only_without_one(tmp_path):
    # Spark asks reportLatestOffset (for the query's progress) right after each latestOffset, every
    # 10 ms on an idle query: the reader reports the ends latestOffset read, before admission
    # control, instead of opening every partition again; with no trigger since, it reads them.
    make_topic(tmp_path, "r", partitions=2, n=10)
    opts = SourceOptions.parse({"root": str(tmp_path), "subscribe": "r", "maxOffsetsPerTrigger": "4"}, batch=False)
    reader = FileChannelStreamReader(opts)
    start = {"r": {"0": 0, "1": 0}}
    assert sum(reader.latestOffset(start, reader.getDefaultReadLimit())["r"].values()) == 4
    produce(tmp_path, "r", range(10, 16))
    reported = reader.reportLatestOffset()
    assert reported is not None and sum(reported["r"].values()) == 10  # what the trigger read
    reported = reader.reportLatestOffset()
    assert reported is not None and sum(reported["r"].values()) == 16  # no trigger since: the files now


def test_min_offsets_per_trigger_in_a_running_query(spark, tmp_path):
    root = tmp_path / "root"
    make_topic(root, "q", n=5)
    q = (
        _reader(spark, root, stream=True, subscribe="q", startingOffsets="earliest", minOffsetsPerTrigger="1000")
        .load()
        .writeStream.format("memory")
        .queryName("min_offsets_q")
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        q.processAllAvailable()
        assert spark.table("min_offsets_q").count() == 5  # the first trigger fires
        produce(root, "q", range(5, 1005))  # 1000 more: enough for the next one
        q.processAllAvailable()
        assert spark.table("min_offsets_q").count() == 1005
    finally:
        q.stop()


def test_kafka_options_are_accepted_and_those_kafka_refuses_are_refused(spark, tmp_path):
    make_topic(tmp_path, "k", n=3)
    df = _reader(
        spark,
        tmp_path,
        subscribe="k",
        **{"kafka.bootstrap.servers": "localhost:9092", "kafka.security.protocol": "SSL", "groupIdPrefix": "x"},
    ).load()
    assert df.count() == 3
    with pytest.raises(
        Exception, match=r'Kafka option "auto\.offset\.reset" is not supported: set the source option startingOffsets'
    ):
        _reader(spark, tmp_path, subscribe="k", **{"kafka.auto.offset.reset": "earliest"}).load()
    with pytest.raises(Exception, match=r'Kafka option "value\.deserializer" is not supported'):
        _reader(spark, tmp_path, subscribe="k", **{"kafka.value.deserializer": "x"}).load()
    with pytest.raises(Exception, match="only one of the options"):
        _reader(spark, tmp_path, subscribe="k", subscribePattern="k.*").load()
    out = spark.createDataFrame([("v",)], "value string")
    out.write.mode("append").format("filechannel").option("root", str(tmp_path)).option("topic", "k").option(
        "kafka.bootstrap.servers", "localhost:9092"
    ).save()
    assert _reader(spark, tmp_path, subscribe="k").load().count() == 4
    with pytest.raises(Exception, match=r'Kafka option "key\.serializer" is not supported'):
        out.write.mode("append").format("filechannel").option("root", str(tmp_path)).option("topic", "k").option(
            "kafka.key.serializer", "x"
        ).save()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "latest"}, 'startingOffsets cannot be "latest" for batch queries'),
        ({"startingOffsets": '{"o":{"0":-1,"1":0}}'}, r"startingOffsets for o\[0\] cannot be latest"),
        ({"endingOffsets": "earliest"}, 'endingOffsets cannot be "earliest" for batch queries'),
        ({"endingOffsets": '{"o":{"0":-2,"1":-1}}'}, r"endingOffsets for o\[0\] cannot be earliest"),
        ({"startingOffsets": '{"o":{"0":7,"1":0}}', "endingOffsets": '{"o":{"0":3,"1":-1}}'}, r"of o\[0\] \(7\) is after"),
        ({"startingOffsets": '{"o":{"0":50,"1":0}}'}, r"o\[0\]: the query would start at offset 50, after where it ends"),
    ],
)
def test_batch_offset_combinations_kafka_rejects_fail_before_any_row(spark, tmp_path, options, message):
    make_topic(tmp_path, "o", partitions=2, n=20)
    with pytest.raises(Exception, match=message):
        _reader(spark, tmp_path, subscribe="o", **options).load().collect()


@pytest.mark.parametrize("option", ["endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"])
def test_an_ending_option_on_a_stream_fails_at_start(spark, tmp_path, option):
    make_topic(tmp_path, "e", n=3)
    value = {"endingOffsets": "latest", "endingTimestamp": "1", "endingOffsetsByTimestamp": '{"e":{"0":1}}'}[option]
    df = _reader(spark, tmp_path, stream=True, subscribe="e", **{option: value}).load()
    with pytest.raises(Exception, match=f'option "{option}" is not valid in streaming queries'):
        df.writeStream.format("memory").queryName(f"ending_{option}").start().processAllAvailable()


def test_the_sink_topic_option_overrides_a_topic_column(spark, tmp_path):
    df = spark.createDataFrame([("elsewhere", "1"), ("elsewhere", "2")], "topic string, value string")
    df.write.mode("append").format("filechannel").option("root", str(tmp_path)).option("topic", "chosen").save()
    assert Admin(tmp_path).list_topics() == ["chosen"]
    got = _reader(spark, tmp_path, subscribe="chosen").load().collect()
    assert sorted(bytes(r.value) for r in got) == [b"1", b"2"]


def test_what_the_sink_cannot_do_fails_clearly_and_writes_nothing(spark, tmp_path):
    # Spark refuses the default save mode (ErrorIfExists) to every Python data source before
    # calling it; Kafka's sink (a V1 source) takes it as append. If pyspark ever lets it
    # through, this test fails and the sink can accept it.
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        df.write.format("filechannel").option("root", str(tmp_path)).option("topic", "s").save()
    assert "s" not in Admin(tmp_path).list_topics()


def test_a_null_value_writes_a_tombstone(spark, tmp_path):
    # As Kafka's sink: a null value is a record without a value (a tombstone), not an empty one.
    rows = spark.createDataFrame([("k1", "a"), ("k2", None), ("k3", "")], "key string, value string")
    rows.write.mode("append").format("filechannel").option("root", str(tmp_path)).option("topic", "s").save()
    with FileChannel(tmp_path / "s" / "0", read_only=True) as ch:
        got = {r.key: r.value for r in ch.receiver("earliest").recv_many(10, timeout=5)}
    assert got == {b"k1": b"a", b"k2": None, b"k3": b""}
    back = {r["key"]: r["value"] for r in _reader(spark, tmp_path, subscribe="s").load().collect()}
    assert back == {b"k1": b"a", b"k2": None, b"k3": b""}
