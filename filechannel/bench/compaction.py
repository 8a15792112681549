"""The log cleaner of a compacted channel (issue 39): MB/s of sealed segments cleaned, and its memory.

    python -m filechannel.bench.compaction [--quick]

Rows (each in a fresh process when run by the harness, ``filechannel bench --only compaction``):

- ``cleaner, P% superseded``: a compacted channel's sealed raw segments (100 B or 1 KiB
  records, keys such that P% = 10% or 90% of the records have a later record of their key,
  spread through the log)
  cleaned by ``FileChannel.compact()`` passes until none is left to do (one, unless the keys
  do not fit the default 128 MiB map): the cleaned segments written as zstd ``.seg.z``
  (level 3, the default) and fsynced. MB/s counts the raw bytes of the segments each pass
  rewrote; ``peak_rss_mb`` is the process's peak (filling the channel included),
  ``extra["python_peak_mb"]`` the peak of Python allocations during the same passes over
  the same data again (``tracemalloc``, which slows it: not timed), ``extra["keys"]`` the
  number of keys;
- ``raw read+write of the same bytes``: the same sealed segments read and written to
  another file with one fsync each (what any rewrite costs at least), for the ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
import tracemalloc
from typing import Any

from .measure import Row, in_child, peak_rss_mb

SIZES = (100, 1024)
SUPERSEDED = (0.1, 0.9)
DURABILITY = "fsync per segment"
SEGMENT_BYTES = 8 * 1024 * 1024  # (a quarter of the records when that is less: a smaller run still seals segments)


def _filled(folder: str, size: int, superseded: float, total_bytes: int) -> tuple[Any, int, int]:
    """A compacted channel in ``folder`` holding ``total_bytes`` of records of ``size`` bytes,
    ``superseded`` of them with a later record of their key, all but the last segment sealed;
    returns the open channel, the records and the raw bytes of the sealed segments."""
    from filechannel import FileChannel
    from filechannel.engine.segment import SEGMENT_HEADER_SIZE

    n = max(1, total_bytes // size)
    keys = max(1, round(n * (1 - superseded)))
    # every key once, plus n - keys more of them, shuffled: the superseded records are spread
    # through the log, so a pass over the sealed segments finds its share of them there too
    rng = random.Random(39)
    order = list(range(keys)) + [rng.randrange(keys) for _ in range(n - keys)]
    rng.shuffle(order)
    ch = FileChannel(
        os.path.join(folder, "c"),
        cleanup_policy="compact",
        segment_bytes=min(SEGMENT_BYTES, max(64 * 1024, total_bytes // 4)),
        maintenance_interval=0,
        fsync="never",
    )
    value = os.urandom(max(1, size - 12))
    with ch.sender() as s:
        for k in order:
            s.send(value, key=b"%011d" % k)
    sealed = ch._log.local_segments()[:-1]
    return ch, n, sum(os.path.getsize(r.path) - SEGMENT_HEADER_SIZE for r in sealed)


def _clean(size: int, superseded: float, total_bytes: int) -> list[dict[str, Any]]:
    from filechannel.engine import cleaner

    pct = round(superseded * 100)
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        ch, n, raw = _filled(folder, size, superseded, total_bytes)
        with ch:
            cleaned = []
            t0 = time.perf_counter()
            while done := cleaner.clean(ch._log, force=True):  # several passes when the keys do not fit one map
                cleaned += done
            secs = time.perf_counter() - t0
            rss = peak_rss_mb()
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        ch, _n, _raw = _filled(folder, size, superseded, total_bytes)
        with ch:
            tracemalloc.start()
            while cleaner.clean(ch._log, force=True):
                pass
            _now, python_peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
    records = sum(c.records_before for c in cleaned)
    cleaned_bytes = sum(c.bytes_before for c in cleaned)
    return [
        Row(
            f"cleaner, {pct}% superseded",
            "filechannel cleaner (zstd .seg.z)",
            DURABILITY,
            size,
            records,
            records / secs,
            cleaned_bytes / secs / 1e6,
            peak_rss_mb=rss,
            ours=True,
            extra={
                "python_peak_mb": python_peak / 1e6,
                "keys": max(1, round(n * (1 - superseded))),
                "bytes_after": sum(c.bytes_after for c in cleaned),
                "sealed_bytes": raw,
                "passes_bytes": cleaned_bytes,
            },
        ).to_json()
    ]


def _copy(size: int, total_bytes: int) -> list[dict[str, Any]]:
    """The same sealed segments read whole and written to another file, one fsync each."""
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        ch, _n, raw = _filled(folder, size, 0.5, total_bytes)
        with ch:
            paths = [r.path for r in ch._log.local_segments()[:-1]]
            records = 0
            t0 = time.perf_counter()
            for path in paths:
                with open(path, "rb") as f:
                    data = f.read()
                with open(path + ".copy", "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                records += len(data) // (size + 20)  # a frame: 8 + a payload of size + 12 (see _filled)
            secs = time.perf_counter() - t0
    return [
        Row(
            "raw read+write of the same bytes",
            "read + write + fsync",
            DURABILITY,
            size,
            records,
            records / secs,
            raw / secs / 1e6,
            peak_rss_mb=peak_rss_mb(),
        ).to_json()
    ]


def workloads(quick: bool) -> list[tuple[str, Any, tuple[Any, ...]]]:
    """(name, function, args) of the rows above: 512 KiB of records per row quick (four segments), 256 MiB otherwise."""
    total = (512 << 10) if quick else (256 << 20)
    out: list[tuple[str, Any, tuple[Any, ...]]] = []
    for size in SIZES:
        out += [("compaction cleaner", _clean, (size, s, total)) for s in SUPERSEDED]
        out.append(("compaction raw read+write", _copy, (size, total)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m filechannel.bench.compaction", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="512 KiB of records per row instead of 256 MiB")
    args = parser.parse_args()
    print(
        "| workload | backend | size | records | records/s | MB/s | peak RSS MB | Python peak MB |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    for _, fn, fargs in workloads(args.quick):
        for r in in_child(fn, *fargs):
            py = r["extra"].get("python_peak_mb")
            print(
                f"| {r['workload']} | {r['backend']} | {r['size']} | {r['n']:,} | {r['msgs_per_s']:,.0f} | "
                f"{r['mb_per_s']:.1f} | {r['peak_rss_mb']:.0f} | {'' if py is None else f'{py:.0f}'} |"
            )


if __name__ == "__main__":
    main()
