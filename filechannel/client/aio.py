"""Async producer and consumer on anyio (asyncio or trio), aiokafka style.

Nothing here blocks the event loop while it waits: a consumer with nothing to read
waits for the partitions' wake-up in a worker thread (cancellable, at most 1 s per
step), and a producer with ``fsync="always"`` waits for its record's fsync in a worker
thread. Sends themselves only buffer: they take microseconds and run inline.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread

from ..record import Headers
from .consumer import Consumer
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


class AsyncConsumer:
    """``Consumer`` for async code: ``await getone()``, ``await getmany(timeout_ms=...)``,
    ``async for record in consumer``. Takes the same arguments as :class:`Consumer`.
    """

    def __init__(self, *topics: str, **kwargs: Any) -> None:
        self._consumer = Consumer(*topics, **kwargs)

    @property
    def consumer(self) -> Consumer:
        """The synchronous consumer underneath (for commit, seek, position, ...)."""
        return self._consumer

    async def start(self) -> None:
        """Nothing to start (no server); kept for aiokafka compatibility."""

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records by partition: what is there now, else waits up to ``timeout_ms``."""
        deadline = time.monotonic() + timeout_ms / 1000
        wakeup = self._consumer._wakeup
        while True:
            seq = wakeup.seq
            batch = self._consumer.poll(timeout_ms=0, max_records=max_records)
            if partitions:
                batch = {tp: recs for tp, recs in batch.items() if tp in partitions}
            remaining = deadline - time.monotonic()
            if batch or remaining <= 0:
                return batch
            await anyio.to_thread.run_sync(wakeup.wait, seq, remaining, abandon_on_cancel=True)

    async def getone(self, *partitions: TopicPartition) -> ConsumerRecord:
        """The next record (of ``partitions``, if given); waits for one."""
        while True:
            # One record at a time: positions never run ahead of what was handed out.
            batch = await self.getmany(*partitions, timeout_ms=1000, max_records=1)
            for recs in batch.values():
                return recs[0]

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self

    async def __anext__(self) -> ConsumerRecord:
        return await self.getone()

    def commit(self, offsets: Any = None) -> None:
        self._consumer.commit(offsets)

    async def stop(self) -> None:
        self._consumer.close()

    close = stop

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
