"""format("filechannel") as a sink: batch writes, streaming exactly once through crashes."""

import os

import pytest

from filechannel.client import Admin

from .helpers import make_topic, read, stream

pytestmark = pytest.mark.spark


def _values(spark, root, topic):
    return sorted(int(bytes(r.value)) for r in read(spark, root, topic).select("value").collect())


def test_batch_write_with_keys_headers_and_partitions(spark, tmp_path):
    Admin(tmp_path).create_topic("out", partitions=3)
    df = spark.createDataFrame(
        [(str(i), f"k{i % 4}", i % 3 if i % 2 else None) for i in range(300)], "value string, key string, partition int"
    ).selectExpr("value", "key", "partition", "array(named_struct('key', 'src', 'value', cast('t' as binary))) as headers")
    df.write.mode("append").format("filechannel").option("root", str(tmp_path)).option("topic", "out").save()
    rows = read(spark, tmp_path, "out", includeHeaders="true").collect()
    assert sorted(int(bytes(r.value)) for r in rows) == list(range(300))
    for r in rows:
        i = int(bytes(r.value))
        assert bytes(r.key) == b"k%d" % (i % 4)
        assert [(h.key, bytes(h.value)) for h in r.headers] == [("src", b"t")]
        if i % 2:
            assert r.partition == i % 3
    # Rows without a partition go by key hash: one key, one partition.
    by_key: dict[bytes, set[int]] = {}
    for r in rows:
        if not int(bytes(r.value)) % 2:
            by_key.setdefault(bytes(r.key), set()).add(r.partition)
    assert all(len(ps) == 1 for ps in by_key.values())


def test_topic_column_routes_rows_and_missing_topics_are_created(spark, tmp_path):
    df = spark.createDataFrame([("a", "1"), ("b", "2"), ("a", "3")], "topic string, value string")
    df.write.mode("append").format("filechannel").option("root", str(tmp_path)).save()
    assert sorted(Admin(tmp_path).list_topics()) == ["a", "b"]
    assert _values(spark, tmp_path, "a") == [1, 3] and _values(spark, tmp_path, "b") == [2]
    Admin(tmp_path).set_root_setting("auto.create.topics.enable", False)  # as Kafka's broker setting
    df = spark.createDataFrame([("a", "4"), ("c", "5")], "topic string, value string")
    with pytest.raises(Exception, match=r"topic 'c' does not exist .* auto\.create\.topics\.enable is false"):
        df.write.mode("append").format("filechannel").option("root", str(tmp_path)).save()
    assert sorted(Admin(tmp_path).list_topics()) == ["a", "b"]


@pytest.mark.parametrize(
    ("select", "message"),
    [
        ("offset", "needs a 'value' column"),
        ("value, offset", "column 'offset' cannot be written"),
        ("value, cast(1 as bigint) as partition", "column 'partition' has type bigint"),
    ],
)
def test_bad_columns_fail_with_a_clear_message(spark, tmp_path, select, message):
    make_topic(tmp_path, "src", n=3)
    df = read(spark, tmp_path, "src").selectExpr(*select.split(", "))
    with pytest.raises(Exception, match=message):
        df.write.mode("append").format("filechannel").option("root", str(tmp_path)).option("topic", "x").save()


def _stream_copy(spark, root, checkpoint, max_per_trigger="400"):
    q = (
        stream(spark, root, "in", startingOffsets="earliest", maxOffsetsPerTrigger=max_per_trigger)
        .selectExpr("value", "key")
        .writeStream.format("filechannel")
        .option("root", str(root))
        .option("topic", "out")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()


@pytest.mark.parametrize("crash_at", ["sink-before-append", "sink-mid-append", "sink-after-append"])
def test_streaming_sink_is_exactly_once_across_a_crash_in_commit(spark, tmp_path, failpoint, crash_at):
    # The failpoint kills Spark's Python process running the sink's commit of a micro-batch:
    # before it appends, half-way through, or after it appended but before Spark recorded
    # the batch as done. Restarted from its checkpoint, the query replays that batch.
    root, ck = tmp_path / "root", tmp_path / "ck"
    make_topic(root, "in", partitions=2, n=2000)
    Admin(root).create_topic("out", partitions=2)
    armed = failpoint(crash_at)
    with pytest.raises(Exception):
        _stream_copy(spark, root, ck)
    assert not os.path.exists(armed)  # the failpoint was reached: that process died there
    partial = _values(spark, root, "out")
    assert len(partial) == len(set(partial)) < 2000
    _stream_copy(spark, root, ck)
    assert _values(spark, root, "out") == list(range(2000))
    # Nothing staged is left behind.
    assert not list((root / ".staging").glob("*.arrow"))


def test_a_new_query_into_the_same_topic_is_not_mistaken_for_a_replay(spark, tmp_path):
    root = tmp_path / "root"
    make_topic(root, "in", n=500)
    _stream_copy(spark, root, tmp_path / "ck1")
    _stream_copy(spark, root, tmp_path / "ck2")
    assert _values(spark, root, "out") == sorted(list(range(500)) * 2)


def test_a_deleted_and_recreated_checkpoint_is_a_new_query(spark, tmp_path):
    import shutil

    root, ck = tmp_path / "root", tmp_path / "ck"
    make_topic(root, "in", n=300)
    _stream_copy(spark, root, ck)
    shutil.rmtree(ck)
    _stream_copy(spark, root, ck)  # same path, new query: its batch 0 is not a replay
    assert _values(spark, root, "out") == sorted(list(range(300)) * 2)
