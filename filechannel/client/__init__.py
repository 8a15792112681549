"""The Kafka-like client: topics of partitions under one root folder, no server.

Names and semantics follow kafka-python (``Producer``, ``Consumer``, ``poll``, ``commit``,
``seek``, ``offsets_for_times``; every configuration name, see ``kafka_names``) and aiokafka
for the async variants. The README's "Coming from Kafka" section maps one onto the other.
"""

from typing import TYPE_CHECKING, Any

from .admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions, NewTopic
from .assignors import (
    CooperativeStickyAssignor,
    RangePartitionAssignor,
    RoundRobinPartitionAssignor,
    StickyPartitionAssignor,
)
from .consumer import Consumer
from .producer import Producer
from .records import (
    AsyncConsumerRecord,
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    RecordMetadata,
    TopicPartition,
)
from .serializer import Deserializer, JsonSerializer, Serializer, StringSerializer
from .subscription import ConsumerRebalanceListener
from .topics import Admin, PartitionDescription, TopicDescription

if TYPE_CHECKING:
    from .aio import AsyncConsumer, AsyncProducer


def __getattr__(name: str) -> Any:
    """The async client when it is first asked for: importing it imports asyncio and anyio, which
    a process using only the blocking client (the CLI, Spark's Python workers) never needs."""
    if name in ("AsyncConsumer", "AsyncProducer"):
        from . import aio

        return getattr(aio, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Admin",
    "AsyncConsumer",
    "AsyncConsumerRecord",
    "AsyncProducer",
    "ConfigResource",
    "ConfigResourceType",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "CooperativeStickyAssignor",
    "Deserializer",
    "JsonSerializer",
    "KafkaAdminClient",
    "NewPartitions",
    "NewTopic",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "PartitionDescription",
    "Producer",
    "RangePartitionAssignor",
    "RecordMetadata",
    "RoundRobinPartitionAssignor",
    "Serializer",
    "StickyPartitionAssignor",
    "StringSerializer",
    "TopicDescription",
    "TopicPartition",
]
