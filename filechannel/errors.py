"""Every exception filechannel raises, rooted at :class:`FileChannelError`.

Errors from the layers below (the OS, zstandard, and later boto3, fsspec and
pyspark) are translated at the boundary, so a caller only ever has to catch
the families defined here. Each message names what was involved (the file,
the offset) and, where there is one, what to do about it.
"""

from __future__ import annotations

import errno
import os
from types import TracebackType


class FileChannelError(Exception):
    """Base class of every error raised by filechannel."""


class ConfigError(FileChannelError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class InvalidNameError(FileChannelError, ValueError):
    """A name that becomes part of a path is not allowed (only ``[A-Za-z0-9._-]``, no ``..``)."""


class RecordTypeError(FileChannelError, TypeError):
    """A value, key or header is not of a type a record holds (bytes, and str for header names)."""


class MessageTooLargeError(FileChannelError, ValueError):
    """A record is larger than the configured ``max_record_bytes``; nothing was written."""


class InvalidRecordError(FileChannelError, ValueError):
    """A record the channel cannot take as it is: a record without a key sent to a compacted
    channel (Kafka's InvalidRecordException), where compaction keeps records by key."""


class ChannelClosedError(FileChannelError):
    """The channel, sender or receiver was used after it was closed."""


class Timeout(FileChannelError, TimeoutError):
    """A blocking call did not complete within its timeout."""


class OffsetOutOfRangeError(FileChannelError, IndexError):
    """An offset lies below the first retained offset (retention deleted it) or past the end."""


class CorruptRecordError(FileChannelError):
    """A frame failed its CRC-32C check or is malformed inside data that should be whole."""

    # Set on the error for a CRC mismatch met while decoding a buffer (engine.record.decode_records):
    # the frame's position in the buffer, and its offset. Not set on other corruption errors.
    position: int
    offset: int


class AckError(FileChannelError, ValueError):
    """An ack receiver was asked to acknowledge more records than it has delivered."""


class SenderFailedError(FileChannelError):
    """A previous write failed; the sender refuses further records until the channel is reopened."""


class UnknownTopicError(FileChannelError, KeyError):
    """The topic does not exist (and auto-creation is off)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownPartitionError(UnknownTopicError, ConfigError):
    """The topic exists but has no partition of that number (kafka-python: UnknownTopicOrPartitionError).
    A ConfigError too: a bad partition number was one before this class existed."""


class TopicExistsError(FileChannelError):
    """A topic of that name already exists (with ``exist_ok``: with other settings or another partition count)."""


class InvalidPartitionsError(ConfigError):
    """A partition count a topic cannot take: fewer than it has (partitions are never removed) or out of range."""


class IllegalStateError(ConfigError):
    """A call the object's state does not allow (``subscribe`` after ``assign``, a partition not assigned)."""


class UnsupportedError(ConfigError):
    """A Kafka feature filechannel does not provide (broker timestamps, ...)."""


class GroupNotFoundError(ConfigError):
    """There is no consumer group of that name under the root."""


class GroupNotEmptyError(ConfigError):
    """The consumer group has a live member, so its offsets cannot be changed nor the group deleted from outside."""


class CommitFailedError(FileChannelError):
    """A commit was rejected: this consumer no longer owns the partition (its generation is stale)."""


class FencedInstanceIdError(FileChannelError):
    """A consumer's ``group_instance_id`` is in use by another live member of its group."""


class ProducerFencedError(FileChannelError):
    """A producer with the same ``transactional_id`` called ``init_transactions()`` later: this one is a zombie."""


class TransactionAbortedError(FileChannelError):
    """The transaction was aborted (open past ``transaction_timeout_ms``, or its commit refused); call ``abort_transaction()``."""


class NoOffsetForPartitionError(FileChannelError):
    """A partition has no committed offset and ``auto_offset_reset`` is "none"."""


class StorageError(FileChannelError, OSError):
    """An operating-system error on a file of the channel, with the path in the message."""


class DiskFullError(StorageError):
    """The disk (or the file-size limit) is full; the log stays readable up to its last whole record."""


class RootUnavailableError(StorageError):
    """The root folder cannot hold topics (it is a file, or not accessible): kafka-python's NoBrokersAvailable."""


class MissingSegmentError(CorruptRecordError):
    """Offsets between two segments are missing: a segment file in the middle of the log was deleted or lost."""


class LogCorruptedError(CorruptRecordError):
    """Damage in the middle of the log (not a torn tail): nothing was cut; appends are refused until a repair."""


class TierError(FileChannelError):
    """An operation on tier-2 (chunk storage or its metadata) failed."""


class ObjectNotFoundError(TierError, FileNotFoundError):
    """The object does not exist in chunk storage."""


class StorageUnavailableError(TierError):
    """Chunk storage could not be reached or kept failing after retries; retry later."""


class AccessDeniedError(TierError, PermissionError):
    """The credentials were refused by chunk storage (the message never contains a secret)."""


class StorageFullError(TierError):
    """Chunk storage refused the write for lack of space or quota."""


class FencedError(TierError):
    """A newer uploader took over (its epoch is newer); this one must stop."""


class ReadOnlyError(ConfigError):
    """A write to something read-only: a channel opened with ``read_only=True``, or any part of a
    replica root (``tier rebuild --replica``), which never sends, uploads or deletes."""


class NotOwnerError(TierError):
    """Another root owns this tier-2 prefix (its claim is in the bucket): this root uploads, sweeps and deletes nothing there."""


class OriginLayoutError(NotOwnerError):
    """A tier URL holds the other origin layout: a root without an origin at a URL that has roots with
    origins, or the reverse (their topics would mix); this root tiers nothing there."""


class MetadataDamagedError(TierError):
    """The local tier-2 index (``metadata.db``) is damaged or not a database; it is rebuilt from the bucket."""


class DataLossError(OffsetOutOfRangeError):
    """Records a Spark query needs are gone (retention, garbage collection, a truncated log)."""


class SinkError(FileChannelError):
    """The Spark sink cannot write what it was given."""


class TierDataLostError(TierError, CorruptRecordError):
    """Offsets of a tier-2 segment were marked lost by ``tier fsck --repair`` (objects gone, no local copy)."""


class ExportFormatError(TierError):
    """A file or object is not a tier-2 metadata export of a version this filechannel reads, or is damaged."""


_FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


def storage_error(exc: OSError, action: str, path: str | os.PathLike[str]) -> StorageError:
    """Translate an :class:`OSError` into our hierarchy, naming the action and the path."""
    cls = DiskFullError if exc.errno in _FULL_ERRNOS else StorageError
    reason = exc.strerror or str(exc)
    hint = " Free some space (or raise the limit) and reopen the channel." if cls is DiskFullError else ""
    return cls(exc.errno or 0, f"cannot {action} {os.fspath(path)!r}: {reason}.{hint}")


def file_vanished(exc: BaseException) -> bool:
    """Whether ``exc`` says a file does not exist (bare, or wrapped as a :class:`StorageError`).

    Compression replaces a ``.seg`` by a ``.seg.z`` and garbage collection deletes sealed
    segments at any moment, so code that lists and then opens segments meets this normally.
    """
    return isinstance(exc, FileNotFoundError) or (isinstance(exc, StorageError) and exc.errno == errno.ENOENT)


class os_errors:  # lower case: used as the function it replaced was, ``with os_errors(...)``
    """Context manager that re-raises any :class:`OSError` as a :class:`StorageError`.

    A class rather than a ``@contextmanager`` generator: it wraps every chunk a reader
    reads, and a generator costs much more a use.
    """

    __slots__ = ("action", "path")

    def __init__(self, action: str, path: str | os.PathLike[str]) -> None:
        self.action = action
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(exc, OSError) and not isinstance(exc, StorageError):
            raise storage_error(exc, self.action, self.path) from exc
