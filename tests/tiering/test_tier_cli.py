"""``filechannel tier run`` and ``filechannel tier status``: once in the test's process (tests/cli_helpers.py),
as a daemon in a real subprocess of the console script."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ..cli_helpers import SCRIPT
from ..cli_helpers import fc_text as fc
from .conftest import wait_for
from .tier_helpers import local_bases, make_topic, produce


def status(root: Path) -> list[dict]:
    return [json.loads(line) for line in fc("tier", "status", "--root", str(root), "--format", "json").stdout.splitlines()]


def test_run_once_uploads_and_status_shows_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_topic(root, f"file://{tmp_path}/tier", partitions=2, local_retention_bytes=0)
    for p in range(2):
        produce(root, [os.urandom(100) for _ in range(150)], partition=p)
    sealed = {p: len(local_bases(root, p)) - 1 for p in range(2)}
    [waiting0, waiting1] = status(root)
    assert (waiting0["partition"], waiting0["waiting_segments"], waiting0["uploaded_segments"]) == ("t/0", sealed[0], 0)
    assert waiting1["upload_lag_offsets"] > 0
    run = fc("tier", "run", "--root", str(root), "--once")
    assert "uploaded offsets" in run.stdout and "pass done:" in run.stdout and run.stderr == ""
    rows = status(root)
    assert [(r["uploaded_segments"], r["waiting_segments"], r["local_segments"]) for r in rows] == [
        (sealed[0], 0, 1),
        (sealed[1], 0, 1),
    ]
    assert all(r["tier_bytes"] > 0 and r["last_error"] is None for r in rows)
    table = fc("tier", "status", "--root", str(root)).stdout
    assert "t/0" in table and "t/1" in table


def test_run_once_fails_with_one_line_per_failure(tmp_path: Path) -> None:
    root = tmp_path / "root"
    not_a_folder = tmp_path / "tier"
    make_topic(root, f"file://{not_a_folder}", partitions=2, local_retention_bytes=0)
    not_a_folder.rmdir()  # the storage, good when the topic was made, is a file by the time the daemon runs
    not_a_folder.write_bytes(b"x")
    for p in range(2):
        produce(root, [os.urandom(100) for _ in range(100)], partition=p)
    before = [local_bases(root, p) for p in range(2)]
    run = fc("tier", "run", "--root", str(root), "--once", check=False)
    assert run.returncode == 1
    errors = run.stderr.splitlines()
    assert [line.split(":")[0:2] for line in errors] == [["error", " t/0"], ["error", " t/1"]]
    assert [local_bases(root, p) for p in range(2)] == before  # nothing deleted locally
    assert all(r["last_error"] and r["waiting_segments"] > 0 for r in status(root))


def test_run_stops_cleanly_on_sigterm_and_one_daemon_per_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_topic(root, f"file://{tmp_path}/tier")
    produce(root, [os.urandom(100) for _ in range(100)])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [str(SCRIPT), "tier", "run", "--root", str(root), "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("uploaded offsets" in line for line in lines), 30, "the daemon to upload")
        second = fc("tier", "run", "--root", str(root), "--once", check=False)
        assert second.returncode == 1 and "another tiering daemon holds" in second.stderr
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)  # stdout is the reader thread's; stderr is small
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    assert proc.returncode == 143, err  # 128 + SIGTERM, as a shell reports it (README "Command line")
    assert any("SIGTERM" in line for line in lines) and lines[-1].rstrip().endswith("stopped")
    fc("tier", "run", "--root", str(root), "--once")  # the lock was released


def test_run_wait_blocks_until_the_first_daemon_stops(tmp_path: Path) -> None:
    """With --wait, a second daemon blocks on the root's lock (seen in /proc/locks as a blocked
    flock request), then runs once the first one is closed, with a newer epoch."""
    from filechannel.tiering.daemon import TieringDaemon

    root = tmp_path / "root"
    make_topic(root, f"file://{tmp_path}/tier")
    produce(root, [os.urandom(100) for _ in range(100)])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    first = TieringDaemon(root)
    first.start()
    try:

        def waiter() -> subprocess.Popen[str]:
            return subprocess.Popen(
                [str(SCRIPT), "tier", "run", "--root", str(root), "--once", "--wait"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )

        def blocked(pid: int) -> bool:
            with open("/proc/locks") as f:
                return any("->" in line and " FLOCK " in line and f" {pid} " in line for line in f)

        # a waiter can be stopped while it waits (SIGTERM ends it at once, the lock still held by us)
        quitter = waiter()
        wait_for(lambda: blocked(quitter.pid), 30, "a waiting daemon to block on the root's lock")
        quitter.send_signal(signal.SIGTERM)
        assert quitter.wait(timeout=30) == -signal.SIGTERM
        quitter.communicate()
        proc = waiter()
        wait_for(lambda: blocked(proc.pid), 30, "the second daemon to block on the root's lock")
        epoch = first.epoch
    finally:
        first.close()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"epoch {epoch + 1} taken" in out and "uploaded offsets" in out


def test_ctrl_c_stops_the_daemon_with_exit_130(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_topic(root, f"file://{tmp_path}/tier")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        [str(SCRIPT), "tier", "run", "--root", str(root), "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        try:
            assert proc.stdout is not None
            while "owned by this root" not in proc.stdout.readline():  # its first pass: its handlers are in
                pass
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err
    assert "SIGINT: stopping" in out and err == ""


@pytest.mark.parametrize(
    "option", [("--interval", "nan"), ("--interval", "inf"), ("--interval", "-1"), ("--defrag", "--garbage-delay", "nan")]
)
def test_seconds_that_are_not_finite_are_refused_in_one_line(tmp_path: Path, option: tuple[str, ...]) -> None:
    proc = fc("tier", "run", "--root", str(tmp_path / "root"), "--once", *option, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: ") and "finite number of seconds" in line
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("command", [("status",), ("fsck",), ("run", "--once"), ("defrag",), ("export", "-o", "x.export")])
def test_a_missing_root_is_an_error_and_is_not_made(tmp_path: Path, command: tuple[str, ...]) -> None:
    root = tmp_path / "nosuch"
    proc = fc("tier", *command, "--root", str(root), check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: the root folder") and str(root) in line
    assert not root.exists()


def test_status_shows_each_tiers_offsets_and_the_active_segment_as_waiting(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_topic(root, f"file://{tmp_path}/tier", local_retention_bytes=0)
    produce(root, [os.urandom(100) for _ in range(150)])
    fc("tier", "run", "--root", str(root), "--once")
    produce(root, [os.urandom(100) for _ in range(3)], partition=0)
    [row] = status(root)
    bases = local_bases(root)
    assert (row["local_first_offset"], row["local_end_offset"]) == (bases[0], 153)
    assert (row["tier_first_offset"], row["tier_end_offset"]) == (0, bases[0])
    assert row["active_offsets"] == 153 - bases[-1] > 0
    assert row["upload_lag_offsets"] == row["active_offsets"] + sum(b - a for a, b in itertools.pairwise(bases))
    table = fc("tier", "status", "--root", str(root)).stdout
    assert f"{bases[0]}-153" in table and f"0-{bases[0]}" in table


def test_status_of_records_only_in_the_active_segment_is_not_zero_lag(tmp_path: Path) -> None:
    """The README's block: a few records in a default 64 MiB segment, nothing sealed, nothing uploaded."""
    root = tmp_path / "root"
    fc("topics", "create", "t", "--root", str(root), "-c", f"tier=file://{tmp_path}/tier")
    produce(root, [b"x" * 100 for _ in range(5)])
    fc("tier", "run", "--root", str(root), "--once")
    [row] = status(root)
    assert (row["waiting_segments"], row["active_offsets"], row["upload_lag_offsets"]) == (0, 5, 5)
    assert row["tier_first_offset"] is None and row["uploaded_segments"] == 0


def test_status_says_when_no_topic_is_tiered(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fc("topics", "create", "plain", "--root", str(root))
    assert "no tiered topic" in fc("tier", "status", "--root", str(root)).stdout
    assert fc("tier", "status", "--root", str(root), "--format", "json").stdout == ""
