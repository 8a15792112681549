"""Consumer groups: rebalancing in one process, and real processes with one SIGKILLed."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from filechannel.client import Admin, Consumer, Producer
from filechannel.client.group import GroupMember
from filechannel.engine.lock import FileLock
from filechannel.errors import CommitFailedError

from .listeners import Recorder
from .waiting import wait_for

MEMBER = Path(__file__).parent / "procs" / "group_member.py"


def test_two_members_split_partitions_and_never_overlap(tmp_path):
    Admin(tmp_path).create_topic("t", 4)
    with Producer(tmp_path) as p:
        for i in range(40):
            p.send("t", b"%d" % i, partition=i % 4)
    la, lb = Recorder(), Recorder()
    a = Consumer(root=tmp_path, group_id="g", auto_offset_reset="earliest", heartbeat_interval_ms=50)
    a.subscribe(["t"], listener=la)
    assert len(a.assignment()) == 4
    b = Consumer(root=tmp_path, group_id="g", auto_offset_reset="earliest", heartbeat_interval_ms=50)
    b.subscribe(["t"], listener=lb)
    # b is assigned two partitions but may read them only once a has let go.
    assert b.assignment() == set()
    a.poll(timeout_ms=0)
    wait_for(lambda: (b.poll(timeout_ms=10), len(b.assignment()) == 2)[1], what="b to take its partitions")
    assert not a.assignment() & b.assignment() and len(a.assignment() | b.assignment()) == 4
    assert la.events == [("assigned", [0, 1, 2, 3]), ("revoked", sorted(tp.partition for tp in b.assignment()))]
    assert lb.events == [("assigned", sorted(tp.partition for tp in b.assignment()))]
    # a can no longer commit what b owns.
    with pytest.raises(CommitFailedError):
        a.commit({next(iter(b.assignment())): 1})
    b.close()
    wait_for(lambda: (a.poll(timeout_ms=10), len(a.assignment()) == 4)[1], what="a to take everything back")
    a.close()


def test_a_member_starting_while_another_locks_its_life_file_keeps_it(tmp_path, monkeypatch):
    """A member creates and locks its life file under group.lock. Created outside it, the file of
    a member B was deleted (as a dead member's) by a member A starting between B's creation of it
    and B's flock: B then locked a file nobody could see, A evicted B at every sync and B joined
    again, for ever (tests/client/test_groups.py's three processes, thousands of generations).
    Here A starts at exactly that moment: it waits for B to finish, and B stays a member."""
    root = str(tmp_path)
    Admin(root).create_topic("t", 2)
    b_opened, a_started = threading.Event(), threading.Event()
    take = FileLock.acquire

    def acquire(self, blocking=True):
        if f"{os.sep}members{os.sep}" in self.path and not b_opened.is_set():
            b_opened.set()  # B's life file exists, not yet flocked: A starts now, and may finish
            a_started.wait(2)
        return take(self, blocking)

    monkeypatch.setattr(FileLock, "acquire", acquire)
    members: dict[str, GroupMember] = {}

    def start(name: str) -> None:
        members[name] = GroupMember(root, "g", session_timeout_ms=10_000, heartbeat_interval_ms=100)

    b = threading.Thread(target=start, args=("b",))
    b.start()
    assert b_opened.wait(10)
    a = threading.Thread(target=lambda: (start("a"), a_started.set()))
    a.start()
    a.join(10)
    b.join(10)
    try:
        life = members["b"]._life
        assert os.stat(life.path).st_ino == os.fstat(life.fd).st_ino  # B locks the file the others see
        members["b"].join(["t"], {"t": 2})
        members["a"].join(["t"], {"t": 2})  # evicts members whose life file is gone or free
        assert members["b"].sync({"t": 2}, held=set()) is not None  # B is still a member
        assert members["a"].sync({"t": 2}, held=set()) is not None
    finally:
        for member in members.values():
            member.leave()


@pytest.mark.crash
@pytest.mark.slow
def test_three_processes_over_six_partitions_one_killed(tmp_path):
    root = tmp_path
    Admin(root).create_topic("g6", 6)
    with Producer(root) as producer:
        for i in range(1200):
            producer.send("g6", b"%d" % i, partition=i % 6)
    procs = [subprocess.Popen([sys.executable, str(MEMBER), str(root), "grp", "g6"], stdout=subprocess.PIPE) for _ in range(3)]
    outputs: list[list[str]] = [[] for _ in procs]  # each member's lines, collected as they come
    readers = [
        threading.Thread(target=lambda p=p, o=o: o.extend(line.decode().rstrip("\n") for line in p.stdout))
        for p, o in zip(procs, outputs, strict=True)
    ]
    for t in readers:
        t.start()
    try:
        state_path = root / ".groups" / "grp" / "state.json"
        offsets_path = root / ".groups" / "grp" / "offsets.json"

        def group_picture() -> str:  # what the group looked like and what each member last did
            state = json.loads(state_path.read_text()) if state_path.exists() else None
            committed = json.loads(offsets_path.read_text()) if offsets_path.exists() else None
            tails = [(p.poll(), out[-6:]) for p, out in zip(procs, outputs, strict=True)]
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGUSR1)  # each live member writes its stacks
            live = [p for p in procs if p.poll() is None]
            try:
                wait_for(lambda: all((root / f"stack.{p.pid}").stat().st_size for p in live), timeout=5, what="the stacks")
            except AssertionError:
                pass  # a picture without some stacks is still worth printing
            stacks = {p.pid: (root / f"stack.{p.pid}").read_text()[-3000:] for p in live if (root / f"stack.{p.pid}").exists()}
            return f"state {state}; offsets {committed}; members (exit code, last lines) {tails}; stacks {stacks}"

        def settled():
            if not state_path.exists():
                return False
            state = json.loads(state_path.read_text())
            return len(state["members"]) == 3 and len(state["owners"]) == 6 and len(set(state["owners"].values())) == 3

        try:
            wait_for(settled, what="3 members owning 6 partitions")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {group_picture()}") from None
        # The first member up may have read and committed the first 1,200 records alone before the
        # others joined (under load, it did): more records now give each member some to commit.
        with Producer(root) as producer:
            for i in range(1200, 1800):
                producer.send("g6", b"%d" % i, partition=i % 6)

        def every_member_committed():  # each owns two partitions: all six moved on
            if not offsets_path.exists():
                return False
            committed = json.loads(offsets_path.read_text())
            return len(committed) == 6 and all(v > 0 for v in committed.values())

        try:
            wait_for(every_member_committed, what="progress on every partition")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {group_picture()}") from None
        wait_for(lambda: any(line.startswith("C ") for line in outputs[0]), what="the victim to commit")
        victim = procs[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed_at = time.monotonic()
        with Producer(root) as producer:
            for i in range(1800, 2400):
                producer.send("g6", b"%d" % i, partition=i % 6)

        def all_committed():
            if not offsets_path.exists():
                return False
            committed = json.loads(offsets_path.read_text())
            return len(committed) == 6 and all(v == 400 for v in committed.values())

        try:
            wait_for(all_committed, timeout=60, what="every record committed")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {group_picture()}") from None
        moved_within = time.monotonic() - killed_at
        # Read the ownership before stopping: members leaving at the end hand partitions on. A partition
        # can be between two owners for a moment after a rebalance (released, not yet taken): wait for
        # the two survivors to own all six.
        owners: dict[str, str] = {}

        def survivors_own_everything():
            owners.clear()
            owners.update(json.loads(state_path.read_text())["owners"])
            return len(owners) == 6 and len(set(owners.values())) == 2

        try:
            wait_for(survivors_own_everything, what="the two survivors to own all six partitions")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {group_picture()}") from None
        (root / "stop").touch()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"a member did not stop within 30 s: {group_picture()}") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for t in readers:
            t.join(timeout=10)
    reads = [{(int(p), int(o)) for kind, p, o in (line.split() for line in out if line.startswith("R "))} for out in outputs]
    everything = {(i % 6, i // 6) for i in range(2400)}
    assert set().union(*reads) == everything, "a record was never consumed"
    survivors = reads[1] & reads[2]
    assert not survivors, f"records consumed by two live members: {sorted(survivors)[:10]}"
    # Only what the killed member read but had not committed may be read twice.
    commits_by_victim: dict[int, int] = {}
    for line in outputs[0]:
        if line.startswith("C "):
            _, p, o = line.split()
            commits_by_victim[int(p)] = int(o)
    for part, offset in reads[0] & (reads[1] | reads[2]):
        assert offset >= commits_by_victim.get(part, 0), (
            f"record {part}/{offset} was committed by the killed member and read again"
        )
    # No committed offset went backwards, as each member saw its own commits.
    for out in outputs:
        last: dict[str, int] = {}
        for line in out:
            if line.startswith("C "):
                _, p, o = line.split()
                assert int(o) >= last.get(p, 0)
                last[p] = int(o)

    def last_assignment(out):
        lines = [line for line in out if line.startswith("A ")]
        return {int(x) for x in lines[-1][2:].split(",") if x} if lines else set()

    assert last_assignment(outputs[0]), ("the killed member owned nothing when it died", outputs[0][:5], owners)
    assert len(owners) == 6 and len(set(owners.values())) == 2, owners
    assert moved_within < 30


def test_a_partition_taken_then_reassigned_before_it_is_read_is_given_up(tmp_path):
    """A member can take a partition in one sync and lose it to a rebalance before its next
    (between the two syncs of a revocation). Not reading it, it must still give it up:
    otherwise the member it is now assigned to waits for it forever (the three-process test
    above found one such, owned by a live member that never read it)."""
    from filechannel.client.group import GroupMember
    from filechannel.client.records import TopicPartition

    def member() -> GroupMember:
        return GroupMember(str(tmp_path), "g", session_timeout_ms=10_000, heartbeat_interval_ms=100)

    def synced(m: GroupMember, held: set[TopicPartition]) -> tuple[set[TopicPartition], set[TopicPartition]]:
        result = m.sync({"t": 4}, held=held)
        assert result is not None, "the member fell out of the group"
        return result

    a, b = member(), member()
    a.join(["t"], {"t": 4})
    _, owned = synced(a, held=set())
    assert owned == {TopicPartition("t", p) for p in range(4)}  # alone: it takes all four
    b.join(["t"], {"t": 4})  # the rebalance, before `a` opened anything
    assigned_b, owned_b = synced(b, held=set())
    assert assigned_b and not owned_b  # still owned by `a`, which is alive
    held = {TopicPartition("t", 0)}  # `a` reads one of them: it keeps it until it has closed it
    assigned_a, owned_a = synced(a, held=held)
    assert owned_a == assigned_a  # the rest of its assignment
    assigned_b, owned_b = synced(b, held=set())
    assert owned_b == assigned_b - held and assigned_a.isdisjoint(assigned_b)
    a.sync({"t": 4}, held=set())  # it closed the one it read: given up
    assert synced(b, held=set())[1] == assigned_b
    a.leave()
    b.leave()
