"""The Kafka-like client under misuse and damage: nothing skipped, nothing half-written (issue 17)."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from filechannel.client import Admin, AsyncConsumer, Consumer, OffsetAndMetadata, Producer, TopicPartition
from filechannel.errors import (
    ChannelClosedError,
    ConfigError,
    FileChannelError,
    NoOffsetForPartitionError,
    RecordTypeError,
)

from ..cli_helpers import fc, fc_process

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
PROCS = Path(__file__).parent / "procs"


@pytest.fixture
def root(tmp_path):
    """Topic t: 30 records in partition 0, 5 in partition 1."""
    Admin(tmp_path).create_topic("t", 2)
    with Producer(tmp_path) as p:
        for i in range(30):
            p.send("t", b"v%d" % i, partition=0)
        for i in range(5):
            p.send("t", b"w%d" % i, partition=1)
    return tmp_path


def offsets_file(root, group="g"):
    return root / ".groups" / group / "offsets.json"


# -- iterating a Consumer ---------------------------------------------------------------------


def test_iterator_position_follows_each_yielded_record(root):
    with Consumer(root=root, max_poll_records=10, consumer_timeout_ms=300) as c:
        c.assign([TP0])
        c.seek(TP0, 0)
        seen = []
        for record in c:
            seen.append(record.offset)
            assert c.position(TP0) == record.offset + 1
    assert seen == list(range(30))


def test_break_then_iterate_or_poll_again_loses_and_repeats_nothing(root):
    with Consumer(root=root, max_poll_records=10, consumer_timeout_ms=300) as c:
        c.assign([TP0])
        c.seek(TP0, 0)
        seen = []
        for record in c:
            seen.append(record.offset)
            if len(seen) == 3:
                break
        assert c.position(TP0) == 3
        batch = c.poll(timeout_ms=500)
        assert [r.offset for r in batch[TP0]] == list(range(3, 10))  # the rest of the fetched batch first
        seen += [r.offset for r in batch[TP0]]
        for record in c:
            seen.append(record.offset)
            if len(seen) == 14:
                break
        seen += [r.offset for r in c]
    assert seen == list(range(30))


def test_close_commits_only_what_the_loop_received(root):
    c = Consumer("t", root=root, group_id="g", auto_offset_reset="earliest", max_poll_records=10)
    taken = []
    for record in c:
        taken.append(record)
        if len(taken) == 4:
            break
    c.close()
    with Consumer(root=root, group_id="g", enable_auto_commit=False) as d:
        committed = {tp: d.committed(tp) for tp in (TP0, TP1)}
    last = {r.partition: r.offset for r in taken}
    for p, tp in ((0, TP0), (1, TP1)):
        assert committed[tp] == last.get(p, -1) + 1  # a partition not read yet: its position, 0


def test_commit_then_resume_in_a_second_process_skips_nothing(tmp_path):
    Admin(tmp_path).create_topic("r", 2)
    with Producer(tmp_path) as p:
        for i in range(200):
            p.send("r", b"%d" % i, partition=i % 2)
    first = []
    c = Consumer("r", root=tmp_path, group_id="g", auto_offset_reset="earliest", auto_commit_interval_ms=1, max_poll_records=25)
    for record in c:
        first.append((record.partition, record.offset))
        if len(first) == 130:
            break
    c.close()
    proc = subprocess.run(
        [sys.executable, str(PROCS / "robust_resume.py"), str(tmp_path), "g", "r"],
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode().splitlines()
    second = [(int(p), int(o)) for _, p, o in (line.split() for line in lines if line.startswith("R "))]
    delivered = first + second
    assert sorted(set(delivered)) == [(p, o) for p in (0, 1) for o in range(100)]  # none skipped
    assert len(delivered) == 200  # close committed exactly what was handed out: none twice either
    starts = dict(item.split(":") for item in lines[0].split()[1:])
    for part in (0, 1):
        assert int(starts[str(part)]) == max([o + 1 for q, o in first if q == part], default=0)


# -- AsyncConsumer with a partition filter ----------------------------------------------------


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.mark.anyio
async def test_getmany_of_one_partition_keeps_the_others(root, anyio_backend):
    async with AsyncConsumer(root=root, max_poll_records=4) as ac:
        ac.consumer.assign([TP0, TP1])
        ac.consumer.seek_to_beginning()
        got = await ac.getmany(TP0, timeout_ms=1000)
        assert list(got) == [TP0] and [r.offset for r in got[TP0]] == [0, 1, 2, 3]
        assert ac.consumer.position(TP1) == 0
        one = await ac.getone(TP1)
        assert (one.partition, one.offset) == (1, 0)
        assert ac.consumer.position(TP1) == 1 and ac.consumer.position(TP0) == 4
        # the rest of what getone read ahead first, in order (how much it read ahead, a worker's
        # fetch or max_poll_records read in memory on the loop, is not promised)
        rest = await ac.getmany(TP1, timeout_ms=1000)
        tp1 = [r.offset for r in rest[TP1]]
        assert tp1 == list(range(1, 1 + len(tp1))) and 1 <= len(tp1) <= 4
        everything = {0: [], 1: tp1}
        while batch := await ac.getmany(timeout_ms=200):
            for tp, recs in batch.items():
                everything[tp.partition] += [r.offset for r in recs]
        assert everything == {0: list(range(4, 30)), 1: [1, 2, 3, 4]}


@pytest.mark.anyio
async def test_waiting_getmany_leaves_the_loop_free_and_cancellation_loses_nothing(root, anyio_backend):
    async with AsyncConsumer(root=root, max_poll_records=100) as ac:
        ac.consumer.assign([TP0])
        ac.consumer.seek_to_end()
        ticks = 0
        done = anyio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            assert await ac.getmany(timeout_ms=400) == {}
            done.set()
        # the ticker ran while getmany waited: a blocked loop gives 1; 40 on a quiet machine, and a
        # loaded one may wake a 10 ms sleep late, so a few more than 1 is the claim
        assert ticks >= 3

        with anyio.move_on_after(0.2) as scope:
            await ac.getmany(timeout_ms=60_000)
        assert scope.cancelled_caught
        with Producer(root) as p:
            for i in range(3):
                p.send("t", b"late%d" % i, partition=0)
        # The cancelled call's worker may still fetch these; they stay pending, never lost.
        got: list[bytes | None] = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            batch = await ac.getmany(timeout_ms=500)
            got += [r.value for r in batch.get(TP0, [])]
        assert got == [b"late0", b"late1", b"late2"]


@pytest.mark.anyio
async def test_async_iteration_ends_at_close(root, anyio_backend):
    ac = AsyncConsumer("t", root=root, auto_offset_reset="earliest")
    assert (await ac.__anext__()).offset == 0
    await ac.stop()
    with pytest.raises(StopAsyncIteration):
        await ac.__anext__()
    with pytest.raises(ChannelClosedError):
        await ac.getmany()


@pytest.mark.anyio
async def test_async_rejects_a_nan_timeout(root, anyio_backend):
    async with AsyncConsumer("t", root=root) as ac:
        with pytest.raises(ConfigError, match="timeout_ms"):
            await ac.getmany(timeout_ms=math.nan)


# -- auto_offset_reset="none" -----------------------------------------------------------------


def test_reset_none_builds_and_seeks_first(root):
    with Consumer("t", root=root, group_id="g", auto_offset_reset="none", enable_auto_commit=False) as c:
        assert c.assignment() == {TP0, TP1}
        with pytest.raises(NoOffsetForPartitionError):
            c.position(TP0)
        with pytest.raises(NoOffsetForPartitionError, match="seek"):
            c.poll(timeout_ms=0)
        c.seek(TP0, 28)
        c.pause(TP1)  # a paused partition is not fetched, so its missing position does not matter
        assert [r.offset for r in c.poll(timeout_ms=500)[TP0]] == [28, 29]
        c.resume(TP1)
        c.seek_to_beginning(TP1)
        assert [r.offset for r in c.poll(timeout_ms=500)[TP1]] == [0, 1, 2, 3, 4]
        c.commit()
    with Consumer(root=root, group_id="g", auto_offset_reset="none") as c:
        c.assign([TP0])  # has a committed offset now: no error
        assert c.position(TP0) == 30


# -- rejected calls leave nothing behind ------------------------------------------------------


@pytest.mark.parametrize("bad", [2**70, 2**63, -5, "3", 3.0, True, 31, OffsetAndMetadata(2**70, "")])
def test_a_rejected_commit_writes_nothing(root, bad):
    with Consumer("t", root=root, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.commit({TP0: 7})
        before = offsets_file(root).read_bytes()
        with pytest.raises(ConfigError, match=r"t\[0\]"):
            c.commit({TP1: 2, TP0: bad})
        assert offsets_file(root).read_bytes() == before
        assert c.committed(TP0) == 7 and c.committed(TP1) is None
    with Consumer("t", root=root, group_id="g") as d:  # a later member polls normally
        assert [r.offset for r in d.poll(timeout_ms=500).get(TP0, [])][:1] == [7]


@pytest.mark.parametrize("bad", [2**63, 2**70, -1, "3", None])
def test_a_rejected_seek_keeps_the_position(root, bad):
    with Consumer(root=root) as c:
        c.assign([TP0])
        c.seek(TP0, 5)
        with pytest.raises(ConfigError, match="offset"):
            c.seek(TP0, bad)
        assert c.position(TP0) == 5


@pytest.mark.parametrize("bad", [math.nan, -1, "1"])
def test_poll_rejects_a_bad_timeout(root, bad):
    with Consumer("t", root=root) as c, pytest.raises(ConfigError, match="timeout_ms"):
        c.poll(timeout_ms=bad)


@pytest.mark.parametrize("field", ["key", "value"])
@pytest.mark.parametrize("bad", ["text", 42])
def test_producer_names_the_serializer_for_non_bytes(tmp_path, field, bad):
    with Producer(tmp_path) as p:
        with pytest.raises(RecordTypeError, match=f"{field}_serializer"):
            p.send("t", **{"value": b"v", field: bad})
        assert p.send("t", b"ok", key=b"k").result().offset == 0  # nothing was left half-sent
    with Producer(tmp_path, key_serializer=str.encode, value_serializer=str.encode) as p:
        assert p.send("t", "v", key="k").result().offset == 1


# -- damaged topic and group files ------------------------------------------------------------


def test_a_lost_topic_json_is_an_error_never_a_new_topic(tmp_path):
    Admin(tmp_path).create_topic("t", 3, retention_ms=3_600_000)
    with Producer(tmp_path) as p:
        for i in range(300):
            p.send("t", b"%d" % i, partition=i % 3)
    (tmp_path / "t" / "topic.json").unlink()
    for attempt in (
        lambda: Producer(tmp_path).send("t", b"x"),
        lambda: Consumer("t", root=tmp_path),
        lambda: Admin(tmp_path).describe_topic("t"),
    ):
        with pytest.raises(ConfigError, match=r"no topic\.json.*--partitions 3"):
            attempt()
    assert not (tmp_path / "t" / "topic.json").exists()
    with pytest.raises(ConfigError, match="at least 3 partitions"):
        Admin(tmp_path).create_topic("t", 2)
    Admin(tmp_path).create_topic("t", 3, retention_ms=3_600_000)  # the repair the error names
    with Consumer("t", root=tmp_path, auto_offset_reset="earliest", consumer_timeout_ms=300) as c:
        assert sorted(int(r.value) for r in c) == list(range(300))


@pytest.mark.parametrize("damage", ["delete", "empty", "garbage", "wrong types"])
def test_damaged_group_offsets_fall_back_to_durable_positions(root, damage):
    with Consumer("t", root=root, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.poll(timeout_ms=500)
        c.commit({TP0: 12, TP1: 3})
    path = offsets_file(root)
    if damage == "delete":
        path.unlink()
    else:
        path.write_bytes({"empty": b"", "garbage": b"{not json", "wrong types": b'{"t/0": "x", "t/1": [1]}'}[damage])
    with Consumer("t", root=root, group_id="g", auto_offset_reset="latest", enable_auto_commit=False) as c:
        assert (c.committed(TP0), c.committed(TP1)) == (12, 3)
        assert (c.position(TP0), c.position(TP1)) == (12, 3)
        c.commit({TP0: 13})
    assert json.loads(path.read_bytes()) == {"t/0": 13}
    with Consumer("t", root=root, group_id="g", enable_auto_commit=False) as c:
        assert (c.committed(TP0), c.committed(TP1)) == (13, 3)


def test_group_temp_files_of_a_dead_writer_are_removed_on_open(root):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    pid = int(dead.stdout)  # a process that has exited: nothing of it is writing
    folder = root / ".groups" / "g"
    folder.mkdir(parents=True)
    left = [folder / f"offsets.json.{pid}.tmp", folder / f"state.json.{pid}.140000.tmp"]
    for path in left:
        path.write_bytes(b"{half")
    mine = folder / f"offsets.json.{os.getpid()}.1.tmp"  # this process's: maybe being written, kept
    mine.write_bytes(b"{")
    with Consumer(root=root, group_id="g"):  # no subscription: opening the group is enough
        assert not any(path.exists() for path in left)
        assert mine.exists()
    mine.unlink()


# -- the CLI ----------------------------------------------------------------------------------


def cli(root, *args, input=None):
    return fc(root, *args, input=input, check=False)


@pytest.mark.parametrize(
    "args",
    [
        ["consume", "t", "--from", "²"],
        ["consume", "t", "--from", "0001-01-01"],
        ["consume", "t", "--from", "99999999999999999999999"],
        ["consume", "t", "--from", "1e3"],
        ["consume", "nope"],
        ["produce", "t", "--partition", "7"],
    ],
)
def test_cli_bad_input_is_one_line_without_traceback(root, args):
    proc = cli(root, *args, input=b"x\n")
    err = proc.stderr.decode()
    assert proc.returncode != 0
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_cli_non_utf8_key_separator_and_corrupt_offsets(root):
    proc = cli(root, "produce", "t", "--partition", "1", "-k", os.fsdecode(b"\xff"), input=b"k\xffv\n")
    assert proc.returncode == 0, proc.stderr.decode()
    assert "Traceback" not in proc.stderr.decode()
    with Consumer(root=root) as c:
        c.assign([TP1])
        c.seek(TP1, 5)
        (rec,) = c.poll(timeout_ms=500)[TP1]
        assert (rec.key, rec.value) == (b"k", b"v")
    proc = cli(root, "consume", "t", "--group", "g", "--max", "2", "--from-beginning")
    assert proc.returncode == 0, proc.stderr.decode()
    offsets_file(root).write_bytes(b"{corrupt")
    for args in (["groups", "describe", "g"], ["consume", "t", "--group", "g", "--max", "1", "--from-beginning"]):
        proc = fc_process(root, *args)  # (a process warns once about a file: each command its own)
        err = proc.stderr.decode()
        assert proc.returncode == 0 and "Traceback" not in err, err
        # one warning line (consume also prints Kafka's "Processed a total of N messages")
        assert [line for line in err.splitlines() if "offsets.json" in line] == err.splitlines()[:1], err
    (root / ".groups" / "g" / "state.json").write_bytes(b"\x00garbage")
    proc = cli(root, "groups", "describe", "g")
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in err and "state.json" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_rejected_subscribe_assign_and_lookups_change_nothing(root):
    with Consumer("t", root=root, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        with pytest.raises(FileChannelError, match="nope"):
            c.subscribe(["t", "nope!"])  # a missing topic is read once created (kafka-python); a bad name is refused
        with pytest.raises(ConfigError, match="regular expression"):
            c.subscribe(pattern="[")
        assert c.subscription() == {"t"} and c.assignment() == {TP0, TP1}
        for bad in (("t",), ("t", "x"), 5, "tt", ("t", -1)):
            with pytest.raises(ConfigError, match="TopicPartition"):
                c.assign([bad])  # type: ignore[list-item]
            with pytest.raises(ConfigError, match="TopicPartition"):
                c.offsets_for_times({bad: 0})  # type: ignore[dict-item]
        for ts in (2**63, -1, "x", None, 1.5):
            with pytest.raises(ConfigError, match="timestamp"):
                c.offsets_for_times({TP0: ts})  # type: ignore[dict-item]
        with pytest.raises(ConfigError):
            c.pause(TP0, ("t", 9))  # type: ignore[arg-type]
        assert c.paused() == set()
        assert [r.offset for r in c.poll(timeout_ms=500).get(TP0, [])][:1] == [0]


def test_a_failed_constructor_leaves_no_group_member(root):
    with pytest.raises(FileChannelError, match="nope"):
        Consumer("t", "nope!", root=root, group_id="g")
    members = root / ".groups" / "g" / "members"
    assert list(members.iterdir()) == []
    state = root / ".groups" / "g" / "state.json"
    assert not state.exists() or json.loads(state.read_bytes())["members"] == {}


# -- the Spark sink's staging -----------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_staging_file_is_a_sink_error_naming_it(tmp_path, damage):
    import pyarrow as pa

    from filechannel.spark.errors import SinkError
    from filechannel.spark.sink import FileChannelWriter, SinkSpec

    writer = FileChannelWriter(SinkSpec(str(tmp_path), "t", None, ["value"]))
    batch = pa.record_batch([pa.array([b"a", b"b", b"c"], pa.binary())], names=["value"])
    staged = writer.write(iter([batch]))  # what a task does
    assert staged.path is not None
    path = Path(staged.path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\0" * len(data))
    with pytest.raises(SinkError, match=str(path)):
        writer.commit([staged])  # what the driver does
    assert not path.exists()  # discarded, as after any commit
    assert "t" not in Admin(tmp_path).list_topics()  # and nothing was appended


def test_a_poll_that_raises_loses_no_record(root):
    def picky(value):
        if value == b"v3":
            raise ValueError("cannot read v3")
        return value

    with Consumer(root=root, value_deserializer=picky, max_poll_records=100) as c:
        c.assign([TP0, TP1])
        c.seek_to_beginning()
        with pytest.raises(ValueError, match="v3"):
            c.poll(timeout_ms=500)  # partition 1's records may have been taken first: they stay
        assert (c.position(TP0), c.position(TP1)) == (0, 0)
        c.fetcher.value_deserializer = None  # the user fixes the deserializer
        got: dict[int, list[int]] = {0: [], 1: []}
        while batch := c.poll(timeout_ms=200):
            for tp, recs in batch.items():
                got[tp.partition] += [r.offset for r in recs]
        assert got == {0: list(range(30)), 1: list(range(5))}
    with Consumer(root=root, auto_offset_reset="none", max_poll_records=100) as c:
        c.assign([TP0, TP1])
        for _ in range(2):  # whichever partition the rotation takes first
            c.seek(TP1, 2)
            with pytest.raises(NoOffsetForPartitionError):
                c.poll(timeout_ms=0)
            assert c.position(TP1) == 2
        c.seek(TP0, 29)
        batch = c.poll(timeout_ms=500)
        assert [r.offset for r in batch[TP1]] == [2, 3, 4] and [r.offset for r in batch[TP0]] == [29]


def test_deleting_a_topic_is_atomic_and_works_without_topic_json(tmp_path):
    admin = Admin(tmp_path)
    admin.create_topic("t", 2)
    with Producer(tmp_path) as p:
        p.send("t", b"x", partition=1)
    (tmp_path / "t" / "topic.json").unlink()
    left = tmp_path / ".deleted.old.0123"  # what a delete killed half-way leaves
    (left / "0").mkdir(parents=True)
    admin.delete_topic("t")
    assert sorted(os.listdir(tmp_path)) == [".topics.lock"]
    admin.create_topic("t", 1)
    assert admin.describe_topic("t").partitions[0].end_offset == 0


@pytest.mark.parametrize(
    "kwargs", [{"linger_ms": math.inf}, {"linger_ms": math.nan}, {"linger_ms": -1}, {"consumer_timeout_ms": math.nan}]
)
def test_nan_and_inf_durations_are_refused(root, kwargs):
    cls = Consumer if "consumer_timeout_ms" in kwargs else Producer
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        cls(root=root, **kwargs) if cls is Consumer else cls(root, **kwargs)


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"name": "t", "partitions": 1, "config": {}}', 'set "partitions" to 3'),  # an older version's re-creation
        (b'{"name": "t", "partitions": -1}', "not an int from 1"),
        (b'{"name": "t", "partitions": 3, "config": []}', "config is not an object"),
        (b"[3]", "not a valid topic description"),
    ],
)
def test_a_wrong_topic_json_is_an_error_naming_it(tmp_path, content, message):
    Admin(tmp_path).create_topic("t", 3)
    (tmp_path / "t" / "topic.json").write_bytes(content)
    with pytest.raises(ConfigError, match=message) as caught:
        Producer(tmp_path).send("t", b"x")
    assert "topic.json" in str(caught.value)


@pytest.mark.parametrize(
    "kwargs", [{"partition": 2}, {"partition": -1}, {"partition": "0"}, {"timestamp_ms": "now"}, {"value": "text"}]
)
def test_a_rejected_send_creates_no_topic(tmp_path, kwargs):
    with Producer(tmp_path) as p:
        with pytest.raises(FileChannelError):
            p.send("fresh", **{"value": b"v", **kwargs})
        assert Admin(tmp_path).list_topics() == [] and not (tmp_path / "fresh").exists()
        assert p.send("fresh", b"v", partition=0).result().offset == 0


@pytest.mark.anyio
async def test_async_fetching_runs_off_the_event_loop_thread(root, anyio_backend):
    import threading

    fetch_threads = set()

    def deserializer(value):  # runs where the records are read and decoded
        fetch_threads.add(threading.get_ident())
        return value

    async with AsyncConsumer("t", root=root, group_id="g", auto_offset_reset="earliest", value_deserializer=deserializer) as ac:
        assert (await ac.getone()).value in (b"v0", b"w0")
        batch = await ac.getmany(timeout_ms=1000)
        assert batch
        await ac.commit()
    assert fetch_threads and threading.get_ident() not in fetch_threads
