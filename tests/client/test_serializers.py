"""Serializers as kafka-python takes them (functions, or objects with serialize(topic, value) /
deserialize(topic, data)), the ones it ships, and aiokafka's last_poll_timestamp."""

from __future__ import annotations

import time

import anyio
import pytest

from filechannel.client import (
    Admin,
    AsyncConsumer,
    Consumer,
    JsonSerializer,
    Producer,
    Serializer,
    StringSerializer,
    TopicPartition,
)
from filechannel.errors import ConfigError, IllegalStateError

T0 = TopicPartition("t", 0)


class TopicTagged(Serializer):
    """A serializer that needs the topic (as a schema registry's does)."""

    def __init__(self) -> None:
        self.topics: list[str] = []

    def serialize(self, topic: str, value: object) -> bytes:
        self.topics.append(topic)
        return f"{topic}:{value}".encode()


def test_json_and_string_serializers_round_trip_through_producer_and_consumer(tmp_path):
    Admin(tmp_path).create_topic("t", 1)
    with Producer(root=tmp_path, value_serializer=JsonSerializer(), key_serializer=StringSerializer()) as producer:
        producer.send("t", {"n": 1, "tags": ["a"]}, key="k1").get(timeout=10)
        producer.send("t", [2, None], key="k2").get(timeout=10)
    consumer = Consumer(
        root=tmp_path,
        auto_offset_reset="earliest",
        value_deserializer=JsonSerializer(),
        key_deserializer=StringSerializer(),
        enable_auto_commit=False,
    )
    consumer.assign([T0])
    try:
        got = consumer.poll(timeout_ms=5000)[T0]
    finally:
        consumer.close()
    assert [(r.key, r.value) for r in got] == [("k1", {"n": 1, "tags": ["a"]}), ("k2", [2, None])]


def test_a_serializer_object_gets_each_records_topic(tmp_path):
    tagged = TopicTagged()
    with Producer(root=tmp_path, value_serializer=tagged) as producer:
        producer.send("a", 1).get(timeout=10)
        producer.send("b", 2).get(timeout=10)
    assert tagged.topics == ["a", "b"]
    consumer = Consumer(root=tmp_path, auto_offset_reset="earliest", value_deserializer=bytes.decode, enable_auto_commit=False)
    consumer.assign([TopicPartition("a", 0), TopicPartition("b", 0)])
    try:
        values = sorted(r.value for recs in consumer.poll(timeout_ms=5000).values() for r in recs)
    finally:
        consumer.close()
    assert values == ["a:1", "b:2"]  # a plain function still works as a deserializer


def test_a_serializer_that_is_neither_a_function_nor_an_object_with_the_method_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"value_serializer must be a function or have a serialize\(topic, value\)"):
        Producer(root=tmp_path, value_serializer=42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"key_deserializer must be a function or have a deserialize"):
        Consumer(root=tmp_path, key_deserializer="json")  # type: ignore[arg-type]


def test_last_poll_timestamp_says_when_a_fetch_last_read_the_partition(tmp_path):
    Admin(tmp_path).create_topic("t", 1)
    with Producer(root=tmp_path) as producer:
        producer.send("t", b"x").get(timeout=10)

    async def main() -> None:
        async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
            before = time.time() * 1000
            with pytest.raises(IllegalStateError):
                consumer.last_poll_timestamp(TopicPartition("t", 7))
            assert consumer.last_poll_timestamp(T0) is None  # assigned, never fetched
            batch = await consumer.getmany(timeout_ms=5000)
            assert [r.value for r in batch[T0]] == [b"x"]
            first = consumer.last_poll_timestamp(T0)
            assert first is not None and before - 1 <= first <= time.time() * 1000 + 1
            assert await consumer.getmany(timeout_ms=50) == {}  # a fetch that reads nothing still counts
            second = consumer.last_poll_timestamp(T0)
            assert second is not None and second >= first

    anyio.run(main)
