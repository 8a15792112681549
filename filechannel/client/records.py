"""The value types of the Kafka-like client, named and shaped as in kafka-python (2.x).

Every kafka-python field is there, so code that reads them runs unchanged. The fields
that describe a broker's wire format have fixed values here: ``timestamp_type`` is always
0 (CreateTime: the producer's timestamp, or the send time), ``leader_epoch`` is -1 (no
leaders without a broker) and ``checksum`` is None (kafka-python's value for v2 record
batches; every frame on disk has its own CRC32C, checked on read).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..engine.record import Headers

# The fields of a ConsumerRecord after the receiver's (offset, timestamp, key, value, headers).
CONSUMER_RECORD_SUFFIX = (0, -1, None)  # timestamp_type CreateTime, leader_epoch unknown, checksum


class TopicPartition(NamedTuple):
    """A partition of a topic."""

    topic: str
    partition: int


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
    """A record as a consumer delivers it (key and value after deserialization).

    The first seven fields are in this order (older filechannel versions had only those);
    kafka-python's others follow. Read them by name: kafka-python's positional order
    differs (``leader_epoch`` third). ``serialized_*_size`` are the stored sizes in bytes
    (-1: no key, no headers); a header's size counts its UTF-8 name and its value.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Any
    value: Any
    headers: Headers
    timestamp_type: int = 0
    leader_epoch: int = -1
    checksum: None = None
    serialized_key_size: int = -1
    serialized_value_size: int = -1
    serialized_header_size: int = -1


class OffsetAndTimestamp(NamedTuple):
    """The answer of ``offsets_for_times`` for one partition."""

    offset: int
    timestamp: int
    leader_epoch: int = -1


class OffsetAndMetadata(NamedTuple):
    """A committed offset (the next record to consume) with free-form metadata.

    kafka-python >= 2.1 has three fields; the two-field form (``OffsetAndMetadata(5, "m")``)
    and the offset alone work too. ``metadata`` is stored with the offset and returned by
    ``committed(tp, metadata=True)``; ``leader_epoch`` is accepted and not stored (-1 back).
    """

    offset: int
    metadata: str = ""
    leader_epoch: int = -1
