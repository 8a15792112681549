"""Advisory file locks (``flock``) shared by the processes that open one channel.

``writer.lock`` serializes appends, rolls and tail recovery across processes: a writer
holds it from the moment it assigns offsets to buffered records until they are written.
The file also holds the writer state (see :mod:`filechannel.engine.writer_state`), so the next
holder learns where the log ends without scanning. ``maintenance.lock`` lets exactly one
process at a time compress and collect segments. The kernel releases both when a
process dies, however it dies.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import ConfigError, os_errors, storage_error


class FileLock:
    """An exclusive lock on one file that excludes other processes *and* the other threads
    of this one. Not reentrant.

    An ``flock`` belongs to an open file description, which every thread of the process
    shares: on its own it let a second thread "take" a lock another thread held, and one
    thread's release freed it for all (the maintenance thread and a user's
    ``compress_sealed()`` then compressed the same segment at once). So a thread lock is
    taken first and the ``flock`` second; both are held until :meth:`release`, which any
    thread may call (the appender's flusher releases what a sending thread took). Another
    ``FileLock`` on the same file, in this process or another, is excluded by the ``flock``.
    """

    def __init__(self, path: str, *, read_only: bool = False) -> None:
        """Open (and create) the lock file; with ``read_only``, open it for reading only and never
        create it (``fd`` is -1 if it does not exist): what a reader on a read-only mount can do.
        A lock opened read-only is never taken (:meth:`acquire` raises)."""
        self.path = path
        self.read_only = read_only
        self.fd = -1
        with os_errors("open lock file", path):
            try:
                flags = os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT
                self.fd = os.open(path, flags | os.O_CLOEXEC, 0o666)
            except FileNotFoundError:
                if not read_only:
                    raise
        self._threads = threading.Lock()
        self.held = False

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock; with ``blocking=False`` return False at once if another holder has
        it, a thread of this process or another process."""
        if self.read_only:
            raise ConfigError(f"{self.path!r} was opened read-only: its lock is for writers, never taken by a reader")
        if not self._threads.acquire(blocking):
            return False
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._threads.release()
            return False
        except OSError as exc:
            self._threads.release()
            raise storage_error(exc, "lock", self.path) from exc
        except BaseException:  # e.g. KeyboardInterrupt while waiting for another process
            self._threads.release()
            raise
        self.held = True
        return True

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Hold the lock (blocking) for a ``with`` block."""
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def release(self) -> None:
        """Release the lock if it is held (by any thread of this process); else do nothing."""
        if self.held:
            self.held = False
            try:
                with os_errors("unlock", self.path):
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                self._threads.release()

    def close(self) -> None:
        self.release()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
