"""Channels shared by real processes: receivers wake on another process's writes, and
concurrent senders in several processes keep offsets dense and unique."""

import subprocess
import sys
from pathlib import Path

import pytest

from filechannel import FileChannel, Record

PROCS = Path(__file__).parent / "procs"


def run(script, *args, **kwargs):
    return subprocess.Popen([sys.executable, str(PROCS / script), *map(str, args)], **kwargs)


@pytest.mark.slow
def test_receiver_in_one_process_gets_records_from_a_sender_in_another(tmp_path):
    path = tmp_path / "ch"
    FileChannel(path).close()
    receiver = run("waiting_receiver.py", path, 50, stdout=subprocess.PIPE)
    try:
        assert receiver.stdout.readline() == b"ready\n"  # blocked in recv before anything is sent
        sender = run("appender.py", path, "s", 50, 0.01)
        assert sender.wait(60) == 0
        out, _ = receiver.communicate(timeout=60)
    finally:
        for p in (receiver,):
            if p.poll() is None:
                p.kill()
                p.wait()
    lines = [line.split() for line in out.decode().splitlines()]
    assert [int(o) for o, _v, _lat in lines] == list(range(50))
    assert {v for _o, v, _lat in lines} == {f"s-{i}" for i in range(50)}


@pytest.mark.slow
def test_two_sender_processes_append_dense_complete_and_in_their_order(tmp_path):
    path = tmp_path / "ch"
    with FileChannel(path) as ch:
        rx = ch.receiver()
        senders = [run("appender.py", path, tag, 20_000) for tag in ("a", "b")]
        try:
            assert [p.wait(120) for p in senders] == [0, 0]
        finally:
            for p in senders:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        records: list[Record] = []
        while len(records) < 40_000:
            batch = rx.recv_many(10_000, timeout=10)
            assert batch, f"only {len(records)} records arrived"
            records.extend(batch)
    assert [r.offset for r in records] == list(range(40_000))
    for tag in (b"a", b"b"):
        mine = [int((r.value or b"").split(b"-")[1]) for r in records if (r.value or b"").startswith(tag + b"-")]
        assert mine == list(range(20_000)), f"{tag!r}: missing, duplicated or reordered records"
