"""Consumer: reads topics kafka-python style, alone or as a member of a group."""

from __future__ import annotations

import math
import os
import re
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import Future
from functools import partial
from itertools import repeat, starmap
from typing import Any, Literal, Protocol, TypeVar, overload

from ..channel import FileChannel
from ..engine.cursor import WouldBlock
from ..engine.record import RecordLayout
from ..engine.wakeup import Wakeup
from ..errors import (
    ChannelClosedError,
    CommitFailedError,
    ConfigError,
    FileChannelError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    UnknownTopicError,
)
from ..receiver import Receiver
from .group import GroupMember, position_name
from .kafka_names import CONSUMER_IGNORED, check_names
from .records import KAFKA_PYTHON_RECORDS, ConsumerRecord, OffsetAndMetadata, OffsetAndTimestamp, RecordShape, TopicPartition
from .topics import TopicStore

T = TypeVar("T")
Deserializer = Callable[[bytes], Any]
# What commit takes: offsets, OffsetAndMetadata or both by partition (three dict types: a dict's value type is invariant).
CommitOffsets = (
    dict[TopicPartition, int] | dict[TopicPartition, OffsetAndMetadata] | dict[TopicPartition, OffsetAndMetadata | int]
)
_RESETS = ("earliest", "latest", "none")
_HONOURED = (
    "auto_commit_interval_ms",
    "auto_offset_reset",
    "client_id",
    "consumer_timeout_ms",
    "default_offset_commit_callback",
    "enable_auto_commit",
    "group_id",
    "heartbeat_interval_ms",
    "isolation_level",
    "fetch_max_bytes",
    "key_deserializer",
    "max_partition_fetch_bytes",
    "max_poll_records",
    "metadata_max_age_ms",
    "session_timeout_ms",
    "value_deserializer",
)


class ConsumerRebalanceListener(Protocol):
    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...


# Offsets are u64 on disk but signed 64-bit in Kafka's API: anything from 2**63 on is refused.
MAX_OFFSET = 2**63 - 1


def to_tp(obj: Any) -> TopicPartition:
    """``obj`` (a TopicPartition or a (topic, partition) pair) as a TopicPartition, or :class:`ConfigError`."""
    try:
        topic, partition = obj
    except (TypeError, ValueError):
        raise ConfigError(f"expected a TopicPartition(topic, partition), not {obj!r}") from None
    if not isinstance(topic, str) or isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ConfigError(f"expected a TopicPartition of a topic name and a partition number >= 0, not {obj!r}")
    return obj if type(obj) is TopicPartition else TopicPartition(topic, partition)


def check_offset(tp: TopicPartition, offset: Any, what: str) -> int:
    """``offset`` as an int in [0, 2**63), or :class:`ConfigError` naming the partition."""
    if isinstance(offset, OffsetAndMetadata):
        offset = offset.offset
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_OFFSET:
        raise ConfigError(f"{what} {tp.topic}[{tp.partition}]: the offset must be an int from 0 to 2**63-1, not {offset!r}")
    return offset


# About the most one fetch reads from a partition by default (max_partition_fetch_bytes, as
# Kafka's; at least one record; the cursor's bound, Cursor.read): a 4 MiB poll of 64 KiB
# records, decoded and copied in one go, fell out of the CPU cache and ran at half the rate of
# 1 MiB ones.
_FETCH_BYTES = 1 << 20
# About the most one fill (a trip of the async consumer to its worker thread, a step of the
# iterator) fetches, or one fetch if more: max_poll_records (500) of 1 MB records took 500 MB.
_FILL_BYTES = 8 << 20
# About the most one fetch reads from all partitions by default (fetch_max_bytes, Kafka's 50 MiB).
_FETCH_MAX_BYTES = 50 << 20
_UNSIZED = 1 << 62  # a partition's fetch_records before its record sizes are seen


def _two_sizes(batch: Sequence[Any]) -> int:
    """The value bytes of ``batch``'s first and last records together (non-empty, records with
    a ``value``): how a batch's record size is judged, O(1)."""
    first, last = batch[0].value, batch[-1].value
    return (0 if first is None else len(first)) + (0 if last is None else len(last))


def _records_for_bytes(nbytes: int, batch: Sequence[Any]) -> int:
    """About how many records like ``batch``'s make ``nbytes``; at least 1."""
    return max(1, 2 * nbytes // max(1, _two_sizes(batch)))


def _bytes_about(batch: Sequence[Any]) -> int:
    """About the bytes of ``batch``'s values."""
    return len(batch) * _two_sizes(batch) // 2


def _take_pending(pending: deque[ConsumerRecord], budget: int) -> list[ConsumerRecord]:
    """The first ``budget`` records of ``pending``, removed from it."""
    if len(pending) <= budget:
        recs = list(pending)
        pending.clear()
        return recs
    return list(starmap(pending.popleft, repeat((), budget)))  # popleft called from C: 22 -> 15 ns a record


def _no_wait(timeout_ms: Any) -> None:
    """Check a kafka-python ``timeout_ms=`` of a call that never waits here (None or a number >= 0)."""
    if timeout_ms is not None:
        check_timeout_ms(timeout_ms)


def check_timeout_ms(timeout_ms: Any, name: str = "timeout_ms") -> float:
    """``timeout_ms`` if it is a number >= 0 (inf: forever), else :class:`ConfigError` (nan too: it would hang)."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not timeout_ms >= 0:
        raise ConfigError(f"{name} must be a number of milliseconds >= 0 (inf: forever), not {timeout_ms!r}")
    return float(timeout_ms)


class _FetchState:
    """The fetch state a consumer keeps per assigned partition: its channel, receiver, undelivered records.

    ``pending`` holds records fetched from the receiver but not yet handed to the user (the
    rest of an iterator's batch, or what a filtered async fetch left); they come first. So
    the partition's position is the first pending record's offset, else the receiver's: it
    never runs ahead of what was handed out. ``receiver`` is None while the partition has no
    position (no committed offset and ``auto_offset_reset="none"``) until the user seeks.
    """

    __slots__ = ("channel", "fetch_records", "paused", "pending", "receiver")

    def __init__(self, channel: FileChannel, receiver: Receiver | None) -> None:
        self.channel = channel
        self.receiver = receiver
        self.paused = False
        self.pending: deque[ConsumerRecord] = deque()
        self.fetch_records = _UNSIZED  # records per fetch (max_partition_fetch_bytes of them), once sizes are seen

    def position(self) -> int | None:
        if self.pending:
            return self.pending[0].offset
        return None if self.receiver is None else self.receiver.position


class Consumer:
    """Reads records from topics under ``root``.

    topics: topics to subscribe to at once (or call :meth:`subscribe` / :meth:`assign`).
    root: the folder holding the topics.
    group_id: the consumer group; members of one group, in any processes, share the
        partitions and commit offsets. None: this consumer reads every partition of its
        subscription and cannot commit.
    auto_offset_reset: where to start a partition with no committed offset (or whose
        offset was deleted by retention): "earliest", "latest" (default) or "none"
        (raise :class:`NoOffsetForPartitionError`).
    enable_auto_commit / auto_commit_interval_ms: commit positions in the background of
        :meth:`poll` every interval (default True, 5000), and on rebalance and close.
    max_poll_records: most records one :meth:`poll` returns (default 500).
    max_partition_fetch_bytes: about the most a fetch reads from one partition (default
        1 MiB, Kafka's; at least one record, at most one 256 KiB read beyond); what the
        iterator and the async consumer read ahead is about 8 MiB, or one such fetch if more.
    fetch_max_bytes: about the most a fetch reads from all its partitions (default 50 MiB,
        Kafka's; at least one record), and what a read-ahead holds if that is less than 8 MiB.
    key_deserializer / value_deserializer: turn bytes into objects (default: bytes as is).
    session_timeout_ms: a member that has not polled for this long is evicted (default 10000).
    heartbeat_interval_ms: how often a member heartbeats and looks for dead members (1000).
    consumer_timeout_ms: iteration stops after this long without a record (default: never).
    metadata_max_age_ms: how often a subscription looks for topics created since (a topic
        matching its pattern, or a subscribed topic that did not exist yet); default 1000,
        so such a topic is read within about a second (plus a rebalance in a group).
    default_offset_commit_callback: ``f(offsets, response)`` called by :meth:`commit_async`
        without a callback of its own.
    client_id: names this consumer in :meth:`metrics`.
    isolation_level: "read_uncommitted" or "read_committed"; the same here (there are no
        transactions: every record written is committed).
    Every other kafka-python name is accepted and ignored (see kafka_names.py and the
    README); an unknown name is a :class:`ConfigError`.
    """

    # The record type poll and iteration hand out: kafka-python's (AsyncConsumer's is aiokafka's).
    _record_shape: RecordShape = KAFKA_PYTHON_RECORDS

    def __init__(
        self,
        *topics: str,
        root: str | os.PathLike[str],
        group_id: str | None = None,
        auto_offset_reset: str = "latest",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        max_poll_records: int = 500,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        consumer_timeout_ms: float = float("inf"),
        **configs: Any,
    ) -> None:
        check_names("Consumer", configs, CONSUMER_IGNORED, _HONOURED)
        if configs.get("isolation_level", "read_uncommitted") not in ("read_uncommitted", "read_committed"):
            raise ConfigError(
                f"isolation_level must be 'read_uncommitted' or 'read_committed', not {configs['isolation_level']!r}"
            )
        metadata_max_age_ms = configs.get("metadata_max_age_ms", 1000)
        fetch_bytes: int = configs.get("max_partition_fetch_bytes", _FETCH_BYTES)  # (checked below, as the others)
        fetch_max_bytes: int = configs.get("fetch_max_bytes", _FETCH_MAX_BYTES)
        commit_callback = configs.get("default_offset_commit_callback")
        if commit_callback is not None and not callable(commit_callback):
            raise ConfigError(f"default_offset_commit_callback must be callable, not {commit_callback!r}")
        if auto_offset_reset not in _RESETS:
            raise ConfigError(f"auto_offset_reset must be one of {', '.join(_RESETS)}, not {auto_offset_reset!r}")
        for name, value in (
            ("auto_commit_interval_ms", auto_commit_interval_ms),
            ("max_poll_records", max_poll_records),
            ("session_timeout_ms", session_timeout_ms),
            ("heartbeat_interval_ms", heartbeat_interval_ms),
            ("metadata_max_age_ms", metadata_max_age_ms),
            ("max_partition_fetch_bytes", fetch_bytes),
            ("fetch_max_bytes", fetch_max_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, not {value!r}")
        check_timeout_ms(consumer_timeout_ms, "consumer_timeout_ms")
        if heartbeat_interval_ms >= session_timeout_ms:
            raise ConfigError("heartbeat_interval_ms must be smaller than session_timeout_ms")
        for name, fn in (("key_deserializer", key_deserializer), ("value_deserializer", value_deserializer)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name} must be callable, not {fn!r}")
        self._topics = TopicStore(root)
        self._reset = auto_offset_reset
        self._auto_commit = enable_auto_commit and group_id is not None
        self._auto_commit_interval = auto_commit_interval_ms / 1000
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval
        self._max_poll_records = max_poll_records
        self._fetch_bytes = min(fetch_bytes, fetch_max_bytes)  # what one partition's fetch reads, about
        self._fetch_max_bytes = fetch_max_bytes
        self._fill_bytes = min(_FILL_BYTES, fetch_max_bytes)
        self._key_de = key_deserializer
        self._value_de = value_deserializer
        self._layouts: dict[TopicPartition, RecordLayout] = {}  # by partition: how its records are decoded
        self._consumer_timeout = consumer_timeout_ms / 1000
        self._metadata_max_age = metadata_max_age_ms / 1000
        self._next_metadata = math.inf  # when a subscription next looks for new topics
        self._counts: dict[str, int] = {}  # the subscribed topics that exist, with their partition counts
        self._commit_callback = commit_callback
        self.client_id = str(configs.get("client_id") or f"filechannel-consumer-{os.getpid()}-{id(self):x}")
        self._iterator: Iterator[ConsumerRecord] | None = None
        self._wakeup = Wakeup()
        self._parts: dict[TopicPartition, _FetchState] = {}
        self._subscription: list[str] = []
        self._pattern: re.Pattern[str] | None = None
        self._listener: ConsumerRebalanceListener | None = None
        self._manual = False
        self._rotation = 0
        self._closed = False
        self._assigned: set[TopicPartition] = set()
        self._group = (
            GroupMember(
                self._topics.root,
                group_id,
                session_timeout_ms=session_timeout_ms,
                heartbeat_interval_ms=heartbeat_interval_ms,
            )
            if group_id is not None
            else None
        )
        self._joined = False
        if topics:
            try:
                self.subscribe(list(topics))
            except BaseException:
                self.close(autocommit=False)  # leave the group: a failed constructor leaves no member behind
                raise

    # -- subscription and assignment ------------------------------------------------------------

    def subscribe(
        self, topics: Iterable[str] = (), pattern: str | None = None, listener: ConsumerRebalanceListener | None = None
    ) -> None:
        """Subscribe to ``topics`` or to every topic matching the regex ``pattern``.

        ``pattern`` matches as ``re.match`` does (at the start of a name, as kafka-python).
        A subscribed topic that does not exist yet, and a topic created later that matches
        the pattern, is read from the first poll at least ``metadata_max_age_ms`` after it
        appeared (``listener`` is told, as for any rebalance).
        """
        self._check_open()
        topics = [topics] if isinstance(topics, str) else list(topics)
        if bool(topics) == bool(pattern):
            raise ConfigError("subscribe takes either a list of topics or a pattern, not both or neither")
        if self._manual and self._parts:
            raise ConfigError("subscribe cannot be mixed with assign; call unsubscribe first")
        try:
            compiled = re.compile(pattern) if pattern else None
        except (re.error, TypeError) as exc:
            raise ConfigError(f"subscribe: {pattern!r} is not a regular expression ({exc})") from None
        for topic in topics:
            try:
                self._topics.partitions(topic)  # a badly named topic (or a lost topic.json) fails here, changing nothing
            except UnknownTopicError:
                pass  # read once it is created
        self._pattern = compiled
        self._subscription = topics
        self._listener = listener
        self._manual = False
        self._joined = False
        self._refresh_assignment(force=True)

    def subscription(self) -> set[str] | None:
        """The subscribed topics (those matching the pattern, for a pattern); None without a subscription."""
        if not self._subscription and self._pattern is None:
            return None
        return set(self._matching_topics())

    def unsubscribe(self) -> None:
        """Drop the subscription (or the assignment): nothing is read until the next subscribe/assign."""
        self._check_open()
        self._set_assignment(set())
        self._subscription, self._pattern = [], None
        self._manual = False
        self._counts, self._next_metadata = {}, math.inf
        if self._group is not None and self._joined:
            self._group.join([], {})
        self._joined = False

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (no group rebalancing)."""
        self._check_open()
        tps = {to_tp(tp) for tp in partitions}  # every one checked before anything changes
        if self._subscription or self._pattern:
            raise ConfigError("assign cannot be mixed with subscribe; call unsubscribe first")
        for tp in tps:
            if not 0 <= tp.partition < self._topics.partitions(tp.topic):
                raise ConfigError(f"{tp.topic} has no partition {tp.partition}")
        self._manual = True
        self._set_assignment(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self._parts)

    def _matching_topics(self) -> list[str]:
        if self._pattern is not None:
            return [t for t in self._topics.list() if self._pattern.match(t)]
        return list(self._subscription)

    def _partition_counts(self) -> dict[str, int]:
        """The subscribed topics that exist now, with their partition counts."""
        counts = {}
        for topic in self._matching_topics():
            try:
                counts[topic] = self._topics.partitions(topic)
            except UnknownTopicError:
                pass  # not created yet (or deleted): looked for again every metadata_max_age_ms
        return counts

    def _refresh_assignment(self, force: bool = False) -> None:
        """Bring the set of partitions read up to date (group rebalance, new topics).

        Every ``metadata_max_age_ms`` a subscription lists its topics again; a topic that
        appeared (or whose partition count changed) joins the group again with the new
        topic set, or, without a group, is simply opened.
        """
        if not self._follows_topics():
            return
        now = time.monotonic()
        topics_changed = False
        if force or now >= self._next_metadata:
            counts = self._partition_counts()
            topics_changed = counts != self._counts
            self._counts = counts
            self._next_metadata = now + self._metadata_max_age
        if self._group is None:
            if force or topics_changed:
                self._rebalance_alone({TopicPartition(t, p) for t, n in self._counts.items() for p in range(n)})
            return
        group = self._group
        if not force and not topics_changed and not group.changed() and not group.heartbeat_due():
            return
        counts = self._counts
        if not self._joined or topics_changed:
            group.join(list(counts), counts)
            self._joined = True
        assigned, owned = group.sync(counts, held=set(self._parts))
        revoked = set(self._parts) - owned
        if revoked:
            if self._auto_commit:
                positions = self._positions()
                self._commit_quietly({tp: positions[tp] for tp in revoked if tp in positions})
            if self._listener is not None:
                self._listener.on_partitions_revoked(revoked)
            for tp in revoked:
                self._close_partition(tp)
            # Give them up only now (no longer held): from here on another member may read them.
            assigned, owned = group.sync(counts, held=set(self._parts))
        added = owned - set(self._parts)
        for tp in sorted(added):
            self._open_partition(tp)
        if added and self._listener is not None:
            self._listener.on_partitions_assigned(added)
        self._assigned = assigned

    def _rebalance_alone(self, tps: set[TopicPartition]) -> None:
        """A subscription without a group: read ``tps``, telling the listener what changed."""
        revoked = set(self._parts) - tps
        if revoked and self._listener is not None:
            self._listener.on_partitions_revoked(revoked)
        added = tps - set(self._parts)
        self._set_assignment(tps)
        if added and self._listener is not None:
            self._listener.on_partitions_assigned(added)

    def _set_assignment(self, tps: set[TopicPartition]) -> None:
        for tp in set(self._parts) - tps:
            self._close_partition(tp)
        for tp in sorted(tps - set(self._parts)):
            self._open_partition(tp)

    def _open_partition(self, tp: TopicPartition) -> None:
        ch = self._topics.open_partition(tp.topic, tp.partition, wakeup=self._wakeup)
        try:
            start = self._starting_offset(tp, ch)
            rx = None if start is None else ch.receiver(start)
        except BaseException:
            ch.close()
            raise
        self._parts[tp] = _FetchState(ch, rx)

    def _starting_offset(self, tp: TopicPartition, ch: FileChannel) -> int | None:
        """The committed offset, else the reset offset; None (no position yet) for reset "none"."""
        committed = self.committed(tp) if self._group is not None else None
        if committed is not None and ch.first_offset <= committed <= ch.end_offset:
            return committed
        return None if self._reset == "none" else self._reset_offset(tp, ch)

    def _reset_offset(self, tp: TopicPartition, ch: FileChannel) -> int:
        if self._reset == "earliest":
            return ch.first_offset
        if self._reset == "latest":
            return ch.end_offset
        raise self._no_offset(tp)

    @staticmethod
    def _no_offset(tp: TopicPartition) -> NoOffsetForPartitionError:
        return NoOffsetForPartitionError(
            f"{tp.topic}[{tp.partition}] has no committed offset (or it was deleted by retention) and "
            "auto_offset_reset is 'none'; seek to an offset or use 'earliest'/'latest'"
        )

    def _close_partition(self, tp: TopicPartition) -> None:
        part = self._parts.pop(tp, None)
        if part is not None:
            if part.receiver is not None:
                part.receiver.close()
            part.channel.close()

    # -- reading --------------------------------------------------------------------------------

    def poll(
        self, timeout_ms: float = 0, max_records: int | None = None, update_offsets: bool = True
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records from the assigned, unpaused partitions: what is there, else waits up to ``timeout_ms``.

        Positions move past every record returned (the whole batch is handed out); with
        ``update_offsets=False`` (kafka-python's) they do not: the same records come again.
        Raises :class:`NoOffsetForPartitionError` for an unpaused partition that has no
        position (``auto_offset_reset="none"`` and nothing committed) until it is seeked.
        """
        batch = self._poll(timeout_ms, max_records, None)
        if not update_offsets:
            self._unread(batch)
        return batch

    def _poll(
        self, timeout_ms: float, max_records: int | None, only: Collection[TopicPartition] | None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """``poll`` restricted to the partitions ``only`` (all if None); the others are not touched."""
        self._check_open()
        check_timeout_ms(timeout_ms)
        budget = self._max_poll_records if max_records is None else max_records
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ConfigError(f"max_records must be an int >= 1, not {budget!r}")
        deadline = time.monotonic() + timeout_ms / 1000 if math.isfinite(timeout_ms) else math.inf
        while True:
            self._refresh_assignment()
            self._maybe_auto_commit()
            seq = self._wakeup.seq
            result = self._fetch(budget, only)
            remaining = deadline - time.monotonic()
            if result or remaining <= 0:
                return result
            wait = min(remaining, 3600.0)
            if self._group is not None:
                wait = min(wait, self._group.heartbeat_interval)
            self._wakeup.wait(seq, wait)

    def _fetch(
        self, budget: int, only: Collection[TopicPartition] | None, nowait: bool = False
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Up to ``budget`` records, each partition's pending records before its receiver's.

        All or nothing: if a partition raises (no position, out of range with reset "none",
        damage, a deserializer), what was already taken from the others goes back to their
        pending records and the failing partition's receiver back to its first record, so
        the error costs no record. Reads stop at about ``fetch_max_bytes`` in all (after at
        least one record; pending records were read before and do not count).

        ``nowait`` (an event loop's fetch): only records in memory (``Cursor.read``);
        :class:`WouldBlock`, all or nothing as well, where a partition needs more (the disk,
        a seek, tier-2: a fetch without ``nowait`` does that).
        """
        result: dict[TopicPartition, list[ConsumerRecord]] = {}
        tps = list(self._parts) if only is None else [tp for tp in self._parts if tp in only]
        if not tps:
            return result
        self._rotation = (self._rotation + 1) % len(tps)
        room = self._fetch_max_bytes  # bytes this fetch may still read, about
        try:
            for tp in tps[self._rotation :] + tps[: self._rotation]:
                part = self._parts[tp]
                if part.paused:
                    continue
                if part.pending:
                    recs = result[tp] = _take_pending(part.pending, budget)
                else:
                    rx = part.receiver
                    if rx is None:
                        if nowait:
                            raise WouldBlock
                        raise self._no_offset(tp)
                    layout = self._layouts.get(tp) or self._new_layout(tp)
                    try:
                        raw = rx._read_now(budget, layout, min(self._fetch_bytes, room), nowait)
                    except WouldBlock as exc:
                        exc.partition = tp
                        raise
                    except OffsetOutOfRangeError:
                        if nowait:
                            raise WouldBlock from None
                        rx.seek(self._reset_offset(tp, part.channel))
                        raw = rx._read_now(budget, layout, min(self._fetch_bytes, room))
                    if not raw:
                        if not nowait and rx.position > part.channel.end_offset:
                            # Past the end (a seek there, or a committed offset beyond a log that
                            # lost its tail): as Kafka, reset by auto_offset_reset, never wait forever.
                            rx.seek(self._reset_offset(tp, part.channel))
                        continue
                    try:
                        recs = self._record_shape.deserialized(raw, self._key_de, self._value_de)
                    except BaseException:
                        rx.seek(raw[0].offset)
                        raise
                    result[tp] = recs
                    part.fetch_records = _records_for_bytes(self._fetch_bytes, raw)  # what a fetch holds (_fill_budget)
                    room -= _bytes_about(raw)
                budget -= len(recs)
                if budget <= 0 or room <= 0:
                    break
        except BaseException:
            self._unread(result)
            raise
        return result

    def _unread(self, batch: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Put records fetched but not handed out back in front: the next fetch returns them first."""
        for tp, recs in batch.items():
            part = self._parts.get(tp)
            if part is not None:
                part.pending.extendleft(reversed(recs))

    def _fill(
        self, timeout_ms: float, only: Collection[TopicPartition] | None, asked: int | None = None, ahead: bool = False
    ) -> bool:
        """Fetch the records a fill takes when ``asked`` (default ``max_poll_records``) are
        wanted (:meth:`_fill_budget`) into the pending records, waiting up to ``timeout_ms``
        for the first; True if any.

        After the first fetch, fetches again without waiting while records come and the budget
        is not met: a fetch reads about ``max_partition_fetch_bytes`` of a partition, and the
        async consumer makes one trip to a worker thread per fill. The budget is judged again
        after each fetch, from the record sizes seen. What was fetched goes to the pending
        records even if a later fetch raises.
        """
        asked = self._max_poll_records if asked is None else asked
        batch = self._poll(timeout_ms, self._fill_budget(asked, only, ahead), only)
        try:
            got = sum(map(len, batch.values()))
            more = batch
            while more and got < (budget := self._fill_budget(asked, only, ahead)):
                more = self._fetch(budget - got, only)
                for tp, recs in more.items():
                    batch.setdefault(tp, []).extend(recs)
                    got += len(recs)
        finally:
            self._unread(batch)
        return bool(batch)

    def _fill_budget(self, asked: int, only: Collection[TopicPartition] | None, ahead: bool) -> int:
        """Records a fill fetches when ``asked`` are wanted: about ``_FILL_BYTES`` of them at
        most (``fetch_max_bytes`` if less), or one fetch if that is more (32 records of 256
        KiB, not 500), counted in records of the partition (of ``only``) with the most in a
        fetch (``max_partition_fetch_bytes``); until a partition's sizes are seen, ``asked``
        (each fetch is bounded in bytes anyway).
        ``ahead`` (the async consumer, whose fills cost a trip to a worker thread): at least
        one such fetch, past ``asked``, as aiokafka fetches ``max_partition_fetch_bytes`` ahead
        of what ``getmany`` hands out (at 100 B about 10,000 records a trip, not 500). They
        wait as pending records (positions do not move past them)."""
        sized = [p.fetch_records for tp, p in self._parts.items() if p.fetch_records != _UNSIZED and (only is None or tp in only)]
        if not sized:
            return asked
        per_fetch = max(sized)
        return min(max(asked, per_fetch) if ahead else asked, per_fetch * max(1, self._fill_bytes // self._fetch_bytes))

    def _take(self, budget: int, only: Collection[TopicPartition] | None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Up to ``budget`` pending records of unpaused partitions (of ``only``). Never blocks."""
        self._check_open()
        result: dict[TopicPartition, list[ConsumerRecord]] = {}
        for tp, part in self._parts.items():
            if part.pending and not part.paused and (only is None or tp in only):
                recs = result[tp] = _take_pending(part.pending, budget)
                budget -= len(recs)
                if budget <= 0:
                    break
        return result

    def _take_one(self, only: Collection[TopicPartition] | None) -> ConsumerRecord | None:
        """The next pending record of an unpaused partition (of ``only``), or None. Never blocks."""
        self._check_open()
        for tp, part in self._parts.items():
            if part.pending and not part.paused and (only is None or tp in only):
                return part.pending.popleft()
        return None

    def _new_layout(self, tp: TopicPartition) -> RecordLayout:
        """How ``tp``'s receiver decodes records: straight into this consumer's record type."""
        layout = self._layouts[tp] = self._record_shape.layout(tp[0], tp[1])
        return layout

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self

    def __next__(self) -> ConsumerRecord:
        """The next record; waits for one. ``StopIteration`` after ``consumer_timeout_ms``
        without one, or once closed (kafka-python's ``next(consumer)``); the next call
        (or ``for`` loop) starts waiting again.

        A partition's position moves past a record only as it is returned (kafka-python:
        the position is the next record to be returned), so a ``break`` loses nothing and
        a commit never covers a record the loop has not received: the rest of the fetched
        batch stays pending, returned first by the next iteration or :meth:`poll`.
        """
        if self._iterator is None:
            self._iterator = self._records()
        try:
            return next(self._iterator)
        except BaseException:  # StopIteration, or an error that ended the generator: start anew next time
            self._iterator = None
            raise

    def _records(self) -> Iterator[ConsumerRecord]:
        idle_since = time.monotonic()
        while not self._closed:
            if not self._fill(min(1000.0, self._consumer_timeout * 1000), None):
                if time.monotonic() - idle_since >= self._consumer_timeout:
                    return
                continue
            for tp, part in list(self._parts.items()):
                pending = part.pending
                # Re-checked per record: the loop body may seek, pause, commit or close.
                while pending and not part.paused and self._parts.get(tp) is part:
                    yield pending.popleft()
            idle_since = time.monotonic()

    # -- positions and offsets ------------------------------------------------------------------

    def _part(self, tp: TopicPartition) -> _FetchState:
        part = self._parts.get(to_tp(tp))
        if part is None:
            raise ConfigError(f"{tp} is not assigned to this consumer (assignment: {sorted(self._parts)})")
        return part

    def position(self, tp: TopicPartition, timeout_ms: float | None = None) -> int:
        """The offset of the next record to be returned from ``tp`` (not of the next fetched).

        Raises :class:`NoOffsetForPartitionError` if ``tp`` has no position yet (reset "none").
        ``timeout_ms``: kafka-python's; nothing here waits, so it only has to be valid.
        """
        _no_wait(timeout_ms)
        offset = self._part(tp).position()
        if offset is None:
            raise self._no_offset(to_tp(tp))
        return offset

    def _positions(self) -> dict[TopicPartition, int]:
        """The positions of the assigned partitions that have one: what a commit covers."""
        return {tp: off for tp, part in self._parts.items() if (off := part.position()) is not None}

    @staticmethod
    def _seek_part(part: _FetchState, offset: int) -> None:
        """Deliver ``offset`` next; the pending records go only once the seek succeeded."""
        if part.receiver is None:
            part.receiver = part.channel.receiver(offset)
        else:
            part.receiver.seek(offset)
        part.pending.clear()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch from ``offset`` next (``OffsetOutOfRangeError`` if retention deleted it).

        Records fetched but not yet returned are dropped: the next one returned is ``offset``.
        """
        part = self._part(tp)
        self._seek_part(part, check_offset(to_tp(tp), offset, "seek"))

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        for part in [self._part(tp) for tp in tps or list(self._parts)]:  # all checked first
            self._seek_part(part, part.channel.first_offset)

    def seek_to_end(self, *tps: TopicPartition) -> None:
        for part in [self._part(tp) for tp in tps or list(self._parts)]:
            self._seek_part(part, part.channel.end_offset)

    def _with_channel(self, tp: TopicPartition, fn: Callable[[FileChannel], T]) -> T:
        part = self._parts.get(to_tp(tp))
        if part is not None:
            return fn(part.channel)
        with self._topics.open_partition(tp[0], tp[1], maintenance_interval=0) as ch:
            return fn(ch)

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: float | None = None
    ) -> dict[TopicPartition, int]:
        """The first offset each partition still holds."""
        _no_wait(timeout_ms)
        return {to_tp(tp): self._with_channel(tp, lambda ch: ch.first_offset) for tp in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition], timeout_ms: float | None = None) -> dict[TopicPartition, int]:
        """One past each partition's last record (the offset the next record gets)."""
        _no_wait(timeout_ms)
        return {to_tp(tp): self._with_channel(tp, lambda ch: ch.end_offset) for tp in partitions}

    def highwater(self, tp: TopicPartition) -> int:
        """The end offset of an assigned partition (kafka-python's high watermark: every
        record written is readable at once here, so it is always current)."""
        return self._part(tp).channel.end_offset

    def topics(self) -> set[str]:
        """The names of every topic under the root."""
        return set(self._topics.list())

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """The partition numbers of ``topic``; None if there is no such topic (as kafka-python)."""
        try:
            return set(range(self._topics.partitions(topic)))
        except UnknownTopicError:
            return None

    def metrics(self, raw: bool = False) -> dict[str, dict[str, float]]:
        """kafka-python's ``metrics()``, small and computed on call (nothing counted per record):
        the assigned and paused partitions and the largest lag (end offset - position)."""
        lags = [part.channel.end_offset - pos for part in self._parts.values() if (pos := part.position()) is not None]
        return {
            "consumer-fetch-manager-metrics": {
                "assigned-partitions": float(len(self._parts)),
                "paused-partitions": float(len(self.paused())),
                "records-lag-max": float(max(lags, default=0)),
            }
        }

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int], timeout_ms: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the first offset whose timestamp is >= the given ms, by time index.

        A negative timestamp raises :class:`ConfigError` (a ``ValueError``, as kafka-python's).
        """
        _no_wait(timeout_ms)

        def lookup(ch: FileChannel, ts: int) -> OffsetAndTimestamp | None:
            offset = ch.offset_for_time(ts)
            if offset is None:
                return None
            rx = ch.receiver(offset)
            try:
                rec = rx.recv(timeout=0)
            finally:
                rx.close()
            return OffsetAndTimestamp(offset, rec.timestamp)

        checked = {}
        for tp, ts in timestamps.items():
            tp = to_tp(tp)
            if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts <= MAX_OFFSET:
                raise ConfigError(
                    f"offsets_for_times {tp.topic}[{tp.partition}]: the timestamp must be an int of milliseconds "
                    f"from 0 to 2**63-1, not {ts!r}"
                )
            checked[tp] = ts
        return {tp: self._with_channel(tp, partial(lookup, ts=ts)) for tp, ts in checked.items()}

    @overload
    def committed(self, tp: TopicPartition, metadata: Literal[False] = False, timeout_ms: float | None = None) -> int | None: ...

    @overload
    def committed(
        self, tp: TopicPartition, metadata: Literal[True], timeout_ms: float | None = None
    ) -> OffsetAndMetadata | None: ...

    @overload
    def committed(
        self, tp: TopicPartition, metadata: bool, timeout_ms: float | None = None
    ) -> int | OffsetAndMetadata | None: ...

    def committed(
        self, tp: TopicPartition, metadata: bool = False, timeout_ms: float | None = None
    ) -> int | OffsetAndMetadata | None:
        """The group's committed offset of ``tp`` (the next record to consume), or None.

        ``metadata=True``: an :class:`OffsetAndMetadata` with the metadata committed with it.
        """
        _no_wait(timeout_ms)
        tp = to_tp(tp)
        if self._group is None:
            return None
        offset = self._group.committed_offset(tp, self._topics.root)
        if offset is None or not metadata:
            return offset
        return OffsetAndMetadata(offset, self._group.committed_metadata(tp), -1)

    def commit(self, offsets: CommitOffsets | None = None, timeout_ms: float | None = None) -> None:
        """Commit ``offsets`` (default: the positions of the assigned partitions, i.e. the
        records handed out so far).

        Values are offsets or :class:`OffsetAndMetadata` (whose metadata is stored too,
        returned by ``committed(tp, metadata=True)``). Every offset is checked (an int,
        from 0 to the partition's end offset) before anything is written, so a rejected
        commit leaves the group's offsets as they were. Raises :class:`CommitFailedError`
        if this consumer no longer owns one of them.
        """
        self._check_open()
        _no_wait(timeout_ms)
        if self._group is None:
            raise ConfigError("commit needs a group_id: create the Consumer with group_id=...")
        texts: dict[TopicPartition, str] = {}
        if offsets is None:
            plain = self._positions()
        else:
            if not isinstance(offsets, dict):
                raise ConfigError(f"commit takes a dict {{TopicPartition: offset}}, not {type(offsets).__name__}")
            plain = {to_tp(tp): check_offset(to_tp(tp), o, "commit") for tp, o in offsets.items()}
            for tp, o in offsets.items():
                if isinstance(o, OffsetAndMetadata) and o.metadata:
                    if not isinstance(o.metadata, str):
                        raise ConfigError(f"commit {tp}: the metadata must be a str, not {type(o.metadata).__name__}")
                    texts[to_tp(tp)] = o.metadata
        self._commit_checked(plain, check_ends=offsets is not None, metadata=texts)

    def commit_async(
        self,
        offsets: CommitOffsets | None = None,
        callback: Callable[[dict[TopicPartition, OffsetAndMetadata], Any], Any] | None = None,
    ) -> Future[None]:
        """kafka-python's ``commit_async``: commits (a commit here is a local file write, done
        at once), then calls ``callback(offsets, response)``, or ``default_offset_commit_callback``:
        ``offsets`` as ``{tp: OffsetAndMetadata}``, ``response`` None or the exception the
        commit raised. Returns a done future of the same outcome; nothing is raised here.
        """
        future: Future[None] = Future()
        committed: dict[TopicPartition, OffsetAndMetadata] = {}
        try:
            if offsets is None:
                self._check_open()
                offsets = dict(self._positions())
            committed = {
                to_tp(tp): o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()
            }
            self.commit(offsets)
        except FileChannelError as exc:
            future.set_exception(exc)
        else:
            future.set_result(None)
        callback = callback or self._commit_callback
        if callback is not None:
            callback(committed, future.exception())
        return future

    def _check_ends(self, offsets: dict[TopicPartition, int]) -> None:
        """ConfigError unless each offset is at most its partition's end offset (the partition exists)."""
        for tp, off in offsets.items():
            end = self._with_channel(tp, lambda ch: ch.end_offset)
            if off > end:
                raise ConfigError(
                    f"commit {tp.topic}[{tp.partition}]: offset {off} is past the partition's end offset {end}; "
                    "commit the offset of the next record to read (last offset read + 1)"
                )

    def _commit_checked(
        self, offsets: dict[TopicPartition, int], check_ends: bool = False, metadata: dict[TopicPartition, str] | None = None
    ) -> None:
        """Store ``offsets`` (ints in range) in the group and in the partitions' durable positions.

        ``check_ends``: also check them against the partitions' end offsets, after the
        ownership check and before anything is written (user-given offsets; positions are
        valid by construction).
        """
        group = self._group
        if group is None or not offsets:
            return
        group.commit(offsets, manual=self._manual, check=self._check_ends if check_ends else None, metadata=metadata)
        key = position_name(group.group_id)

        def store(ch: FileChannel, offset: int) -> None:
            ch.positions.set(key, offset)

        for tp, off in offsets.items():
            self._with_channel(tp, partial(store, offset=off))
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval

    def _commit_quietly(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit positions (valid by construction) for auto-commit, rebalance and close."""
        try:
            self._commit_checked(offsets)
        except CommitFailedError:
            pass  # lost them already; the new owner resumes from the last good commit

    def _upkeep_due(self) -> bool:
        """Whether a poll now has file work to do besides reading records: an auto-commit, a
        listing of the topics (every ``metadata_max_age_ms``), or joining or heartbeating the
        group. A group's state file is not looked at (that is a stat): a rebalance is then
        seen at the next heartbeat, as a Kafka member learns of one from a heartbeat's answer."""
        if self._auto_commit_due():
            return True
        if not self._follows_topics():
            return False
        if time.monotonic() >= self._next_metadata:
            return True
        return self._group is not None and (not self._joined or self._group.heartbeat_due())

    def _follows_topics(self) -> bool:
        """A subscription (topics or a pattern), not a manual assignment: its partitions are
        looked for again and, in a group, rebalanced (:meth:`_refresh_assignment`)."""
        return not self._manual and (bool(self._subscription) or self._pattern is not None)

    def _auto_commit_due(self) -> bool:
        return self._auto_commit and bool(self._parts) and time.monotonic() >= self._next_auto_commit

    def _maybe_auto_commit(self) -> None:
        if self._auto_commit_due():
            self._commit_quietly(self._positions())

    # -- flow control and lifecycle ------------------------------------------------------------

    def pause(self, *tps: TopicPartition) -> None:
        for part in [self._part(tp) for tp in tps]:  # all checked before any changes
            part.paused = True

    def resume(self, *tps: TopicPartition) -> None:
        for part in [self._part(tp) for tp in tps]:
            part.paused = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, p in self._parts.items() if p.paused}

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError("this consumer is closed")

    def close(self, autocommit: bool = True, timeout_ms: float | None = None) -> None:
        """Commit (if auto-commit is on and ``autocommit``), leave the group, release files."""
        _no_wait(timeout_ms)
        if self._closed:
            return
        try:
            if autocommit and self._auto_commit and self._parts:
                self._commit_quietly(self._positions())
        finally:
            self._closed = True
            for tp in list(self._parts):
                self._close_partition(tp)
            if self._group is not None:
                self._group.leave()
            self._wakeup.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
