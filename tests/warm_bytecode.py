"""The bytecode of the suite and the package, compiled once before pytest-xdist's workers start.

Each worker imports every test module to collect it, and pytest rewrites a test module's asserts
(then caches the result in ``__pycache__``) when it finds no cached copy. In a fresh checkout the
four workers found none at the same moment and each rewrote all of them: the same 6.5 CPU-seconds
four times over, ``pytest -n 4 -k test_grouping`` (everything collected, one test run) 23.0 s
instead of 12.0 s with the cache warm. The package's modules, compiled by every worker and by the
first of the suite's subprocesses, likewise.

Invariants:

- Only the controller of an xdist run warms (``pytest_sessionstart`` runs before xdist's, which
  starts the workers), in two forked processes splitting the files, and only files whose cached
  copy is missing or stale: a warm checkout pays a stat and a read of each cached file. The
  tests' helper modules are left to Python (few, small).
- What it writes is what pytest and Python would write themselves (pytest's own rewrite and
  atomic write; ``compileall``), so a worker cannot tell a warmed cache from its own.
- It never fails the run: a module that does not compile, a read-only checkout, or a pytest whose
  private rewrite functions moved (pinned in constraints.txt; tests/test_warm_bytecode.py notices)
  leaves the workers to compile as before.
"""

from __future__ import annotations

import compileall
import contextlib
import multiprocessing
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]


def _rewrite(config: pytest.Config, files: list[Path]) -> None:
    """Rewrite and cache ``files`` the way pytest's import hook does (``AssertionRewritingHook.exec_module``)."""
    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _read_pyc,
            _rewrite_test,
            _write_pyc,
            assertstate_key,
            get_cache_dir,
            try_makedirs,
        )
    except ImportError:
        return
    state = config.stash[assertstate_key]
    for fn in files:
        cache_dir = get_cache_dir(fn)
        pyc = cache_dir / (fn.name[:-3] + PYC_TAIL)
        if try_makedirs(cache_dir) and _read_pyc(fn, pyc, state.trace) is None:
            try:
                source_stat, code = _rewrite_test(fn, config)
            except (SyntaxError, ValueError):
                continue  # the worker that imports it reports it
            _write_pyc(state, code, source_stat, pyc)


def _warm(config: pytest.Config, share: int, shares: int) -> None:
    """The ``share``-th of ``shares`` parts: every ``shares``-th test module, and the package in the first."""
    tests = sorted(_ROOT.glob("tests/**/test_*.py")) + sorted(_ROOT.glob("tests/**/conftest.py"))
    _rewrite(config, tests[share::shares])
    if share == 0:
        compileall.compile_dir(_ROOT / "filechannel", quiet=2)


@contextlib.contextmanager
def warming(config: pytest.Config) -> Iterator[None]:
    """Compile what the workers would, in two processes (the rewrites are most of it), while the
    block runs; done on exit."""
    procs = []
    if not sys.dont_write_bytecode:
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=_warm, args=(config, share, 2)) for share in range(2)]
        for p in procs:
            p.start()
    try:
        yield
    finally:
        for p in procs:
            p.join()
