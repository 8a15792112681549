"""The harness: ``filechannel bench`` (or ``python -m filechannel.bench``) runs, prints and writes the results.

Where a run puts things:

- the results (``results.md``, ``results.json``, ``throughput.png``) in ``--out``, by default a
  new temp folder named on stderr at the end: a run never overwrites the committed
  ``bench/results`` of a checkout unless told to (``--out bench/results``);
- every work file (each backend's folder, the servers' data, ``dd``'s file) in one temp folder
  made under ``--work`` (default: the system's temp folder), the disk whose ``dd`` and fsync
  figures are reported; it is removed at the end, however the run ends (Ctrl-C included;
  only a SIGKILL of the bench process leaves it behind).

Only the ``bench`` command of the CLI imports this module, when it runs; nothing else in the
package imports the bench.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator

import click

from . import compaction, machine, measure, report, spark_source, transactions, workloads
from .measure import QUICK_SECONDS, REPEATS, Row, throughput
from .peers import BACKENDS
from .workloads import SIZES


def _throughput_plan(quick: bool) -> list[tuple[str, int, int, float]]:
    """(backend key, size, N cap, time cap in s) of every produce/consume run."""
    scale = 10 if quick else 1
    caps = {100: 1_000_000, 1024: 300_000, 65536: 10_000}
    plan = []
    for size in SIZES:
        for key, make in BACKENDS.items():
            sizes = make().sizes
            if sizes is None or size in sizes:
                plan.append((key, size, caps[size] // scale, QUICK_SECONDS if quick else 10.0))
    return plan


def _selected(name: str, patterns: str | None) -> bool:
    """Whether ``name`` matches one of the comma-separated ``patterns`` (a glob or a substring)."""
    return patterns is None or any(
        fnmatch.fnmatch(name, p) or p.lower() in name.lower() for p in (p.strip() for p in patterns.split(",")) if p
    )


@contextlib.contextmanager
def work_folder(parent: str | None) -> Iterator[str]:
    """A new folder under ``parent`` (the system's temp folder if None) that is every temp folder
    of the run, in this process (``tempfile.tempdir``) and in the ones it starts (``TMPDIR``);
    both restored and the folder removed on the way out, however the run ends (but SIGKILL)."""
    folder = tempfile.mkdtemp(prefix="fc-bench-work-", dir=parent)
    saved_tempdir, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = os.environ["TMPDIR"] = folder
    try:
        yield folder
    finally:
        tempfile.tempdir = saved_tempdir
        if saved_env is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(folder, ignore_errors=True)


def run(*, quick: bool, out: str | None, work: str | None, only: str | None, spark: bool, command_line: str) -> str:
    """Run the benchmarks; print the table and targets; write results.md, results.json and
    throughput.png in ``out`` (a new temp folder if None), whose path is returned."""
    t0 = time.perf_counter()
    if quick:
        measure.fork_from_server()
    info = machine.describe(command_line)
    rows: list[Row] = []
    with work_folder(work) as folder:
        info["work_folder"] = os.path.dirname(folder)
        info["dd"] = machine.dd_bandwidth(64 if quick else 256)
        info["fsync"] = machine.fsync_latency(200)
        for key, size, n, cap in _throughput_plan(quick):
            if _selected(f"produce consume {key} {BACKENDS[key]().name}", only):
                rows += throughput(key, size, n, cap, best_of=1 if quick else REPEATS)
        specials = [*workloads.special(quick), *transactions.workloads(quick, references=False), *compaction.workloads(quick)]
        for name, fn, fargs in specials:
            if _selected(name, only):
                rows += workloads.run(name, fn, *fargs)
        if spark:
            rows += spark_source.run(quick)
    report.add_ratios(rows)
    goals = report.targets(rows, info)
    info["wall_s"] = time.perf_counter() - t0
    out = out or tempfile.mkdtemp(prefix="fc-bench-results-")  # never the committed bench/results by surprise
    print(report.write(out, rows, info, goals))
    return out


def _command_line(ctx: click.Context) -> str:
    """The command as typed, rebuilt from its options (results.md names it)."""
    words = ctx.command_path.split()
    for param in ctx.command.params:
        value = ctx.params[param.name or ""]
        if isinstance(param, click.Option) and value not in (None, False):
            words += [param.opts[0]] if value is True else [param.opts[0], str(value)]
    return shlex.join(words)


@click.command(name="bench")
@click.option(
    "--quick", is_flag=True, help="A CI-sized run: a tenth of the records, 0.1 s caps, one run per row (about a minute)."
)
@click.option(
    "--out",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Write results.md, results.json and throughput.png there (default: a new temp folder, named at the end; "
    "the run of record: --out bench/results).",
)
@click.option(
    "--work",
    metavar="DIR",
    type=click.Path(exists=True, file_okay=False),
    help="Make the run's work folder there: the disk measured (default: the system's temp folder). "
    "Removed at the end, also after Ctrl-C.",
)
@click.option(
    "--only", metavar="PATTERNS", help="Run only the workloads and backends whose name matches one of these (comma-separated)."
)
@click.option("--spark", is_flag=True, help="Also run the Spark rows (they need pyspark).")
@click.pass_context
def command(ctx: click.Context, quick: bool, out: str | None, work: str | None, only: str | None, spark: bool) -> None:
    """Measure filechannel's APIs against peer disk queues, Redis Streams, NATS JetStream and the
    Python floor, in one run on this machine.

    A peer that is not installed is a skipped row saying how to install it.
    """
    done = run(quick=quick, out=out, work=work, only=only, spark=spark, command_line=_command_line(ctx))
    print(f"results written to {done}", file=sys.stderr)
