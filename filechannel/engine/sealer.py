"""The sealer: fsyncs rolled segments in the background, off the append path.

Rolling used to fsync the sealed 64 MiB segment before the next record could be
appended, which made produce disk-bound for large records. Now a roll only asks this
thread to fsync every sealed segment below the new active one and then move the
recovery point (:func:`.roll.sync_sealed`; see :mod:`filechannel.engine.recovery_point`). Requests made while it works are
merged into its next pass. An fsync error is kept: the appender then refuses further
sends, as after a failed write, because the kernel may have dropped the pages it could
not write.
"""

from __future__ import annotations

import logging
import threading

from .log import Log
from .roll import sync_sealed

log = logging.getLogger("filechannel")


class Sealer:
    """One background thread per appender, started by the first roll."""

    def __init__(self, log_: Log) -> None:
        self._log = log_
        self._cond = threading.Condition()
        self._target = 0  # make the sealed segments below this offset durable
        self._done = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def seal(self, upto: int) -> None:
        """Ask for the sealed segments below ``upto`` to be fsynced; returns at once."""
        with self._cond:
            self._target = max(self._target, upto)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="filechannel-sealer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._target <= self._done and not self._closed:
                    self._cond.wait()
                if self._target <= self._done:
                    return
                target = self._target
            try:
                sync_sealed(self._log, target)
            except Exception as exc:
                log.error("channel %s: fsync of sealed segments below offset %d failed: %s", self._log.path, target, exc)
                self.error = exc
            with self._cond:
                self._done = target
                self._cond.notify_all()

    def wait(self, upto: int) -> None:
        """Return once the sealed segments below ``upto`` that a roll asked for are fsynced (at once
        if none is pending); raise the error of a failed fsync. A sync drain calls it: records
        written, then sealed by a roll before any fsync covered them, are on disk only then."""
        with self._cond:
            while self._done < min(upto, self._target) and self.error is None:
                thread = self._thread
                if thread is None or not thread.is_alive():
                    break  # (closed, or died: nothing more will be done; the error says why if it failed)
                self._cond.wait(timeout=1.0)
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Finish the fsyncs asked for so far, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
