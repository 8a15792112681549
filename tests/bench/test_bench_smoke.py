"""The harness runs end to end in --quick mode and writes its table, JSON and chart.

A smoke test: it asserts the outputs exist and are well formed, never a time or a ratio.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from filechannel.bench.freshness import TIER_AFTER_MS
from filechannel.bench.peers import BACKENDS
from filechannel.bench.seaweed import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.s3
def test_quick_run_writes_table_json_and_chart(tmp_path):
    """Every workload, the tiering and freshness ones on their own SeaweedFS servers included; every server and
    the run's work folder gone afterwards, nothing written in the working directory."""
    temp, cwd, out = tmp_path / "temp", tmp_path / "cwd", tmp_path / "out"
    temp.mkdir()
    cwd.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "filechannel.bench", "--quick", "--out", str(out)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(temp)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.listdir(temp) == [] and os.listdir(cwd) == []
    md = (out / "results.md").read_text()
    assert "| workload | backend | durability | size | N | msgs/s |" in md
    for key, make in BACKENDS.items():
        assert f"| {make().name} |" in md or f"| **{make().name}** |" in md, key
    data = json.loads((out / "results.json").read_text())
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
    # the compressed reads come with the most this machine's CPUs allow them (filechannel/bench/cpu_bound.py)
    zstd = [r for r in data["rows"] if r["workload"] == "read back sealed segments (zstd)"]
    assert all(r["extra"]["cpu_bound_ratio"] > 0 for r in zstd)
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    check_tier_rows(data)
    # the freshness row (filechannel/bench/freshness.py): every record sent seen in tier-2, with its percentiles
    [fresh] = [r for r in data["rows"] if r["workload"].endswith(f"tier_after_ms={TIER_AFTER_MS}")]
    assert fresh["error"] is None and fresh["n"] > 10, fresh
    assert 0 < fresh["extra"]["p50_ms"] <= fresh["extra"]["p99_ms"] <= fresh["extra"]["max_ms"], fresh


TIER_ROWS = {
    ("tier upload", "filechannel TieringDaemon.run_once"),
    ("tier upload", "boto3 put_object (raw)"),
    ("tier read, local copies deleted", "filechannel Receiver from tier-2"),
    ("tier read, local copies deleted", "boto3 ranged get_object (raw, no decoding)"),
    ("tier read, same segments local", "filechannel Receiver (local .seg.z)"),
    ("tier read RSS", "filechannel Receiver from tier-2"),
    ("tier read, bucket only (no root)", "filechannel Consumer(tier=URL), no root"),
    ("tier read, bucket only (no root)", "boto3 ranged get_object (raw, no decoding)"),
}


def check_tier_rows(data: dict) -> None:
    """The tiering rows (filechannel/bench/tiering.py) are there, without error, each saying its sizes and concurrency,
    and their three targets are measured (met or not: no time or ratio is asserted)."""
    rows = {(r["workload"], r["backend"]): r for r in data["rows"] if r["workload"].startswith("tier")}
    assert set(rows) == TIER_ROWS, [r.get("error") for r in data["rows"] if r["workload"].startswith("tier")]
    for r in rows.values():
        assert r["error"] is None and r["n"] > 0 and r["mb_per_s"] > 0, r
        assert {"segments", "segment_mb", "seg_z_mb", "chunk_mb", "block_kb", "server", "cpus"} <= set(r["extra"]), r
        assert r["extra"]["segments"] >= 2, r
    for key in TIER_ROWS - {("tier read, same segments local", "filechannel Receiver (local .seg.z)")}:
        assert "in_flight" in rows[key]["extra"], key
    rss = rows[("tier read RSS", "filechannel Receiver from tier-2")]
    assert rss["peak_rss_mb"] > 0 and rss["extra"]["seg_z_mb"] > 2 * rss["extra"]["cache_mb"], rss
    tier_targets = [t for t in data["targets"] if t["target"].startswith("tier")]
    assert len(tier_targets) == 3 and all(t["measured"] is not None and t["met"] is not None for t in tier_targets)


@pytest.mark.bench
def test_without_out_a_run_writes_to_a_new_temp_folder_and_names_it(tmp_path):
    """A run in a checkout never overwrites the committed bench/results unless told to (--out),
    and its work folder (under --work) is gone at the end."""
    checkout, work = tmp_path / "checkout", tmp_path / "work"
    (checkout / "bench" / "results").mkdir(parents=True)
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    only = ["--only", "python floor (frames in one file)"]
    proc = subprocess.run(
        [sys.executable, "-m", "filechannel.bench", "--quick", "--work", str(work), *only],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((checkout / "bench" / "results").iterdir()) == []  # the checkout's results untouched
    assert list(work.iterdir()) == []
    out = Path(proc.stderr.strip().splitlines()[-1].removeprefix("results written to "))
    assert out.parent == tmp_path and out.name.startswith("fc-bench-results-")
    data = json.loads((out / "results.json").read_text())
    assert {r["backend"] for r in data["rows"]} == {"python floor (frames in one file)"}
    assert (
        data["machine"]["command"]
        == f"python -m filechannel.bench --quick --work {work} --only 'python floor (frames in one file)'"
    )
    assert data["machine"]["work_folder"] == str(work)


@pytest.mark.bench
def test_ctrl_c_ends_a_run_with_130_and_removes_its_work_folder(tmp_path):
    """Interrupted while a backend runs in its child process: exit 130 with one line, and the
    run's work folder (the child's scratch folder in it) gone."""
    script = Path(sys.executable).parent / "filechannel"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [str(script), "bench", "--quick", "--only", "python floor,queuelib"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # Ctrl-C even from a background job
    )
    try:

        def in_a_backend() -> bool:  # a child's folder in its scratch folder in the run's work folder
            return any(p.is_dir() for p in tmp_path.glob("fc-bench-work-*/fc-bench-*/fc-bench-*"))

        wait_for(in_a_backend, 60, "a backend's scratch folder in the run's work folder")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "aborted", err[-3000:]
    assert list(tmp_path.iterdir()) == []
