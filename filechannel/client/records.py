"""The value types of the Kafka-like client, named and shaped as in kafka-python."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..record import Headers


class TopicPartition(NamedTuple):
    """A partition of a topic."""

    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where a produced record landed."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class ConsumerRecord(NamedTuple):
    """A record as a consumer delivers it (key and value after deserialization)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Any
    value: Any
    headers: Headers


class OffsetAndTimestamp(NamedTuple):
    """The answer of ``offsets_for_times`` for one partition."""

    offset: int
    timestamp: int


class OffsetAndMetadata(NamedTuple):
    """A committed offset (the next record to consume) with free-form metadata."""

    offset: int
    metadata: str = ""
