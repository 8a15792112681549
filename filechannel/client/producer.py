"""Producer: sends records to topics, kafka-python style, straight into partition channels."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ..channel import FileChannel
from ..errors import ChannelClosedError, ConfigError, RecordTypeError, Timeout, UnknownTopicError
from ..record import Headers, checked_timestamp
from .durable import GroupSync
from .futures import RecordFuture
from .partitioner import DefaultPartitioner, Partitioner
from .records import RecordMetadata
from .topics import TopicStore

_BYTES_LIKE = (bytes, bytearray, memoryview)


def _not_bytes(what: str, obj: Any, serializer: Callable[[Any], bytes] | None) -> RecordTypeError:
    """The error for a record ``what`` ("key" or "value") that is not bytes after serialization."""
    if serializer is not None:
        return RecordTypeError(f"{what}_serializer returned {type(obj).__name__}, not bytes")
    return RecordTypeError(
        f"the {what} must be bytes, not {type(obj).__name__}: encode it (e.g. .encode()) or create the Producer with "
        f"{what}_serializer=..."
    )


Serializer = Callable[[Any], bytes]


class Producer:
    """Sends records to topics under ``root``. Thread-safe; any number of producers, in any
    number of processes, may send to the same topics at once.

    root: the folder holding the topics.
    linger_ms: the longest a record waits in the buffer before it is written (the
        partition channels' ``flush_interval``); default 5.
    batch_size: bytes buffered per partition before a write is forced; default 1 MiB.
    fsync: "never", "interval" or "always" (a send's future completes once the record is on
        disk); default: the topic's setting.
    partitioner: ``f(key_bytes_or_None, partition_count) -> partition``; default Kafka's
        (murmur2 of the key, round-robin without one).
    key_serializer / value_serializer: turn keys / values into bytes; default: they must be
        bytes already.
    auto_create_topics: create a missing topic (1 partition, default settings) on first
        send; with False, sending to it raises :class:`UnknownTopicError`.

    ``send`` returns a ``concurrent.futures.Future`` of :class:`RecordMetadata`. The offset
    is known when the record is buffered, so the future is already done on return, except
    with ``fsync="always"``: then ``send`` returns at once and the future completes once an
    fsync covered the record (records sent meanwhile, by any thread, share that fsync); the
    record is queued, appended by a background thread, and its offset known only then, so
    an error about the record itself (too large, not bytes) is raised by its future.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        linger_ms: float = 5,
        batch_size: int = 1024 * 1024,
        fsync: str | None = None,
        partitioner: Partitioner | None = None,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
        auto_create_topics: bool = True,
    ) -> None:
        if isinstance(linger_ms, bool) or not isinstance(linger_ms, (int, float)) or not 0 <= linger_ms < math.inf:
            # inf would keep the partitions' writer lock from other processes for good; nan is no time
            raise ConfigError(f"linger_ms must be a finite number >= 0, not {linger_ms!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be an int >= 1, not {batch_size!r}")
        if fsync not in (None, "never", "interval", "always"):
            raise ConfigError(f"fsync must be 'never', 'interval' or 'always', not {fsync!r}")
        for name, fn in (
            ("partitioner", partitioner),
            ("key_serializer", key_serializer),
            ("value_serializer", value_serializer),
        ):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name} must be callable, not {fn!r}")
        self._topics = TopicStore(root)
        self._overrides: dict[str, Any] = {"flush_interval": linger_ms / 1000, "buffer_bytes": batch_size}
        if fsync is not None:
            self._overrides["fsync"] = fsync
        self._partitioner = partitioner or DefaultPartitioner()
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._auto_create = auto_create_topics
        self._lock = threading.Lock()
        self._channels: dict[tuple[str, int], FileChannel] = {}
        self._senders: dict[tuple[str, int], Any] = {}
        self._syncs: dict[tuple[str, int], GroupSync] = {}
        self._closed = False

    def _sender(self, topic: str, partition: int) -> Any:
        key = (topic, partition)
        sender = self._senders.get(key)
        if sender is not None:
            return sender
        with self._lock:
            if self._closed:
                raise ChannelClosedError("this producer is closed")
            sender = self._senders.get(key)
            if sender is None:
                overrides = self._overrides
                durable = overrides.get("fsync", self._topics.meta(topic).get("config", {}).get("fsync")) == "always"
                if durable:  # the GroupSync fsyncs; the channel itself must not block sends
                    overrides = {**overrides, "fsync": "never"}
                ch = self._topics.open_partition(topic, partition, **overrides)
                self._channels[key] = ch
                sender = ch.sender()
                if durable:
                    self._syncs[key] = GroupSync(sender, topic, partition)
                self._senders[key] = sender
        return sender

    def partitions_for(self, topic: str) -> set[int]:
        """The partition numbers of ``topic`` (creating it if allowed and missing)."""
        return set(range(self._partition_count(topic)))

    def _partition_count(self, topic: str, partition: int | None = None) -> int:
        """The topic's partition count; a missing topic is created with one partition (if allowed
        and ``partition`` is None or 0: a send to a partition it would not have creates nothing)."""
        try:
            return self._topics.partitions(topic)
        except UnknownTopicError:
            if not self._auto_create:
                raise
            if partition:
                raise ConfigError(
                    f"topic {topic!r} does not exist and would be created with one partition, so it has no partition "
                    f"{partition}; create it first: Admin(root).create_topic({topic!r}, partitions=N)"
                ) from None
            self._topics.create(topic, 1, {}, exist_ok=True)
            return self._topics.partitions(topic)

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Future[RecordMetadata]:
        """Send one record; returns a future of where it landed."""
        if self._closed:
            raise ChannelClosedError("this producer is closed")
        kbytes = self._key_serializer(key) if (self._key_serializer and key is not None) else key
        vbytes = self._value_serializer(value) if self._value_serializer else value
        if vbytes is None:
            vbytes = b""
        elif vbytes.__class__ is not bytes and not isinstance(vbytes, _BYTES_LIKE):
            raise _not_bytes("value", vbytes, self._value_serializer)
        if kbytes is not None and kbytes.__class__ is not bytes and not isinstance(kbytes, _BYTES_LIKE):
            raise _not_bytes("key", kbytes, self._key_serializer)
        if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int) or partition < 0):
            raise ConfigError(f"partition must be an int >= 0, not {partition!r}")
        # Checked before the topic may be auto-created: a rejected send leaves nothing behind.
        timestamp_ms = int(time.time() * 1000) if timestamp_ms is None else checked_timestamp(timestamp_ms)
        count = self._partition_count(topic, partition)
        if partition is None:
            partition = self._partitioner(kbytes, count)
        elif partition >= count:
            raise ConfigError(f"partition {partition!r} does not exist: topic {topic!r} has partitions 0 to {count - 1}")
        sender = self._sender(topic, partition)
        sync = self._syncs.get((topic, partition))
        if sync is not None:
            return sync.add(vbytes, kbytes, headers, timestamp_ms)
        offset = sender.send(vbytes, key=kbytes, headers=headers, timestamp=timestamp_ms)
        return RecordFuture.resolved(RecordMetadata(topic, partition, offset, timestamp_ms))

    def flush(self, timeout: float | None = None) -> None:
        """Write every buffered record (and fsync, unless the policy is "never").

        With ``fsync="always"``, returns once every future sent so far is complete.
        """
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0):
            raise ConfigError(f"timeout must be None or a number of seconds >= 0, not {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        markers = {key: sync.marker() for key, sync in list(self._syncs.items())}
        for key, sender in list(self._senders.items()):
            if key not in markers:
                sender.flush()
        for key, marker in markers.items():
            try:
                marker.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                raise Timeout(f"flush: records of {key[0]}[{key[1]}] not on disk within {timeout} s") from None
            except Exception:
                pass  # the records' own futures carry the error

    def close(self, timeout: float | None = None) -> None:
        """Flush and release the partitions. Closing twice is harmless."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            channels = list(self._channels.values())
            syncs = list(self._syncs.values())
        for sync in syncs:
            sync.close(timeout)  # completes the futures still waiting for an fsync
        for ch in channels:
            ch.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
