"""Async producer and consumer on anyio (asyncio or trio), aiokafka style.

Past construction, nothing here blocks the event loop. A consumer's file work (reads from
disk, decompression, tier-2 fetches, the group's flocks, the fsyncs of a commit) and its
waiting run in a worker thread, in steps of at most 1 s, and what a step fetches goes
into the consumer's pending records; the event loop hands records out from there, with
no await between taking and returning them. So a cancelled ``getmany`` loses nothing:
what its abandoned worker fetched stays pending for the next call.

Records already in memory (a raw segment's pages in the page cache, which the records
just written and those being tailed are) the event loop decodes itself, as aiokafka
decodes what its fetches bring: ``preadv`` with ``RWF_NOWAIT`` never waits for the disk,
and whatever else a read would need (the disk, a seek, a compressed or tier-2 segment,
the next segment, a group heartbeat or an auto-commit due) sends the call to the worker
thread instead (``Cursor.read(nowait=True)``). A trip to a worker costs more than decoding
a thousand small records: ``getmany`` of small records was faster without a trip per
megabyte (DESIGN.md, "Async consumer"). At least every ``_INLINE_SPAN`` a call goes to
the worker anyway, so a partition whose records need it (rolled, cold, compressed) waits
no longer than that behind others read in memory.

One lock orders the worker threads and the event loop's reads and takes (the loop only
ever tries it without blocking). A producer with ``fsync="always"`` waits for its
record's fsync in a worker thread; sends themselves only buffer, far cheaper than a trip
to a worker, and run inline.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Generator, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, TypeVar, cast

import anyio
import anyio.from_thread
import anyio.to_thread

from ..engine.cursor import WouldBlock
from ..engine.record import Headers
from ..errors import ChannelClosedError, ConfigError, ProducerFencedError
from .consumer import Consumer
from .coordinator import CommitOffsets
from .fetcher import check_timeout_ms
from .futures import RecordFuture, SentFuture
from .producer import Producer
from .records import (
    AIOKAFKA_RECORDS,
    AsyncConsumerRecord,
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndTimestamp,
    RecordMetadata,
    TopicPartition,
    to_tp,
)

if TYPE_CHECKING:
    from ..engine._codec import AsyncSend

T = TypeVar("T")
P = ParamSpec("P")

_CAsyncSend: type[AsyncSend[..., RecordDelivery | SentFuture]] | None
try:  # AsyncProducer.send's common case in C (filechannel/engine/_codec.c), when it was built and loads
    from ..engine._codec import AsyncSend as _CAsyncSend
except ImportError:
    _CAsyncSend = None

# aiokafka's constructor names that kafka-python does not have: what each becomes here (None: ignored).
_AIOKAFKA_PRODUCER = {"loop": None, "max_batch_size": "batch_size"}
_AIOKAFKA_CONSUMER = {"loop": None, "rebalance_timeout_ms": None}


def _aiokafka_names(kwargs: dict[str, Any], names: Mapping[str, str | None]) -> dict[str, Any]:
    """``kwargs`` with aiokafka's own names dropped or renamed to kafka-python's."""
    out = {}
    for name, value in kwargs.items():
        if name not in names:
            out[name] = value
        elif (renamed := names[name]) is not None:
            out[renamed] = value
    return out


class RecordDelivery:
    """What ``await AsyncProducer.send(...)`` gives: a future to await for the record's
    :class:`RecordMetadata` (aiokafka's two steps: ``await (await producer.send(...))``).
    A record whose metadata is known at send gives its done future instead, which answers
    the same (awaitable, ``done``, ``result``, ``exception``).

    Awaiting it does not block the event loop: under asyncio it wraps the underlying
    ``concurrent.futures.Future``; under trio a worker thread waits (only with
    ``fsync="always"``: otherwise the record's offset is known on send and it is done).
    It can be awaited any number of times, and by ``asyncio.gather``.
    """

    __slots__ = ("future",)

    def __init__(self, future: RecordFuture[RecordMetadata]) -> None:
        self.future = future

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        return self._wait().__await__()

    async def _wait(self) -> RecordMetadata:
        future = self.future
        if future.done():
            return future.result()
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # trio: a worker thread waits
            return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        return await asyncio.wrap_future(future)

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> RecordMetadata:
        """The metadata once done (raises the record's error); :class:`Timeout` while pending."""
        return self.future.get(timeout=0)

    def exception(self) -> BaseException | None:
        return self.future.exception(timeout=0)


_new_delivery = object.__new__


class BatchRecord(NamedTuple):
    """What ``BatchBuilder.append`` returns (aiokafka's): the record's place in its batch."""

    offset: int  # relative to the batch's first record
    timestamp: int | None
    crc: None
    size: int


class BatchBuilder:
    """aiokafka's batch: records for one partition, sent together by :meth:`AsyncProducer.send_batch`.

    ``append`` returns None once the batch holds ``max_batch_size`` bytes (the producer's
    ``batch_size``; a first record is always taken) or after ``close()``.
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._records: list[tuple[Any, Any, int | None, Headers | None]] = []
        self._size = 0
        self._closed = False

    def append(self, *, timestamp: int | None, key: Any, value: Any, headers: Headers | None = None) -> BatchRecord | None:
        """Add a record (``timestamp`` in ms, None: now); None if the batch is full or closed.

        ``key`` and ``value`` are bytes (or None), as in aiokafka: a batch forgoes the producer's
        serializers. Anything else is refused when the batch is sent.
        """
        if self._closed:
            return None
        kbytes, vbytes = key, value
        size = (0 if kbytes is None else len(kbytes)) + (0 if vbytes is None else len(vbytes))
        if self._records and self._size + size > self._max_bytes:
            return None
        self._records.append((kbytes, vbytes, timestamp, headers or None))
        self._size += size
        return BatchRecord(len(self._records) - 1, timestamp, None, size)

    def close(self) -> None:
        """No more appends."""
        self._closed = True

    def size(self) -> int:
        """The bytes of the keys and values appended."""
        return self._size

    def record_count(self) -> int:
        return len(self._records)

    def appended(self) -> list[tuple[Any, Any, int | None, Headers | None]]:
        """The records appended, in order, as ``(key, value, timestamp, headers)`` (what
        :meth:`AsyncProducer.send_batch` sends)."""
        return list(self._records)


class AsyncProducer:
    """``Producer`` for async code, aiokafka style: ``await (await producer.send(topic, value))``
    -> RecordMetadata, or ``await producer.send_and_wait(topic, value)``.

    Takes the same arguments as :class:`Producer` (kafka-python's names), and aiokafka's
    ``max_batch_size`` (= ``batch_size``) and ``loop`` (ignored).
    """

    def __init__(self, root: Any, **kwargs: Any) -> None:
        kwargs = _aiokafka_names(kwargs, _AIOKAFKA_PRODUCER)
        self._producer = Producer(root, **kwargs)
        self._transactional = kwargs.get("transactional_id") is not None
        self._batch_bytes = kwargs.get("batch_size", 16384)
        if _CAsyncSend is not None:  # send(topic, value) in C, this class's send for any other call (see _codec.c)
            self.send = _CAsyncSend(self._producer.send, self._send, RecordDelivery, SentFuture)  # type: ignore[method-assign]

    async def start(self) -> None:
        """With ``transactional_id``: ``init_transactions()`` (aiokafka's start does it); else nothing
        to start (no server), kept for aiokafka compatibility."""
        if self._transactional:
            await anyio.to_thread.run_sync(self._producer.init_transactions)

    async def begin_transaction(self) -> None:
        """Open a transaction (after ``await start()``); see ``Producer.begin_transaction``."""
        self._producer.begin_transaction()

    async def commit_transaction(self) -> None:
        """Commit the open transaction, in a worker thread (it writes and fsyncs); see
        ``Producer.commit_transaction``. A send's future completes then: await it after."""
        await anyio.to_thread.run_sync(self._producer.commit_transaction)

    async def abort_transaction(self) -> None:
        """Drop the open transaction (nothing of it was written)."""
        self._producer.abort_transaction()

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, Any], group_id: Any) -> None:
        """Commit consumed offsets of group ``group_id`` (or ``consumer.group_metadata()``) with the transaction."""
        self._producer.send_offsets_to_transaction(offsets, group_id)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """``async with producer.transaction():`` (aiokafka's): begins a transaction, commits it
        when the block ends, aborts it if the block raises (and re-raises)."""
        await self.begin_transaction()
        try:
            yield
        except BaseException:
            with contextlib.suppress(ProducerFencedError):  # a fenced producer has nothing to abort
                await self.abort_transaction()
            raise
        await self.commit_transaction()

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers | None = None,
    ) -> RecordDelivery | SentFuture:
        """Buffer one record (aiokafka's argument order); returns a future to await for its metadata.

        An error about the arguments (not bytes, no such partition) raises here; one about
        the record once written (too large) is raised by the future. A record whose offset
        is known at send (fsync not "always") gives its done future itself, as awaitable and
        with the same ``done``/``result``/``exception``; others a :class:`RecordDelivery`.

        ``send(topic, value)`` is made in C where the extension is built: the record is
        buffered when ``send`` is called, not when it is awaited, and an awaitable that is
        already done is returned (a coroutine to asyncio: ``create_task`` and ``gather``
        take it); its await gives the future, or raises what the send raised. An ``async
        def`` cost a frame and its six arguments' binding per send, a large part of a small
        record's send (DESIGN.md, "Async producer").
        """
        if key is None and partition is None and timestamp_ms is None and headers is None:
            future = self._producer.send(topic, value)  # the form the producer's short path takes
            if future.__class__ is SentFuture:
                return future
        else:
            future = self._producer.send(topic, value, key, headers, partition, timestamp_ms)
        delivery = _new_delivery(RecordDelivery)  # RecordDelivery(future) without a Python __init__ call
        delivery.future = future
        return delivery

    _send = send  # the C send's fallback for any call but send(topic, value)

    async def send_and_wait(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers | None = None,
    ) -> RecordMetadata:
        """Send one record and wait for its metadata (one step)."""
        return await (await self.send(topic, value, key, partition, timestamp_ms, headers))

    def create_batch(self) -> BatchBuilder:
        """An empty batch of at most ``batch_size`` bytes, filled with ``append`` and sent with :meth:`send_batch`."""
        return BatchBuilder(self._batch_bytes)

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> RecordDelivery:
        """Send ``batch``'s records to ``partition`` in order; a future of the first record's metadata
        (aiokafka's: the batch's base offset). The batch is closed. Records other producers
        send at the same time may land between its records."""
        batch.close()
        first: RecordDelivery | None = None
        for key, value, timestamp, headers in batch.appended():
            future = self._producer.send_serialized(topic, value, key, headers, partition, timestamp)
            if first is None:
                first = RecordDelivery(future)
        if first is None:
            raise ConfigError("send_batch: the batch is empty")
        return first

    async def partitions_for(self, topic: str) -> set[int]:
        """The partition numbers of ``topic`` (creating it if allowed and missing, as aiokafka's)."""
        return await anyio.to_thread.run_sync(self._producer.partitions_for, topic)

    async def flush(self) -> None:
        await anyio.to_thread.run_sync(self._producer.flush)

    async def stop(self) -> None:
        await anyio.to_thread.run_sync(self._producer.close)

    close = stop

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _as_async(batch: dict[TopicPartition, list[ConsumerRecord]]) -> dict[TopicPartition, list[AsyncConsumerRecord]]:
    """An AsyncConsumer's records as they are: its Consumer's shape is AIOKAFKA_RECORDS (see
    AsyncConsumer.__init__), though the Consumer's methods are typed with their default one."""
    return cast(dict[TopicPartition, list[AsyncConsumerRecord]], batch)


def _as_kafka_python(batch: dict[TopicPartition, list[AsyncConsumerRecord]]) -> dict[TopicPartition, list[ConsumerRecord]]:
    """Records handed back to the Consumer's fetcher (``unread``), typed as its methods are (see _as_async)."""
    return cast(dict[TopicPartition, list[ConsumerRecord]], batch)


async def _awaited(called: Awaitable[object]) -> None:
    await called


ListenerCall = Callable[[Callable[[set[TopicPartition]], object], set[TopicPartition]], None]


class _AwaitedListener:
    """A rebalance listener as the async consumer's coordinator calls it: each of
    ``listener``'s methods through ``call`` (which lends it the lock and awaits an ``async
    def`` method's coroutine)."""

    def __init__(self, listener: Any, call: ListenerCall) -> None:
        self._listener = listener
        self._call = call

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._call(self._listener.on_partitions_revoked, revoked)

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._call(self._listener.on_partitions_assigned, assigned)


_STEP = 1.0  # seconds a worker thread waits at most per step (bounds an abandoned one's life)
_INLINE_SPAN = 0.05  # seconds the event loop reads records in memory itself before a worker trip (fairness, above)


class AsyncConsumer:
    """``Consumer`` for async code, aiokafka's surface: ``await getone()``, ``await
    getmany(timeout_ms=...)``, ``async for record in consumer``; awaitable where aiokafka's
    are (``commit``, ``committed``, ``position``, ``seek_to_*``, ``beginning_offsets``,
    ``end_offsets``, ``offsets_for_times``, ``topics``), plain where aiokafka's are
    (``seek``, ``subscribe``, ``assign``, ``pause``, ``highwater``, ...).

    Takes the same arguments as :class:`Consumer` (kafka-python's names), and aiokafka's
    ``loop`` and ``rebalance_timeout_ms`` (ignored), ``group_instance_id`` (static membership) and
    ``max_poll_records=None`` (the default).

    A rebalance listener's methods may be ``async def`` (aiokafka's are): each is awaited
    on the event loop before records are handed out again, so a ``seek`` made in
    ``on_partitions_assigned`` takes effect, and ``on_partitions_revoked`` runs before the
    partitions are given up (it may ``await consumer.commit()``). Plain methods are called
    as they are. A listener, plain or async, may call the consumer's methods: the call that
    is rebalancing waits for it and lends it the consumer's lock.

    As in aiokafka, ``getmany(tp)`` / ``getone(tp)`` read only the partitions given:
    records of the others are neither fetched nor dropped, and positions move only past
    records returned. Not for concurrent use by several tasks. The plain methods take the
    consumer's lock, which a worker thread abandoned by a cancelled ``getmany`` may hold
    for at most one step (1 s).
    """

    def __init__(self, *topics: str, **kwargs: Any) -> None:
        kwargs = _aiokafka_names(kwargs, _AIOKAFKA_CONSUMER)
        if kwargs.get("max_poll_records", 0) is None:
            del kwargs["max_poll_records"]
        self._consumer = Consumer(*topics, **kwargs)
        self._fetcher = self._consumer.fetcher
        self._fetcher.record_shape = AIOKAFKA_RECORDS  # aiokafka's ConsumerRecord, not kafka-python's (before any fetch)
        self._io = threading.Lock()  # held by whoever touches the consumer's files or pending records
        self._closed = False
        self._inline_until = 0.0  # monotonic: until then the loop may read records in memory itself
        self._past_end: Any = None  # the partition whose segment's end stopped the loop's last read (_trip)
        self._on_loop = False  # a plain method runs on the loop, under the lock: an async listener it calls waits
        self._lent = False  # a listener runs with the lock its caller holds (_call_listener)
        self._waiting: list[Awaitable[object]] = []  # async listener calls made on the loop, awaited before records

    @property
    def consumer(self) -> Consumer:
        """The synchronous consumer underneath (for seek, position, ...); not while a call runs."""
        return self._consumer

    async def start(self) -> None:
        """Nothing to start (no server); kept for aiokafka compatibility."""

    def _fill(
        self, only: Collection[TopicPartition] | None, timeout: float, max_records: int | None = None, ahead: bool = True
    ) -> None:
        """Worker thread: fetch for a getmany of ``max_records`` (default ``max_poll_records``;
        see ``Fetcher.fill``) into the pending records, waiting up to ``timeout`` s."""
        with self._io:
            fetcher = self._fetcher
            if not fetcher.closed:
                fetcher.fill(timeout * 1000, only, max_records, ahead=ahead)

    async def _trip(self, only: Collection[TopicPartition] | None, timeout: float, max_records: int | None = None) -> None:
        """Fill in a worker thread (:meth:`_fill`); the loop may then read in memory again for ``_INLINE_SPAN``.

        Where the loop's read stopped at the end of a partition's segment (``_past_end``), the
        trip fetches one record of that partition: that is the file work the loop may not do
        (find the seal, open the next segment), and the loop reads on from the chunk it left.
        A whole fill there read 64 values of 64 KiB in the worker thread, whose pages glibc
        takes back from its arena once the loop frees them: page faults on every trip, and far
        more time than the loop takes for the same records (DESIGN.md, "Async consumer")."""
        edge, self._past_end = self._past_end, None
        consumer = self._consumer
        # Not one paused, unassigned or left out since: its fill would wait for nothing.
        if (
            edge is not None
            and (only is None or edge in only)
            and edge in consumer.assignment()
            and edge not in consumer.paused()
        ):
            args: tuple[Any, ...] = (frozenset((edge,)), timeout, 1, False)
        else:
            args = (only, timeout, max_records)
        await anyio.to_thread.run_sync(self._fill, *args, abandon_on_cancel=True)
        self._inline_until = time.monotonic() + _INLINE_SPAN

    def _take(
        self, only: Collection[TopicPartition] | None, budget: int | None
    ) -> dict[TopicPartition, list[AsyncConsumerRecord]]:
        """Event loop: pending records, else up to ``budget`` records read in memory
        (:meth:`_read_here`), if no worker holds the lock (never blocks)."""
        if self._closed:
            raise ChannelClosedError("this consumer is closed")
        self._consumer.coordinator.polled()
        if not self._io.acquire(blocking=False):
            return {}
        try:
            if budget is None:
                budget = self._fetcher.max_poll_records
            return _as_async(self._fetcher.take(budget, only)) or self._read_here(budget, only)
        finally:
            self._io.release()

    def _read_here(self, budget: int, only: Collection[TopicPartition] | None) -> dict[TopicPartition, list[AsyncConsumerRecord]]:
        """Event loop, holding the lock: up to ``budget`` records that need no file work
        beyond reading cached pages ({} where any would: a worker trip fetches them)."""
        fetcher = self._fetcher
        if fetcher.closed or time.monotonic() >= self._inline_until or self._consumer.coordinator.upkeep_due():
            return {}
        try:
            return _as_async(fetcher.fetch(budget, only, nowait=True))
        except WouldBlock as exc:
            self._inline_until = 0.0  # what was read went back to the pending records
            self._past_end = exc.partition if exc.segment_end else None  # see _trip
            return {}

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[AsyncConsumerRecord]]:
        """Records by partition (of ``partitions``, if given): what is there now, else waits up to ``timeout_ms``."""
        timeout = check_timeout_ms(timeout_ms) / 1000
        if max_records is not None and (isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1):
            raise ConfigError(f"max_records must be an int >= 1, not {max_records!r}")
        only = frozenset(to_tp(tp) for tp in partitions) or None
        deadline = time.monotonic() + timeout
        fetched = False
        while True:
            await self._listeners_waiting()
            batch = self._take(only, max_records)
            remaining = deadline - time.monotonic()
            if batch or (fetched and remaining <= 0):
                return batch
            step = max(0.0, min(remaining, _STEP))
            # As many as this call may return: with max_poll_records (500) a getmany of 2,000
            # took four trips to a worker thread, which cost more than reading the records.
            await self._trip(only, step, max_records)
            fetched = True

    async def getone(self, *partitions: TopicPartition) -> AsyncConsumerRecord:
        """The next record (of ``partitions``, if given); waits for one."""
        only = frozenset(to_tp(tp) for tp in partitions) or None
        while True:
            if self._closed:
                raise ChannelClosedError("this consumer is closed")
            await self._listeners_waiting()
            self._consumer.coordinator.polled()
            if self._io.acquire(blocking=False):
                try:
                    fetcher = self._fetcher
                    rec = fetcher.take_one(only)
                    if rec is None:
                        fetcher.unread(_as_kafka_python(self._read_here(fetcher.max_poll_records, only)))
                        rec = fetcher.take_one(only)
                finally:
                    self._io.release()
                if rec is not None:
                    return cast(AsyncConsumerRecord, rec)  # see _as_async
            await self._trip(only, _STEP)

    def __aiter__(self) -> AsyncIterator[AsyncConsumerRecord]:
        return self

    async def __anext__(self) -> AsyncConsumerRecord:
        """The next record; the iteration ends (StopAsyncIteration) once the consumer is closed."""
        try:
            return await self.getone()
        except ChannelClosedError:
            if self._closed:
                raise StopAsyncIteration from None
            raise

    def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        with self._io:
            return fn(*args)

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread, holding the consumer's lock (file work stays off the
        loop); in an async listener, with the lock the waiting worker lent it."""
        if self._closed:
            raise ChannelClosedError("this consumer is closed")
        if self._lent:
            return await anyio.to_thread.run_sync(partial(fn, *args))
        return await anyio.to_thread.run_sync(self._locked, fn, *args)

    # -- rebalance listeners --------------------------------------------------------------------

    def _call_listener(self, method: Callable[[set[TopicPartition]], object], tps: set[TopicPartition]) -> None:
        """Call a listener's ``method``, lending it the lock its caller holds (so that it may
        call this consumer's methods), and await what it returns if that is awaitable: from a
        worker thread (a rebalance in a fetch), on the event loop while the worker waits; on
        the loop itself (a rebalance in ``subscribe``), before records are handed out."""
        lent, self._lent = self._lent, True
        try:
            called = method(tps)
            if inspect.isawaitable(called):
                if self._on_loop:
                    self._waiting.append(called)
                else:
                    anyio.from_thread.run(_awaited, called)
        finally:
            self._lent = lent

    async def _listeners_waiting(self) -> None:
        """Await the async listener calls made on the loop (in order)."""
        while self._waiting:
            await self._waiting.pop(0)

    # -- awaitable, as aiokafka's ------------------------------------------------------------------

    async def commit(self, offsets: CommitOffsets | None = None) -> None:
        """Commit ``offsets`` (default: the positions, i.e. what was handed out), off the event loop."""
        await self._off_loop(self._consumer.commit, offsets)

    async def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed offset of ``partition``, or None."""
        return await self._off_loop(self._consumer.committed, partition)

    async def position(self, partition: TopicPartition) -> int:
        """The offset of the next record to be returned from ``partition``."""
        return await self._off_loop(self._consumer.position, partition)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        await self._off_loop(self._consumer.seek_to_beginning, *partitions)

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        await self._off_loop(self._consumer.seek_to_end, *partitions)

    async def seek_to_committed(self, *partitions: TopicPartition) -> dict[TopicPartition, int | None]:
        """Seek each partition (default: all assigned) to its committed offset; returns them
        (None where nothing is committed: that partition keeps its position)."""
        return await self._off_loop(self._seek_to_committed, partitions)

    def _seek_to_committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        consumer = self._consumer
        tps = [to_tp(tp) for tp in partitions] or sorted(consumer.assignment())
        committed = {tp: consumer.committed(tp) for tp in tps}
        for tp, offset in committed.items():
            if offset is not None:
                consumer.seek(tp, offset)
        return committed

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._off_loop(self._consumer.beginning_offsets, list(partitions))

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._off_loop(self._consumer.end_offsets, list(partitions))

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        return await self._off_loop(self._consumer.offsets_for_times, timestamps)

    async def topics(self) -> set[str]:
        return await self._off_loop(self._consumer.topics)

    # -- plain, as aiokafka's ---------------------------------------------------------------------

    def _now(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn`` on the loop, under the consumer's lock (quick state changes and lookups); in an
        async listener, with the lock the waiting worker lent it."""
        if self._closed:
            raise ChannelClosedError("this consumer is closed")
        if self._lent:
            return fn(*args, **kwargs)
        with self._io:
            self._on_loop = True
            try:
                return fn(*args, **kwargs)
            finally:
                self._on_loop = False

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None, listener: Any = None) -> None:
        """Subscribe (see ``Consumer.subscribe``); ``listener``'s methods may be ``async def``."""
        awaited = None if listener is None else _AwaitedListener(listener, self._call_listener)
        self._now(self._consumer.subscribe, topics, pattern, awaited)

    def subscription(self) -> set[str] | None:
        return self._now(self._consumer.subscription)

    def unsubscribe(self) -> None:
        self._now(self._consumer.unsubscribe)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._now(self._consumer.assign, partitions)

    def assignment(self) -> set[TopicPartition]:
        return self._consumer.assignment()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._now(self._consumer.seek, partition, offset)

    def pause(self, *partitions: TopicPartition) -> None:
        self._now(self._consumer.pause, *partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._now(self._consumer.resume, *partitions)

    def paused(self) -> set[TopicPartition]:
        return self._consumer.paused()

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._consumer.partitions_for_topic(topic)

    def highwater(self, partition: TopicPartition) -> int:
        """The end offset of an assigned partition."""
        return self._now(self._consumer.highwater, partition)

    def last_poll_timestamp(self, partition: TopicPartition) -> int | None:
        """When a fetch last read ``partition`` (ms since the epoch), records or none; None before
        the first (aiokafka's). :class:`IllegalStateError` if it is not assigned."""
        return self._now(self._consumer.last_poll_timestamp, partition)

    def last_stable_offset(self, partition: TopicPartition) -> int:
        """The same as :meth:`highwater`: a transaction's records reach a partition only once
        committed, so every record there is stable."""
        return self.highwater(partition)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This member of its group, for ``AsyncProducer.send_offsets_to_transaction`` (see ``Consumer.group_metadata``)."""
        return self._consumer.group_metadata()

    async def stop(self) -> None:
        """Commit (with auto-commit) and close, off the event loop; pending iterations end."""
        self._closed = True
        await anyio.to_thread.run_sync(self._locked, self._consumer.close)

    close = stop

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
