"""filechannel: a durable, file-backed message log with a Kafka-like client API.

The public surface is re-exported here; the modules behind it may move.
"""

from .channel import FileChannel
from .config import ChannelConfig
from .errors import (
    AckError,
    ChannelClosedError,
    ConfigError,
    CorruptRecordError,
    DiskFullError,
    FileChannelError,
    InvalidNameError,
    LogCorruptedError,
    MessageTooLargeError,
    MissingSegmentError,
    OffsetOutOfRangeError,
    RecordTypeError,
    SenderFailedError,
    StorageError,
    Timeout,
)
from .receiver import AckReceiver, Receiver
from .record import Record
from .sender import Sender

__version__ = "0.1.0"

__all__ = [
    "AckError",
    "AckReceiver",
    "ChannelClosedError",
    "ChannelConfig",
    "ConfigError",
    "CorruptRecordError",
    "DiskFullError",
    "FileChannel",
    "FileChannelError",
    "InvalidNameError",
    "LogCorruptedError",
    "MessageTooLargeError",
    "MissingSegmentError",
    "OffsetOutOfRangeError",
    "Receiver",
    "Record",
    "RecordTypeError",
    "Sender",
    "SenderFailedError",
    "StorageError",
    "Timeout",
]
