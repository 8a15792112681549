"""The machine under test: what it is, what its disk can do (dd, fsync latency), how busy its CPUs have been."""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from typing import Any

PACKAGES = ("filechannel", "crc32c", "zstandard", "persist-queue", "diskcache", "queuelib", "litequeue", "pyspark", "pyarrow")


def describe(command: str) -> dict[str, Any]:
    """The machine, the versions of what is measured, and ``command``, the command line of the run."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": sys.version.split()[0],
        "versions": versions,
        "command": command,
    }


def dd_bandwidth(mib: int) -> dict[str, Any]:
    """Sequential write bandwidth of the disk under test (dd, fdatasync at the end)."""
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        out = subprocess.run(
            ["dd", "if=/dev/zero", f"of={os.path.join(folder, 'dd')}", "bs=1M", f"count={mib}", "conv=fdatasync"],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", out)
    if not m:
        return {"error": out.strip().splitlines()[-1] if out.strip() else "no output"}
    return {"mib": mib, "mb_per_s": int(m.group(1)) / float(m.group(2)) / 1e6, "dd": out.strip().splitlines()[-1]}


def fsync_latency(count: int) -> dict[str, Any]:
    """Median latency of a 4 KiB append + fsync: the cost of one durable message."""
    lat = []
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        fd = os.open(os.path.join(folder, "f"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            block = b"x" * 4096
            for _ in range(count):
                t = time.perf_counter()
                os.write(fd, block)
                os.fsync(fd)
                lat.append(time.perf_counter() - t)
        finally:
            os.close(fd)
    median = statistics.median(lat)
    return {
        "count": count,
        "median_us": median * 1e6,
        "p99_us": sorted(lat)[int(0.99 * len(lat))] * 1e6,
        "one_fsync_per_message_msgs_per_s": 1 / median,
    }


def busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux's /proc/stat), None elsewhere:
    a Spark query's CPU is spread over its JVM and Python workers, which no one process's figures hold."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
