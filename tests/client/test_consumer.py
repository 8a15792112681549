"""Consumer semantics kafka-python users rely on."""

import json
import time

import pytest

from filechannel import ConfigError
from filechannel.client import Admin, Consumer, OffsetAndTimestamp, Producer, TopicPartition
from filechannel.errors import CommitFailedError, NoOffsetForPartitionError, UnknownTopicError

TP0 = TopicPartition("t", 0)


@pytest.fixture
def root(tmp_path):
    Admin(tmp_path).create_topic("t", 2)
    with Producer(tmp_path) as p:
        for i in range(10):
            p.send("t", b"v%d" % i, partition=0, timestamp_ms=1000 + 100 * i)
        for i in range(5):
            p.send("t", b"w%d" % i, partition=1, timestamp_ms=5000 + i)
    return tmp_path


def drain(consumer, timeout_ms=200):
    out = []
    while batch := consumer.poll(timeout_ms=timeout_ms):
        for recs in batch.values():
            out.extend(recs)
    return out


def test_poll_returns_records_by_partition_in_order(root):
    with Consumer("t", root=root, auto_offset_reset="earliest") as c:
        recs = drain(c)
    by_part = {p: [r.value for r in recs if r.partition == p] for p in (0, 1)}
    assert by_part == {0: [b"v%d" % i for i in range(10)], 1: [b"w%d" % i for i in range(5)]}
    assert recs[0].topic == "t" and recs[0].timestamp in (1000, 5000)


def test_max_records_bounds_a_poll(root):
    with Consumer("t", root=root, auto_offset_reset="earliest", max_poll_records=3) as c:
        assert sum(len(v) for v in c.poll(timeout_ms=500).values()) == 3
        assert sum(len(v) for v in c.poll(timeout_ms=500, max_records=1).values()) == 1


def test_poll_after_seek(root):
    with Consumer(root=root) as c:
        c.assign([TP0])
        c.seek(TP0, 7)
        assert c.position(TP0) == 7
        assert [r.offset for r in c.poll(timeout_ms=500)[TP0]] == [7, 8, 9]
        c.seek_to_beginning(TP0)
        assert c.poll(timeout_ms=500)[TP0][0].offset == 0
        c.seek_to_end()
        assert c.poll(timeout_ms=50) == {}


@pytest.mark.parametrize("reset,expected", [("earliest", 0), ("latest", 10)])
def test_auto_offset_reset(root, reset, expected):
    with Consumer("t", root=root, group_id="g-" + reset, auto_offset_reset=reset) as c:
        assert c.position(TP0) == expected


def test_auto_offset_reset_none_raises_without_a_commit(root):
    # kafka-python: the error comes from poll (and position), not from the constructor.
    with (
        Consumer("t", root=root, group_id="g", auto_offset_reset="none") as c,
        pytest.raises(NoOffsetForPartitionError, match="auto_offset_reset is 'none'"),
    ):
        c.poll(timeout_ms=0)


def test_commit_then_restart_resumes_after_the_committed_offset(root):
    with Consumer("t", root=root, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.poll(timeout_ms=500, max_records=4)
        c.commit({TP0: 4, TopicPartition("t", 1): 0})
        assert c.committed(TP0) == 4
    with Consumer("t", root=root, group_id="g", auto_offset_reset="none") as c:
        assert c.position(TP0) == 4
        got = [r for r in drain(c) if r.partition == 0]
        assert got[0].offset == 4


def test_auto_commit_on_close(root):
    with Consumer("t", root=root, group_id="g", auto_offset_reset="earliest") as c:
        drain(c)
    with Consumer("t", root=root, group_id="g") as c:
        assert c.committed(TP0) == 10 and c.committed(TopicPartition("t", 1)) == 5


def test_committed_offsets_hold_back_garbage_collection(tmp_path):
    Admin(tmp_path).create_topic("gc", 1, segment_bytes=4096)
    with Producer(tmp_path) as p:
        for _ in range(300):
            p.send("gc", b"x" * 50)
    tp = TopicPartition("gc", 0)
    with Consumer("gc", root=tmp_path, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.poll(timeout_ms=500, max_records=100)
        c.commit()
    with Admin(tmp_path).open_partition("gc", 0, maintenance_interval=0) as ch:
        assert ch.positions.get("group.g") == 100
        ch.collect_garbage()
        assert 0 < ch.first_offset <= 100
    with Consumer("gc", root=tmp_path, group_id="g") as c:
        assert c.position(tp) == 100


def test_offsets_for_times_at_between_and_past(root):
    with Consumer(root=root) as c:
        c.assign([TP0])
        found = c.offsets_for_times({TP0: 1000, TopicPartition("t", 1): 5002})
        assert found == {TP0: OffsetAndTimestamp(0, 1000), TopicPartition("t", 1): OffsetAndTimestamp(2, 5002)}
        assert c.offsets_for_times({TP0: 1150})[TP0] == OffsetAndTimestamp(2, 1200)
        assert c.offsets_for_times({TP0: 99_999})[TP0] is None


def test_beginning_and_end_offsets(root):
    with Consumer(root=root) as c:
        tps = [TP0, TopicPartition("t", 1)]
        assert c.beginning_offsets(tps) == {tps[0]: 0, tps[1]: 0}
        assert c.end_offsets(tps) == {tps[0]: 10, tps[1]: 5}


def test_pause_and_resume(root):
    with Consumer("t", root=root, auto_offset_reset="earliest") as c:
        c.pause(TP0)
        assert c.paused() == {TP0}
        assert {r.partition for r in drain(c)} == {1}
        c.resume(TP0)
        assert {r.partition for r in drain(c)} == {0}


def test_deserializers_and_iteration_with_consumer_timeout(tmp_path):
    with Producer(tmp_path, value_serializer=lambda v: json.dumps(v).encode(), key_serializer=str.encode) as p:
        for i in range(3):
            p.send("j", {"n": i}, key="k")
    c = Consumer(
        "j",
        root=tmp_path,
        auto_offset_reset="earliest",
        consumer_timeout_ms=200,
        value_deserializer=json.loads,
        key_deserializer=bytes.decode,
    )
    got = [(r.key, r.value) for r in c]
    c.close()
    assert got == [("k", {"n": 0}), ("k", {"n": 1}), ("k", {"n": 2})]


def test_subscribe_by_pattern(tmp_path):
    for name in ("logs-a", "logs-b", "other"):
        Admin(tmp_path).create_topic(name)
    with Consumer(root=tmp_path) as c:
        c.subscribe(pattern=r"logs-.*")
        assert {tp.topic for tp in c.assignment()} == {"logs-a", "logs-b"}


def test_a_record_sent_while_polling_wakes_the_poll(root):
    with Consumer("t", root=root) as c, Producer(root) as p:
        start = time.monotonic()
        assert c.poll(timeout_ms=100) == {}
        assert time.monotonic() - start >= 0.09
        p.send("t", b"late", partition=1)
        p.flush()
        got = c.poll(timeout_ms=10_000)
        assert [r.value for r in got[TopicPartition("t", 1)]] == [b"late"]


def test_commit_needs_a_group_and_fencing_rejects_non_owners(root):
    with Consumer("t", root=root) as c, pytest.raises(ConfigError, match="group_id"):
        c.commit()
    a = Consumer("t", root=root, group_id="g", enable_auto_commit=False)
    try:
        with pytest.raises(CommitFailedError, match="no longer owns"):
            a.commit({TopicPartition("t", 5): 1})
    finally:
        a.close()


@pytest.mark.parametrize(
    "kwargs", [dict(auto_offset_reset="middle"), dict(max_poll_records=0), dict(heartbeat_interval_ms=20_000)]
)
def test_consumer_arguments_are_validated(root, kwargs):
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        Consumer("t", root=root, **kwargs)


def test_a_subscribed_topic_that_does_not_exist_yet_is_read_once_created(root):
    # kafka-python subscribes to a missing topic without an error and reads it once it exists.
    with Consumer("missing", root=root, auto_offset_reset="earliest", metadata_max_age_ms=50) as c:
        assert c.assignment() == set() and c.poll(timeout_ms=0) == {}
        with Producer(root, auto_create_topics=False) as p, pytest.raises(UnknownTopicError):
            p.send("missing", b"x")
        Admin(root).create_topic("missing")
        with Producer(root) as p:
            p.send("missing", b"first")
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = [r.value for recs in c.poll(timeout_ms=100).values() for r in recs]
        assert got == [b"first"]
        assert c.assignment() == {TopicPartition("missing", 0)}


def test_durable_producer_futures_complete_after_their_fsync(tmp_path, monkeypatch):
    import os as _os
    import threading

    from filechannel.client import Admin, Consumer, Producer

    Admin(tmp_path).create_topic("d", partitions=2, fsync="always")
    synced = []
    real_fsync = _os.fsync
    monkeypatch.setattr("filechannel.engine.appender.os.fsync", lambda fd: (real_fsync(fd), synced.append(1)))
    producer = Producer(tmp_path)
    futures = []

    def send(t):
        for i in range(300):
            futures.append(producer.send("d", b"%d-%d" % (t, i)))

    threads = [threading.Thread(target=send, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    producer.flush()
    assert all(f.done() and f.exception() is None for f in futures)
    assert len(synced) < len(futures) / 4  # records shared fsyncs (group commit)
    producer.close()
    with Consumer("d", root=tmp_path, auto_offset_reset="earliest") as c:
        got = [r.value for recs in c.poll(timeout_ms=500, max_records=5000).values() for r in recs]
    assert sorted(got) == sorted(b"%d-%d" % (t, i) for t in range(4) for i in range(300))


def test_durable_producer_fails_only_the_bad_record_and_keeps_order(tmp_path):
    from filechannel.client import Admin, Producer
    from filechannel.errors import MessageTooLargeError

    Admin(tmp_path).create_topic("d", fsync="always", max_record_bytes=1024)
    with Producer(tmp_path) as producer:
        futures = [producer.send("d", b"x%d" % i) for i in range(50)]
        bad = producer.send("d", b"y" * 2000)
        futures += [producer.send("d", b"z%d" % i) for i in range(50)]
        producer.flush()
        with pytest.raises(MessageTooLargeError, match="1024"):
            bad.result()
        offsets = [f.result().offset for f in futures]
    assert offsets == list(range(100))  # one thread's records land in the order it sent them


def test_a_group_consumer_on_a_root_that_does_not_exist_says_so_and_creates_nothing(tmp_path):
    """A typo in the root is not a new, empty root: the group's state has nowhere to go."""
    root = tmp_path / "typo"
    with pytest.raises(ConfigError, match=rf"the root folder '{root}' does not exist, so group 'g' cannot"):
        Consumer("t", root=root, group_id="g")
    assert not root.exists()
    with Consumer("t", root=root) as c:  # without a group nothing is created: it waits for the topic
        assert c.poll(timeout_ms=10) == {}
    assert not root.exists()
