"""Durable futures: a Producer with ``fsync="always"`` completes a send's future after its fsync.

``Sender.send`` on an "always" channel blocks until the record is on disk, so a thread
gets at most one record into each fsync. A Kafka producer does better: ``send`` returns a
future at once and the future completes when the record is durable, so one thread can have
thousands of records in one fsync.

:class:`GroupSync` does that for one partition, the way Kafka's record accumulator does:
``send`` only puts the record on a queue (a ``deque`` append, atomic under the GIL, so
producer threads never contend for a lock). One background thread takes everything
queued, appends it to the channel (opened with fsync "never") with an uncontended lock,
fsyncs it (``Sender.sync``) and completes those futures. Records queued while that fsync
runs go into the next one. Offsets are assigned in queue order, so one thread's records
keep their order. A record the channel refuses (too large, not bytes) fails its own
future; an fsync's error fails the futures of the records it covered.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from ..engine.record import Headers, serialized_sizes
from ..errors import ChannelClosedError, FileChannelError
from .futures import RecordFuture
from .records import RecordMetadata, TopicPartition

# (future, value or _MARKER, key, headers, timestamp): a record's future is of its RecordMetadata, a marker's of None
_Entry = tuple[RecordFuture[Any], Any, "bytes | bytearray | memoryview | None", "Headers | None", int]
_MARKER = object()  # a queue entry whose future completes when everything before it is durable


class GroupSync:
    """Appends one partition's records, fsyncs them in groups, and completes their futures."""

    def __init__(self, sender: Any, topic: str, partition: int, client_id: str = "filechannel") -> None:
        self._sender = sender
        self._tp = TopicPartition(topic, partition)
        self._topic, self._partition = topic, partition
        self._queue: deque[_Entry] = deque()
        self._wake = threading.Event()
        self._done = threading.Condition()  # shared by this partition's futures (see futures.py)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"{client_id}-sync-{topic}-{partition}", daemon=True)
        self._thread.start()

    def add(
        self,
        value: bytes | bytearray | memoryview | None,
        key: bytes | bytearray | memoryview | None,
        headers: Headers | None,
        timestamp_ms: int,
    ) -> RecordFuture[RecordMetadata]:
        """Queue one record; its future completes once an fsync covers it."""
        if self._closed:
            raise ChannelClosedError(f"the producer of {self._topic}[{self._partition}] is closed")
        future: RecordFuture[RecordMetadata] = RecordFuture(self._done)
        self._queue.append((future, value, key, headers, timestamp_ms))
        if not self._wake.is_set():
            self._wake.set()
        return future

    def _run(self) -> None:
        queue, sync = self._queue, self._sender.sync
        while True:
            self._wake.wait()
            self._wake.clear()
            batch = []
            while queue:
                batch.append(queue.popleft())
            done = self._append(batch)
            if done:
                try:
                    sync()
                except BaseException as exc:
                    RecordFuture.complete_many(self._done, done, exc)
                else:
                    RecordFuture.complete_many(self._done, done, None)
            if self._closed and not queue:
                return

    def _append(self, batch: list[_Entry]) -> list[tuple[RecordFuture[Any], RecordMetadata | None]]:
        """Append the queued records in order; return the futures to complete after the fsync.

        Runs of key-less records with one timestamp go in with one ``send_many``.
        """
        send, send_many = self._sender.send, self._sender.send_many
        topic, partition, tp = self._topic, self._partition, self._tp
        done: list[tuple[RecordFuture[Any], RecordMetadata | None]] = []
        i, n = 0, len(batch)
        one_by_one_until = 0
        while i < n:
            future, value, key, headers, ts = batch[i]
            j = i + 1
            if i >= one_by_one_until and key is None and headers is None and type(value) is bytes:
                while j < n and batch[j][4] == ts and batch[j][2] is None and batch[j][3] is None and type(batch[j][1]) is bytes:
                    j += 1
            if j - i > 1:
                run = batch[i:j]
                try:
                    offsets = send_many([e[1] for e in run], timestamp=ts)
                except (FileChannelError, TypeError, ValueError):
                    one_by_one_until, j = j, i + 1  # one is refused (send_many checks all first)
                else:
                    done.extend(
                        (e[0], RecordMetadata(topic, partition, tp, off, ts, None, -1, len(e[1]), -1))
                        for e, off in zip(run, offsets, strict=True)
                    )
                    i = j
                    continue
            i = j
            if value is _MARKER:
                done.append((future, None))
                continue
            try:
                offset = send(value, key=key, headers=headers, timestamp=ts)
            except (FileChannelError, TypeError, ValueError) as exc:
                future.set_exception(exc)
                continue
            done.append((future, RecordMetadata(topic, partition, tp, offset, ts, None, *serialized_sizes(key, value, headers))))
        return done

    def marker(self) -> RecordFuture[None]:
        """A future that completes once every record queued before it is durable."""
        future: RecordFuture[None] = RecordFuture(self._done)
        self._queue.append((future, _MARKER, None, None, 0))
        self._wake.set()
        return future

    def close(self, timeout: float | None = None) -> None:
        """Make every queued record durable (completing its future), then stop."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():  # a send that raced with close: never leave a future pending
            while self._queue:
                self._queue.popleft()[0].set_exception(ChannelClosedError(f"{self._topic}[{self._partition}]: producer closed"))
