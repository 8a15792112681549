"""Wake-ups for receivers waiting for new records, in this process and across processes.

In-process senders bump a sequence number under a condition after every write. For
writers in other processes, a watchdog observer (inotify on Linux) watches the channel
folder and bumps the same sequence on any change to a segment file, so a waiting
receiver wakes within milliseconds of another process's flush and costs no CPU while
it waits. The observer starts when a receiver first has to wait.

If the observer cannot start (e.g. the inotify watch limit is reached), waits fall back
to polling every ``POLL_INTERVAL`` seconds, and that is logged once. Even with the
observer, no single wait is longer than ``SAFETY_INTERVAL``: a cheap re-check in case
an event was lost (an inotify queue overflow), not a poll.
"""

from __future__ import annotations

import logging
import threading
import time

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

log = logging.getLogger("filechannel")

POLL_INTERVAL = 0.05
SAFETY_INTERVAL = 1.0
_SEGMENT_SUFFIXES = (".seg", ".seg.z")


class _Handler(FileSystemEventHandler):
    def __init__(self, wakeup: Wakeup) -> None:
        self._wakeup = wakeup

    def on_any_event(self, event: FileSystemEvent) -> None:
        path = event.src_path if isinstance(event.src_path, str) else event.src_path.decode()
        if path.endswith(_SEGMENT_SUFFIXES):
            self._wakeup.bump()


class Wakeup:
    """A sequence number that waiters watch; thread-safe."""

    def __init__(self, folder: str) -> None:
        self._folder = folder
        self._cond = threading.Condition(threading.Lock())
        self._seq = 0
        self._observer: Observer | None = None  # type: ignore[valid-type]
        self._polling = False
        self._closed = False

    @property
    def seq(self) -> int:
        return self._seq

    def bump(self) -> None:
        with self._cond:
            self._seq += 1
            self._cond.notify_all()

    def wait(self, seq: int, timeout: float | None) -> bool:
        """Wait until the sequence moves past ``seq`` or ``timeout`` passes; True if it moved."""
        self._watch()
        limit = POLL_INTERVAL if self._polling else SAFETY_INTERVAL
        step = limit if timeout is None else min(timeout, limit)
        with self._cond:
            if self._seq != seq:
                return True
            self._cond.wait(step)
            return self._seq != seq

    def _watch(self) -> None:
        if self._observer is not None or self._polling or self._closed:
            return
        with self._cond:
            if self._observer is not None or self._polling:
                return
            observer = Observer()
            try:
                observer.schedule(_Handler(self), self._folder, recursive=False)
                observer.daemon = True
                observer.start()
            except OSError as exc:
                self._polling = True
                log.warning(
                    "cannot watch %s for new records (%s); receivers poll every %.0f ms instead",
                    self._folder, exc, POLL_INTERVAL * 1000,
                )
                return
            self._observer = observer

    def close(self) -> None:
        with self._cond:
            self._closed = True
            observer, self._observer = self._observer, None
            self._cond.notify_all()
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)


def deadline_after(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout
