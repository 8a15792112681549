"""filechannel: a durable, file-backed message log with a Kafka-like client API.

The public surface is re-exported here; the modules behind it may move.
"""

from .channel import FileChannel
from .config import ChannelConfig
from .engine.record import Record
from .errors import (
    AccessDeniedError,
    AckError,
    ChannelClosedError,
    CommitFailedError,
    ConfigError,
    CorruptRecordError,
    DiskFullError,
    ExportFormatError,
    FencedError,
    FileChannelError,
    InvalidNameError,
    LogCorruptedError,
    MessageTooLargeError,
    MissingSegmentError,
    NoOffsetForPartitionError,
    ObjectNotFoundError,
    OffsetOutOfRangeError,
    RecordTypeError,
    SenderFailedError,
    StorageError,
    StorageFullError,
    StorageUnavailableError,
    TierDataLostError,
    TierError,
    Timeout,
    TopicExistsError,
    UnknownTopicError,
)
from .receiver import AckReceiver, Receiver
from .sender import Sender

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "AckError",
    "AckReceiver",
    "ChannelClosedError",
    "ChannelConfig",
    "CommitFailedError",
    "ConfigError",
    "CorruptRecordError",
    "DiskFullError",
    "ExportFormatError",
    "FencedError",
    "FileChannel",
    "FileChannelError",
    "InvalidNameError",
    "LogCorruptedError",
    "MessageTooLargeError",
    "MissingSegmentError",
    "NoOffsetForPartitionError",
    "ObjectNotFoundError",
    "OffsetOutOfRangeError",
    "Receiver",
    "Record",
    "RecordTypeError",
    "Sender",
    "SenderFailedError",
    "StorageError",
    "StorageFullError",
    "StorageUnavailableError",
    "TierDataLostError",
    "TierError",
    "Timeout",
    "TopicExistsError",
    "UnknownTopicError",
]
