"""kafka-python's error names (``kafka.errors``) for filechannel's errors.

``from filechannel.client.errors import KafkaError`` and then ``except KafkaError:`` catches
what kafka-python's would: each name is one of our classes (rooted at
:class:`~filechannel.errors.FileChannelError`, itself ``KafkaError``), so code written against
kafka-python runs with its imports changed and nothing else, and our own names keep working.

Several Kafka names share one class where filechannel does not tell the cases apart
(``InvalidConfigurationError`` and ``IllegalArgumentError`` are both a bad value:
:class:`~filechannel.errors.ConfigError`). ``NoBrokersAvailable`` is a root folder that cannot
hold topics (there is no broker to be unavailable).
"""

from __future__ import annotations

from ..errors import (
    CommitFailedError,
    ConfigError,
    CorruptRecordError,
    FencedInstanceIdError,
    FileChannelError,
    GroupNotEmptyError,
    GroupNotFoundError,
    IllegalStateError,
    InvalidNameError,
    InvalidPartitionsError,
    InvalidRecordError,
    MessageTooLargeError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    ProducerFencedError,
    RootUnavailableError,
    Timeout,
    TopicExistsError,
    TransactionAbortedError,
    UnknownTopicError,
    UnsupportedError,
)

KafkaError = FileChannelError
KafkaTimeoutError = Timeout
MessageSizeTooLargeError = MessageTooLargeError
RecordTooLargeError = MessageTooLargeError
InvalidRecordException = InvalidRecordError
TopicAlreadyExistsError = TopicExistsError
UnknownTopicOrPartitionError = UnknownTopicError  # UnknownPartitionError derives from it
NoBrokersAvailable = RootUnavailableError
InvalidConfigurationError = ConfigError
IllegalArgumentError = ConfigError
UnsupportedVersionError = UnsupportedError
InvalidTopicError = InvalidNameError
GroupIdNotFoundError = GroupNotFoundError

__all__ = [
    "CommitFailedError",
    "CorruptRecordError",
    "FencedInstanceIdError",
    "GroupIdNotFoundError",
    "GroupNotEmptyError",
    "IllegalArgumentError",
    "IllegalStateError",
    "InvalidConfigurationError",
    "InvalidPartitionsError",
    "InvalidRecordError",
    "InvalidRecordException",
    "InvalidTopicError",
    "KafkaError",
    "KafkaTimeoutError",
    "MessageSizeTooLargeError",
    "NoBrokersAvailable",
    "NoOffsetForPartitionError",
    "OffsetOutOfRangeError",
    "ProducerFencedError",
    "RecordTooLargeError",
    "TopicAlreadyExistsError",
    "TransactionAbortedError",
    "UnknownTopicOrPartitionError",
    "UnsupportedVersionError",
]
