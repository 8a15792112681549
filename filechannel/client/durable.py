"""Durable futures: a Producer with ``fsync="always"`` completes a send's future after its fsync.

``Sender.send`` on an "always" channel blocks until the record is on disk, so a thread
gets at most one record into each fsync. A Kafka producer does better: ``send`` returns a
future at once and the future completes when the record is durable, so one thread can have
thousands of records in one fsync. :class:`GroupSync` does that for one partition: sends
go into the channel's buffer (opened with fsync "never"); a background thread repeatedly
fsyncs everything buffered so far (``Sender.sync``) and then completes the futures of the
records it covered. An fsync's error fails exactly those futures.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from .records import RecordMetadata


class GroupSync:
    """Completes the futures of one partition's records once an fsync covers them."""

    def __init__(self, sender: Any, name: str) -> None:
        self._sender = sender
        self._cond = threading.Condition()
        self._waiting: list[tuple[Future[RecordMetadata], RecordMetadata]] = []
        self._in_flight = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"filechannel-sync-{name}", daemon=True)
        self._thread.start()

    def add(self, future: Future[RecordMetadata], meta: RecordMetadata) -> None:
        with self._cond:
            self._waiting.append((future, meta))
            if len(self._waiting) == 1:  # the syncer may be asleep; otherwise it will look anyway
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return
                batch, self._waiting = self._waiting, []
                self._in_flight = len(batch)
            try:
                self._sender.sync()
            except BaseException as exc:
                for future, _ in batch:
                    future.set_exception(exc)
            else:
                for future, meta in batch:
                    future.set_result(meta)
            with self._cond:
                self._in_flight = 0
                self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every future handed in so far is complete; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._waiting and not self._in_flight, timeout)

    def close(self, timeout: float | None = None) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
