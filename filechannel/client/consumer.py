"""Consumer: reads topics kafka-python style, alone or as a member of a group.

``Consumer`` is kafka-python's API over three parts, as aiokafka's consumer is: its
subscription and assigned partitions (``subscription.py``), the fetcher that reads their
records (``fetcher.py``) and its side of the group (``coordinator.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, Self, Unpack, overload

from ..channel import FileChannel
from ..engine.wakeup import Wakeup
from ..errors import ChannelClosedError, ConfigError, FileChannelError, IllegalStateError, UnknownTopicError
from .assignors import DEFAULT_STRATEGIES, strategy_names
from .coordinator import CommitOffsets, GroupCoordinator
from .fetcher import FETCH_BYTES, FETCH_MAX_BYTES, Fetcher, check_timeout_ms
from .group import STATIC_PREFIX, GroupMember, is_static
from .kafka_names import CONSUMER_IGNORED, ConsumerConfigs, check_names
from .records import (
    MAX_OFFSET,
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
    check_offset,
    to_tp,
)
from .serializer import Codec, check_codec
from .subscription import ConsumerRebalanceListener, SubscriptionState, TopicSource, no_offset
from .topics import TopicStore
from .transaction_log import recover_transactions

if TYPE_CHECKING:
    from .bucket import BucketTopics

_RESETS = ("earliest", "latest", "none")
_HONOURED = (
    "auto_commit_interval_ms",
    "auto_offset_reset",
    "client_id",
    "consumer_timeout_ms",
    "default_offset_commit_callback",
    "enable_auto_commit",
    "group_id",
    "group_instance_id",
    "heartbeat_interval_ms",
    "isolation_level",
    "fetch_max_bytes",
    "key_deserializer",
    "max_partition_fetch_bytes",
    "max_poll_interval_ms",
    "max_poll_records",
    "metadata_max_age_ms",
    "partition_assignment_strategy",
    "session_timeout_ms",
    "value_deserializer",
)


def _no_wait(timeout_ms: Any) -> None:
    """Check a kafka-python ``timeout_ms=`` of a call that never waits here (None or a number >= 0)."""
    if timeout_ms is not None:
        check_timeout_ms(timeout_ms)


class Consumer:
    """Reads records from topics under ``root``, or from a tier URL alone (``tier``).

    topics: topics to subscribe to at once (or call :meth:`subscribe` / :meth:`assign`).
    root: the folder holding the topics.
    tier, tier_options, origins, state_dir, tier_poll_ms: instead of ``root``, read what roots
        uploaded to the tier URL ``tier`` (opened with ``tier_options``: ``endpoint_url``...),
        with no root, writing nothing there (see :mod:`.bucket`): the topics of every origin
        found (or of ``origins``, a list of names), named ``<origin>.<topic>`` (plain
        ``<topic>`` for a root without an origin), each record with the header
        ``filechannel.origin``; uploaded segments only, followed by one GET of each read
        partition's head every ``tier_poll_ms`` (default 1000). ``state_dir`` (required with
        ``tier``) is a local folder of the reader's: the derived indexes and the groups' offsets.
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
    key_deserializer / value_deserializer: turn bytes into objects: a function of the bytes, or an
        object with ``deserialize(topic, data)`` (kafka-python's ``Deserializer``; see
        :mod:`.serializer`); default: bytes as they are.
    session_timeout_ms: a member whose heartbeat is older than this is evicted (default
        10000): its heartbeats come from a background thread, so only a process that is
        gone or stopped as a whole (SIGSTOP) misses them.
    heartbeat_interval_ms: how often a member heartbeats, and how often its polls look for
        dead members and rebalances (default 3000, below session_timeout_ms).
    max_poll_interval_ms: a member that has not polled for this long leaves its group (its
        partitions go to the others; its commits fail with :class:`CommitFailedError`) and
        its next poll joins again (default 300000).
    partition_assignment_strategy: how a group assigns partitions, one or more strategies in
        order of preference (default ``(RangePartitionAssignor, RoundRobinPartitionAssignor)``,
        kafka-python's): the classes of ``assignors.py`` or their names (``"range"``,
        ``"roundrobin"``, ``"sticky"``, ``"cooperative-sticky"``, or the class names). The
        group uses the first one every member supports; a member that shares none with the
        others cannot join (:class:`ConfigError`).
    group_instance_id: static membership (Kafka's, aiokafka's name): closed or killed, the
        member keeps its place and partitions for ``session_timeout_ms``, and a consumer
        started with the same id within that time takes them back with no rebalance of
        the others. A second live consumer with the id of a live one fails
        (:class:`FencedInstanceIdError`).
    consumer_timeout_ms: iteration stops after this long without a record (default: never).
    metadata_max_age_ms: how often a subscription looks for topics created since (a topic
        matching its pattern, or a subscribed topic that did not exist yet); default 1000,
        so such a topic is read within about a second (plus a rebalance in a group).
    default_offset_commit_callback: ``f(offsets, response)`` called by :meth:`commit_async`
        without a callback of its own.
    client_id: names this consumer in :meth:`metrics`.
    isolation_level: "read_uncommitted" (default) or "read_committed". Both read only
        committed records: a transaction's records reach a partition only once committed
        (see the README's "Transactions"). "read_committed" also applies, when it opens, what
        a transactional producer that died mid-commit committed, so it sees that at once.
    Every other kafka-python name is accepted and ignored (see kafka_names.py and the
    README); an unknown name is a :class:`ConfigError`.

    ``fetcher`` and ``coordinator`` are its parts (``fetcher.py``, ``coordinator.py``), there
    for the async consumer of this package: not kafka-python's API.
    """

    def __init__(
        self,
        *topics: str,
        root: str | os.PathLike[str] | None = None,
        tier: str | None = None,
        tier_options: dict[str, Any] | None = None,
        origins: Sequence[str] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        tier_poll_ms: int = 1000,
        group_id: str | None = None,
        auto_offset_reset: str = "latest",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        max_poll_records: int = 500,
        key_deserializer: Codec | None = None,
        value_deserializer: Codec | None = None,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 3_000,
        consumer_timeout_ms: float = float("inf"),
        **configs: Unpack[ConsumerConfigs],
    ) -> None:
        check_names("Consumer", configs, CONSUMER_IGNORED, _HONOURED)
        if configs.get("isolation_level", "read_uncommitted") not in ("read_uncommitted", "read_committed"):
            raise ConfigError(
                f"isolation_level must be 'read_uncommitted' or 'read_committed', not {configs['isolation_level']!r}"
            )
        metadata_max_age_ms = configs.get("metadata_max_age_ms", 1000)
        max_poll_interval_ms = configs.get("max_poll_interval_ms", 300_000)
        strategies = strategy_names(configs.get("partition_assignment_strategy", DEFAULT_STRATEGIES))
        fetch_bytes: int = configs.get("max_partition_fetch_bytes", FETCH_BYTES)  # (checked below, as the others)
        fetch_max_bytes: int = configs.get("fetch_max_bytes", FETCH_MAX_BYTES)
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
            ("max_poll_interval_ms", max_poll_interval_ms),
            ("max_partition_fetch_bytes", fetch_bytes),
            ("fetch_max_bytes", fetch_max_bytes),
            ("tier_poll_ms", tier_poll_ms),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, not {value!r}")
        check_timeout_ms(consumer_timeout_ms, "consumer_timeout_ms")
        if heartbeat_interval_ms >= session_timeout_ms:
            raise ConfigError("heartbeat_interval_ms must be smaller than session_timeout_ms")
        check_codec("key_deserializer", key_deserializer, "deserialize")
        check_codec("value_deserializer", value_deserializer, "deserialize")
        self._bucket: BucketTopics | None = None
        self._topics: TopicSource
        if tier is None:
            if root is None:
                raise ConfigError("Consumer needs root= (a folder of topics) or tier= (a tier URL read alone, with state_dir=)")
            if tier_options is not None or origins is not None or state_dir is not None:
                raise ConfigError("tier_options, origins and state_dir go with tier= (a tier URL read alone), not root=")
            self._topics = TopicStore(root)
        else:
            if root is not None:
                raise ConfigError("give the Consumer root= or tier=, not both")
            if state_dir is None:
                raise ConfigError("a Consumer of a tier URL needs state_dir=, a local folder for its indexes and groups")
            from .bucket import BucketTopics  # tier-2's reading side: imported by a consumer of a bucket only

            self._topics = self._bucket = BucketTopics(
                tier,
                tier_options,
                origins,
                state_dir,
                max_age_s=metadata_max_age_ms / 1000,
                follow_s=tier_poll_ms / 1000,
            )
        if configs.get("isolation_level") == "read_committed":
            recover_transactions(self._topics)
        self._consumer_timeout = consumer_timeout_ms / 1000
        self._commit_callback = commit_callback
        self.client_id = str(configs.get("client_id") or f"filechannel-consumer-{os.getpid()}-{id(self):x}")
        self._iterator: Iterator[ConsumerRecord] | None = None
        self._wakeup = Wakeup()
        self._subscription = SubscriptionState(self._topics, metadata_max_age_ms)
        member = (
            GroupMember(
                self._topics.root,
                group_id,
                session_timeout_ms=session_timeout_ms,
                heartbeat_interval_ms=heartbeat_interval_ms,
                max_poll_interval_ms=max_poll_interval_ms,
                group_instance_id=configs.get("group_instance_id"),
                strategies=strategies,
            )
            if group_id is not None
            else None
        )
        self.coordinator = GroupCoordinator(
            self._subscription,
            member,
            self._set_assignment,
            auto_commit=enable_auto_commit,
            auto_commit_interval_ms=auto_commit_interval_ms,
        )
        self.fetcher = Fetcher(
            self._subscription,
            self._wakeup,
            self.coordinator.upkeep if self._bucket is None else self._bucket_upkeep,
            auto_offset_reset=auto_offset_reset,
            max_poll_records=max_poll_records,
            fetch_bytes=fetch_bytes,
            fetch_max_bytes=fetch_max_bytes,
            key_deserializer=key_deserializer,
            value_deserializer=value_deserializer,
            header_of=None if self._bucket is None else self._bucket.origin_header,
        )
        if topics:
            try:
                self.subscribe(list(topics))
            except BaseException:
                self.close(autocommit=False)  # leave the group: a failed constructor leaves no member behind
                raise

    def _bucket_upkeep(self) -> float:
        """The group's upkeep; a wait for records then lasts at most ``tier_poll_ms`` (no upload
        wakes a bucket reader: its next fetch asks the heads)."""
        assert self._bucket is not None
        return min(self.coordinator.upkeep(), self._bucket.follow_s)

    def _set_assignment(self, tps: set[TopicPartition]) -> None:
        """Read ``tps``: the other partitions closed, the new ones opened at their committed
        offsets (else by ``auto_offset_reset``)."""
        subscription = self._subscription
        for tp in set(subscription.parts) - tps:
            subscription.close_partition(tp)
        for tp in sorted(tps - set(subscription.parts)):
            self.fetcher.open_partition(tp, self.coordinator.committed_offset(tp))

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This member of its group (Kafka's ``groupMetadata()``), for a transactional
        producer's ``send_offsets_to_transaction``: its offsets are then committed only while
        this consumer owns their partitions. IllegalStateError without a group."""
        member = self.coordinator.member
        if member is None:
            raise IllegalStateError("group_metadata() needs a group: create the Consumer with group_id=...")
        instance = member.member_id[len(STATIC_PREFIX) :] if is_static(member.member_id) else None
        return ConsumerGroupMetadata(member.group_id, member.generation, member.member_id, instance)

    def _check_open(self) -> None:
        if self.fetcher.closed:
            raise ChannelClosedError("this consumer is closed")

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
        self._subscription.subscribe(topics, pattern, listener)
        self.coordinator.resubscribe()

    def subscription(self) -> set[str] | None:
        """The subscribed topics (those matching the pattern, for a pattern); None without a subscription."""
        return self._subscription.subscription()

    def unsubscribe(self) -> None:
        """Drop the subscription (or the assignment): nothing is read until the next subscribe/assign."""
        self._check_open()
        self._set_assignment(set())
        self._subscription.unsubscribe()
        self.coordinator.unsubscribed()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (no group rebalancing)."""
        self._check_open()
        self._set_assignment(self._subscription.assign(partitions))

    def assignment(self) -> set[TopicPartition]:
        return set(self._subscription.parts)

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
        batch = self.fetcher.poll(timeout_ms, max_records, None)
        if not update_offsets:
            self.fetcher.unread(batch)
        return batch

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
            self._iterator = self.fetcher.records(self._consumer_timeout)
        try:
            return next(self._iterator)
        except BaseException:  # StopIteration, or an error that ended the generator: start anew next time
            self._iterator = None
            raise

    # -- positions and offsets ------------------------------------------------------------------

    def position(self, tp: TopicPartition, timeout_ms: float | None = None) -> int:
        """The offset of the next record to be returned from ``tp`` (not of the next fetched).

        Raises :class:`NoOffsetForPartitionError` if ``tp`` has no position yet (reset "none").
        ``timeout_ms``: kafka-python's; nothing here waits, so it only has to be valid.
        """
        _no_wait(timeout_ms)
        offset = self._subscription.part(tp).position()
        if offset is None:
            raise no_offset(to_tp(tp))
        return offset

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch from ``offset`` next (``OffsetOutOfRangeError`` if retention deleted it).

        Records fetched but not yet returned are dropped: the next one returned is ``offset``.
        """
        part = self._subscription.part(tp)
        part.seek(check_offset(to_tp(tp), offset, "seek"))

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        subscription = self._subscription
        for part in [subscription.part(tp) for tp in tps or list(subscription.parts)]:  # all checked first
            part.seek(part.channel.first_offset)

    def seek_to_end(self, *tps: TopicPartition) -> None:
        subscription = self._subscription
        for part in [subscription.part(tp) for tp in tps or list(subscription.parts)]:
            part.seek(part.channel.end_offset)

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: float | None = None
    ) -> dict[TopicPartition, int]:
        """The first offset each partition still holds."""
        _no_wait(timeout_ms)
        return {to_tp(tp): self._subscription.with_channel(tp, lambda ch: ch.first_offset) for tp in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition], timeout_ms: float | None = None) -> dict[TopicPartition, int]:
        """One past each partition's last record (the offset the next record gets)."""
        _no_wait(timeout_ms)
        return {to_tp(tp): self._subscription.with_channel(tp, lambda ch: ch.end_offset) for tp in partitions}

    def highwater(self, tp: TopicPartition) -> int:
        """The end offset of an assigned partition (kafka-python's high watermark: every
        record written is readable at once here, so it is always current)."""
        return self._subscription.part(tp).channel.end_offset

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None:
        """When a fetch last read an assigned partition (ms since the epoch), records or none;
        None before the first (aiokafka's ``last_poll_timestamp``, here for both clients)."""
        return self._subscription.part(tp).polled_ms

    def topics(self) -> set[str]:
        """The names of every topic under the root (of a tier URL: ``<origin>.<topic>``, see ``tier``)."""
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
        parts = self._subscription.parts
        lags = [part.channel.end_offset - pos for part in parts.values() if (pos := part.position()) is not None]
        return {
            "consumer-fetch-manager-metrics": {
                "assigned-partitions": float(len(parts)),
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
        return {tp: self._subscription.with_channel(tp, partial(lookup, ts=ts)) for tp, ts in checked.items()}

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
        return self.coordinator.committed(to_tp(tp), metadata)

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
        self.coordinator.commit(offsets)

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
                offsets = dict(self._subscription.positions())
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

    # -- flow control and lifecycle ------------------------------------------------------------

    def pause(self, *tps: TopicPartition) -> None:
        self._subscription.pause(*tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._subscription.resume(*tps)

    def paused(self) -> set[TopicPartition]:
        return self._subscription.paused()

    def close(self, autocommit: bool = True, timeout_ms: float | None = None) -> None:
        """Commit (if auto-commit is on and ``autocommit``), leave the group, release files."""
        _no_wait(timeout_ms)
        if self.fetcher.closed:
            return
        try:
            if autocommit:
                self.coordinator.commit_positions()
        finally:
            self.fetcher.closed = True
            self._set_assignment(set())
            self.coordinator.leave()
            self._wakeup.close()
            if self._bucket is not None:
                self._bucket.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
