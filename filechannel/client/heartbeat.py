"""A group member's background heartbeat (kafka-python's heartbeat thread).

A consumer that spends longer than ``session_timeout_ms`` on a batch between two polls is
still alive, and Kafka keeps it in its group until it has not polled for
``max_poll_interval_ms``: its heartbeats go out from a background thread. So does this one:
a :class:`Heartbeat` thread calls ``beat`` (which touches the member's life file, whose mtime
the other members read) every ``heartbeat_interval_ms`` whatever the consumer is doing, and
calls ``on_poll_timeout`` once the consumer has not polled (:meth:`Heartbeat.polled`) for
``max_poll_interval_ms`` (the member then leaves its group, as Kafka's does, and its next
poll joins again). A member's heartbeat therefore stops only with its whole process (killed,
or stopped by SIGSTOP, or hung in C code that holds the GIL).

Invariants: the thread is a daemon (it never keeps a process alive) and holds no file
handle of its own; :meth:`Heartbeat.stop` ends and joins it, and after it returns neither
callback runs again. Not fork-safe, as no thread is: a forked child has no heartbeat thread
(and shares its parent's flock on the life file), so a consumer is not to be used across a
``fork``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..errors import FileChannelError

log = logging.getLogger("filechannel")


class Heartbeat:
    """Calls ``beat`` every ``interval`` seconds, and ``on_poll_timeout`` once each time
    :meth:`polled` has not been called for ``max_poll_interval`` seconds (see the module
    docstring). Started on construction."""

    def __init__(
        self,
        beat: Callable[[], None],
        on_poll_timeout: Callable[[], None],
        *,
        interval: float,
        max_poll_interval: float,
        name: str,
    ) -> None:
        self.polled_at = time.monotonic()  # written by the consumer's thread, read by this one (one float: atomic)
        self._beat = beat
        self._on_poll_timeout = on_poll_timeout
        self._interval = interval
        self._max_poll_interval = max_poll_interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def polled(self) -> None:
        """The consumer polled: the ``max_poll_interval`` starts again."""
        self.polled_at = time.monotonic()

    def overdue(self) -> bool:
        """Whether the consumer has not polled for ``max_poll_interval``."""
        return time.monotonic() - self.polled_at > self._max_poll_interval

    def _run(self) -> None:
        timed_out = False
        while not self._stopped.wait(self._interval):
            overdue = self.overdue()
            try:
                self._beat()
                if overdue and not timed_out:
                    self._on_poll_timeout()
            except (FileChannelError, OSError) as exc:  # a full or broken disk: try again at the next beat
                log.warning("consumer group heartbeat failed: %s", exc)
                continue
            timed_out = overdue

    def stop(self) -> None:
        """End the thread and wait for it: no callback runs after this returns."""
        self._stopped.set()
        self._thread.join()
