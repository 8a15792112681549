"""Compacted topics through the Kafka-like client: Kafka's config names (admin API and CLI), a
producer refusing records without a key, and a consumer group reading a cleaned topic."""

import json
import threading
import time
from typing import Any

import pytest

from filechannel import Record
from filechannel.client import Admin, Consumer, Producer, TopicPartition
from filechannel.client.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from filechannel.client.errors import InvalidConfigurationError, InvalidRecordError

from ..cli_helpers import fc

T0 = TopicPartition("t", 0)


def test_kafkas_compaction_configs_are_taken_described_and_altered(tmp_path):
    admin = KafkaAdminClient(root=tmp_path)
    configs = {
        "cleanup.policy": "delete,compact",
        "delete.retention.ms": "1000",
        "min.cleanable.dirty.ratio": "0.25",
        "min.compaction.lag.ms": "5",
        "max.compaction.lag.ms": "9223372036854775807",
    }
    admin.create_topics([NewTopic("t", 1, 1, topic_configs=configs)])
    config = Admin(tmp_path).describe_topic("t").config
    assert config["cleanup_policy"] == "compact,delete" and config["delete_retention_ms"] == 1000
    assert config["min_cleanable_dirty_ratio"] == 0.25 and config["min_compaction_lag_ms"] == 5
    assert config.get("max_compaction_lag_ms") is None
    topic = ConfigResource(ConfigResourceType.TOPIC, "t")
    described = admin.describe_configs([topic])["topic"]["t"]
    assert described["cleanup.policy"]["value"] == "compact,delete" and described["min.cleanable.dirty.ratio"]["value"] == "0.25"
    admin.alter_configs(
        [ConfigResource(ConfigResourceType.TOPIC, "t", {"cleanup.policy": "compact", "delete.retention.ms": "7"})]
    )
    config = Admin(tmp_path).describe_topic("t").config
    assert config["cleanup_policy"] == "compact" and config["delete_retention_ms"] == 7
    with pytest.raises(InvalidConfigurationError, match="must be delete, compact, or compact,delete"):
        admin.create_topics([NewTopic("u", 1, 1, topic_configs={"cleanup.policy": "squash"})])
    with pytest.raises(InvalidConfigurationError, match="compaction of tier-2 history is not done"):
        Admin(tmp_path).create_topic("v", 1, cleanup_policy="compact", tier=f"file://{tmp_path}/tier")


def test_the_cli_creates_a_compacted_topic(tmp_path):
    fc(tmp_path, "topics", "create", "t", "-c", "cleanup.policy=compact", "-c", "min.cleanable.dirty.ratio=0.1")
    config = Admin(tmp_path).describe_topic("t").config
    assert config["cleanup_policy"] == "compact" and config["min_cleanable_dirty_ratio"] == 0.1


def test_a_producer_refuses_a_record_without_a_key_on_a_compacted_topic(tmp_path):
    Admin(tmp_path).create_topic("t", 1, cleanup_policy="compact")
    with Producer(tmp_path) as p:
        with pytest.raises(InvalidRecordError, match="needs a key"):
            p.send("t", b"v").get(timeout=10)
        p.send("t", b"v", key=b"k").get(timeout=10)


def test_a_consumer_group_reads_a_cleaned_topic_seeks_into_holes_and_counts_lag_in_offsets(tmp_path):
    Admin(tmp_path).create_topic("t", 1, cleanup_policy="compact", segment_bytes=4096)
    with Producer(tmp_path) as p:
        for i in range(200):
            p.send("t", b"v%d-" % i + b"x" * 100, key=b"k%d" % (i % 4), timestamp_ms=1000 + i)
    with Admin(tmp_path).open_partition("t", 0, maintenance_interval=0) as ch:
        ch.compact()  # (the producer's maintenance thread may have cleaned already: reads below check it)
        with ch.receiver() as rx:
            kept: list[Record] = []
            while batch := rx.recv_many(1000, timeout=0.2):
                kept.extend(batch)
    assert len(kept) < 200 and [r.offset for r in kept] == sorted({r.offset for r in kept})
    with Consumer("t", root=tmp_path, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        got = []
        while polled := c.poll(timeout_ms=500):
            got.extend(polled[T0])
            if len(got) >= len(kept):
                break
        assert [(r.offset, r.key, r.value) for r in got] == [(r.offset, r.key, r.value) for r in kept]
        c.commit({T0: kept[0].offset + 1})  # kafka-python's form: a plain offset
        c.seek(T0, kept[0].offset + 1)  # into the hole after the first kept record
        (first,) = c.poll(timeout_ms=500, max_records=1)[T0]
        assert first.offset == kept[1].offset
        assert c.end_offsets([T0])[T0] == 200
        assert c.metrics()["consumer-fetch-manager-metrics"]["records-lag-max"] == 200 - kept[1].offset - 1
        found = c.offsets_for_times({T0: 1000})[T0]
        assert found is not None and found.offset == kept[0].offset
    with Consumer(root=tmp_path, group_id="g", enable_auto_commit=False) as c:
        assert c.committed(T0) == kept[0].offset + 1


def test_describe_counts_the_records_a_cleaned_topic_holds_not_its_offsets(tmp_path):
    Admin(tmp_path).create_topic("t", 1, cleanup_policy="compact", segment_bytes=4096, delete_retention_ms=0)
    with Producer(tmp_path) as p:
        for i in range(200):
            p.send("t", b"v%d-" % i + b"x" * 100, key=b"k%d" % (i % 4)).get(timeout=10)
        p.send("t", None, key=b"k0").get(timeout=10)  # a tombstone: counted while it is kept
    with Admin(tmp_path).open_partition("t", 0, maintenance_interval=0) as ch:
        ch.compact()
        with ch.receiver() as rx:
            kept = []
            while batch := rx.recv_many(1000, timeout=0.2):
                kept.extend(batch)
    (part,) = Admin(tmp_path).describe_topic("t").partitions
    assert (part.first_offset, part.end_offset) == (0, 201)
    assert part.records == len(kept) < 201  # the cleaner's holes are not records
    (line,) = fc(tmp_path, "topics", "describe", "t", "--format", "json").stdout.decode().splitlines()
    assert json.loads(line)["partitions"][0]["records"] == len(kept)
    table = fc(tmp_path, "topics", "describe", "t").stdout.decode()
    (row,) = [line.replace("│", " ").split() for line in table.splitlines() if " 201 " in line]
    assert row[:4] == ["0", "0", "201", str(len(kept))]


def test_a_group_member_reads_a_topic_while_it_is_written_and_cleaned(tmp_path):
    Admin(tmp_path).create_topic("t", 1, cleanup_policy="compact", segment_bytes=4096, min_cleanable_dirty_ratio=0.01)
    total, keys = 3000, 20
    stop = threading.Event()

    def produce() -> None:
        with Producer(tmp_path) as p:
            for i in range(total):
                p.send("t", b"%d" % i, key=b"k%d" % (i % keys))

    def clean() -> None:
        with Admin(tmp_path).open_partition("t", 0, maintenance_interval=0) as ch:
            while not stop.is_set():
                ch.compact()

    threads = [threading.Thread(target=produce), threading.Thread(target=clean)]
    for t in threads:
        t.start()
    got: list[Any] = []
    try:
        with Consumer("t", root=tmp_path, group_id="g", auto_offset_reset="earliest", max_poll_records=50) as c:
            deadline = time.monotonic() + 120
            while (not got or got[-1].offset < total - 1) and time.monotonic() < deadline:
                for records in c.poll(timeout_ms=200).values():
                    got.extend(records)
                time.sleep(0.01)  # slower than the writer: the cleaner gets ahead of the member
    finally:
        stop.set()
        for t in threads:
            t.join()
    # Segments were rewritten while the member read (by the cleaner thread, or first by the
    # producer's own maintenance thread: on a loaded machine either may find nothing left to do).
    with Admin(tmp_path).open_partition("t", 0, maintenance_interval=0) as ch, ch.receiver() as rx:
        left = 0
        while batch := rx.recv_many(10_000, timeout=0):
            left += len(batch)
    assert left < total
    offsets = [r.offset for r in got]
    assert offsets == sorted(set(offsets)) and offsets[-1] == total - 1
    assert all(r.value == b"%d" % r.offset and r.key == b"k%d" % (r.offset % keys) for r in got)
    last = {r.key: r.offset for r in got}
    assert sorted(last.values()) == list(range(total - keys, total))  # every key's last value was read
