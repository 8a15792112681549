"""``python -m bench [--quick] [--out DIR] [--only PATTERN] [--spark]``: run, print, write results."""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import sys
import tempfile
import time

from . import machine, report, transactions, workloads
from .measure import REPEATS, Row, throughput
from .peers import BACKENDS
from .workloads import SIZES


def _throughput_plan(quick: bool) -> list[tuple[str, int, int, float]]:
    """(backend key, size, N cap, time cap in s) of every produce/consume run."""
    scale = 10 if quick else 1
    caps = {100: 1_000_000, 1024: 300_000, 65536: 10_000}
    return [
        (key, size, caps[size] // scale, 0.2 if quick else 10.0)
        for size in SIZES
        for key, make in BACKENDS.items()
        if make().sizes is None or size in make().sizes
    ]


def _selected(name: str, patterns: str | None) -> bool:
    """Whether ``name`` matches one of the comma-separated ``patterns`` (a glob or a substring)."""
    return patterns is None or any(
        fnmatch.fnmatch(name, p) or p.lower() in name.lower() for p in (p.strip() for p in patterns.split(",")) if p
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; print the table and targets; write results.md, results.json, throughput.png."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="CI-sized run: a tenth of the records, 0.2 s caps, one run per row (about a minute)"
    )
    parser.add_argument(
        "--out",
        help="output folder (default: a new temp folder, named at the end; the run of record: --out bench/results)",
    )
    parser.add_argument(
        "--only", metavar="PATTERNS", help="run only workloads/backends whose name matches one of these (comma-separated)"
    )
    parser.add_argument("--spark", action="store_true", help="also run bench/spark_source.py if importable")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    info = machine.describe()
    info["dd"] = machine.dd_bandwidth(64 if args.quick else 256)
    info["fsync"] = machine.fsync_latency(200)
    rows: list[Row] = []
    for key, size, n, cap in _throughput_plan(args.quick):
        if _selected(f"produce consume {key} {BACKENDS[key]().name}", args.only):
            rows += throughput(key, size, n, cap, best_of=1 if args.quick else REPEATS)
    for name, fn, fargs in [*workloads.special(args.quick), *transactions.workloads(args.quick, references=False)]:
        if _selected(name, args.only):
            rows += workloads.run(name, fn, *fargs)
    if args.spark:
        try:
            spark = importlib.import_module("bench.spark_source")
        except ImportError as exc:
            print(f"spark workload skipped: {exc}", file=sys.stderr)
        else:
            rows += spark.run(args.quick)
    report.add_ratios(rows)
    goals = report.targets(rows, info)
    info["wall_s"] = time.perf_counter() - t0
    out = args.out or tempfile.mkdtemp(prefix="fc-bench-results-")  # never the committed bench/results by surprise
    print(report.write(out, rows, info, goals))
    print(f"results written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
