"""``filechannel tier run --roll``: a quiet partition's records move to tier-2 before its segment
fills, run through the console script's entry point (tests/cli_helpers.py), beside real writer processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from filechannel.client.topics import Admin, TopicStore
from filechannel.engine.lock import FileLock

from ..cli_helpers import fc_text as fc
from .conftest import wait_for

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def status(root: Path) -> dict:
    [row] = [json.loads(line) for line in fc("tier", "status", "--root", str(root), "--format", "json").stdout.splitlines()]
    return row


def values(root: Path) -> list[str]:
    out = fc("consume", "t", "--root", str(root), "--from-beginning", "--no-follow").stdout
    return out.splitlines()


def writer_locked(root: Path) -> bool:
    lock = FileLock(str(root / "t" / "0" / "writer.lock"))
    try:
        if lock.acquire(blocking=False):
            lock.release()
            return False
        return True
    finally:
        lock.close()


# A writer process that stays alive: sends the words of each line it reads from stdin and says
# "sent"; "hold" takes writer.lock as its appender does from assigning offsets until they are
# written (a writer in the middle of a write), "release" lets it go; an empty line closes it.
WRITER = textwrap.dedent(
    """
    import os, sys
    from filechannel.client.topics import TopicStore
    from filechannel.engine.lock import FileLock
    root = sys.argv[1]
    ch = TopicStore(root).open_partition("t", 0, maintenance_interval=0)
    lock = FileLock(os.path.join(root, "t", "0", "writer.lock"))
    tx = ch.sender()
    for line in sys.stdin:
        if line == "\\n":
            break
        if line == "hold\\n":
            lock.acquire()
            print("held", flush=True)
        elif line == "release\\n":
            lock.release()
            print("released", flush=True)
        else:
            for value in line.split():
                tx.send(value.encode())
            print("sent", flush=True)
    tx.close()
    ch.close()
    print("closed", flush=True)
    """
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    Admin(root).create_topic("t", 1, tier=f"file://{tmp_path}/tier", local_retention_bytes=0)  # segment_bytes: 64 MiB
    return root


@pytest.fixture
def writer(root: Path) -> Iterator[Callable[[], subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start() -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def say(proc: subprocess.Popen[str], line: str, answer: str) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == answer


def test_without_roll_the_active_segment_waits_and_with_roll_it_moves(root: Path) -> None:
    fc("produce", "t", "--root", str(root), input="a\nb\nc\n")
    run = fc("tier", "run", "--root", str(root), "--once")
    assert "pass done: 0 segment(s) uploaded" in run.stdout
    assert (status(root)["active_offsets"], status(root)["uploaded_segments"]) == (3, 0)

    run = fc("tier", "run", "--root", str(root), "--once", "--roll")
    assert "t/0: sealed the idle active segment, offsets [0, 3)" in run.stdout
    assert "pass done: 1 segment(s) uploaded" in run.stdout
    row = status(root)
    assert (row["tier_first_offset"], row["tier_end_offset"], row["active_offsets"], row["upload_lag_offsets"]) == (0, 3, 0, 0)
    assert row["local_first_offset"] == 3  # local_retention_bytes=0: only tier-2 holds them now

    fc("produce", "t", "--root", str(root), input="d\n")  # the next writer goes on after the sealed segment
    assert values(root) == ["a", "b", "c", "d"]
    again = fc("tier", "run", "--root", str(root), "--once", "--roll", "--idle", "3600")
    assert "sealed" not in again.stdout and status(root)["active_offsets"] == 1  # written just now: not idle


def test_an_idle_writer_process_goes_on_in_the_new_segment(root: Path, writer: Callable[[], subprocess.Popen[str]]) -> None:
    proc = writer()
    say(proc, "a b c", "sent")
    wait_for(lambda: not writer_locked(root), 60, "the writer to let writer.lock go")  # written, and the lock let go: idle
    run = fc("tier", "run", "--root", str(root), "--once", "--roll")
    assert "sealed the idle active segment, offsets [0, 3)" in run.stdout
    say(proc, "d e", "sent")  # the same process, still alive, sends again
    say(proc, "", "closed")
    assert proc.wait(timeout=60) == 0
    assert values(root) == ["a", "b", "c", "d", "e"]
    row = status(root)
    assert (row["tier_end_offset"], row["local_end_offset"], row["active_offsets"]) == (3, 5, 2)
    with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch:
        assert ch.check() == 5  # every record's CRC, across both tiers


def test_a_writer_holding_the_lock_is_left_alone(root: Path, writer: Callable[[], subprocess.Popen[str]]) -> None:
    proc = writer()
    say(proc, "a b c", "sent")
    say(proc, "hold", "held")
    assert writer_locked(root)
    run = fc("tier", "run", "--root", str(root), "--once", "--roll")
    assert "t/0: a writer is writing: its active segment is left to it" in run.stdout
    assert "pass done: 0 segment(s) uploaded" in run.stdout
    say(proc, "release", "released")
    run = fc("tier", "run", "--root", str(root), "--once", "--roll")
    assert "offsets [0, 3)" in run.stdout and "pass done: 1 segment(s) uploaded" in run.stdout
    say(proc, "d", "sent")
    say(proc, "", "closed")
    assert proc.wait(timeout=60) == 0
    assert values(root) == ["a", "b", "c", "d"]
