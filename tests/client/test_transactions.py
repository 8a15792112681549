"""Transactions: a transactional Producer's records and its group offsets are written all
together at commit, or not at all (abort, timeout, fencing, a crash before the commit record),
and a crash after the commit record is finished by the next recovery without duplicates."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from filechannel.client import Admin, AsyncConsumer, AsyncProducer, Consumer, OffsetAndMetadata, Producer, TopicPartition
from filechannel.client.errors import IllegalStateError, KafkaError, ProducerFencedError
from filechannel.client.transaction_log import TRANSACTIONS_DIR, Batch, CommitRecord, TxnRecord
from filechannel.engine import failpoints
from filechannel.errors import (
    CommitFailedError,
    ConfigError,
    InvalidNameError,
    MessageTooLargeError,
    TransactionAbortedError,
)

from .waiting import wait_for

TOPICS = ("a", "b", "c")


@pytest.fixture
def root(tmp_path):
    admin = Admin(tmp_path / "root")
    for topic in TOPICS:
        admin.create_topic(topic, partitions=2)
    admin.create_topic("in", partitions=2)
    return str(tmp_path / "root")


def read_all(root, topic, isolation_level="read_committed"):
    """Every record of ``topic``: (partition, offset, key, value, headers)."""
    with Consumer(topic, root=root, auto_offset_reset="earliest", isolation_level=isolation_level) as c:
        out: list[tuple[Any, ...]] = []
        while batch := c.poll(timeout_ms=200):
            out.extend((r.partition, r.offset, r.key, r.value, tuple(r.headers)) for rs in batch.values() for r in rs)
        return sorted(out)


def transactional(root, tid="t1", **kw):
    p = Producer(root, transactional_id=tid, **kw)
    p.init_transactions()
    return p


def test_a_commit_across_three_topics_writes_every_record_and_completes_the_futures(root):
    with transactional(root) as p:
        p.begin_transaction()
        futures = [
            p.send(t, f"{t}{i}".encode(), key=b"k", headers=[("h", b"v")], partition=i % 2) for t in TOPICS for i in range(4)
        ]
        assert not any(f.done() for f in futures)  # nothing written before the commit
        assert all(read_all(root, t) == [] for t in TOPICS)
        p.commit_transaction()
        metadata = [f.get(timeout=10) for f in futures]
    assert [(m.topic, m.partition, m.offset) for m in metadata] == [(t, i % 2, i // 2) for t in TOPICS for i in range(4)]
    for t in TOPICS:
        assert read_all(root, t) == sorted((i % 2, i // 2, b"k", f"{t}{i}".encode(), (("h", b"v"),)) for i in range(4))
    assert not any(n.endswith(".commit") for n in os.listdir(os.path.join(root, TRANSACTIONS_DIR)))


def test_an_abort_across_three_topics_writes_nothing_and_fails_the_futures(root):
    with transactional(root) as p:
        p.begin_transaction()
        futures = [p.send(t, b"doomed") for t in TOPICS]
        p.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "g")
        p.abort_transaction()
        assert all(isinstance(f.exception(timeout=10), TransactionAbortedError) for f in futures)
        p.begin_transaction()  # the next one goes on as usual
        p.send("a", b"kept", partition=0)
        p.commit_transaction()
    assert [r[3] for t in TOPICS for r in read_all(root, t)] == [b"kept"]
    with Consumer(root=root, group_id="g", enable_auto_commit=False) as c:
        assert c.committed(TopicPartition("in", 0)) is None


def test_read_committed_and_read_uncommitted_side_by_side_see_the_same_committed_records(root):
    with transactional(root) as p:
        p.begin_transaction()
        p.send("a", b"one", partition=0)
        p.commit_transaction()
        p.begin_transaction()
        p.send("a", b"open", partition=0)  # an open transaction: in memory only
        committed = read_all(root, "a", "read_committed")
        uncommitted = read_all(root, "a", "read_uncommitted")
        assert committed == uncommitted == [(0, 0, None, b"one", ())]

        async def read_async():
            c = AsyncConsumer("a", root=root, auto_offset_reset="earliest", isolation_level="read_committed")
            got = await c.getmany(timeout_ms=2000)
            await c.stop()
            return [r.value for rs in got.values() for r in rs]

        assert anyio.run(read_async) == [b"one"]
        p.abort_transaction()
    with pytest.raises(ConfigError, match="isolation_level"):
        Consumer(root=root, isolation_level="read_everything")


def test_offsets_sent_to_the_transaction_are_the_groups_and_a_consumer_resumes_right_after(root):
    with Producer(root) as plain:
        for i in range(10):
            plain.send("in", f"in{i}".encode(), partition=0)
    with Consumer("in", root=root, group_id="g", enable_auto_commit=False, auto_offset_reset="earliest") as c:
        batch = c.poll(timeout_ms=5000, max_records=4)
        records = batch[TopicPartition("in", 0)]
        assert len(records) == 4
        with transactional(root) as p:
            p.begin_transaction()
            for r in records:
                p.send("a", r.value.upper(), partition=0)
            p.send_offsets_to_transaction({TopicPartition("in", 0): OffsetAndMetadata(4, "")}, c.group_metadata())
            assert c.committed(TopicPartition("in", 0)) is None  # not before the commit
            p.commit_transaction()
        assert c.committed(TopicPartition("in", 0)) == 4
    with Consumer("in", root=root, group_id="g", enable_auto_commit=False, auto_offset_reset="earliest") as again:
        batch = again.poll(timeout_ms=5000)
        assert batch[TopicPartition("in", 0)][0].offset == 4
    assert [r[3] for r in read_all(root, "a")] == [b"IN0", b"IN1", b"IN2", b"IN3"]


def test_a_consumer_that_lost_its_partition_cannot_commit_it_in_a_transaction(root):
    with Consumer("in", root=root, group_id="g", enable_auto_commit=False) as c:
        wait_for(lambda: c.poll(timeout_ms=50) is not None and c.assignment(), what="an assignment")
        stale = c.group_metadata()._replace(member_id="gone-member")
        with transactional(root) as p:
            p.begin_transaction()
            f = p.send("a", b"x", partition=0)
            p.send_offsets_to_transaction({TopicPartition("in", 0): 1}, stale)
            with pytest.raises(CommitFailedError, match="no longer owns"):
                p.commit_transaction()
            assert isinstance(f.exception(timeout=10), CommitFailedError)
            with pytest.raises(TransactionAbortedError):
                p.send("a", b"y")
            p.abort_transaction()
    assert read_all(root, "a") == []


def test_a_zombie_is_fenced_by_a_newer_producer_with_its_id(root):
    zombie = transactional(root, "w")
    zombie.begin_transaction()
    zombie.send("a", b"zombie", partition=0)
    with transactional(root, "w") as fresh:
        with pytest.raises(ProducerFencedError, match="fenced"):
            zombie.send("a", b"more", partition=0)
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction()
        with pytest.raises(ProducerFencedError):
            zombie.begin_transaction()
        fresh.begin_transaction()
        fresh.send("a", b"fresh", partition=0)
        fresh.commit_transaction()
    zombie.close()
    assert [r[3] for r in read_all(root, "a")] == [b"fresh"]
    assert issubclass(ProducerFencedError, KafkaError)


def test_a_zombie_fenced_between_its_last_send_and_its_commit_writes_nothing(root):
    zombie = transactional(root, "w")
    zombie.begin_transaction()
    zombie.send("a", b"zombie", partition=0)
    transactional(root, "w").close()  # init_transactions only
    with pytest.raises(ProducerFencedError):
        zombie.commit_transaction()
    zombie.close()
    assert read_all(root, "a") == []


def test_a_transaction_open_past_its_timeout_is_aborted(root):
    with transactional(root, transaction_timeout_ms=1) as p:
        p.begin_transaction()
        wait_for(lambda: _timed_out(p), what="the transaction timeout")
        with pytest.raises(TransactionAbortedError, match="transaction_timeout_ms"):
            p.commit_transaction()
        with pytest.raises(IllegalStateError, match="abort_transaction"):
            p.begin_transaction()
        p.abort_transaction()
    assert read_all(root, "a") == []


def _timed_out(p):
    try:
        p.send("a", b"late", partition=0)
    except TransactionAbortedError:
        return True
    return False


def test_calls_out_of_order_and_bad_arguments_raise_before_anything_is_written(root):
    with Producer(root) as plain, pytest.raises(IllegalStateError, match="transactional_id"):
        plain.begin_transaction()
    with pytest.raises(InvalidNameError, match="transactional_id"):
        Producer(root, transactional_id="../escape")
    with Producer(root, transactional_id="t") as p:
        with pytest.raises(IllegalStateError, match="init_transactions"):
            p.begin_transaction()
        p.init_transactions()
        with pytest.raises(IllegalStateError, match="called already"):
            p.init_transactions()
        with pytest.raises(IllegalStateError, match="begin_transaction"):
            p.send("a", b"x")
        with pytest.raises(IllegalStateError, match="no transaction"):
            p.abort_transaction()
        with pytest.raises(IllegalStateError, match="begin_transaction"):
            p.commit_transaction()
        p.begin_transaction()
        with pytest.raises(IllegalStateError, match="open already"):
            p.begin_transaction()
        with pytest.raises(ConfigError, match="group id"):
            p.send_offsets_to_transaction({TopicPartition("in", 0): 1}, 42)
        with pytest.raises(ConfigError, match="TopicPartition"):
            p.send_offsets_to_transaction({"in": 1}, "g")  # type: ignore[dict-item]
        with pytest.raises(ConfigError, match="offset"):
            p.send_offsets_to_transaction({TopicPartition("in", 0): -1}, "g")
        with pytest.raises(MessageTooLargeError):
            p.send("a", b"x" * (2 << 20))
        p.commit_transaction()  # an empty transaction commits nothing
    assert read_all(root, "a") == []


def test_the_async_producers_transaction_commits_and_aborts_on_an_exception(root):
    async def main():
        async with AsyncProducer(root, transactional_id="async") as p:
            await p.start()
            async with p.transaction():
                delivery = await p.send("a", b"committed", partition=0)
                await p.send_offsets_to_transaction({TopicPartition("in", 1): 3}, "g")
            assert (await delivery).offset == 0
            with pytest.raises(RuntimeError, match="boom"):
                async with p.transaction():
                    doomed = await p.send("a", b"aborted", partition=0)
                    raise RuntimeError("boom")
            with pytest.raises(TransactionAbortedError):
                await doomed

    anyio.run(main)
    assert [r[3] for r in read_all(root, "a")] == [b"committed"]
    with Consumer(root=root, group_id="g", enable_auto_commit=False) as c:
        assert c.committed(TopicPartition("in", 1)) == 3


def test_the_async_producers_queued_sends_are_never_duplicated(root):
    """Idempotence (enable_idempotence): the async producer's sends are appended once each;
    nothing retries them, in or out of a transaction."""

    async def main():
        async with AsyncProducer(root, enable_idempotence=True, linger_ms=50) as p:
            deliveries = [await p.send("b", f"{i}".encode(), partition=0) for i in range(500)]
            await p.flush()
            return [(await d).offset for d in deliveries]

    offsets = anyio.run(main)
    assert offsets == list(range(500))
    assert [r[3] for r in read_all(root, "b")] == [f"{i}".encode() for i in range(500)]


# -- crash points inside commit_transaction (failpoints) ----------------------------------------------------------

COMMITTER = r"""
import sys
from filechannel.client import Producer, TopicPartition
root, n = sys.argv[1], int(sys.argv[2])
p = Producer(root, transactional_id="crashy")
p.init_transactions()
p.begin_transaction()
for t in ("a", "b", "c"):
    for i in range(n):
        p.send(t, f"{t}-{i}".encode(), key=str(i).encode(), partition=i % 2)
p.send_offsets_to_transaction({TopicPartition("in", 0): 7}, "g")
p.commit_transaction()
print("committed")
"""


def crashed_commit(root: str, tmp_path: Path, point: str, n: int) -> None:
    """Run COMMITTER (``n`` records to each of a, b, c, and group offsets) until failpoint ``point``
    kills it inside its commit."""
    points = tmp_path / "points"
    points.mkdir()
    (points / point).write_bytes(b"")
    env = {**os.environ, failpoints.ENV: str(points)}
    proc = subprocess.run([sys.executable, "-c", COMMITTER, root, str(n)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == failpoints.EXIT_CODE, proc.stderr


@pytest.mark.crash
@pytest.mark.parametrize("point", ["txn-record-written", "txn-mid-append", "txn-partition-applied", "txn-offsets-stored"])
def test_a_crash_at_each_point_after_the_commit_record_is_finished_once_by_the_next_reader(root, tmp_path, point):
    crashed_commit(root, tmp_path, point, 40)
    if point == "txn-mid-append":  # the first partition holds half its share: a reader that recovers nothing sees that
        assert 0 < len(read_all(root, "a", "read_uncommitted")) < 40
    # The next one to touch the root (here a read_committed consumer) finishes the commit, once.
    for t in TOPICS:
        values = sorted(r[3] for r in read_all(root, t))
        assert values == sorted(f"{t}-{i}".encode() for i in range(40)), t
    with Consumer(root=root, group_id="g", enable_auto_commit=False) as c:
        assert c.committed(TopicPartition("in", 0)) == 7
    # Recovering again (a new producer of the id) changes nothing.
    transactional(root, "crashy").close()
    for t in TOPICS:
        assert len(read_all(root, t)) == 40


@pytest.mark.crash
def test_a_crash_before_the_commit_record_leaves_nothing(root, tmp_path):
    code = COMMITTER.replace("p.commit_transaction()", "import os; os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code, root, "40"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    transactional(root, "crashy").close()
    assert all(read_all(root, t) == [] for t in TOPICS)
    with Consumer(root=root, group_id="g", enable_auto_commit=False) as c:
        assert c.committed(TopicPartition("in", 0)) is None


# -- the commit record's codec ------------------------------------------------------------------------------------

_bytes = st.one_of(st.none(), st.binary(max_size=64))
_records = st.lists(
    st.builds(
        TxnRecord,
        st.integers(0, 2**62),
        _bytes,
        _bytes,
        st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=16)), max_size=3).map(tuple),
    ),
    max_size=8,
)


@given(
    batches=st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 9), st.integers(0, 2**40), _records), max_size=4),
    offsets=st.dictionaries(st.integers(0, 9), st.integers(0, 2**62), max_size=3),
)
def test_a_commit_record_decodes_to_what_was_encoded(batches, offsets):
    record = CommitRecord(
        "tid",
        3,
        [Batch(t, p, rs, start) for t, p, start, rs in batches],
        {"g": {TopicPartition("in", p): off for p, off in offsets.items()}} if offsets else {},
    )
    data = record.encode()
    assert CommitRecord.decode(data, "x") == record
    with pytest.raises(KafkaError, match=r"damaged|truncated"):
        CommitRecord.decode(data[:-1] + bytes([data[-1] ^ 1]) if len(data) > 12 else data[:5], "x")


# -- the crash storm ----------------------------------------------------------------------------------------------

WORKERS = os.path.join(os.path.dirname(__file__), "procs", "txn_workers.py")
COMMIT_POINTS = ("txn-record-written", "txn-mid-append", "txn-partition-applied", "txn-offsets-stored")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(pid):
    """SIGKILL ``pid``; whether it was still there to be killed (a worker may end on its own, and its
    spawner reap it, between a check that it lives and the kill)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["assign", "group"])
def test_a_storm_of_sigkills_inside_transactions_leaves_the_output_exactly_once(tmp_path, mode):
    """Three worker slots consume-transform-produce in transactions of at most three records
    while the input grows; workers are SIGKILLed at random moments (inside begin, send,
    send_offsets, commit: they do little else), some die at a failpoint inside the commit, some
    are left running as zombies while a newer worker of their slot starts. "assign": each slot
    reads its own partition (fenced by its transactional id); "group": the workers are members
    of one consumer group, rebalancing at every death (fenced by the group's ownership too).
    Afterwards every input record is in the output exactly once, and the group's committed
    offsets are the input's ends."""
    rng = random.Random(38)
    root = str(tmp_path / "root")
    admin = Admin(root)
    admin.create_topic("in", partitions=3)
    admin.create_topic("out", partitions=3)
    group = "storm" if mode == "assign" else "gstorm"
    counts = [0, 0, 0]  # input records written, per partition of "in"
    feeder = Producer(root)

    def feed():
        for p in range(3):
            feeder.send("in", f"record-{p}-{counts[p]}".encode(), key=str(counts[p]).encode(), partition=p)
            counts[p] += 1

    def committed():
        with Consumer(root=root, group_id=group, enable_auto_commit=False) as c:
            return [c.committed(TopicPartition("in", p)) or 0 for p in range(3)]

    status = tmp_path / "status"
    status.mkdir()
    spawner = subprocess.Popen(
        [sys.executable, WORKERS, root, str(status)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )

    assert spawner.stdin is not None and spawner.stdout is not None

    def spawn(slot, point="-"):
        assert spawner.stdin is not None and spawner.stdout is not None
        spawner.stdin.write(f"{slot} {point} {mode}\n")
        spawner.stdin.flush()
        return int(spawner.stdout.readline())

    def ended(pid, kill_at):
        """How a gone worker ended (a worker that failed fails the test)."""
        result = (status / str(pid)).read_text() if (status / str(pid)).exists() else None
        if result is None:
            return "killed" if time.monotonic() >= kill_at else "failpoint"  # died before its kill: at its failpoint
        if result not in ("done", "fenced"):
            pytest.fail(f"a worker failed:\n{result}")
        return result

    kills = 0
    ends: list[str] = []
    live: dict[int, dict[int, float]] = {slot: {} for slot in range(3)}  # slot -> {pid: when to kill it}
    try:
        deadline = time.monotonic() + 120
        while kills < 210:
            assert time.monotonic() < deadline, f"the storm took too long: {kills} kills"
            feed()
            for slot in range(3):
                workers = live[slot]
                for pid, kill_at in list(workers.items()):
                    if time.monotonic() >= kill_at and _kill(pid):
                        kills += 1
                        wait_for(lambda pid=pid: not _alive(pid), what="a killed worker to be gone")
                    if not _alive(pid):
                        del workers[pid]
                        ends.append(ended(pid, kill_at))
                if not workers or rng.random() < 0.01:  # now and then a newer worker beside a live one: a zombie
                    point = rng.choice(COMMIT_POINTS) if rng.random() < 0.15 else "-"
                    workers[spawn(slot, point)] = time.monotonic() + rng.uniform(0.0, 0.12)
            time.sleep(0.005)  # pacing between two rounds (what is waited for is polled above)
        for workers in live.values():  # the storm's last workers die too
            for pid in workers:
                kills += _kill(pid)
                wait_for(lambda pid=pid: not _alive(pid), what="a killed worker to be gone")
            workers.clear()
        feeder.close()
        committed_in_storm = sum(committed())
        finals = [spawn(slot) for slot in range(3)]  # one worker per slot processes what is left
        if mode == "group":
            wait_for(lambda: committed() == counts, timeout=120, what="the group to commit the whole input")
            (status / "stop").touch()
        wait_for(lambda: not any(map(_alive, finals)), timeout=120, what="the last workers to finish")
        assert [ended(pid, float("inf")) for pid in finals] == ["done"] * 3
    finally:
        feeder.close()
        if spawner.stdin is not None:
            spawner.stdin.close()
        spawner.wait(timeout=60)
        for workers in live.values():
            for pid in workers:
                _kill(pid)
    assert kills >= 200
    seen = read_all(root, "out")
    sources = sorted(dict(r[4])["source"].decode() for r in seen)
    assert sources == sorted(f"{p}/{i}" for p in range(3) for i in range(counts[p]))  # each exactly once
    assert sorted(r[3] for r in seen) == sorted(f"RECORD-{p}-{i}".encode() for p in range(3) for i in range(counts[p]))
    assert committed() == counts
    print(
        f"storm ({mode}): {kills} SIGKILLs, {ends.count('failpoint')} deaths at a commit failpoint, "
        f"{ends.count('fenced')} zombies fenced; {committed_in_storm} of {sum(counts)} input records committed when "
        "the kills ended"
    )


EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "transactional_worker.py")


def test_the_example_worker_says_how_to_run_it():
    proc = subprocess.run([sys.executable, EXAMPLE, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--root" in proc.stdout and "--demo" in proc.stdout


@pytest.mark.crash
@pytest.mark.slow
def test_the_example_workers_demo_is_exactly_once_with_a_worker_killed():
    proc = subprocess.run([sys.executable, EXAMPLE, "--demo", "--records", "600"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "600 input records, 600 in the output, 0 more than once; 600 committed" in proc.stdout
    assert proc.stdout.rstrip().endswith("exactly once")


@pytest.mark.crash
def test_a_topic_deleted_before_the_recovery_does_not_block_the_root(root, tmp_path):
    crashed_commit(root, tmp_path, "txn-record-written", 4)
    Admin(root).delete_topic("b")
    with transactional(root, "other") as p:  # recovers first: a's and c's shares, not b's
        p.begin_transaction()
        p.send("a", b"next", partition=0)
        p.commit_transaction()
    assert len(read_all(root, "a")) == 5 and len(read_all(root, "c")) == 4


def test_consume_isolation_level_read_committed_finishes_a_dead_producers_commit(root, tmp_path):
    crashed_commit(root, tmp_path, "txn-record-written", 3)
    argv = [sys.executable, "-m", "filechannel", "--root", root, "consume", "a", "--from-beginning", "--timeout-ms", "500"]
    uncommitted = subprocess.run([*argv, "--isolation-level", "read_uncommitted"], capture_output=True, text=True, timeout=120)
    assert uncommitted.returncode == 0 and uncommitted.stdout == "", uncommitted.stderr  # nothing applied yet
    committed = subprocess.run([*argv, "--isolation-level", "read_committed"], capture_output=True, text=True, timeout=120)
    assert committed.returncode == 0, committed.stderr
    assert sorted(committed.stdout.split()) == ["a-0", "a-1", "a-2"]


def test_an_async_consume_transform_produce_loop_commits_its_offsets_with_its_records(root):
    with Producer(root) as plain:
        for i in range(6):
            plain.send("in", f"in{i}".encode(), partition=1)

    async def main():
        consumer = AsyncConsumer("in", root=root, group_id="ag", enable_auto_commit=False, auto_offset_reset="earliest")
        async with AsyncProducer(root, transactional_id="async-loop") as p:
            await p.start()
            batch: dict[TopicPartition, list[Any]] = {}
            while sum(len(rs) for rs in batch.values()) < 6:
                for tp, rs in (await consumer.getmany(timeout_ms=1000)).items():
                    batch.setdefault(tp, []).extend(rs)
            async with p.transaction():
                for rs in batch.values():
                    for r in rs:
                        await p.send("c", r.value.upper(), partition=0)
                await p.send_offsets_to_transaction(
                    {tp: rs[-1].offset + 1 for tp, rs in batch.items()}, consumer.group_metadata()
                )
        await consumer.stop()

    anyio.run(main)
    assert [r[3] for r in read_all(root, "c")] == [f"IN{i}".encode() for i in range(6)]
    with Consumer(root=root, group_id="ag", enable_auto_commit=False) as c:
        assert c.committed(TopicPartition("in", 1)) == 6


@pytest.mark.crash
@pytest.mark.parametrize("point, begun", [("txn-record-written", False), ("txn-partition-applied", True)])
def test_a_commit_record_whose_rename_a_machine_crash_lost_counts_only_if_its_apply_had_begun(root, tmp_path, point, begun):
    """The folder is not fsynced after the commit record's rename: after a machine crash its
    temp file may be there instead. Its records in a partition prove the rename happened."""
    points = tmp_path / "points"
    points.mkdir()
    (points / point).write_bytes(b"")
    env = {**os.environ, failpoints.ENV: str(points)}
    proc = subprocess.run([sys.executable, "-c", COMMITTER, root, "6"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == failpoints.EXIT_CODE, proc.stderr
    folder = os.path.join(root, TRANSACTIONS_DIR)
    os.rename(os.path.join(folder, "crashy.commit"), os.path.join(folder, "crashy.commit.99999999.1.tmp"))  # a lost rename
    transactional(root, "other").close()  # recovers
    assert [len(read_all(root, t)) for t in TOPICS] == ([6, 6, 6] if begun else [0, 0, 0])
    with Consumer(root=root, group_id="g", enable_auto_commit=False) as c:
        assert c.committed(TopicPartition("in", 0)) == (7 if begun else None)
    assert not [n for n in os.listdir(folder) if ".commit" in n]


def test_sends_from_several_threads_go_into_one_transaction(root):
    with transactional(root) as p:
        p.begin_transaction()
        futures: list = []

        def sender(i):
            futures.extend(p.send("a", f"{i}-{j}".encode(), partition=0) for j in range(250))

        threads = [threading.Thread(target=sender, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        p.commit_transaction()
    assert sorted(f.get(timeout=10).offset for f in futures) == list(range(1000))
    assert sorted(r[3] for r in read_all(root, "a")) == sorted(f"{i}-{j}".encode() for i in range(4) for j in range(250))


def test_a_commit_record_of_another_layout_is_a_corrupt_record_error_not_a_raw_one():
    rest = (5).to_bytes(4, "little") + b"{bad}"
    data = b"FCTX" + crc32c(rest).to_bytes(4, "little") + rest
    with pytest.raises(KafkaError, match="cannot be read"):
        CommitRecord.decode(data, "x")
