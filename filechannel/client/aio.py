"""Async producer and consumer on anyio (asyncio or trio), aiokafka style.

Past construction, nothing here blocks the event loop. A consumer's file work (reads, decompression, the
group's flocks, the fsyncs of a commit) and its waiting run in a worker thread, in steps
of at most 1 s, and what a step fetches goes into the consumer's pending records; the
event loop hands records out from there, with no await between taking and returning
them. So a cancelled ``getmany`` loses nothing: what its abandoned worker fetched stays
pending for the next call. One lock orders the worker threads and the event loop's
takes (the loop only ever tries it without blocking). A producer with
``fsync="always"`` waits for its record's fsync in a worker thread; sends themselves only
buffer: they take microseconds and run inline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Collection
from typing import Any

import anyio
import anyio.to_thread

from ..errors import ChannelClosedError, ConfigError
from ..record import Headers
from .consumer import Consumer, check_timeout_ms, to_tp
from .producer import Producer
from .records import ConsumerRecord, RecordMetadata, TopicPartition


class AsyncProducer:
    """``Producer`` for async code: ``await producer.send(topic, value)`` -> RecordMetadata.

    Takes the same arguments as :class:`Producer`.
    """

    def __init__(self, root: Any, **kwargs: Any) -> None:
        self._producer = Producer(root, **kwargs)

    async def start(self) -> None:
        """Nothing to start (no server); kept for aiokafka compatibility."""

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        future = self._producer.send(topic, value, key, headers, partition, timestamp_ms)
        if future.done():
            return future.result()
        return await anyio.to_thread.run_sync(future.result)  # fsync="always": wait off the loop

    send_and_wait = send

    async def flush(self) -> None:
        await anyio.to_thread.run_sync(self._producer.flush)

    async def stop(self) -> None:
        await anyio.to_thread.run_sync(self._producer.close)

    close = stop

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


_STEP = 1.0  # seconds a worker thread waits at most per step (bounds an abandoned one's life)


class AsyncConsumer:
    """``Consumer`` for async code: ``await getone()``, ``await getmany(timeout_ms=...)``,
    ``async for record in consumer``. Takes the same arguments as :class:`Consumer`.

    As in aiokafka, ``getmany(tp)`` / ``getone(tp)`` read only the partitions given:
    records of the others are neither fetched nor dropped, and positions move only past
    records returned. Not for concurrent use by several tasks.
    """

    def __init__(self, *topics: str, **kwargs: Any) -> None:
        self._consumer = Consumer(*topics, **kwargs)
        self._io = threading.Lock()  # held by whoever touches the consumer's files or pending records
        self._closed = False

    @property
    def consumer(self) -> Consumer:
        """The synchronous consumer underneath (for seek, position, ...); not while a call runs."""
        return self._consumer

    async def start(self) -> None:
        """Nothing to start (no server); kept for aiokafka compatibility."""

    def _fill(self, only: Collection[TopicPartition] | None, timeout: float) -> None:
        """Worker thread: fetch into the pending records, waiting up to ``timeout`` s."""
        with self._io:
            if not self._consumer._closed:
                self._consumer._fill(timeout * 1000, only)

    def _take(self, only: Collection[TopicPartition] | None, budget: int | None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Event loop: pending records, if no worker holds the lock (never blocks)."""
        if self._closed:
            raise ChannelClosedError("this consumer is closed")
        if not self._io.acquire(blocking=False):
            return {}
        try:
            if budget is None:
                budget = self._consumer._max_poll_records
            return self._consumer._take(budget, only)
        finally:
            self._io.release()

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records by partition (of ``partitions``, if given): what is there now, else waits up to ``timeout_ms``."""
        timeout = check_timeout_ms(timeout_ms) / 1000
        if max_records is not None and (isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1):
            raise ConfigError(f"max_records must be an int >= 1, not {max_records!r}")
        only = frozenset(to_tp(tp) for tp in partitions) or None
        deadline = time.monotonic() + timeout
        fetched = False
        while True:
            batch = self._take(only, max_records)
            remaining = deadline - time.monotonic()
            if batch or (fetched and remaining <= 0):
                return batch
            step = max(0.0, min(remaining, _STEP))
            await anyio.to_thread.run_sync(self._fill, only, step, abandon_on_cancel=True)
            fetched = True

    async def getone(self, *partitions: TopicPartition) -> ConsumerRecord:
        """The next record (of ``partitions``, if given); waits for one."""
        only = frozenset(to_tp(tp) for tp in partitions) or None
        while True:
            if self._closed:
                raise ChannelClosedError("this consumer is closed")
            if self._io.acquire(blocking=False):
                try:
                    rec = self._consumer._take_one(only)
                finally:
                    self._io.release()
                if rec is not None:
                    return rec
            await anyio.to_thread.run_sync(self._fill, only, _STEP, abandon_on_cancel=True)

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self

    async def __anext__(self) -> ConsumerRecord:
        """The next record; the iteration ends (StopAsyncIteration) once the consumer is closed."""
        try:
            return await self.getone()
        except ChannelClosedError:
            if self._closed:
                raise StopAsyncIteration from None
            raise

    def _locked(self, fn: Any, *args: Any) -> Any:
        with self._io:
            return fn(*args)

    async def commit(self, offsets: Any = None) -> None:
        """Commit ``offsets`` (default: the positions, i.e. what was handed out), off the event loop."""
        await anyio.to_thread.run_sync(self._locked, self._consumer.commit, offsets)

    async def stop(self) -> None:
        """Commit (with auto-commit) and close, off the event loop; pending iterations end."""
        self._closed = True
        await anyio.to_thread.run_sync(self._locked, self._consumer.close)

    close = stop

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
