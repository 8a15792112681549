"""Wake-ups for receivers waiting for new records, in this process and across processes.

In-process senders bump a sequence number under a condition after every write. For
writers in other processes, a watchdog observer (inotify on Linux) watches the channel
folder and bumps the same sequence on any change to a segment file, so a waiting
receiver wakes within milliseconds of another process's flush and costs no CPU while
it waits. The observer starts when a receiver first has to wait, and watchdog is imported
only then: most processes that open a channel never wait on one (a producer, a command
that lists topics), and watchdog's import (ctypes, subprocess, its platform emitters) was
the largest part of ``import filechannel``.

If the observer cannot start (e.g. the inotify watch limit is reached), waits fall back
to polling every ``POLL_INTERVAL`` seconds, and that is logged once. Even with the
observer, no single wait is longer than ``SAFETY_INTERVAL``: a cheap re-check in case
an event was lost (an inotify queue overflow), not a poll.

Locks: ``bump`` takes the wake-up's condition, and watchdog calls our handler (which
bumps) holding its observer's lock; so the condition is never held while calling into
watchdog (starting the observer, scheduling a folder), or the two deadlock: a group member
of three partitions once hung for ever in ``observer.schedule`` while its observer's thread
waited in ``bump``. Starting and scheduling are serialized by a lock of their own instead.

A library prints nothing on a normal close. watchdog's inotify emitter logs an ERROR
("queue_events() called when the thread is inactive") when its thread reads once more
after ``stop()``: a race inside watchdog's own shutdown (its loop checks "keep running"
before ``stop`` sets the flag, then finds the watch already gone), whatever order the
observer is stopped in. With no logging configured, Python prints such a record on
stderr; so that one message is routed to the ``filechannel`` logger at DEBUG.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Observer is the platform's class, chosen at run time; each is a BaseObserver
    from watchdog.events import FileSystemEvent, FileSystemEventHandler
    from watchdog.observers.api import BaseObserver

log = logging.getLogger("filechannel")

_SHUTDOWN_RACE = "called when the thread is inactive"


class _ShutdownRaceFilter(logging.Filter):
    """Routes watchdog's shutdown-race message to our logger at DEBUG (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _SHUTDOWN_RACE in str(record.msg):
            log.debug("watchdog, while its observer stopped: %s", record.getMessage())
            return False
        return True


POLL_INTERVAL = 0.05
SAFETY_INTERVAL = 1.0
_SEGMENT_SUFFIXES = (".seg", ".seg.z")


@functools.cache
def _watchdog() -> tuple[Callable[[], BaseObserver], Callable[[Wakeup], FileSystemEventHandler]]:
    """watchdog's observer class and our event handler class, imported on first use (see the
    module docstring), with the filter for its shutdown race installed once."""
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    watchdog_log = logging.getLogger("watchdog.observers.inotify")
    if not any(isinstance(f, _ShutdownRaceFilter) for f in watchdog_log.filters):
        watchdog_log.addFilter(_ShutdownRaceFilter())

    class Handler(FileSystemEventHandler):
        def __init__(self, wakeup: Wakeup) -> None:
            self._wakeup = wakeup

        def on_any_event(self, event: FileSystemEvent) -> None:
            path = event.src_path if isinstance(event.src_path, str) else event.src_path.decode()
            if path.endswith(_SEGMENT_SUFFIXES):
                self._wakeup.bump()

    return Observer, Handler


class Wakeup:
    """A sequence number that waiters watch, bumped by writes to any of its folders; thread-safe.

    One wakeup may serve several channels (a consumer reading many partitions waits on
    one), each adding its folder with :meth:`add_folder`.
    """

    def __init__(self, *folders: str) -> None:
        self._folders: list[str] = list(folders)
        self._cond = threading.Condition(threading.Lock())
        # Held while the observer is started or given a folder, and by close() to take it (see
        # the module docstring, "Locks"); never taken with _cond held.
        self._setup = threading.Lock()
        self._seq = 0
        self._observer: BaseObserver | None = None
        self._polling = False
        self._closed = False

    @property
    def seq(self) -> int:
        return self._seq

    def add_folder(self, folder: str) -> None:
        """Also wake on writes to segment files in ``folder``."""
        with self._setup:
            with self._cond:
                if folder in self._folders:
                    return
                self._folders.append(folder)
                observer = self._observer
            if observer is not None:
                self._schedule(observer, folder)

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
        with self._setup:
            if self._observer is not None or self._polling or self._closed:
                return
            make_observer, _handler = _watchdog()
            observer = make_observer()
            observer.daemon = True
            try:
                observer.start()
            except OSError as exc:
                self._fall_back(exc)
                return
            with self._cond:
                self._observer = observer  # close() stops it, whatever scheduling raises
                folders = list(self._folders)
            for folder in folders:  # add_folder waits for _setup: no folder is missed
                self._schedule(observer, folder)

    def _schedule(self, observer: BaseObserver, folder: str) -> None:
        try:
            _make_observer, make_handler = _watchdog()
            observer.schedule(make_handler(self), folder, recursive=False)
        except OSError as exc:
            self._fall_back(exc)

    def _fall_back(self, exc: OSError) -> None:
        with self._cond:
            first, self._polling = not self._polling, True
        if first:
            log.warning(
                "cannot watch %s for new records (%s); receivers poll every %.0f ms instead",
                ", ".join(self._folders),
                exc,
                POLL_INTERVAL * 1000,
            )

    def close(self) -> None:
        with self._setup, self._cond:  # after a start in progress: it stops what that started
            self._closed = True
            observer, self._observer = self._observer, None
            self._cond.notify_all()
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)
