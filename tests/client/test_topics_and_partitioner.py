"""Topics under a root folder, and Kafka's partitioner."""

import json
import subprocess
import sys

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from filechannel import ConfigError, InvalidNameError
from filechannel.client import Admin, Producer
from filechannel.client.partitioner import DefaultPartitioner, murmur2
from filechannel.errors import TopicExistsError, UnknownTopicError
from filechannel.root import partition_name, split_partition_name


def test_create_list_describe_delete(tmp_path):
    admin = Admin(tmp_path)
    admin.create_topic("orders", partitions=3, retention_ms=60_000, segment_bytes=1 << 20)
    admin.create_topic("audit")
    assert admin.list_topics() == ["audit", "orders"]
    meta = json.loads((tmp_path / "orders" / "topic.json").read_text())
    assert meta == {"name": "orders", "partitions": 3, "config": {"retention_ms": 60_000, "segment_bytes": 1 << 20}}
    with Producer(tmp_path) as p:
        p.send("orders", b"x", partition=2)
    desc = admin.describe_topic("orders")
    assert [(d.partition, d.first_offset, d.end_offset) for d in desc.partitions] == [(0, 0, 0), (1, 0, 0), (2, 0, 1)]
    assert desc.partitions[2].size_bytes > desc.partitions[0].size_bytes
    assert desc.config["retention_ms"] == 60_000
    admin.delete_topic("orders")
    assert admin.list_topics() == ["audit"] and not (tmp_path / "orders").exists()


@pytest.mark.parametrize(
    "call,error",
    [
        (lambda a: a.create_topic("a/b"), InvalidNameError),
        (lambda a: a.create_topic(".."), InvalidNameError),
        (lambda a: a.create_topic(".hidden"), ConfigError),
        (lambda a: a.create_topic("t", partitions=0), ConfigError),
        (lambda a: a.create_topic("t", fsync="sometimes"), ConfigError),
        (lambda a: a.create_topic("t", flush_interval=1), ConfigError),
        (lambda a: a.describe_topic("missing"), UnknownTopicError),
        (lambda a: a.delete_topic("missing"), UnknownTopicError),
    ],
)
def test_bad_admin_calls_raise_clear_errors(tmp_path, call, error):
    with pytest.raises(error):
        call(Admin(tmp_path))


def test_creating_an_existing_topic(tmp_path):
    admin = Admin(tmp_path)
    admin.create_topic("t", 2)
    with pytest.raises(TopicExistsError):
        admin.create_topic("t", 2)
    admin.create_topic("t", 2, exist_ok=True)  # the same topic: silent
    with pytest.raises(TopicExistsError, match="partitions 2, not 5"):
        admin.create_topic("t", 5, exist_ok=True)
    with pytest.raises(TopicExistsError, match="retention_ms None, not 1000"):
        admin.create_topic("t", 2, exist_ok=True, retention_ms=1000)
    assert len(admin.describe_topic("t").partitions) == 2
    assert admin.describe_topic("t").config == {}


@pytest.mark.parametrize(
    "key,expected",
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
        (b"", 275646681),
    ],
)
def test_murmur2_matches_kafkas_test_vectors(key, expected):
    assert murmur2(key) == expected


def test_keyed_partitioning_is_stable_across_processes(tmp_path):
    keys = [b"user-%d" % i for i in range(200)]
    here = [DefaultPartitioner()(k, 7) for k in keys]
    script = (
        "from filechannel.client.partitioner import DefaultPartitioner;"
        "p = DefaultPartitioner();"
        "print([p(b'user-%d' % i, 7) for i in range(200)])"
    )
    there = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123", "PATH": ""}
    )
    assert eval(there.stdout) == here
    assert len(set(here)) == 7


def test_producer_puts_a_key_on_one_partition_and_spreads_unkeyed(tmp_path):
    Admin(tmp_path).create_topic("t", 4)
    with Producer(tmp_path) as p:
        keyed = {p.send("t", b"v", key=b"same").result().partition for _ in range(20)}
        unkeyed = {p.send("t", b"v").result().partition for _ in range(20)}
    assert len(keyed) == 1 and unkeyed == {0, 1, 2, 3}


def test_missing_topic_is_created_or_refused(tmp_path):
    with Producer(tmp_path) as p:
        assert p.send("auto", b"x").result().offset == 0
    assert Admin(tmp_path).list_topics() == ["auto"]
    with Producer(tmp_path, auto_create_topics=False) as p, pytest.raises(UnknownTopicError, match="nothere"):
        p.send("nothere", b"x")


@pytest.mark.parametrize("kwargs", [dict(linger_ms=-1), dict(batch_size=0), dict(fsync="maybe"), dict(partitioner=3)])
def test_producer_arguments_are_validated(tmp_path, kwargs):
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        Producer(tmp_path, **kwargs)


@given(st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,30}", fullmatch=True), st.integers(min_value=0, max_value=10**6))
def test_a_partition_name_splits_back_into_its_topic_and_partition(topic: str, partition: int) -> None:
    assume(topic not in (".", ".."))
    assert split_partition_name(partition_name(topic, partition)) == (topic, partition)


@pytest.mark.parametrize("name", ["t", "t/", "/0", "t/x", "t/-1", "a/b/0", "t/²", "../0", "t/0 "])
def test_a_name_that_is_not_topic_slash_partition_is_refused_naming_it(name: str) -> None:
    with pytest.raises(ValueError, match="is not TOPIC/PARTITION"):
        split_partition_name(name)
