"""AsyncConsumer's rebalance listeners: ``async def`` methods are awaited (a seek made in
``on_partitions_assigned`` takes effect, a commit in ``on_partitions_revoked`` lands before
the partition is handed on); plain methods are called as they are. Either may call the
consumer's methods, from a rebalance in ``subscribe`` (on the loop) or in a fetch (in a
worker thread)."""

import time
from typing import Any

import anyio
import pytest

from filechannel.client import Admin, AsyncConsumer, Consumer, Producer, TopicPartition

SETTINGS: dict[str, Any] = {
    "group_id": "g",
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
    "heartbeat_interval_ms": 100,
}


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


class AsyncListener:
    """Seeks every assigned partition to offset 3; commits the positions on a revocation."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.events = []

    async def on_partitions_revoked(self, revoked):
        await anyio.sleep(0)  # a real await: only an awaited coroutine gets past it
        await self.consumer.commit()
        self.events.append(("revoked", sorted(tp.partition for tp in revoked)))

    async def on_partitions_assigned(self, assigned):
        await anyio.sleep(0)
        for tp in assigned:
            self.consumer.seek(tp, 3)
        self.events.append(("assigned", sorted(tp.partition for tp in assigned)))


class PlainListener(AsyncListener):
    """The same with plain methods (the commit through the consumer underneath: it is no coroutine)."""

    def on_partitions_revoked(self, revoked):
        self.consumer.consumer.commit()
        self.events.append(("revoked", sorted(tp.partition for tp in revoked)))

    def on_partitions_assigned(self, assigned):
        for tp in assigned:
            self.consumer.seek(tp, 3)
        self.events.append(("assigned", sorted(tp.partition for tp in assigned)))


async def read(consumer, count, other=None):
    """``count`` records as (partition, offset), polling ``other`` (a sync member) meanwhile."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + 60
    while len(got) < count and time.monotonic() < deadline:
        for tp, recs in (await consumer.getmany(timeout_ms=50)).items():
            got += [(tp.partition, r.offset) for r in recs]
        if other is not None:
            other.poll(timeout_ms=0)
    return got


@pytest.mark.anyio
@pytest.mark.parametrize("kind", [AsyncListener, PlainListener])
async def test_listeners_are_awaited_and_their_seeks_and_commits_take_effect(tmp_path, anyio_backend, kind):
    Admin(tmp_path).create_topic("t", 2)
    with Producer(tmp_path) as p:
        for i in range(20):
            p.send("t", b"%d" % i, partition=i % 2)
    a = AsyncConsumer(root=tmp_path, **SETTINGS)
    listener = kind(a)
    try:
        a.subscribe(["t"], listener=listener)  # a rebalance on the loop: the async listener is awaited before records
        got = await read(a, 14)
        assert sorted(got) == [(p, o) for p in (0, 1) for o in range(3, 10)]
        assert listener.events == [("assigned", [0, 1])]
        # A second member: a's next fetch revokes one partition (in a worker thread), committing first.
        b = Consumer(root=tmp_path, **SETTINGS)
        b.subscribe(["t"])
        deadline = time.monotonic() + 60
        while len(b.assignment()) < 1 and time.monotonic() < deadline:
            await a.getmany(timeout_ms=50)
            b.poll(timeout_ms=0)
        (moved,) = b.assignment()
        assert listener.events[1:] == [("revoked", [moved.partition])]
        assert b.committed(moved) == 10 and b.position(moved) == 10  # a's commit, made before b took it
        b.close()  # a takes it back in a fetch, and its listener seeks it to 3 again
        again = await read(a, 7)
        assert sorted(again) == [(moved.partition, o) for o in range(3, 10)]
        assert listener.events[2:] == [("assigned", [moved.partition])]
        assert a.assignment() == {TopicPartition("t", 0), TopicPartition("t", 1)}
    finally:
        await a.stop()
