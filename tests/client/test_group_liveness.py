"""Group liveness as Kafka has it: heartbeats from a background thread, eviction for a hung
process (SIGSTOP) or for no poll in max_poll_interval_ms, the evicted member's way back, and
static membership (group_instance_id).

The member under test is a real process (procs/driven_member.py) the test drives a command
at a time; the other member is a Consumer in the test's process.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from filechannel.client import Admin, Consumer, Producer
from filechannel.errors import ConfigError, FencedInstanceIdError

from .waiting import wait_for

DRIVEN = Path(__file__).parent / "procs" / "driven_member.py"
FAST = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}
STATIC = {"session_timeout_ms": 10000, "heartbeat_interval_ms": 500, "group_instance_id": "a"}


class Member:
    """A driven member process: ``send`` a command, ``reply`` its JSON answer."""

    def __init__(self, root, settings):
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVEN), str(root), "g", "t", json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stdin, stdout, stderr = self.proc.stdin, self.proc.stdout, self.proc.stderr
        assert stdin is not None and stdout is not None and stderr is not None
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=lambda: [self.lines.put(line) for line in self.stdout], daemon=True)
        self.reader.start()

    def send(self, command):
        self.stdin.write(command + "\n")
        self.stdin.flush()

    def reply(self, timeout=60.0):
        answer = json.loads(self.lines.get(timeout=timeout))
        assert "error" not in answer, answer
        return answer

    def ask(self, command):
        self.send(command)
        return self.reply()

    def finish(self):
        """Quit; its stderr (which must hold no traceback). Once: then "" ."""
        if self.stderr.closed:
            return ""
        if self.proc.poll() is None:
            self.send("quit")
            self.stdin.close()
            self.proc.wait(timeout=60)
        stderr = self.stderr.read()
        self.stderr.close()
        self.reader.join(timeout=10)
        self.stdout.close()
        return stderr

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def group(tmp_path):
    """A topic t of 4 partitions with 10 records each; start(settings) starts a driven member."""
    Admin(tmp_path).create_topic("t", 4)
    with Producer(tmp_path) as p:
        for i in range(40):
            p.send("t", b"%d" % i, partition=i % 4)
    started = []

    def start(settings):
        member = Member(tmp_path, settings)
        started.append(member)
        return member

    yield start
    for member in started:
        member.kill()
        member.finish()


def other(root, **settings):
    return Consumer("t", root=root, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False, **settings)


def settle(a, b):
    """Poll both until each owns two partitions; a's last answer."""
    last = {}

    def split():
        last.update(a.ask("poll 20"))
        b.poll(timeout_ms=20)
        return len(last["assigned"]) == 2 and len(b.assignment()) == 2

    wait_for(split, what="the two members to own two partitions each")
    return last


def state(root):
    return json.loads((root / ".groups" / "g" / "state.json").read_text())


def test_a_member_busy_longer_than_the_session_timeout_keeps_its_partitions(tmp_path, group):
    a = group(FAST)
    b = other(tmp_path, **FAST)
    try:
        before = settle(a, b)
        generation = state(tmp_path)["generation"]
        a.send("sleep 4")  # twice the session timeout without a poll, well under max_poll_interval_ms
        slept = None
        while slept is None:  # b polls (and looks for dead or hung members) all along
            b.poll(timeout_ms=100)
            try:
                slept = a.reply(timeout=0)
            except queue.Empty:
                pass
        assert a.ask("commit") == {"commit": "ok"}
        after = a.ask("poll 0")
        assert after["assigned"] == before["assigned"] and after["events"] == []
        assert after["generation"] == generation == state(tmp_path)["generation"]
        assert sorted(tp.partition for tp in b.assignment()) == sorted({0, 1, 2, 3} - set(before["assigned"]))
    finally:
        b.close()
    assert "Traceback" not in a.finish()


@pytest.mark.crash
def test_a_stopped_member_is_evicted_and_its_next_poll_joins_again(tmp_path, group):
    a = group(FAST)
    b = other(tmp_path, **FAST)
    try:
        before = settle(a, b)
        os.kill(a.proc.pid, signal.SIGSTOP)  # the whole process, its heartbeat thread too
        try:
            wait_for(lambda: (b.poll(timeout_ms=50), len(b.assignment()) == 4)[1], what="b to take a's partitions")
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        commit = a.ask("commit")
        assert commit["commit"] == "failed" and "removed from the group" in commit["reason"]
        back = a.ask("poll 0")  # joins again: what it read is revoked, nothing raised
        assert back["events"][0] == ["revoked", before["assigned"]]
        assert back["generation"] > before["generation"]
        events = back["events"][1:]
        last = {}

        def split():
            last.update(a.ask("poll 20"))
            events.extend(last["events"])
            b.poll(timeout_ms=20)
            return len(last["assigned"]) == 2 and len(b.assignment()) == 2

        wait_for(split, what="the group to split the partitions again")
        assert events == [["assigned", last["assigned"]]]
        assert a.ask("commit") == {"commit": "ok"}
    finally:
        b.close()
    assert "Traceback" not in a.finish()


def test_a_member_that_does_not_poll_for_max_poll_interval_leaves_though_it_heartbeats(tmp_path, group):
    a = group({**FAST, "max_poll_interval_ms": 1500})
    b = other(tmp_path, **FAST)
    try:
        before = settle(a, b)
        (a_id,) = [m for m in state(tmp_path)["members"] if m.split("-")[-2] == str(a.proc.pid)]
        life = tmp_path / ".groups" / "g" / "members" / f"{a_id}.lock"
        a.send("sleep 6")
        wait_for(lambda: (b.poll(timeout_ms=50), len(b.assignment()) == 4)[1], what="b to take a's partitions")
        assert a_id not in state(tmp_path)["members"]
        beat = life.stat().st_mtime
        wait_for(lambda: life.stat().st_mtime > beat, what="a's heartbeat thread to beat on")  # still sleeping
        assert a.reply()["slept"] == 6
        commit = a.ask("commit")
        assert commit["commit"] == "failed" and "max_poll_interval_ms" in commit["reason"]
        back = a.ask("poll 0")
        assert back["events"][0] == ["revoked", before["assigned"]]
        assert a_id in state(tmp_path)["members"]
    finally:
        b.close()
    stderr = a.finish()
    assert "has not polled for max_poll_interval_ms" in stderr and "Traceback" not in stderr


def test_liveness_settings_are_checked_as_kafka_python_does(tmp_path):
    with pytest.raises(ConfigError, match="heartbeat_interval_ms must be smaller than session_timeout_ms"):
        Consumer(root=tmp_path, group_id="g", session_timeout_ms=3000)  # the default heartbeat is 3000, Kafka's
    with pytest.raises(ConfigError, match="max_poll_interval_ms must be an int >= 1"):
        Consumer(root=tmp_path, group_id="g", max_poll_interval_ms=0)


def answer_while_polling(member, consumer, command):
    """``member``'s answer to ``command``, ``consumer`` polling all along."""
    member.send(command)
    while True:
        consumer.poll(timeout_ms=50)
        try:
            return member.reply(timeout=0)
        except queue.Empty:
            pass


@pytest.mark.crash
def test_a_static_member_closed_or_killed_and_restarted_gets_its_partitions_back_without_a_rebalance(tmp_path, group):
    a = group(STATIC)
    b = other(tmp_path, **FAST)
    try:
        before = settle(a, b)
        generation = state(tmp_path)["generation"]
        b_parts = b.assignment()
        for stop in (Member.finish, Member.kill):
            stop(a)
            b.poll(timeout_ms=50)
            a = group(STATIC)  # the same group_instance_id, within its session timeout
            back = answer_while_polling(a, b, "poll 0")
            assert back["assigned"] == before["assigned"] and back["events"] == [["assigned", before["assigned"]]]
            assert back["generation"] == generation == state(tmp_path)["generation"]
            b.poll(timeout_ms=50)
            assert b.assignment() == b_parts
            assert a.ask("commit") == {"commit": "ok"}
    finally:
        b.close()
    assert "Traceback" not in a.finish()


def test_a_static_member_that_does_not_come_back_is_evicted_after_its_session_timeout(tmp_path, group):
    a = group({**FAST, "group_instance_id": "a"})
    b = other(tmp_path, **FAST)
    try:
        settle(a, b)
        assert "Traceback" not in a.finish()
        assert "static_a" in state(tmp_path)["members"]  # closed, its place kept for now
        wait_for(lambda: (b.poll(timeout_ms=50), len(b.assignment()) == 4)[1], what="b to take a's partitions")
        assert not any(m.startswith("static_") for m in state(tmp_path)["members"])
        assert not (tmp_path / ".groups" / "g" / "members" / "static_a.lock").exists()
    finally:
        b.close()


def test_two_live_consumers_with_one_group_instance_id_the_second_fails(tmp_path, group):
    a = group(STATIC)
    assert a.ask("poll 0")["assigned"] == [0, 1, 2, 3]
    with pytest.raises(FencedInstanceIdError, match="group_instance_id 'a' is in use by a live consumer of group 'g'"):
        Consumer("t", root=tmp_path, group_id="g", group_instance_id="a")
    assert a.ask("poll 0")["assigned"] == [0, 1, 2, 3]  # the live one is untouched
    assert "Traceback" not in a.finish()
    with Consumer("t", root=tmp_path, group_id="g", group_instance_id="a") as again:  # free once it is closed
        assert len(again.assignment()) == 4
