"""The harness runs end to end in --quick mode and writes its table, JSON and chart.

A smoke test: it asserts the outputs exist and are well formed, never a time or a ratio.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peers import BACKENDS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
@pytest.mark.slow
def test_quick_run_writes_table_json_and_chart(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "results.md").read_text()
    assert "| workload | backend | durability | size | N | msgs/s |" in md
    for key, make in BACKENDS.items():
        assert f"| {make().name} |" in md or f"| **{make().name}** |" in md, key
    data = json.loads((tmp_path / "results.json").read_text())
    assert {"cpus", "python", "versions", "command"} <= set(data["machine"])
    assert data["targets"] and all({"target", "goal", "measured", "met"} <= set(t) for t in data["targets"])
    assert {r["workload"] for r in data["rows"]} >= {"produce", "consume"}
    sizes: dict[str, set[int]] = {}
    for r in data["rows"]:
        sizes.setdefault(r["workload"].split(",")[0], set()).add(r["size"])
    for workload in (
        "produce",
        "consume",
        "produce+consume at once",
        "latency",
        "durable produce",
        "2 producer processes",
        "consumer group",
        "read back sealed segments (zstd)",
        "read back sealed segments (uncompressed)",
    ):
        assert sizes[workload] >= {100, 1024, 65536}, workload
    # the compressed reads come with the most this machine's CPUs allow them (bench/cpu_bound.py)
    zstd = [r for r in data["rows"] if r["workload"] == "read back sealed segments (zstd)"]
    assert all(r["extra"]["cpu_bound_ratio"] > 0 for r in zstd)
    assert (tmp_path / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
