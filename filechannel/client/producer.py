"""Producer: sends records to topics, kafka-python style, straight into partition channels."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Self, Unpack

from ..channel import FileChannel
from ..config import ChannelConfig
from ..engine.appender import Appender
from ..engine.clock import now_ms
from ..engine.record import Headers, checked_timestamp, serialized_sizes
from ..errors import (
    ChannelClosedError,
    ConfigError,
    IllegalStateError,
    MessageTooLargeError,
    RecordTypeError,
    Timeout,
    UnknownPartitionError,
    UnknownTopicError,
)
from ..sender import Sender
from .durable import GroupSync
from .futures import RecordFuture, SentFuture
from .kafka_names import PRODUCER_IGNORED, ProducerConfigs, check_names
from .partitioner import DefaultPartitioner, as_partitioner
from .records import RecordMetadata, TopicPartition
from .serializer import Codec, TopicCodec, check_codec
from .topics import TopicStore
from .transaction import Transactions

if TYPE_CHECKING:
    from ..engine._codec import ProducerSend

_BYTES_LIKE = (bytes, bytearray, memoryview)
_new_metadata = tuple.__new__

_CSend: type[ProducerSend[..., RecordFuture[RecordMetadata]]] | None
try:  # Producer.send's short path in C (filechannel/engine/_codec.c), when it was built and loads
    from ..engine._codec import ProducerSend as _CSend
except ImportError:
    _CSend = None


def _nothing() -> None:
    """Nothing to do: a transactional producer keeps the partitions a commit appended to open."""


def _not_bytes(what: str, obj: Any, serializer: Codec | None) -> RecordTypeError:
    """The error for a record ``what`` ("key" or "value") that is not bytes after serialization."""
    if serializer is not None:
        return RecordTypeError(f"{what}_serializer returned {type(obj).__name__}, not bytes")
    return RecordTypeError(
        f"the {what} must be bytes, not {type(obj).__name__}: encode it (e.g. .encode()) or create the Producer with "
        f"{what}_serializer=..."
    )


_ACKS = {0: None, 1: None, -1: "always", "all": "always"}  # kafka-python's acks -> the fsync it asks for
_COMPRESSIONS = (None, "gzip", "snappy", "lz4", "zstd")
_HONOURED = (
    "acks",
    "allow_auto_create_topics",
    "batch_size",
    "client_id",
    "compression_type",
    "key_serializer",
    "linger_ms",
    "max_request_size",
    "partitioner",
    "transaction_timeout_ms",
    "transactional_id",
    "value_serializer",
)


class Producer:
    """Sends records to topics under ``root``. Thread-safe; any number of producers, in any
    number of processes, may send to the same topics at once.

    root: the folder holding the topics.
    linger_ms: the longest a record waits in the buffer before it is written (the
        partition channels' ``flush_interval``); default 5.
    batch_size: bytes buffered per partition before a write is forced; default 1 MiB.
    fsync: "never", "interval" or "always" (a send's future completes once the record is on
        disk); default: the topic's setting. A transactional producer fsyncs at each commit
        instead, whatever this says.
    acks: kafka-python's: 0 or 1 keep the topic's fsync policy; "all" (or -1) means
        ``fsync="always"`` unless ``fsync`` is given.
    partitioner: ``f(key_bytes_or_None, partition_count) -> partition``, or kafka-python
        2.x's ``f(key_bytes, all_partitions, available_partitions)``; default Kafka's
        (murmur2 of the key, round-robin without one).
    key_serializer / value_serializer: turn keys / values into bytes: a function of the value,
        or an object with ``serialize(topic, value)`` (kafka-python's ``Serializer``; see
        :mod:`.serializer`: ``JsonSerializer``, ``StringSerializer``); default: they must be
        bytes already.
    auto_create_topics (kafka-python: allow_auto_create_topics): create a missing topic
        (1 partition, default settings) on first send, if the root allows it (its
        ``auto.create.topics.enable``, true unless set false); else sending to it raises
        :class:`UnknownTopicError`.
    compression_type: kafka-python's; the compression of a topic this producer auto-creates
        (None: "none", any other: "zstd"). An existing topic keeps its own.
    max_request_size: the largest record (key, value and headers) this producer writes;
        at most the topic's ``max_record_bytes``.
    client_id: names this producer in its threads and errors.
    transactional_id: makes this a transactional producer (see :mod:`.transaction` and the
        README's "Transactions"): call :meth:`init_transactions` once, then
        :meth:`begin_transaction`, ``send`` to any topics and partitions of the root,
        :meth:`send_offsets_to_transaction`, and :meth:`commit_transaction` or
        :meth:`abort_transaction`. A transaction's records are written at commit, all of
        them with the offsets or none; a send's future completes then. ``[A-Za-z0-9._-]``.
    transaction_timeout_ms: a transaction open longer is aborted (its next send or commit
        raises :class:`TransactionAbortedError`); default 60000, Kafka's.
    Every other kafka-python name is accepted and ignored (see kafka_names.py and the
    README); an unknown name is a :class:`ConfigError`.

    ``send`` returns a :class:`~.futures.RecordFuture` (a ``concurrent.futures.Future``
    and kafka-python's ``FutureRecordMetadata``) of :class:`RecordMetadata`. The offset
    is known when the record is buffered, so the future is already done on return, except
    with ``fsync="always"``: then ``send`` returns at once and the future completes once an
    fsync covered the record (records sent meanwhile, by any thread, share that fsync); the
    record is queued, appended by a background thread, and its offset known only then, so
    an error about the record itself (too large) is raised by its future.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        linger_ms: float = 5,
        batch_size: int = 1024 * 1024,
        fsync: str | None = None,
        partitioner: Callable[..., int] | None = None,
        key_serializer: Codec | None = None,
        value_serializer: Codec | None = None,
        auto_create_topics: bool = True,
        **configs: Unpack[ProducerConfigs],
    ) -> None:
        check_names("Producer", configs, PRODUCER_IGNORED, _HONOURED)
        if isinstance(linger_ms, bool) or not isinstance(linger_ms, (int, float)) or not 0 <= linger_ms < math.inf:
            # inf would keep the partitions' writer lock from other processes for good; nan is no time
            raise ConfigError(f"linger_ms must be a finite number >= 0, not {linger_ms!r}")
        if fsync not in (None, "never", "interval", "always"):
            raise ConfigError(f"fsync must be 'never', 'interval' or 'always', not {fsync!r}")
        acks = configs.get("acks", 1)
        if isinstance(acks, bool) or acks not in _ACKS:
            raise ConfigError(f"acks must be 0, 1, -1 or 'all', not {acks!r}")
        compression = configs.get("compression_type")
        if compression not in _COMPRESSIONS:
            raise ConfigError(f"compression_type must be one of {_COMPRESSIONS}, not {compression!r}")
        max_request = configs.get("max_request_size")
        transaction_timeout_ms = configs.get("transaction_timeout_ms", 60_000)
        for name, value in (
            ("batch_size", batch_size),
            ("max_request_size", 1 if max_request is None else max_request),
            ("transaction_timeout_ms", transaction_timeout_ms),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, not {value!r}")
        auto_create_topics = configs.get("allow_auto_create_topics", auto_create_topics)
        if partitioner is not None and not callable(partitioner):
            raise ConfigError(f"partitioner must be callable, not {partitioner!r}")
        check_codec("key_serializer", key_serializer, "serialize")
        check_codec("value_serializer", value_serializer, "serialize")
        self._topics = TopicStore(root)
        self.client_id = str(configs.get("client_id") or f"filechannel-producer-{os.getpid()}-{id(self):x}")
        self._overrides: dict[str, Any] = {"flush_interval": linger_ms / 1000, "buffer_bytes": batch_size}
        if fsync is None:
            fsync = _ACKS[acks]
        if fsync is not None:
            self._overrides["fsync"] = fsync
        self._max_request = max_request
        self._new_topic_config = (
            {} if "compression_type" not in configs else {"compression": "none" if compression is None else "zstd"}
        )
        self._partitioner = as_partitioner(partitioner) if partitioner is not None else DefaultPartitioner()
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._key_codec = TopicCodec(key_serializer, "serialize")
        self._value_codec = TopicCodec(value_serializer, "serialize")
        self._auto_create = auto_create_topics
        self._lock = threading.Lock()
        self._channels: dict[tuple[str, int], FileChannel] = {}
        self._senders: dict[tuple[str, int], Any] = {}
        self._syncs: dict[tuple[str, int], GroupSync] = {}
        self._tps: dict[tuple[str, int], TopicPartition] = {}
        # topic -> (its partition's Appender, (topic, 0, TopicPartition)): see _fast_route
        self._routes: dict[str, tuple[Appender, tuple[str, int, TopicPartition]]] = {}
        self._c_send = None
        self._txn: Transactions | None = None
        transactional_id = configs.get("transactional_id")
        if transactional_id is not None:
            # Records wait in the transaction until its commit, which fsyncs them: the channels never do by themselves.
            self._overrides["fsync"] = "never"
            self._txn = Transactions(self._topics.root, transactional_id, transaction_timeout_ms, self._for_commit)
        elif _CSend is not None:  # send's short path in C, the Python one as its fallback (see _codec.c)
            self._c_send = self.send = _CSend(self._routes, self._py_send, SentFuture)  # type: ignore[method-assign]
        self._sent = 0
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
                topic_config = self._topics.meta(topic).get("config", {})
                if self._max_request is not None:  # only ever lowers the topic's limit: readers keep theirs
                    limit = topic_config.get("max_record_bytes", ChannelConfig.max_record_bytes)
                    overrides = {**overrides, "max_record_bytes": min(limit, self._max_request)}
                durable = overrides.get("fsync", topic_config.get("fsync")) == "always"
                if durable:  # the GroupSync fsyncs; the channel itself must not block sends
                    overrides = {**overrides, "fsync": "never"}
                ch = self._topics.open_partition(topic, partition, **overrides)
                self._channels[key] = ch
                sender = ch.sender()
                if durable:
                    self._syncs[key] = GroupSync(sender, topic, partition, self.client_id)
                self._senders[key] = sender
        return sender

    def _tp(self, topic: str, partition: int) -> TopicPartition:
        """The TopicPartition of a partition, made once (every RecordMetadata carries it)."""
        tp = self._tps.get((topic, partition))
        if tp is None:
            tp = self._tps.setdefault((topic, partition), TopicPartition(topic, partition))
        return tp

    def partitions_for(self, topic: str) -> set[int]:
        """The partition numbers of ``topic`` (creating it if allowed and missing, as kafka-python's does)."""
        return set(range(self._partition_count(topic)))

    def metrics(self, raw: bool = False) -> dict[str, dict[str, float]]:
        """kafka-python's ``metrics()``, small: records sent and partitions open, under ``producer-metrics``."""
        return {
            "producer-metrics": {
                "record-send-total": float(self._sent + (self._c_send.sent if self._c_send is not None else 0)),
                "partitions-open": float(len(self._senders)),
            }
        }

    def _partition_count(self, topic: str, partition: int | None = None) -> int:
        """The topic's partition count; a missing topic is created with one partition (if allowed
        and ``partition`` is None or 0: a send to a partition it would not have creates nothing)."""
        try:
            return self._topics.partitions(topic)
        except UnknownTopicError:
            if not self._auto_create or not self._topics.auto_create_allowed():  # the root's setting, as Kafka's broker's
                raise
            if partition:
                raise ConfigError(
                    f"topic {topic!r} does not exist and would be created with one partition, so it has no partition "
                    f"{partition}; create it first: Admin(root).create_topic({topic!r}, partitions=N)"
                ) from None
            self._topics.ensure(topic, 1, dict(self._new_topic_config))
            return self._topics.partitions(topic)

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordFuture[RecordMetadata]:
        """Send one record; returns a future of where it landed (kafka-python's argument order).

        Errors, as kafka-python reports them: a key or value that is not bytes (after the
        serializers), a bad partition or timestamp, a closed producer raise here, before
        anything is written (kafka-python raises these from ``send`` too); a record too large
        fails its future with :class:`MessageTooLargeError` (kafka-python returns a future
        failed with ``MessageSizeTooLargeError``), the same with every fsync policy.
        """
        route = self._routes.get(topic)
        if (
            route is not None
            and value.__class__ is bytes
            and key is None
            and headers is None
            and partition is None
            and timestamp_ms is None
        ):
            # The common case (see _fast_route): one call into the appender's C path, which
            # stamps the record, and a future that builds its metadata only if asked.
            try:
                at = route[0].append_stamped(value)
            except MessageTooLargeError as exc:
                return RecordFuture.rejected(exc)
            self._sent += 1
            return SentFuture.sent(route[1], at, len(value))
        return self._send(topic, value, key, headers, partition, timestamp_ms)

    _py_send = send  # ProducerSend's fallback when send is the C one

    def _fast_route(self, topic: str, sender: Any) -> None:
        """Let ``send`` take its short path for ``topic`` from now on, if that path means the
        same as the whole one: a topic of one partition (its partition count is cached for
        the producer's life either way), no serializers, the default partitioner (a user's
        would be called per record), no GroupSync (``fsync="always"`` queues records)."""
        if (
            self._key_serializer is None
            and self._value_serializer is None
            and type(self._partitioner) is DefaultPartitioner
            and self._topics.partitions(topic) == 1
            and (topic, 0) not in self._syncs
        ):
            with self._lock:
                if not self._closed:
                    self._routes[topic] = (sender.appender, (topic, 0, self._tp(topic, 0)))

    def send_serialized(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordFuture[RecordMetadata]:
        """:meth:`send` of a key and value that are bytes already: the producer's serializers are
        not applied (what aiokafka's ``send_batch`` sends: a batch holds bytes)."""
        return self._send(topic, value, key, headers, partition, timestamp_ms, serialize=False)

    def _send(
        self,
        topic: str,
        value: Any,
        key: Any,
        headers: Headers | None,
        partition: int | None,
        timestamp_ms: int | None,
        serialize: bool = True,
    ) -> RecordFuture[RecordMetadata]:
        """``send``'s whole path: serializers (unless ``serialize`` is false), checks, partitioner,
        keys, headers, GroupSync."""
        if self._closed:
            raise ChannelClosedError("this producer is closed")
        key_fn = value_fn = None
        if serialize:
            key_fn, value_fn = self._key_codec.for_topic(topic), self._value_codec.for_topic(topic)
        kbytes = key_fn(key) if (key_fn is not None and key is not None) else key
        vbytes = value_fn(value) if value_fn is not None else value
        if vbytes is None:
            pass  # a tombstone: read back with value None, distinct from b""
        elif vbytes.__class__ is not bytes and not isinstance(vbytes, _BYTES_LIKE):
            raise _not_bytes("value", vbytes, self._value_serializer if serialize else None)
        if kbytes is not None and kbytes.__class__ is not bytes and not isinstance(kbytes, _BYTES_LIKE):
            raise _not_bytes("key", kbytes, self._key_serializer if serialize else None)
        if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int) or partition < 0):
            raise ConfigError(f"partition must be an int >= 0, not {partition!r}")
        # Checked before the topic may be auto-created: a rejected send leaves nothing behind.
        timestamp_ms = now_ms() if timestamp_ms is None else checked_timestamp(timestamp_ms)
        count = self._partition_count(topic, partition)
        if partition is None:
            partition = self._partitioner(kbytes, count)
        elif partition >= count:
            raise UnknownPartitionError(
                f"partition {partition!r} does not exist: topic {topic!r} has partitions 0 to {count - 1}"
            )
        sender = self._sender(topic, partition)
        if self._txn is not None:
            limit = self._channels[(topic, partition)].config.max_record_bytes
            future = self._txn.add(topic, partition, kbytes, vbytes, headers, timestamp_ms, limit)
            self._sent += 1
            return future
        sync = self._syncs.get((topic, partition))
        self._sent += 1  # not atomic across threads: metrics() is an estimate, as Kafka's are
        if sync is not None:
            return sync.add(vbytes, kbytes, headers, timestamp_ms)
        try:
            offset = sender.send(vbytes, key=kbytes, headers=headers, timestamp=timestamp_ms)
        except MessageTooLargeError as exc:  # kafka-python: a failed future, as with fsync="always"
            return RecordFuture.rejected(exc)
        if topic not in self._routes:
            self._fast_route(topic, sender)
        tp = self._tps.get((topic, partition)) or self._tp(topic, partition)
        # tuple.__new__: the namedtuple's Python-level __new__ with 11 arguments cost more than the rest
        return RecordFuture.resolved(
            _new_metadata(
                RecordMetadata,
                (
                    topic,
                    partition,
                    tp,
                    offset,
                    timestamp_ms,
                    None,
                    -1 if kbytes is None else len(kbytes),
                    -1 if vbytes is None else len(vbytes),
                    serialized_sizes(None, None, headers)[2] if headers else -1,
                    0,
                    -1,
                ),
            )
        )

    # -- transactions (kafka-python 2.1's names) ------------------------------------------------

    def _transactions(self) -> Transactions:
        if self._txn is None:
            raise IllegalStateError("transactions need a transactional producer: create it with transactional_id=...")
        if self._closed:
            raise ChannelClosedError("this producer is closed")
        return self._txn

    def _for_commit(self, topic: str, partition: int) -> tuple[FileChannel, Sender, Callable[[], None]]:
        """A partition's channel and sender for a commit (or a recovery) to append through; kept open."""
        sender = self._sender(topic, partition)
        return self._channels[(topic, partition)], sender, _nothing

    def init_transactions(self) -> None:
        """Take this ``transactional_id``: every older producer with the id is fenced (its next
        send or commit raises :class:`ProducerFencedError`), and what a dead one committed is
        applied (what it had not committed was never written). Call once, before the first
        transaction."""
        self._transactions().init()

    def begin_transaction(self) -> None:
        """Open a transaction: the next sends and offsets belong to it."""
        self._transactions().begin()

    def send_offsets_to_transaction(self, offsets: dict[TopicPartition, Any], consumer_group_id: Any) -> None:
        """Commit consumed ``offsets`` ({TopicPartition: offset or OffsetAndMetadata}, the next
        record to read) of a group with the transaction. ``consumer_group_id``: the group id,
        or ``consumer.group_metadata()`` to also fence the consumer (its commit fails, as its
        own commits would, if it no longer owns one of those partitions)."""
        self._transactions().send_offsets(offsets, consumer_group_id)

    def commit_transaction(self) -> None:
        """Commit the open transaction: its records in every partition and its offsets, all
        of them (even if this process dies midway: the next recovery finishes it) or none.
        Raises :class:`ProducerFencedError` (fenced), :class:`~.errors.CommitFailedError` (a
        consumer lost a partition whose offset it commits; the transaction is then to abort)."""
        self._transactions().commit()

    def abort_transaction(self) -> None:
        """Drop the open transaction: none of it was written; its sends' futures fail."""
        self._transactions().abort()

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
        """Flush and release the partitions. Closing twice is harmless.

        ``timeout`` (seconds, kafka-python's) bounds the wait for records queued for an fsync.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._routes.clear()  # sends take the whole path again, which refuses
            channels = list(self._channels.values())
            syncs = list(self._syncs.values())
        if self._txn is not None:
            self._txn.close()
        for sync in syncs:
            sync.close(timeout)  # completes the futures still waiting for an fsync
        for ch in channels:
            ch.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
