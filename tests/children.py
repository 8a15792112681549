"""Python children of the crash and storm tests, forked from a server that imported the package once.

A child is a real process: it runs its script as ``__main__`` with its own arguments, environment
and working folder, writes to real pipes, and dies of a real SIGKILL. Only its start differs from
``subprocess.Popen([sys.executable, script, ...])``: instead of a new interpreter importing the
package (0.15-0.3 CPU-seconds a child; the SIGKILL and storm tests start some 230 children a run),
it is forked from multiprocessing's fork server, which a test worker starts once, which imports
the package's modules (``PRELOAD``) and nothing else and holds no file of any test open.

Invariants:

- The child's standard streams are the ones its ``start`` names (a pipe read by the test, or
  ``/dev/null``), never the fork server's (a test's captured output of long ago).
- Signals go through a pidfd taken at start: a child that has died and whose pid was reused
  (pids here wrap at 32,768) is never mistaken for another process.
- Children are daemonic: a test worker that exits ends those it left running.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from multiprocessing import reduction
from pathlib import Path
from typing import IO, Any

PRELOAD = [
    "filechannel",
    "filechannel.client",
    "filechannel.tiering",
    "filechannel.tiering.daemon",
    "filechannel.tiering.defrag",
    "filechannel.tiering.metadata",
    "tests.children",
]
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)


class _Fd:
    """A descriptor of the test's, duplicated into the child (as multiprocessing's connections are)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup: Any) -> int:
    return int(dup.detach())


def _run(script: str, args: list[str], env: dict[str, str], cwd: str, streams: tuple[int, int]) -> None:
    """In the child: its streams, environment and folder, then the script as ``__main__``."""
    for target, fd in zip((1, 2), streams, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own, for its life)
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), write_through=False)  # noqa: SIM115
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), write_through=True)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))  # as `python script` has it
    runpy.run_path(script, run_name="__main__")


class Child:
    """A started child, with the part of :class:`subprocess.Popen` the tests use."""

    def __init__(self, process: Any, stdout: IO[Any] | None, stderr: IO[Any] | None) -> None:
        self._process = process
        self.pid: int = process.pid
        self._pidfd = os.pidfd_open(self.pid)
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
            if self.returncode is not None:
                os.close(self._pidfd)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(f"child {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:  # it died meanwhile
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None, *, stdout: bool = True) -> tuple[Any, Any]:
        """What is left on the child's pipes, once it ended (``TimeoutExpired`` if not by ``timeout``);
        ``stdout=False`` where a thread of the test reads its stdout (its part is then None)."""
        out: dict[str, Any] = {}
        pipes = (("stdout", self.stdout if stdout else None), ("stderr", self.stderr))
        readers = [
            threading.Thread(target=lambda n=name, f=f: out.__setitem__(n, f.read()), daemon=True)
            for name, f in pipes
            if f is not None
        ]
        for r in readers:
            r.start()
        self.wait(timeout)
        for r in readers:
            r.join(timeout)
        return out.get("stdout"), out.get("stderr")


def start(
    script: str | Path,
    *args: str,
    stdout: bool = True,
    stderr: bool = False,
    text: bool = True,
    env: Mapping[str, str] | None = None,
) -> Child:
    """``python script *args``, forked from the fork server: ``stdout``/``stderr`` True for a pipe
    the test reads (text or bytes, as ``text``), False for ``/dev/null``; ``env`` the whole
    environment (the test's by default)."""
    mode = "r" if text else "rb"
    ends: list[tuple[int, int] | None] = [os.pipe() if want else None for want in (stdout, stderr)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        streams = tuple(_Fd(end[1] if end else devnull) for end in ends)
        process = _CONTEXT.Process(
            target=_run,
            args=(str(script), list(args), dict(os.environ if env is None else env), os.getcwd(), streams),
            daemon=True,
        )
        process.start()
    except BaseException:
        for end in ends:
            if end:
                os.close(end[0])
        raise
    finally:
        os.close(devnull)
        for end in ends:
            if end:
                os.close(end[1])  # the child's end: the child has its own copy
    readers = [open(end[0], mode) if end else None for end in ends]  # noqa: SIM115 (the Child's)
    return Child(process, readers[0], readers[1])
