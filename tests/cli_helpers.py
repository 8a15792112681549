"""The ``filechannel`` command in the tests: run in the test's own process by default, through the
console script's entry point; in a real subprocess where the test is about processes.

``invoke`` calls :func:`filechannel.cli.main` with the arguments, the environment and the stdin a
user's shell would give the command, stdout and stderr captured, and returns what ``subprocess.run``
would: the exit code (``sys.exit``'s), the two outputs, and for an exception the command let out,
its traceback on stderr and exit 1, as the interpreter would print it. Starting an interpreter and
importing the CLI cost a third of a CPU-second per command, about 200 CPU-seconds of the suite's
runs of the command that involve no other process (2026-11-29). The console script itself, its
installation and everything about processes (signals, ``--follow``, a killed command, two
processes at once, a terminal) is run as a subprocess of ``SCRIPT``, as before.

The command must leave nothing behind in the process, which a subprocess would have hidden: a
thread it started and did not stop fails the test.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filechannel.cli import main

SCRIPT = Path(sys.executable).parent / "filechannel"


def invoke(
    *args: str, env: Mapping[str, str] | None = None, input: bytes | str | None = None, text: bool = False
) -> subprocess.CompletedProcess[Any]:
    """``filechannel ARGS`` in this process; ``env`` (default: this process's) is its whole
    environment, ``input`` its stdin (default: empty)."""
    argv = [str(a) for a in args]
    data = input.encode() if isinstance(input, str) else (input or b"")
    stdout, stderr = io.BytesIO(), io.BytesIO()
    streams = (sys.stdin, sys.stdout, sys.stderr)
    saved_env = dict(os.environ)
    threads = set(threading.enumerate())
    sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(stdout, encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(stderr, encoding="utf-8", errors="backslashreplace", write_through=True)
    # Our loggers have no handler: in its own process, the command's warnings reach stderr through
    # logging's last resort, which pytest's own handlers would stand in the way of here.
    last_resort = logging.StreamHandler()  # (to sys.stderr as it now is)
    last_resort.setLevel(logging.WARNING)
    logging.getLogger().addHandler(last_resort)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        main(argv)
        code = 0
    except SystemExit as exc:  # what the interpreter makes of it at exit
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # the interpreter prints the traceback and exits 1
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        out, err = stdout.getvalue(), stderr.getvalue()  # (before the wrappers go, closing what they wrap)
        sys.stdin, sys.stdout, sys.stderr = streams
        logging.getLogger().removeHandler(last_resort)
        os.environ.clear()
        os.environ.update(saved_env)
    left = [t for t in threading.enumerate() if t not in threads]
    for thread in left:
        thread.join(timeout=5)
    assert not [t for t in left if t.is_alive()], f"filechannel {' '.join(argv)} left threads running: {left}"
    if text:
        return subprocess.CompletedProcess(argv, code, out.decode(), err.decode())
    return subprocess.CompletedProcess(argv, code, out, err)


def fc(root: Path | str, *args: str, input: bytes | str | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """``filechannel ARGS`` with ``FILECHANNEL_ROOT=root``; raises with its stderr if ``check`` and it failed."""
    return _checked(invoke(*args, env={**os.environ, "FILECHANNEL_ROOT": str(root)}, input=input), check)


def fc_process(root: Path | str, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """``filechannel ARGS`` with ``FILECHANNEL_ROOT=root`` in a process of its own, the installed console script."""
    env = {**os.environ, "FILECHANNEL_ROOT": str(root)}
    return subprocess.run([str(SCRIPT), *args], input=input, capture_output=True, env=env, timeout=120)


def fc_text(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``filechannel ARGS`` (text output); raises with its stderr if ``check`` and it failed."""
    return _checked(invoke(*args, input=input, text=True), check)


def _checked(proc: subprocess.CompletedProcess[Any], check: bool) -> subprocess.CompletedProcess[Any]:
    """``proc``, or an AssertionError with its exit code and stderr if ``check`` and it failed."""
    if check and proc.returncode != 0:
        err = proc.stderr.decode() if isinstance(proc.stderr, bytes) else proc.stderr
        raise AssertionError(f"filechannel {' '.join(proc.args)} failed ({proc.returncode}): {err}")
    return proc
