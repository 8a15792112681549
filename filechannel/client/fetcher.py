"""A consumer's fetcher: its records read from the assigned partitions' channels (aiokafka's ``fetcher.py``).

The :class:`Fetcher` reads the partitions of a :class:`~.subscription.SubscriptionState`:
fetches bounded in records and bytes and all or nothing, the records fetched but not yet
handed out (each partition's ``pending``, which come first), waiting for records, the
records' shape and deserializers, and where a partition starts or starts again when it has
no valid position (``auto_offset_reset``). What a consumer does between fetches (its group,
auto-commit, new topics) is the ``upkeep`` it is given.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from itertools import repeat, starmap
from typing import Any

from ..channel import FileChannel
from ..engine.clock import now_ms
from ..engine.cursor import WouldBlock
from ..engine.record import RecordLayout
from ..engine.wakeup import Wakeup
from ..errors import ChannelClosedError, ConfigError, OffsetOutOfRangeError
from .records import KAFKA_PYTHON_RECORDS, ConsumerRecord, RecordShape, TopicPartition
from .serializer import Codec, TopicCodec
from .subscription import UNSIZED, PartitionState, SubscriptionState, no_offset, open_receiver

# About the most one fetch reads from a partition by default (max_partition_fetch_bytes, as
# Kafka's; at least one record; the cursor's bound, Cursor.read): a 4 MiB poll of 64 KiB
# records, decoded and copied in one go, fell out of the CPU cache and ran slower than 1 MiB
# ones.
FETCH_BYTES = 1 << 20
# About the most one fill (a trip of the async consumer to its worker thread, a step of the
# iterator) fetches, or one fetch if more: max_poll_records (500) of 1 MB records took 500 MB.
FILL_BYTES = 8 << 20
# About the most one fetch reads from all partitions by default (fetch_max_bytes, Kafka's 50 MiB).
FETCH_MAX_BYTES = 50 << 20


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
    return list(starmap(pending.popleft, repeat((), budget)))  # popleft called from C: cheaper per record than a Python loop


def check_timeout_ms(timeout_ms: Any, name: str = "timeout_ms") -> float:
    """``timeout_ms`` if it is a number >= 0 (inf: forever), else :class:`ConfigError` (nan too: it would hang)."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not timeout_ms >= 0:
        raise ConfigError(f"{name} must be a number of milliseconds >= 0 (inf: forever), not {timeout_ms!r}")
    return float(timeout_ms)


class Fetcher:
    """Reads records from the partitions of ``subscription`` (see the module docstring).

    ``upkeep()`` is called before each fetch of :meth:`poll` and returns the longest a wait
    for records may then last (a group member's heartbeat interval; a bucket reader's
    ``tier_poll_ms``: nothing wakes it when a root uploads). ``header_of(topic)``: a header
    added to every record of the topic (a bucket reader's origin), or None. ``record_shape`` is the
    type records are made as (kafka-python's; the async consumer sets aiokafka's before its
    first fetch). ``closed``: the consumer is closed, nothing is fetched or taken any more.
    Reads and changes partitions' state without a lock: one thread at a time (the async
    consumer holds its lock).
    """

    def __init__(
        self,
        subscription: SubscriptionState,
        wakeup: Wakeup,
        upkeep: Callable[[], float],
        *,
        auto_offset_reset: str,
        max_poll_records: int,
        fetch_bytes: int,
        fetch_max_bytes: int,
        key_deserializer: Codec | None,
        value_deserializer: Codec | None,
        header_of: Callable[[str], tuple[str, bytes]] | None = None,
    ) -> None:
        self.record_shape: RecordShape = KAFKA_PYTHON_RECORDS
        self._header_of = header_of  # a header every record of a topic gets (a bucket reader's origin), asked once per partition
        self._headers: dict[TopicPartition, tuple[str, bytes]] = {}
        self.max_poll_records = max_poll_records
        self._key_codec = TopicCodec(key_deserializer, "deserialize")
        self._value_codec = TopicCodec(value_deserializer, "deserialize")
        self.closed = False
        self._subscription = subscription
        self._parts = subscription.parts  # the same dict for the consumer's life: read on every fetch
        self._wakeup = wakeup
        self._upkeep = upkeep
        self._reset = auto_offset_reset
        self._fetch_bytes = min(fetch_bytes, fetch_max_bytes)  # what one partition's fetch reads, about
        self._fetch_max_bytes = fetch_max_bytes
        self._fill_bytes = min(FILL_BYTES, fetch_max_bytes)
        self._layouts: dict[TopicPartition, RecordLayout] = {}  # by partition: how its records are decoded
        self._rotation = 0

    def _check_open(self) -> None:
        if self.closed:
            raise ChannelClosedError("this consumer is closed")

    # -- where a partition starts ------------------------------------------------------------------

    def open_partition(self, tp: TopicPartition, committed: int | None) -> None:
        """Assign ``tp``: its channel opened, its receiver at ``committed`` if the log holds that
        offset, else by ``auto_offset_reset`` (none for "none": no position until a seek)."""
        ch = self._subscription.store.open_partition(tp.topic, tp.partition, wakeup=self._wakeup)
        try:
            if committed is not None and ch.first_offset <= committed <= ch.end_offset:
                start: int | None = committed
            else:
                start = None if self._reset == "none" else self._reset_offset(tp, ch)
            rx = None if start is None else open_receiver(ch, start)
        except BaseException:
            ch.close()
            raise
        self._parts[tp] = PartitionState(ch, rx, start)

    def _reset_offset(self, tp: TopicPartition, ch: FileChannel) -> int:
        if self._reset == "earliest":
            return ch.first_offset
        if self._reset == "latest":
            return ch.end_offset
        raise no_offset(tp)

    # -- fetching ------------------------------------------------------------------------------------

    def poll(
        self, timeout_ms: float, max_records: int | None, only: Collection[TopicPartition] | None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Up to ``max_records`` (default ``max_poll_records``) records of the unpaused
        partitions (of ``only``, all if None; the others are not touched): what is there, else
        waits up to ``timeout_ms``, with the upkeep before each fetch."""
        self._check_open()
        check_timeout_ms(timeout_ms)
        budget = self.max_poll_records if max_records is None else max_records
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ConfigError(f"max_records must be an int >= 1, not {budget!r}")
        deadline = time.monotonic() + timeout_ms / 1000 if math.isfinite(timeout_ms) else math.inf
        while True:
            longest = self._upkeep()
            seq = self._wakeup.seq
            result = self.fetch(budget, only)
            remaining = deadline - time.monotonic()
            if result or remaining <= 0:
                return result
            self._wakeup.wait(seq, min(remaining, 3600.0, longest))

    @property
    def key_deserializer(self) -> Codec | None:
        return self._key_codec.codec

    @key_deserializer.setter
    def key_deserializer(self, codec: Codec | None) -> None:
        self._key_codec = TopicCodec(codec, "deserialize")

    @property
    def value_deserializer(self) -> Codec | None:
        return self._value_codec.codec

    @value_deserializer.setter
    def value_deserializer(self, codec: Codec | None) -> None:
        self._value_codec = TopicCodec(codec, "deserialize")

    def fetch(
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
        parts = self._parts
        tps = list(parts) if only is None else [tp for tp in parts if tp in only]
        if not tps:
            return result
        self._rotation = (self._rotation + 1) % len(tps)
        room = self._fetch_max_bytes  # bytes this fetch may still read, about
        try:
            for tp in tps[self._rotation :] + tps[: self._rotation]:
                part = parts[tp]
                if part.paused:
                    continue
                if part.pending:
                    recs = result[tp] = _take_pending(part.pending, budget)
                else:
                    rx = part.receiver
                    if rx is None:
                        if nowait:
                            raise WouldBlock
                        if part.waiting is None:
                            raise no_offset(tp)
                        rx = part.start_waiting()
                        if rx is None:
                            continue  # no segment yet (a bucket reader's partition before its first upload)
                    layout = self._layouts.get(tp) or self._new_layout(tp)
                    try:
                        raw = rx.read_now(budget, layout, min(self._fetch_bytes, room), nowait)
                    except WouldBlock as exc:
                        exc.partition = tp
                        raise
                    except OffsetOutOfRangeError:
                        if nowait:
                            raise WouldBlock from None
                        rx.seek(self._reset_offset(tp, part.channel))
                        raw = rx.read_now(budget, layout, min(self._fetch_bytes, room))
                    part.polled_ms = now_ms()  # aiokafka's last_poll_timestamp: the partition was read, records or none
                    if not raw:
                        if not nowait and rx.position > part.channel.end_offset:
                            # Past the end (a seek there, or a committed offset beyond a log that
                            # lost its tail): as Kafka, reset by auto_offset_reset, never wait forever.
                            rx.seek(self._reset_offset(tp, part.channel))
                        continue
                    if self._header_of is not None:
                        header = self._headers.get(tp) or self._headers.setdefault(tp, self._header_of(tp.topic))
                        raw = self.record_shape.with_header(raw, header)
                    try:
                        recs = self.record_shape.deserialized(
                            raw,
                            self._key_codec.for_topic(tp.topic),
                            self._value_codec.for_topic(tp.topic),
                        )
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
            self.unread(result)
            raise
        return result

    def _new_layout(self, tp: TopicPartition) -> RecordLayout:
        """How ``tp``'s receiver decodes records: straight into this fetcher's record shape."""
        layout = self._layouts[tp] = self.record_shape.layout(tp[0], tp[1])
        return layout

    def unread(self, batch: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Put records fetched but not handed out back in front: the next fetch returns them first."""
        for tp, recs in batch.items():
            part = self._parts.get(tp)
            if part is not None:
                part.pending.extendleft(reversed(recs))

    def fill(
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
        asked = self.max_poll_records if asked is None else asked
        batch = self.poll(timeout_ms, self._fill_budget(asked, only, ahead), only)
        try:
            got = sum(map(len, batch.values()))
            more = batch
            while more and got < (budget := self._fill_budget(asked, only, ahead)):
                more = self.fetch(budget - got, only)
                for tp, recs in more.items():
                    batch.setdefault(tp, []).extend(recs)
                    got += len(recs)
        finally:
            self.unread(batch)
        return bool(batch)

    def _fill_budget(self, asked: int, only: Collection[TopicPartition] | None, ahead: bool) -> int:
        """Records a fill fetches when ``asked`` are wanted: about ``FILL_BYTES`` of them at
        most (``fetch_max_bytes`` if less), or one fetch if that is more (32 records of 256
        KiB, not 500), counted in records of the partition (of ``only``) with the most in a
        fetch (``max_partition_fetch_bytes``); until a partition's sizes are seen, ``asked``
        (each fetch is bounded in bytes anyway).
        ``ahead`` (the async consumer, whose fills cost a trip to a worker thread): at least
        one such fetch, past ``asked``, as aiokafka fetches ``max_partition_fetch_bytes`` ahead
        of what ``getmany`` hands out (at 100 B about 10,000 records a trip, not 500). They
        wait as pending records (positions do not move past them)."""
        sized = [p.fetch_records for tp, p in self._parts.items() if p.fetch_records != UNSIZED and (only is None or tp in only)]
        if not sized:
            return asked
        per_fetch = max(sized)
        return min(max(asked, per_fetch) if ahead else asked, per_fetch * max(1, self._fill_bytes // self._fetch_bytes))

    # -- handing out pending records ---------------------------------------------------------------

    def take(self, budget: int, only: Collection[TopicPartition] | None) -> dict[TopicPartition, list[ConsumerRecord]]:
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

    def take_one(self, only: Collection[TopicPartition] | None) -> ConsumerRecord | None:
        """The next pending record of an unpaused partition (of ``only``), or None. Never blocks."""
        self._check_open()
        for tp, part in self._parts.items():
            if part.pending and not part.paused and (only is None or tp in only):
                return part.pending.popleft()
        return None

    def records(self, consumer_timeout: float) -> Iterator[ConsumerRecord]:
        """A consumer's iteration: fills of ``max_poll_records``, their records one at a time;
        ends after ``consumer_timeout`` seconds without a record, or once closed. A record
        leaves its partition's pending records only as it is yielded."""
        idle_since = time.monotonic()
        while not self.closed:
            if not self.fill(min(1000.0, consumer_timeout * 1000), None):
                if time.monotonic() - idle_since >= consumer_timeout:
                    return
                continue
            parts = self._parts
            for tp, part in list(parts.items()):
                pending = part.pending
                # Re-checked per record: the loop body may seek, pause, commit or close.
                while pending and not part.paused and parts.get(tp) is part:
                    yield pending.popleft()
            idle_since = time.monotonic()
