"""kafka-python's admin API (``KafkaAdminClient``, ``NewTopic``, ``ConfigResource``...) and its
error names (``filechannel.client.errors``), against what kafka-python documents."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from filechannel.client import (
    Admin,
    ConfigResource,
    ConfigResourceType,
    Consumer,
    KafkaAdminClient,
    NewPartitions,
    NewTopic,
    OffsetAndMetadata,
    Producer,
    TopicPartition,
)
from filechannel.client.errors import (
    CommitFailedError,
    GroupIdNotFoundError,
    GroupNotEmptyError,
    IllegalStateError,
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NoBrokersAvailable,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from filechannel.errors import ConfigError, FileChannelError

from .waiting import wait_for

MEMBER = Path(__file__).parent / "procs" / "group_member.py"
T0 = TopicPartition("t", 0)


def produce(root, topic, n, partition=0):
    with Producer(root) as p:
        for i in range(n):
            p.send(topic, b"%d" % i, partition=partition)


# -- the error names ------------------------------------------------------------------------------


def test_kafka_error_is_the_base_of_every_error_and_the_old_names_still_catch():
    assert KafkaError is FileChannelError
    for name in (
        CommitFailedError,
        GroupIdNotFoundError,
        GroupNotEmptyError,
        IllegalStateError,
        InvalidConfigurationError,
        InvalidPartitionsError,
        InvalidTopicError,
        KafkaTimeoutError,
        MessageSizeTooLargeError,
        NoBrokersAvailable,
        NoOffsetForPartitionError,
        OffsetOutOfRangeError,
        TopicAlreadyExistsError,
        UnknownTopicOrPartitionError,
        UnsupportedVersionError,
    ):
        assert issubclass(name, KafkaError), name
    # Errors that were ConfigErrors stay ConfigErrors: existing `except ConfigError` keep working.
    for name in (GroupIdNotFoundError, GroupNotEmptyError, IllegalStateError, InvalidPartitionsError, UnsupportedVersionError):
        assert issubclass(name, ConfigError), name


def test_each_error_name_catches_the_situation_it_names(tmp_path):
    admin = KafkaAdminClient(root=tmp_path)
    admin.create_topic("t", 2, max_record_bytes=1024)
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topic("t", 2)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_topic("nope")
    with Producer(tmp_path) as p:
        with pytest.raises(UnknownTopicOrPartitionError, match="partition 7"):
            p.send("t", b"x", partition=7)
        with pytest.raises(MessageSizeTooLargeError):
            p.send("t", b"x" * 2000).get(timeout=30)
        with pytest.raises(UnsupportedVersionError, match="CreateTime"):
            admin.create_topics([NewTopic("stamped", 1, 1, topic_configs={"message.timestamp.type": "LogAppendTime"})])
    with pytest.raises(InvalidTopicError):
        admin.create_topic("../escape")
    with pytest.raises(InvalidConfigurationError, match="retention_ms"):
        admin.create_topic("u", retention_ms=-5)
    with pytest.raises(InvalidPartitionsError):
        admin.create_partitions({"t": NewPartitions(1)})
    with admin.open_partition("t", 0) as ch, ch.receiver() as rx, pytest.raises(KafkaTimeoutError):
        rx.recv(timeout=0.01)
    produce(tmp_path, "t", 5)
    with Consumer(root=tmp_path, group_id="g", enable_auto_commit=False) as c:
        c.assign([T0])
        with pytest.raises(IllegalStateError, match="cannot be mixed"):
            c.subscribe(["t"])
        with pytest.raises(IllegalStateError, match="not assigned"):
            c.position(TopicPartition("t", 1))
        admin.delete_records({T0: 3})
        with pytest.raises(OffsetOutOfRangeError):
            c.seek(T0, 1)
    with Consumer(root=tmp_path, group_id="g2", auto_offset_reset="none") as c:
        c.assign([T0])
        with pytest.raises(NoOffsetForPartitionError):
            c.poll(timeout_ms=0)
    with pytest.raises(GroupIdNotFoundError):
        admin.describe_consumer_groups(["missing"])
    (tmp_path / "a-file").write_bytes(b"")
    with pytest.raises(NoBrokersAvailable):
        KafkaAdminClient(root=tmp_path / "a-file")


def test_commit_failed_error_for_a_partition_another_member_owns(tmp_path):
    KafkaAdminClient(root=tmp_path).create_topics([NewTopic("t", 2, 1)])
    a = Consumer(root=tmp_path, group_id="g", enable_auto_commit=False, heartbeat_interval_ms=50)
    b = Consumer(root=tmp_path, group_id="g", enable_auto_commit=False, heartbeat_interval_ms=50)
    try:
        a.subscribe(["t"])
        b.subscribe(["t"])
        a.poll(timeout_ms=0)
        wait_for(lambda: (b.poll(timeout_ms=10), len(b.assignment()) == 1)[1], what="b to take a partition")
        with pytest.raises(CommitFailedError):
            a.commit({next(iter(b.assignment())): 1})
    finally:
        b.close()
        a.close()


# -- topics -----------------------------------------------------------------------------------------


def test_create_topics_with_kafkas_config_names_and_describe_configs(tmp_path):
    admin = KafkaAdminClient(root=tmp_path, bootstrap_servers="localhost:9092", client_id="ops", request_timeout_ms=5)
    admin.create_topics(
        [
            NewTopic(
                "a", num_partitions=3, replication_factor=1, topic_configs={"retention.ms": "1000", "cleanup.policy": "delete"}
            ),
            NewTopic("b", 1, 1, topic_configs={"segment_bytes": 8192}),
        ]
    )
    assert admin.list_topics() == ["a", "b"]
    assert len(admin.describe_topic("a").partitions) == 3
    assert admin.describe_topic("a").config == {"retention_ms": 1000, "cleanup_policy": "delete"}
    described = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, "a"), ConfigResource("topic", "b", ["segment.bytes"])]
    )
    a = described["topic"]["a"]
    assert a["retention.ms"] == {
        "value": "1000",
        "is_default": False,
        "read_only": False,
        "is_sensitive": False,
        "config_source": "DYNAMIC_TOPIC_CONFIG",
    }
    assert a["retention.bytes"]["value"] == "-1" and a["retention.bytes"]["is_default"]
    assert a["compression.type"]["value"] == "zstd" and a["tier"]["value"] is None
    assert a["cleanup.policy"]["value"] == "delete" and a["cleanup.policy"]["is_default"]
    assert described["topic"]["b"] == {
        "segment.bytes": {
            "value": "8192",
            "is_default": False,
            "read_only": False,
            "is_sensitive": False,
            "config_source": "DYNAMIC_TOPIC_CONFIG",
        }
    }
    broker = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")])["broker"]["0"]
    assert broker["auto.create.topics.enable"]["value"] == "true"


def test_create_topics_checks_every_topic_before_creating_any(tmp_path):
    admin = KafkaAdminClient(root=tmp_path)
    with pytest.raises(UnsupportedVersionError, match="CreateTime"):
        admin.create_topics(
            [NewTopic("ok", 1, 1), NewTopic("bad", 1, 1, topic_configs={"message.timestamp.type": "LogAppendTime"})]
        )
    with pytest.raises(InvalidConfigurationError, match=r"unknown topic config 'retention\.msec'"):
        admin.create_topics([NewTopic("ok", 1, 1, topic_configs={"retention.msec": "5"})])
    admin.create_topics([NewTopic("ok", 1, 1)], validate_only=True)
    assert admin.list_topics() == []
    admin.create_topics([NewTopic("ok", 1, 1)])
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics([NewTopic("new", 1, 1), NewTopic("ok", 1, 1)])
    assert admin.list_topics() == ["ok"]
    admin.create_topics([NewTopic("assigned", -1, -1, replica_assignments={0: [1], 1: [1]})])
    assert len(admin.describe_topic("assigned").partitions) == 2
    with pytest.raises(InvalidConfigurationError, match="has no setting 'bootstrap_server'"):
        KafkaAdminClient(root=tmp_path, bootstrap_server="typo:9092")


def test_create_topic_exist_ok_names_each_difference_and_is_silent_for_the_same_topic(tmp_path):
    admin = Admin(tmp_path)
    admin.create_topic("t", 2, retention_ms=1000)
    admin.create_topic("t", 2, exist_ok=True, retention_ms=1000)
    with pytest.raises(TopicAlreadyExistsError, match=r"partitions 2, not 3; retention_ms 1000, not None"):
        admin.create_topic("t", 3, exist_ok=True)
    # a send's auto-creation uses whatever exists
    with Producer(tmp_path) as p:
        assert p.send("t", b"x", partition=1).get(timeout=30).partition == 1


def test_delete_topics(tmp_path):
    admin = KafkaAdminClient(root=tmp_path)
    admin.create_topics([NewTopic("a", 1, 1), NewTopic("b", 1, 1)])
    admin.delete_topics(["a", "b"])
    assert admin.list_topics() == []
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topics(["a"])


def test_create_partitions_keeps_the_records_and_an_open_producer_and_consumer_see_the_new_ones(tmp_path):
    admin = KafkaAdminClient(root=tmp_path)
    admin.create_topics([NewTopic("t", 1, 1)])
    produce(tmp_path, "t", 3)
    with (
        Producer(tmp_path) as p,
        Consumer("t", root=tmp_path, group_id="g", auto_offset_reset="earliest", metadata_max_age_ms=50) as c,
    ):
        assert p.partitions_for("t") == {0}
        admin.create_partitions({"t": NewPartitions(total_count=3)})
        assert [p.end_offset for p in admin.describe_topic("t").partitions] == [3, 0, 0]
        wait_for(lambda: p.partitions_for("t") == {0, 1, 2}, what="the producer to see 3 partitions")
        p.send("t", b"new", partition=2).get(timeout=30)
        seen: dict[int, list[bytes]] = {}

        def read_all():
            for tp, recs in c.poll(timeout_ms=50).items():
                seen.setdefault(tp.partition, []).extend(r.value for r in recs)
            return seen == {0: [b"0", b"1", b"2"], 2: [b"new"]}

        wait_for(read_all, what="the consumer to read the old and the new partition")
    with pytest.raises(InvalidPartitionsError, match="has 3 partition"):
        admin.create_partitions({"t": NewPartitions(2)})
    with pytest.raises(InvalidPartitionsError, match="already has 3"):
        admin.create_partitions({"t": NewPartitions(3)})
    admin.create_partitions({"t": NewPartitions(5)}, validate_only=True)
    assert len(admin.describe_topic("t").partitions) == 3


def test_alter_configs_sets_the_given_configs_and_returns_the_others_to_their_defaults(tmp_path):
    admin = KafkaAdminClient(root=tmp_path)
    admin.create_topic("t", retention_ms=1000, segment_bytes=8192)
    result = admin.alter_configs(
        [ConfigResource(ConfigResourceType.TOPIC, "t", {"retention.bytes": "5000000", "segment.ms": "-1"})]
    )
    assert result == {"topic": {"t": None}}
    assert admin.describe_topic("t").config == {"retention_bytes": 5_000_000, "segment_ms": None}
    with pytest.raises(InvalidConfigurationError, match="segment_bytes must be"):
        admin.alter_configs([ConfigResource("topic", "t", {"segment.bytes": "12"})])
    assert admin.describe_topic("t").config == {"retention_bytes": 5_000_000, "segment_ms": None}
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.alter_configs([ConfigResource("topic", "nope", {"retention.ms": "1"})])
    admin.alter_configs([ConfigResource(ConfigResourceType.BROKER, "0", {"auto.create.topics.enable": "false"})])
    assert admin.root_settings() == {"auto.create.topics.enable": False}


def test_alter_topic_changes_only_what_it_names_and_never_the_tier(tmp_path):
    admin = Admin(tmp_path)
    admin.create_topic("t", retention_ms=1000, tier=(tmp_path / "bucket").as_uri())
    assert admin.alter_topic("t", {"segment_bytes": 8192}, ["retention_ms"]) == {
        "segment_bytes": 8192,
        "tier": (tmp_path / "bucket").as_uri(),
    }
    with pytest.raises(ConfigError, match="tier of topic 't' cannot change"):
        admin.alter_topic("t", {"tier": None})


# -- delete_records -----------------------------------------------------------------------------


def test_delete_records_moves_the_start_durably_and_deletes_the_whole_segments_below(tmp_path):
    admin = KafkaAdminClient(root=tmp_path)
    admin.create_topic("t", segment_bytes=4096)
    produce(tmp_path, "t", 400)
    with admin.open_partition("t", 0, maintenance_interval=0) as ch:
        ch.compress_sealed()  # sealed segments as .seg.z, as the maintenance thread leaves them
    before = admin.describe_topic("t").partitions[0]
    assert (before.first_offset, before.records) == (0, 400)
    assert admin.delete_records({T0: 250}) == {T0: {"partition_index": 0, "low_watermark": 250, "error_code": 0}}
    after = admin.describe_topic("t").partitions[0]
    assert (after.first_offset, after.end_offset, after.records) == (250, 400, 150) and after.size_bytes < before.size_bytes
    segment_bases = sorted(int(f.split(".")[0]) for f in os.listdir(tmp_path / "t" / "0") if f.endswith((".seg", ".seg.z")))
    assert segment_bases[0] <= 250 and (len(segment_bases) == 1 or segment_bases[1] > 250)
    # a new process (a restart) keeps the start: its consumers begin there
    script = (
        "import sys; from filechannel.client import Consumer, TopicPartition; tp = TopicPartition('t', 0)\n"
        "with Consumer(root=sys.argv[1], auto_offset_reset='earliest') as c:\n"
        "    c.assign([tp]); print(c.beginning_offsets([tp])[tp], c.poll(timeout_ms=5000, max_records=1)[tp][0].offset)\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["250", "250"]
    # never back; -1 deletes up to the end
    assert admin.delete_records({T0: 10})[T0]["low_watermark"] == 250
    assert admin.delete_records({T0: -1})[T0]["low_watermark"] == 400
    with pytest.raises(OffsetOutOfRangeError, match="offsets run to 400"):
        admin.delete_records({T0: 401})


def test_a_consumer_below_the_deleted_records_resets_by_auto_offset_reset(tmp_path):
    admin = KafkaAdminClient(root=tmp_path)
    admin.create_topic("t")
    produce(tmp_path, "t", 10)
    with Consumer(root=tmp_path, group_id="g", enable_auto_commit=False) as c:
        c.assign([T0])
        c.commit({T0: 2})
    admin.delete_records({T0: 6})
    with Consumer(root=tmp_path, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.assign([T0])
        assert [r.offset for r in c.poll(timeout_ms=5000)[T0]] == [6, 7, 8, 9]
        with pytest.raises(OffsetOutOfRangeError, match="log start offset 6"):  # as below retention's first offset
            c.seek(T0, 3)


# -- consumer groups --------------------------------------------------------------------------------


def test_group_methods_follow_kafka_python(tmp_path):
    admin = KafkaAdminClient(root=tmp_path)
    admin.create_topic("t", 2)
    produce(tmp_path, "t", 5)
    assert admin.list_consumer_groups() == [] and admin.list_consumer_group_offsets("g") == {}
    with Consumer(root=tmp_path, group_id="g", enable_auto_commit=False) as c:
        c.assign([T0])
        c.commit({T0: OffsetAndMetadata(3, "batch 7", -1)})
    assert admin.list_consumer_groups() == [("g", "consumer")]
    assert admin.list_consumer_group_offsets("g") == {T0: OffsetAndMetadata(3, "batch 7", -1)}
    assert admin.list_consumer_group_offsets("g", partitions=[TopicPartition("t", 1)]) == {}
    (info,) = admin.describe_consumer_groups(["g"])
    assert (info.group, info.state, info.protocol_type, info.members) == ("g", "Empty", "consumer", [])
    assert admin.alter_consumer_group_offsets("g", {T0: 5, TopicPartition("t", 1): OffsetAndMetadata(0, "m", -1)}) == {
        T0: None,
        TopicPartition("t", 1): None,
    }
    assert admin.list_consumer_group_offsets("g") == {
        T0: OffsetAndMetadata(5, "", -1),
        TopicPartition("t", 1): OffsetAndMetadata(0, "m", -1),
    }
    assert [(g, e) for g, e in admin.delete_consumer_groups(["g"])] == [("g", None)]
    ((group, error),) = admin.delete_consumer_groups(["g"])
    assert group == "g" and isinstance(error, GroupIdNotFoundError)
    assert admin.list_consumer_groups() == []


def test_a_group_with_a_live_member_in_another_process_is_described_and_not_changed(tmp_path):
    admin = KafkaAdminClient(root=tmp_path)
    admin.create_topic("t", 2)
    produce(tmp_path, "t", 4)
    member = subprocess.Popen(
        [sys.executable, str(MEMBER), str(tmp_path), "g", "t"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert member.stdout is not None
        line = member.stdout.readline()
        assert line.startswith("A "), line
        (info,) = admin.describe_consumer_groups(["g"])
        assert info.state == "Stable" and len(info.members) == 1
        assert info.members[0].member_metadata == ["t"]
        assert info.members[0].member_assignment == [T0, TopicPartition("t", 1)]
        with pytest.raises(GroupNotEmptyError, match="live member"):
            admin.alter_consumer_group_offsets("g", {T0: 0})
        ((group, error),) = admin.delete_consumer_groups(["g"])
        assert group == "g" and isinstance(error, GroupNotEmptyError)
        member.send_signal(signal.SIGKILL)
        member.wait(timeout=60)
        # its process is gone: the group can change
        assert admin.delete_consumer_groups(["g"]) == [("g", None)]
    finally:
        if member.poll() is None:
            member.kill()
            member.wait(timeout=60)
        assert member.stdout is not None and member.stderr is not None
        member.stdout.close()
        member.stderr.close()


def test_delete_records_of_a_tiered_topic_never_reads_tier2_copies_below_the_start(tmp_path):
    from filechannel.tiering.daemon import TieringDaemon

    root = tmp_path / "root"
    admin = KafkaAdminClient(root=root)
    admin.create_topic(
        "t",
        tier=(tmp_path / "bucket").as_uri(),
        local_retention_bytes=0,
        segment_bytes=4096,
        compression_block_bytes=1024,
        tier_chunk_bytes=1024,
    )
    produce(root, "t", 300)
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    local = sorted(int(f.split(".")[0]) for f in os.listdir(root / "t" / "0") if f.endswith((".seg", ".seg.z")))
    assert local[0] > 150  # local retention 0: the uploaded segments below are only in tier-2
    assert admin.describe_topic("t").partitions[0].first_offset == 0  # offset 0 is read from tier-2
    assert admin.delete_records({T0: 150})[T0]["low_watermark"] == 150
    with Consumer(root=root, auto_offset_reset="earliest") as c:
        c.assign([T0])
        assert c.beginning_offsets([T0]) == {T0: 150}
        assert c.poll(timeout_ms=5000, max_records=1)[T0][0].offset == 150
        with pytest.raises(OffsetOutOfRangeError, match="log start offset 150"):
            c.seek(T0, 10)


def test_an_add_of_partitions_that_died_half_way_is_finished_by_a_retry(tmp_path):
    admin = KafkaAdminClient(root=tmp_path)
    admin.create_topic("t", 2)
    for p in (2, 3):  # what an add to 4 leaves if it dies before it rewrites topic.json
        (tmp_path / "t" / str(p)).mkdir()
    with pytest.raises(ConfigError, match='set "partitions" to 4'):
        Admin(tmp_path).describe_topic("t")
    with pytest.raises(InvalidPartitionsError, match="at least 4"):
        admin.create_partitions({"t": NewPartitions(3)})
    admin.create_partitions({"t": NewPartitions(4)})
    assert len(Admin(tmp_path).describe_topic("t").partitions) == 4


# -- altered settings on open channels ----------------------------------------------------------

PRODUCER = """
import os, sys, time
from filechannel.client import Producer
root = sys.argv[1]
with Producer(root) as p:
    for i in range(300):
        p.send("t", b"x" * 100, partition=0)
    p.flush()
    print("ready", flush=True)
    while not os.path.exists(os.path.join(root, "stop")):
        time.sleep(0.02)
"""


def test_an_altered_retention_is_applied_by_a_producer_already_open_in_another_process(tmp_path):
    root = tmp_path / "root"
    admin = Admin(root)
    admin.create_topic("t", segment_bytes=4096)  # no retention: nothing is ever deleted
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert producer.stdout is not None
        assert producer.stdout.readline().strip() == "ready"
        assert admin.describe_topic("t").partitions[0].first_offset == 0
        admin.alter_topic("t", {"retention_bytes": 0})  # every sealed segment is past it
        # only the producer's channel runs maintenance here: the admin reads, read-only
        wait_for(lambda: admin.describe_topic("t").partitions[0].first_offset > 0, what="the open producer to apply retention")
        assert admin.describe_topic("t").partitions[0].end_offset == 300
    finally:
        (root / "stop").write_bytes(b"")
        producer.wait(timeout=60)
        assert producer.stdout is not None
        producer.stdout.close()
    assert producer.returncode == 0


def test_settings_an_open_channel_cannot_take_are_named_and_the_others_applied(tmp_path):
    admin = Admin(tmp_path)
    admin.create_topic("t", segment_bytes=4096)
    with admin.open_partition("t", 0, maintenance_interval=0) as ch, ch.sender() as tx:
        tx.send(b"x")
        assert ch.apply_settings({"segment_bytes": 8192, "retention_ms": 1000, "compression": "none", "tier_after_ms": 5}) == [
            "compression"
        ]
        assert (ch.config.segment_bytes, ch.config.retention_ms, ch.config.compression) == (8192, 1000, "zstd")
        assert ch.apply_settings({}) == []  # a setting removed at the source returns to its default
        assert (ch.config.segment_bytes, ch.config.retention_ms) == (64 * 1024 * 1024, None)
