"""The value types of the Kafka-like client, named and shaped as in kafka-python (2.x) and aiokafka.

Every field of theirs is there, in their positional order, so code that reads them (by
name, by index or by unpacking) runs unchanged. The fields that describe a broker's wire
format have fixed values here: ``timestamp_type`` is always 0 (CreateTime: the producer's
timestamp, or the send time), ``leader_epoch`` is -1 (no leaders without a broker) and
``checksum`` is None (kafka-python's value for v2 record batches; every frame on disk has
its own CRC32C, checked on read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

from ..engine.record import Record, RecordLayout, shaped
from ..errors import ConfigError


class TopicPartition(NamedTuple):
    """A partition of a topic."""

    topic: str
    partition: int


def to_tp(obj: Any) -> TopicPartition:
    """``obj`` (a TopicPartition or a (topic, partition) pair) as a TopicPartition, or :class:`ConfigError`."""
    try:
        topic, partition = obj
    except (TypeError, ValueError):
        raise ConfigError(f"expected a TopicPartition(topic, partition), not {obj!r}") from None
    if not isinstance(topic, str) or isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ConfigError(f"expected a TopicPartition of a topic name and a partition number >= 0, not {obj!r}")
    return obj if type(obj) is TopicPartition else TopicPartition(topic, partition)


class RecordMetadata(NamedTuple):
    """Where a produced record landed: kafka-python's ``RecordMetadata`` fields, then aiokafka's
    two others (``timestamp_type`` 0, CreateTime; ``log_start_offset`` -1, not looked up).

    The serialized sizes are in bytes, -1 for an absent key or for no headers.
    """

    topic: str
    partition: int
    topic_partition: TopicPartition
    offset: int
    timestamp: int
    checksum: None = None
    serialized_key_size: int = -1
    serialized_value_size: int = -1
    serialized_header_size: int = -1
    timestamp_type: int = 0
    log_start_offset: int = -1


class ConsumerRecord(NamedTuple):
    """A record as :class:`Consumer` delivers it: kafka-python's ``ConsumerRecord``, its fields in
    its order (``leader_epoch`` third), key and value after deserialization.

    ``headers`` is a new list of ``(str, bytes)`` per record (``[]`` without headers), as
    kafka-python's. ``serialized_*_size`` are the stored sizes in bytes (-1: no key, no
    value, no headers); a header's size counts its UTF-8 name and its value.
    """

    topic: str
    partition: int
    leader_epoch: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Any
    value: Any
    headers: list[tuple[str, bytes]]
    checksum: None
    serialized_key_size: int
    serialized_value_size: int
    serialized_header_size: int


class AsyncConsumerRecord(NamedTuple):
    """A record as :class:`AsyncConsumer` delivers it: aiokafka's ``ConsumerRecord``, its fields
    in its order (``headers`` last, a tuple of ``(str, bytes)``; no ``leader_epoch``).

    aiokafka's is a dataclass; this is a named tuple with the same fields, positional order
    and attribute access (and unpacking besides).
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Any
    value: Any
    checksum: None
    serialized_key_size: int
    serialized_value_size: int
    headers: Sequence[tuple[str, bytes]]


class RecordShape(NamedTuple):
    """How a receiver's ``(offset, timestamp, key, value, headers)`` records become a client's
    record type: the constant fields (``template``, topic and partition at 0 and 1), where
    each of the record's fields goes (``slots``), where Kafka's serialized key, value and
    header sizes go (``size_slots``, -1: not a field), and the type its headers become (a list or a tuple)."""

    record_type: type[tuple[Any, ...]]
    template: tuple[Any, ...]
    slots: tuple[int, int, int, int, int]
    size_slots: tuple[int, int, int]
    headers_type: type[list[Any]] | type[tuple[Any, ...]]

    def build(self, topic: str, partition: int, records: list[Record]) -> list[Any]:
        """The receiver's records of one partition in this shape (keys and values as stored; the
        sizes are those of the stored bytes, as Kafka's)."""
        return shaped(
            self.record_type, (topic, partition, *self.template[2:]), records, self.slots, self.size_slots, self.headers_type
        )

    def layout(self, topic: str, partition: int) -> RecordLayout:
        """How a receiver decodes one partition's records straight into this shape (no
        :class:`Record` made first: that halved what a poll adds to a read at 100 B); the
        same records as :meth:`build`, which converts those with a key or headers."""
        offset, timestamp, _, value, headers = self.slots
        return RecordLayout(
            self.record_type,
            (topic, partition, *self.template[2:]),
            (offset, timestamp, value, self.size_slots[1], headers if self.headers_type is list else -1),
            partial(self.build, topic, partition),
        )

    def with_header(self, records: list[Any], header: tuple[str, bytes]) -> list[Any]:
        """``records`` (of this shape) with ``header`` after their own headers (not counted in
        their serialized header size: it is not stored with them)."""
        h = self.slots[4]
        if self.headers_type is list:  # a new list per record: extended where it is
            for rec in records:
                rec[h].append(header)
            return records
        new = tuple.__new__
        return [new(self.record_type, (*rec[:h], (*rec[h], header), *rec[h + 1 :])) for rec in records]

    def deserialized(
        self, records: list[Any], key_de: Callable[[bytes], Any] | None, value_de: Callable[[bytes], Any] | None
    ) -> list[Any]:
        """``records`` (of this shape) with keys and values that are not None deserialized."""
        if key_de is None and value_de is None:
            return records
        k, v = self.slots[2], self.slots[3]
        new = tuple.__new__
        out = []
        for rec in records:
            fields = list(rec)
            if key_de is not None and fields[k] is not None:
                fields[k] = key_de(fields[k])
            if value_de is not None and fields[v] is not None:
                fields[v] = value_de(fields[v])
            out.append(new(self.record_type, fields))
        return out


# kafka-python: (topic, partition, leader_epoch -1, offset, timestamp, timestamp_type 0 (CreateTime),
# key, value, headers (a list), checksum None, serialized key/value/header sizes).
KAFKA_PYTHON_RECORDS = RecordShape(
    ConsumerRecord, ("", 0, -1, 0, 0, 0, None, None, None, None, -1, -1, -1), (3, 4, 6, 7, 8), (10, 11, 12), list
)
# aiokafka: (topic, partition, offset, timestamp, timestamp_type 0, key, value, checksum None,
# serialized key/value sizes, headers (a tuple)).
AIOKAFKA_RECORDS = RecordShape(
    AsyncConsumerRecord, ("", 0, 0, 0, 0, None, None, None, -1, -1, ()), (2, 3, 5, 6, 10), (8, 9, -1), tuple
)


class OffsetAndTimestamp(NamedTuple):
    """The answer of ``offsets_for_times`` for one partition."""

    offset: int
    timestamp: int
    leader_epoch: int = -1


class ConsumerGroupMetadata(NamedTuple):
    """A group member as ``Consumer.group_metadata()`` gives it (Kafka's), for
    ``Producer.send_offsets_to_transaction``: a transaction's offsets are then committed only if
    this member still owns their partitions."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


class OffsetAndMetadata(NamedTuple):
    """A committed offset (the next record to consume) with free-form metadata.

    kafka-python >= 2.1 has three fields; the two-field form (``OffsetAndMetadata(5, "m")``)
    and the offset alone work too. ``metadata`` is stored with the offset and returned by
    ``committed(tp, metadata=True)``; ``leader_epoch`` is accepted and not stored (-1 back).
    """

    offset: int
    metadata: str = ""
    leader_epoch: int = -1


# Offsets are u64 on disk but signed 64-bit in Kafka's API: anything from 2**63 on is refused.
MAX_OFFSET = 2**63 - 1


def check_offset(tp: TopicPartition, offset: Any, what: str) -> int:
    """``offset`` (an int, or an :class:`OffsetAndMetadata`'s) as an int in [0, 2**63), or
    :class:`ConfigError` naming the partition and ``what`` was asked (seek, commit)."""
    if isinstance(offset, OffsetAndMetadata):
        offset = offset.offset
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_OFFSET:
        raise ConfigError(f"{what} {tp.topic}[{tp.partition}]: the offset must be an int from 0 to 2**63-1, not {offset!r}")
    return offset
