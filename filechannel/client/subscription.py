"""What a consumer reads: its subscription (topics or a pattern) or manual assignment, and the
state of each partition assigned to it (aiokafka's ``subscription_state.py``).

A :class:`SubscriptionState` holds the subscription and the assigned partitions, each a
:class:`PartitionState`: its channel, receiver, pause flag, and the records fetched but not
yet handed out. Which partitions are assigned is decided elsewhere (the group coordinator,
``coordinator.py``, or ``Consumer.assign``); what is read from them, by the fetcher
(``fetcher.py``).
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from ..channel import FileChannel
from ..engine.wakeup import Wakeup
from ..errors import (
    ConfigError,
    IllegalStateError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from ..receiver import Receiver
from .records import ConsumerRecord, TopicPartition, to_tp

T = TypeVar("T")

UNSIZED = 1 << 62  # a partition's fetch_records before its record sizes are seen


class ConsumerRebalanceListener(Protocol):
    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...


class TopicSource(Protocol):
    """Where a consumer's topics are: a root (``topics.TopicStore``) or a tier URL read alone
    (``bucket.BucketTopics``). ``root`` is the folder its groups keep their state in."""

    @property
    def root(self) -> str: ...

    def list(self) -> list[str]: ...

    def partitions(self, topic: str) -> int: ...

    def open_partition(self, topic: str, partition: int, *, wakeup: Wakeup | None = None, **overrides: Any) -> FileChannel: ...


def open_receiver(channel: FileChannel, offset: int) -> Receiver | None:
    """A receiver of ``channel`` at ``offset``; None while the channel holds no segment at all and
    ``offset`` is not below its first offset (a bucket reader's partition before its first
    upload, or with every upload deleted): it starts there once a segment appears."""
    try:
        return channel.receiver(offset)
    except OffsetOutOfRangeError:
        if channel.first_offset < channel.end_offset or offset < channel.first_offset:
            raise
        return None


def no_offset(tp: TopicPartition) -> NoOffsetForPartitionError:
    """The error of a partition without a position (``auto_offset_reset="none"`` and nothing committed)."""
    return NoOffsetForPartitionError(
        f"{tp.topic}[{tp.partition}] has no committed offset (or it was deleted by retention) and "
        "auto_offset_reset is 'none'; seek to an offset or use 'earliest'/'latest'"
    )


class PartitionState:
    """What a consumer keeps per assigned partition: its channel, receiver, undelivered records.

    ``pending`` holds records fetched from the receiver but not yet handed to the user (the
    rest of an iterator's batch, or what a filtered async fetch left); they come first. So
    the partition's position is the first pending record's offset, else the receiver's: it
    never runs ahead of what was handed out. ``receiver`` is None while the partition has no
    position (no committed offset and ``auto_offset_reset="none"``) until the user seeks, or
    while its channel holds no segment yet (:func:`open_receiver`): then ``waiting`` is the
    position, where the receiver starts once one appears (:meth:`start_waiting`).
    """

    __slots__ = ("channel", "fetch_records", "paused", "pending", "polled_ms", "receiver", "waiting")

    def __init__(self, channel: FileChannel, receiver: Receiver | None, waiting: int | None = None) -> None:
        self.channel = channel
        self.receiver = receiver
        self.waiting = waiting if receiver is None else None
        self.paused = False
        self.pending: deque[ConsumerRecord] = deque()
        self.fetch_records = UNSIZED  # records per fetch (max_partition_fetch_bytes of them), once sizes are seen
        self.polled_ms: int | None = None  # when a fetch last read the partition (ms since the epoch)

    def position(self) -> int | None:
        if self.pending:
            return self.pending[0].offset
        return self.waiting if self.receiver is None else self.receiver.position

    def seek(self, offset: int) -> None:
        """Deliver ``offset`` next; the pending records go only once the seek succeeded."""
        if self.receiver is None:
            self.receiver = open_receiver(self.channel, offset)
            self.waiting = offset if self.receiver is None else None
        else:
            self.receiver.seek(offset)
        self.pending.clear()

    def start_waiting(self) -> Receiver | None:
        """The receiver of a partition that was ``waiting`` for its first segment, if it has one now."""
        if self.waiting is not None and (receiver := open_receiver(self.channel, self.waiting)) is not None:
            self.receiver, self.waiting = receiver, None
        return self.receiver

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
        self.channel.close()


class SubscriptionState:
    """A consumer's subscription and its assigned partitions (``parts``, by partition).

    A subscription (topics, or a regex ``pattern``, with the ``listener`` told of
    rebalances) follows its topics: every ``metadata_max_age_ms`` they are listed again
    (:meth:`refresh_topics`). A manual assignment (``manual``) does not. ``parts`` is one
    dict for the consumer's life (the fetcher reads it on every fetch).
    """

    def __init__(self, store: TopicSource, metadata_max_age_ms: int) -> None:
        self.store = store
        self.parts: dict[TopicPartition, PartitionState] = {}
        self.topics: list[str] = []
        self.pattern: re.Pattern[str] | None = None
        self.listener: ConsumerRebalanceListener | None = None
        self.manual = False
        self.counts: dict[str, int] = {}  # the subscribed topics that exist, with their partition counts
        self._metadata_max_age = metadata_max_age_ms / 1000
        self._next_metadata = math.inf  # when a subscription next looks for new topics

    # -- the subscription -------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str], pattern: str | None, listener: ConsumerRebalanceListener | None) -> None:
        """Subscribe to ``topics`` or to the topics matching ``pattern``, everything checked
        before anything changes (the assigned partitions are the caller's to change)."""
        topics = [topics] if isinstance(topics, str) else list(topics)
        if bool(topics) == bool(pattern):
            raise ConfigError("subscribe takes either a list of topics or a pattern, not both or neither")
        if self.manual and self.parts:
            raise IllegalStateError("subscribe cannot be mixed with assign; call unsubscribe first")
        try:
            compiled = re.compile(pattern) if pattern else None
        except (re.error, TypeError) as exc:
            raise ConfigError(f"subscribe: {pattern!r} is not a regular expression ({exc})") from None
        for topic in topics:
            try:
                self.store.partitions(topic)  # a badly named topic (or a lost topic.json) fails here, changing nothing
            except UnknownTopicError:
                pass  # read once it is created
        self.pattern = compiled
        self.topics = topics
        self.listener = listener
        self.manual = False

    def assign(self, partitions: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Check a manual assignment of ``partitions`` and make this one (no subscription);
        return them as TopicPartitions (the assigned partitions are the caller's to change)."""
        tps = {to_tp(tp) for tp in partitions}  # every one checked before anything changes
        if self.topics or self.pattern:
            raise IllegalStateError("assign cannot be mixed with subscribe; call unsubscribe first")
        for tp in tps:
            if not 0 <= tp.partition < self.store.partitions(tp.topic):
                raise UnknownPartitionError(f"{tp.topic} has no partition {tp.partition}")
        self.manual = True
        return tps

    def unsubscribe(self) -> None:
        """No subscription nor assignment (the assigned partitions are the caller's to close)."""
        self.topics, self.pattern = [], None
        self.manual = False
        self.counts, self._next_metadata = {}, math.inf

    def subscription(self) -> set[str] | None:
        """The subscribed topics (those matching the pattern, for a pattern); None without a subscription."""
        if not self.topics and self.pattern is None:
            return None
        return set(self._matching_topics())

    def follows_topics(self) -> bool:
        """A subscription (topics or a pattern), not a manual assignment: its partitions are
        looked for again and, in a group, rebalanced."""
        return not self.manual and (bool(self.topics) or self.pattern is not None)

    def _matching_topics(self) -> list[str]:
        if self.pattern is not None:
            return [t for t in self.store.list() if self.pattern.match(t)]
        return list(self.topics)

    def metadata_due(self) -> bool:
        """Whether the subscription's topics are due to be listed again."""
        return time.monotonic() >= self._next_metadata

    def refresh_topics(self, force: bool) -> bool:
        """List the subscribed topics that exist now, with their partition counts (``counts``),
        if ``force`` or every ``metadata_max_age_ms``; whether they changed."""
        now = time.monotonic()
        if not force and now < self._next_metadata:
            return False
        counts = {}
        for topic in self._matching_topics():
            try:
                counts[topic] = self.store.partitions(topic)
            except UnknownTopicError:
                pass  # not created yet (or deleted): looked for again every metadata_max_age_ms
        changed = counts != self.counts
        self.counts = counts
        self._next_metadata = now + self._metadata_max_age
        return changed

    def subscribed_partitions(self) -> set[TopicPartition]:
        """Every partition of the subscribed topics that exist (as of :meth:`refresh_topics`)."""
        return {TopicPartition(t, p) for t, n in self.counts.items() for p in range(n)}

    # -- the assigned partitions ------------------------------------------------------------------

    def part(self, tp: TopicPartition) -> PartitionState:
        """The state of an assigned partition, or :class:`IllegalStateError` (a :class:`ConfigError`)."""
        part = self.parts.get(to_tp(tp))
        if part is None:
            raise IllegalStateError(f"{tp} is not assigned to this consumer (assignment: {sorted(self.parts)})")
        return part

    def close_partition(self, tp: TopicPartition) -> None:
        """No longer assigned: its receiver and channel closed."""
        part = self.parts.pop(tp, None)
        if part is not None:
            part.close()

    def positions(self) -> dict[TopicPartition, int]:
        """The positions of the assigned partitions that have one: what a commit covers."""
        return {tp: off for tp, part in self.parts.items() if (off := part.position()) is not None}

    def pause(self, *tps: TopicPartition) -> None:
        for part in [self.part(tp) for tp in tps]:  # all checked before any changes
            part.paused = True

    def resume(self, *tps: TopicPartition) -> None:
        for part in [self.part(tp) for tp in tps]:
            part.paused = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, p in self.parts.items() if p.paused}

    def with_channel(self, tp: TopicPartition, fn: Callable[[FileChannel], T]) -> T:
        """``fn`` of ``tp``'s channel: the assigned partition's, else one opened for the call."""
        part = self.parts.get(to_tp(tp))
        if part is not None:
            return fn(part.channel)
        with self.store.open_partition(tp[0], tp[1], maintenance_interval=0) as ch:
            return fn(ch)
