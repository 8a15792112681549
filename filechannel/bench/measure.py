"""Running one backend on one message size in a fresh process, capped in time.

A fresh process per run gives each backend a clean heap, so its peak RSS is its own, and
a backend that crashes or hangs costs one row, not the run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import shutil
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from multiprocessing import forkserver
from typing import Any

from filechannel.engine.files import folder_bytes

from .optional import NotInstalled
from .peers import BACKENDS

CHUNK = 1000
# Distinct random payload bytes cycled through by the throughput workloads: more than one
# compression block (and zstd's window), so "bytes on disk" is not flattered by repetition.
POOL_BYTES = 4 << 20


@dataclass
class Row:
    workload: str
    backend: str
    durability: str
    size: int
    n: int = 0
    msgs_per_s: float = 0.0
    mb_per_s: float = 0.0
    disk_per_payload: float | None = None
    peak_rss_mb: float | None = None
    ours: bool = False
    error: str | None = None  # why the row has no figures: it failed, or it was skipped
    skipped: bool = False  # the error is an optional part not installed (optional.NotInstalled)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _payload_chunks(size: int, n: int) -> list[list[bytes]]:
    """Lists of CHUNK payloads (fewer if n is smaller) cycling through ``POOL_BYTES`` of
    distinct random ones (at most n of them).

    Each payload is made on its own: one 4 MiB block cut into them, once freed, raised
    glibc's malloc thresholds for the rest of the process, so every row ran in a process
    that a user's need not be (README "Performance": a fresh process's batches of large
    values gave the heap back and faulted it in again)."""
    distinct = max(1, min(n, -(-POOL_BYTES // size)))
    pool = [os.urandom(size) for _ in range(distinct)]
    per = min(CHUNK, n)
    refs = [pool[i % distinct] for i in range(-(-distinct // per) * per)]
    return [refs[i : i + per] for i in range(0, len(refs), per)]


# A run shorter than this is repeated, best of REPEATS kept: on a shared machine two
# sub-second runs of the same code differ by tens of percent.
REPEAT_UNDER_S = 3.0
REPEATS = 3
# How long a timed row runs in --quick, the CI-sized run: long enough to show that the row works, not a figure.
QUICK_SECONDS = 0.1


@dataclass
class _Run:
    done: int
    produce_s: float
    disk: int
    seen: int
    consume_s: float
    consume_faults: int  # minor page faults of this process while it consumed


def _run_once(key: str, size: int, n: int, cap_s: float, chunks: list[list[bytes]]) -> _Run:
    """Produce up to n (or cap_s seconds) into a fresh backend, then consume what was produced."""
    backend = BACKENDS[key]()
    backend.size = size
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        backend.open(folder)
        try:
            done = turn = 0
            t0 = time.perf_counter()
            while done < n and time.perf_counter() - t0 < cap_s:
                part = chunks[turn % len(chunks)]
                turn += 1
                if n - done < len(part):
                    part = part[: n - done]
                backend.produce(part)
                done += len(part)
            backend.finish()
            produce_s = time.perf_counter() - t0
            disk = folder_bytes(folder)
            faults = _minor_faults()
            t1 = time.perf_counter()
            backend.deadline = t1 + cap_s
            seen = backend.consume(done)
            consume_s = time.perf_counter() - t1
            faults = _minor_faults() - faults
        finally:
            backend.close()
    read = seen // size  # every payload has the same size
    if seen % size or read > done or (read < done and consume_s < cap_s):
        raise RuntimeError(f"read back {seen} payload bytes, expected {done * size}")
    return _Run(done, produce_s, disk, seen, consume_s, faults)


def _minor_faults() -> int:
    """This process's minor page faults so far. A consume row's count tells glibc's heap
    being given back and faulted in again under each batch (README "Performance"), which can
    halve a row's rate in one process and not in the next, from a run's own figures."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _throughput(key: str, size: int, n: int, cap_s: float, best_of: int) -> list[dict[str, Any]]:
    """In the child: produce then consume, repeated if that took under ``REPEAT_UNDER_S``,
    up to ``best_of`` runs in all (best produce and best consume kept)."""
    chunks = _payload_chunks(size, n)
    runs = [_run_once(key, size, n, cap_s, chunks)]
    if runs[0].produce_s + runs[0].consume_s < REPEAT_UNDER_S:
        for _ in range(best_of - 1):
            os.sync()  # the last run's writeback is not this one's
            runs.append(_run_once(key, size, n, cap_s, chunks))
    p = max(runs, key=lambda r: r.done / r.produce_s)
    c = max(runs, key=lambda r: r.seen / r.consume_s)
    backend = BACKENDS[key]()
    rss = peak_rss_mb()
    extra = {"runs": len(runs)}
    return [
        Row(
            "produce",
            backend.name,
            backend.durability,
            size,
            ours=backend.ours,
            n=p.done,
            msgs_per_s=p.done / p.produce_s,
            mb_per_s=p.done * size / p.produce_s / 1e6,
            disk_per_payload=p.disk / (p.done * size),
            peak_rss_mb=rss,
            extra=dict(extra),
        ).to_json(),
        Row(
            "consume",
            backend.name,
            backend.durability,
            size,
            ours=backend.ours,
            n=c.seen // size,
            msgs_per_s=c.seen // size / c.consume_s,
            mb_per_s=c.seen / c.consume_s / 1e6,
            peak_rss_mb=rss,
            extra=dict(extra, faults_per_record=round(c.consume_faults / max(1, c.seen // size), 3)),
        ).to_json(),
    ]


def _child(conn: Any, scratch: str, fn: Any, args: tuple[Any, ...]) -> None:
    tempfile.tempdir = os.environ["TMPDIR"] = scratch  # (a fork server's child has its environment)
    try:
        conn.send(("ok", fn(*args)))
    except NotInstalled as exc:
        conn.send(("skipped", str(exc)))
    except BaseException as exc:  # reported as the backend's row, never dropped
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))
    finally:
        conn.close()


# How in_child starts its process: spawned (a new interpreter), or forked from a server that
# has imported the bench and nothing more (fork_from_server).
_context: Any = mp.get_context("spawn")


def fork_from_server() -> None:
    """Start in_child's processes from a fork server that imported the bench once (call it
    before the work folder is made): for
    ``--quick``, whose hundred-odd rows each spent more in a new interpreter's imports (0.4 s
    here) than in its run. A measured run keeps spawning, so each row's process is as a
    user's starts."""
    global _context
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["filechannel.bench.peers", "filechannel.bench.workloads", "filechannel.client"])
    forkserver.ensure_running()  # now, its socket in the system's temp folder, not the run's work folder
    _context = ctx


def in_child(fn: Any, *args: Any, timeout: float = 600) -> Any:
    """Run ``fn(*args)`` in a fresh process (see ``fork_from_server``); its result, or raise
    with its error (:class:`NotInstalled` if it found an optional part missing)."""
    os.sync()  # every backend starts on a disk with no writeback left over from the one before
    ctx = _context
    parent, child = ctx.Pipe(duplex=False)
    # The child makes its temp folders in one the parent removes, even if it has to kill it,
    # in the temp folder (the harness's work folder: the disk whose dd and fsync figures are reported).
    scratch = tempfile.mkdtemp(prefix="fc-bench-")
    proc = ctx.Process(target=_child, args=(child, scratch, fn, args))
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise TimeoutError(f"no result within {timeout:.0f} s")
        status, value = parent.recv()
    except EOFError:
        proc.join(5)
        raise RuntimeError(f"the benchmark process died (exit code {proc.exitcode})") from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        shutil.rmtree(scratch, ignore_errors=True)
    if status == "skipped":
        raise NotInstalled(value)
    if status == "error":
        raise RuntimeError(value)
    return value


def throughput(key: str, size: int, n: int, cap_s: float, best_of: int = REPEATS) -> list[Row]:
    """Produce then consume ``key``'s backend in a fresh process; its two rows (with the
    error as their note if it failed). ``best_of=1``: one run however short (``--quick``)."""
    try:
        return [Row(**r) for r in in_child(_throughput, key, size, n, cap_s, best_of, timeout=cap_s * 6 + 120)]
    except Exception as exc:
        backend = BACKENDS[key]()
        first_line = str(exc).splitlines()[0]
        skipped = isinstance(exc, NotInstalled)
        return [
            Row(w, backend.name, backend.durability, size, ours=backend.ours, error=first_line, skipped=skipped)
            for w in ("produce", "consume")
        ]
