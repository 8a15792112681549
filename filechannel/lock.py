"""Advisory file locks (``flock``) shared by the processes that open one channel.

``writer.lock`` serializes appends, rolls and tail recovery across processes: a writer
holds it from the moment it assigns offsets to buffered records until they are written.
The file also holds the writer state (see :mod:`filechannel.writer_state`), so the next
holder learns where the log ends without scanning. ``maintenance.lock`` lets exactly one
process at a time compress and collect segments. The kernel releases both when a
process dies, however it dies.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import os_errors, storage_error


class FileLock:
    """An exclusive ``flock`` on one file, held by this open file description. Not reentrant."""

    def __init__(self, path: str) -> None:
        self.path = path
        with os_errors("open lock file", path):
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        self.held = False

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock; with ``blocking=False`` return False at once if another holder has it."""
        flags = fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB
        try:
            fcntl.flock(self.fd, flags)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise storage_error(exc, "lock", self.path) from exc
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
        if self.held:
            self.held = False
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.release()
        os.close(self.fd)
