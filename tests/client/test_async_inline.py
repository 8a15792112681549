"""The async consumer reads records in memory on its event loop, and goes to its worker thread
for everything else (client/aio.py): no record lost, skipped or reordered either way; a
partition that needs the worker is not starved by others in memory; upkeep (auto-commit,
heartbeats) still happens while the loop reads."""

import time

import pytest

from filechannel import FileChannel
from filechannel.client import Admin, AsyncConsumer, Producer, TopicPartition, aio
from filechannel.client.fetcher import Fetcher
from filechannel.engine.cursor import WouldBlock

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.fixture
def trips(monkeypatch):
    """The worker trips (fills) every AsyncConsumer makes, counted; each still runs."""
    made = []
    fill = aio.AsyncConsumer._fill

    def counted(self, *args):
        made.append(args)
        return fill(self, *args)

    monkeypatch.setattr(aio.AsyncConsumer, "_fill", counted)
    return made


def produce(root, partition_values, **topic):
    Admin(root).create_topic("t", len(partition_values), exist_ok=True, fsync="never", **topic)
    with Producer(root) as p:
        for partition, values in enumerate(partition_values):
            for v in values:
                p.send("t", v, partition=partition)


def value(p, i, size=90):
    return b"%d-%06d-" % (p, i) + b"x" * (size - 10)


async def read_two_partitions(root, total):
    """The values of partitions 0 and 1 an AsyncConsumer from earliest hands out, 50 a call,
    until ``total`` of them."""
    got: dict[int, list[bytes | None]] = {0: [], 1: []}
    async with AsyncConsumer("t", root=root, auto_offset_reset="earliest", enable_auto_commit=False) as c:
        while len(got[0]) + len(got[1]) < total:
            for tp, recs in (await c.getmany(timeout_ms=1000, max_records=50)).items():
                got[tp.partition] += [r.value for r in recs]
    return got


@pytest.mark.anyio
async def test_a_consumer_tailing_a_producer_reads_on_the_loop_not_a_trip_a_batch(tmp_path, anyio_backend, trips, monkeypatch):
    # A trip for fairness comes once per _INLINE_SPAN: at 1 s, the trips counted below stay few
    # however slowly a loaded machine runs the 300 rounds (at 50 ms, rounds slowed to 4 s could
    # take 4 / 0.05 = 80 trips and fail the bound below though no batch made one).
    monkeypatch.setattr(aio, "_INLINE_SPAN", 1.0)
    Admin(tmp_path).create_topic("t", 1, fsync="never", compression="none")
    got, rounds = [], 300
    with Producer(tmp_path) as p:
        async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest", enable_auto_commit=False) as c:
            await c.getmany(timeout_ms=0)  # the first call's trip: positions
            start, before = time.monotonic(), len(trips)
            for r in range(rounds):
                for i in range(r * 50, r * 50 + 50):
                    p.send("t", value(0, i))
                p.flush()
                got += (await c.getmany(timeout_ms=1000)).get(TP0, [])
            elapsed = time.monotonic() - start
    assert [r.value for r in got] == [value(0, i) for i in range(rounds * 50)]
    # Each batch was read on the loop (it was just written: in the page cache); a worker trip
    # came once per _INLINE_SPAN at most. Before, every batch was a trip.
    assert len(trips) - before <= 1 + elapsed / aio._INLINE_SPAN
    assert len(trips) - before < rounds / 4


@pytest.mark.anyio
async def test_compressed_segments_come_from_the_worker_and_nothing_is_lost(tmp_path, anyio_backend, monkeypatch):
    # 2 x 6 MB of 1 KiB records, more than a worker's fill (8 MiB): the loop meets compressed
    # segments of partition 0 while partition 1 has raw records in memory.
    blocked = []
    fetch = Fetcher.fetch

    def spied(self, budget, only, nowait=False):
        try:
            return fetch(self, budget, only, nowait)
        except WouldBlock:
            blocked.append(budget)
            raise

    monkeypatch.setattr(Fetcher, "fetch", spied)
    values = [[value(p, i, 1024) for i in range(6000)] for p in (0, 1)]
    produce(tmp_path, [values[0], []], segment_bytes=256 * 1024, compression="zstd")
    with FileChannel(tmp_path / "t" / "0", maintenance_interval=0) as ch:
        ch.compress_sealed()  # what the producer's maintenance has not compressed yet
    assert len(list((tmp_path / "t" / "0").glob("*.seg.z"))) > 10
    with Producer(tmp_path) as p:
        for v in values[1]:
            p.send("t", v, partition=1)
    assert await read_two_partitions(tmp_path, 12_000) == {0: values[0], 1: values[1]}
    assert blocked  # the loop's reads met the compressed segments, and gave them to the worker


@pytest.mark.anyio
async def test_a_rolled_partition_is_not_starved_by_one_in_memory(tmp_path, anyio_backend, trips, monkeypatch):
    # Partition 1's reader sits at the end of a segment that then rolls: seeing the roll (a
    # stat of the next segment) is the worker's, while partition 0 always has records in memory.
    monkeypatch.setattr(aio, "_INLINE_SPAN", 0.005)
    produce(
        tmp_path,
        [[value(0, i) for i in range(100_000)], [value(1, i) for i in range(5)]],
        segment_bytes=64 * 1024,
        compression="none",
    )
    async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest", enable_auto_commit=False) as c:
        got: dict[int, list[int]] = {0: [], 1: []}

        async def step():
            for tp, recs in (await c.getmany(timeout_ms=1000, max_records=20)).items():
                got[tp.partition] += [r.offset for r in recs]

        while len(got[1]) < 5:
            await step()
        with Producer(tmp_path) as p:  # 1,000 records of 100 B: partition 1 rolls
            for i in range(5, 1005):
                p.send("t", value(1, i), partition=1)
        assert len(list((tmp_path / "t" / "1").glob("*.seg"))) > 1
        before = len(got[0])
        while len(got[1]) < 1005:
            await step()
            assert len(got[0]) < 100_000, "partition 1's rolled records waited for partition 0 to run dry"
        assert got[1] == list(range(1005))
        assert got[0] == list(range(len(got[0]))) and len(got[0]) > before


@pytest.mark.anyio
async def test_a_loop_reading_in_memory_still_auto_commits(tmp_path, anyio_backend):
    produce(tmp_path, [[value(0, i) for i in range(50_000)]], compression="none")
    async with AsyncConsumer("t", root=tmp_path, group_id="g", auto_offset_reset="earliest", auto_commit_interval_ms=20) as c:
        got = 0
        commits: list[int] = []  # the committed offsets seen, each past the one before
        deadline = time.monotonic() + 60
        # Until two commits past the start are seen, not for a fixed time: on a loaded machine one
        # call may take the whole of a short loop (this test once failed so, at 0.3 s).
        while len(commits) < 2 and time.monotonic() < deadline:
            for _ in range(10):  # reading in memory, 10 records a call
                got += len((await c.getmany(timeout_ms=1000, max_records=10)).get(TP0, []))
            committed = await c.committed(TP0)
            assert committed is None or committed <= got
            if committed and committed > (commits[-1] if commits else 0):
                commits.append(committed)
        # an auto-commit came due every 20 ms, and the loop's calls made them as it read
        assert len(commits) >= 2, (commits, got)


@pytest.mark.anyio
async def test_past_a_segment_end_the_worker_fetches_one_record_of_that_partition(tmp_path, anyio_backend, trips, monkeypatch):
    # Past the end of a segment the loop may not go (a seal to find, the next file to open):
    # a trip does that and fetches one record of the partition there, not a fill (values of
    # 64 KiB a worker read cost a page fault a page: DESIGN.md "Async consumer").
    monkeypatch.setattr(aio, "_INLINE_SPAN", 60.0)  # no trips for fairness here
    values = [[value(p, i, 4096) for i in range(400)] for p in (0, 1)]
    produce(tmp_path, values, segment_bytes=64 * 1024, compression="none")
    segments = [len(list((tmp_path / "t" / str(p)).glob("*.seg"))) for p in (0, 1)]
    assert min(segments) > 10
    assert await read_two_partitions(tmp_path, 800) == {0: values[0], 1: values[1]}
    # The first trip positions the consumer and fills (reading past a few segment ends);
    # every later one was a segment end the loop met: one record of that partition.
    first, *later = trips
    assert first[2:] != (1, False)
    assert later and all(args[2:] == (1, False) and len(args[0]) == 1 for args in later)
    ends = {p: sum(1 for args in later if TopicPartition("t", p) in args[0]) for p in (0, 1)}
    assert all(0 < ends[p] < segments[p] for p in (0, 1)), (ends, segments)


@pytest.mark.anyio
async def test_a_segment_end_seen_before_a_pause_makes_no_one_record_trip(tmp_path, anyio_backend, trips):
    # The loop's last read stopped at partition 0's segment end, then the user paused it: a
    # one-record fill of partition 0 would wait a whole step for nothing (paused partitions
    # are not fetched); the trip fetches the others instead.
    produce(tmp_path, [[value(0, i) for i in range(10)], [value(1, i) for i in range(10)]], compression="none")
    async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.pause(TP0)
        c._past_end = TP0  # as a loop's read at partition 0's segment end leaves it
        got = await c.getmany(timeout_ms=5000)
        assert [r.value for r in got[TP1]] == [value(1, i) for i in range(10)] and TP0 not in got
    assert trips and all(args[2:] != (1, False) for args in trips)
