"""Failpoints: named places where a test can make this process die on purpose.

Crash tests of code that runs inside processes a test does not start itself (Spark's
Python workers) cannot send SIGKILL at the right moment. With ``FILECHANNEL_FAILPOINTS``
set to a folder, :func:`hit` kills the process (``os._exit``, like a crash: no cleanup, no
flush) the first time the file ``<folder>/<name>`` exists, deleting it first so a retry
goes on; a file holding ``stop`` makes the process stop itself instead (SIGSTOP: a pause
at that exact point, which the test ends with SIGCONT). ``before``, if given, runs just before
the process dies there (e.g. a flush, so that the crash leaves what was buffered half-written).
Unset (always, outside tests), a failpoint costs one environment lookup.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

ENV = "FILECHANNEL_FAILPOINTS"
EXIT_CODE = 86


def hit(name: str, before: Callable[[], object] | None = None) -> None:
    folder = os.environ.get(ENV)
    if not folder:
        return
    path = os.path.join(folder, name)
    try:
        with open(path, "rb") as f:
            action = f.read().strip()
        os.unlink(path)
    except FileNotFoundError:
        return
    if action == b"stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    if before is not None:
        before()
    os._exit(EXIT_CODE)
