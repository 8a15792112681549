"""filechannel: a durable, file-backed message log with a Kafka-like client API.

The public surface is re-exported here; the modules behind it may move.
"""

from .channel import FileChannel
from .config import ChannelConfig, ChannelSettings, TopicSettings
from .engine.record import Record
from .errors import (
    AccessDeniedError,
    AckError,
    ChannelClosedError,
    CommitFailedError,
    ConfigError,
    CorruptRecordError,
    DataLossError,
    DiskFullError,
    ExportFormatError,
    FencedError,
    FencedInstanceIdError,
    FileChannelError,
    GroupNotEmptyError,
    GroupNotFoundError,
    IllegalStateError,
    InvalidNameError,
    InvalidPartitionsError,
    InvalidRecordError,
    LogCorruptedError,
    MessageTooLargeError,
    MetadataDamagedError,
    MissingSegmentError,
    NoOffsetForPartitionError,
    NotOwnerError,
    ObjectNotFoundError,
    OffsetOutOfRangeError,
    OriginLayoutError,
    ProducerFencedError,
    ReadOnlyError,
    RecordTypeError,
    RootUnavailableError,
    SenderFailedError,
    SinkError,
    StorageError,
    StorageFullError,
    StorageUnavailableError,
    TierDataLostError,
    TierError,
    Timeout,
    TopicExistsError,
    TransactionAbortedError,
    UnknownPartitionError,
    UnknownTopicError,
    UnsupportedError,
)
from .receiver import AckReceiver, Receiver
from .sender import Sender

__version__ = "0.1.0"


def native_extensions() -> dict[str, bool]:
    """Which C fast paths this process loaded: ``codec`` (frame encoding and decoding, the
    appender, the consumer's records; filechannel/engine/_codec.c) and ``readahead`` (the
    background decompression of sealed segments; _readahead.c). False means the pure-Python
    code runs instead: same results, slower. They are built at install when a C compiler is
    there; the codec loads only on x86-64 with SSE4.2. ``filechannel --version`` prints them."""
    from .engine import readahead, record

    return {"codec": record.NATIVE, "readahead": readahead.NATIVE}


__all__ = [
    "AccessDeniedError",
    "AckError",
    "AckReceiver",
    "ChannelClosedError",
    "ChannelConfig",
    "ChannelSettings",
    "CommitFailedError",
    "ConfigError",
    "CorruptRecordError",
    "DataLossError",
    "DiskFullError",
    "ExportFormatError",
    "FencedError",
    "FencedInstanceIdError",
    "FileChannel",
    "FileChannelError",
    "GroupNotEmptyError",
    "GroupNotFoundError",
    "IllegalStateError",
    "InvalidNameError",
    "InvalidPartitionsError",
    "InvalidRecordError",
    "LogCorruptedError",
    "MessageTooLargeError",
    "MetadataDamagedError",
    "MissingSegmentError",
    "NoOffsetForPartitionError",
    "NotOwnerError",
    "ObjectNotFoundError",
    "OffsetOutOfRangeError",
    "OriginLayoutError",
    "ProducerFencedError",
    "ReadOnlyError",
    "Receiver",
    "Record",
    "RecordTypeError",
    "RootUnavailableError",
    "Sender",
    "SenderFailedError",
    "SinkError",
    "StorageError",
    "StorageFullError",
    "StorageUnavailableError",
    "TierDataLostError",
    "TierError",
    "Timeout",
    "TopicExistsError",
    "TopicSettings",
    "TransactionAbortedError",
    "UnknownPartitionError",
    "UnknownTopicError",
    "UnsupportedError",
    "native_extensions",
]
