"""Async producer and consumer under asyncio and trio."""

import asyncio
import inspect
import time

import anyio
import pytest

from filechannel.client import AsyncConsumer, AsyncConsumerRecord, AsyncProducer, TopicPartition, aio
from filechannel.client.aio import RecordDelivery
from filechannel.errors import RecordTypeError


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.mark.anyio
async def test_send_then_getone_and_getmany(tmp_path, anyio_backend):
    async with AsyncProducer(tmp_path) as producer:
        md = await (await producer.send("t", b"one", key=b"k"))  # aiokafka's two steps
        assert (md.topic, md.partition, md.offset) == ("t", 0, 0)
        await producer.send_and_wait("t", b"two")
        async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest") as consumer:
            first = await consumer.getone()
            assert (first.offset, first.key, first.value) == (0, b"k", b"one")
            batch = await consumer.getmany(timeout_ms=1000)
            assert [r.value for r in batch[TopicPartition("t", 0)]] == [b"two"]
            assert await consumer.getmany(timeout_ms=50) == {}


@pytest.mark.anyio
async def test_waiting_does_not_block_the_loop(tmp_path, anyio_backend):
    async with AsyncProducer(tmp_path) as producer:
        await producer.send("t", b"first")
        await producer.flush()  # in the file before "latest" is looked up (a send's future is done once buffered)
        async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="latest") as consumer:
            ticks = 0
            got: list[AsyncConsumerRecord] = []

            async def ticker():
                nonlocal ticks
                while not got:
                    ticks += 1
                    await anyio.sleep(0.01)

            async def late_send():
                # Once the loop has ticked ten times with getone waiting: counted, not timed (a
                # loaded machine may tick far less often than every 10 ms).
                while ticks < 10:
                    await anyio.sleep(0.01)
                await producer.send("t", b"late")
                await producer.flush()

            async def receive():
                got.append(await consumer.getone())

            start = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                tg.start_soon(late_send)
                tg.start_soon(receive)
            # The record sent after ten ticks of the loop came: the loop ran while getone waited
            # (a getone blocking it would wait for ever, ended by pytest-timeout).
            assert got[0].value == b"late" and ticks >= 10
            assert time.monotonic() - start < 10


@pytest.mark.anyio
async def test_async_for_and_cancellation(tmp_path, anyio_backend):
    async with AsyncProducer(tmp_path, fsync="always") as producer:
        for i in range(3):
            await producer.send("t", b"%d" % i)
    async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest") as consumer:
        seen = []
        async for rec in consumer:
            seen.append(rec.value)
            if len(seen) == 3:
                break
        assert seen == [b"0", b"1", b"2"]
        with anyio.move_on_after(0.2) as scope:
            await consumer.getone()
        assert scope.cancelled_caught


@pytest.mark.anyio
async def test_getmany_fetches_ahead_yet_positions_and_commits_cover_only_what_it_returned(tmp_path, anyio_backend):
    # A trip to the worker thread costs more than reading a few thousand small records, so a
    # fill fetches about a megabyte of a partition, as aiokafka's fetcher does; the records not
    # handed out wait, and neither the position nor a commit moves past them.
    tp = TopicPartition("t", 0)
    async with AsyncProducer(tmp_path) as producer:
        for i in range(6000):
            await producer.send("t", b"%099d" % i)
        await producer.flush()
    async with AsyncConsumer(
        "t", root=tmp_path, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False
    ) as consumer:
        fill, trips = consumer._fill, []
        consumer._fill = lambda *args: trips.append(args) or fill(*args)  # type: ignore[method-assign]
        got: list[AsyncConsumerRecord] = []
        for _ in range(30):
            got += (await consumer.getmany(timeout_ms=1000, max_records=100))[tp]
            assert await consumer.position(tp) == len(got)
        await consumer.commit()
        assert await consumer.committed(tp) == len(got) == 3000
        assert [r.value for r in got] == [b"%099d" % i for i in range(3000)]
        # One trip: its first fetch took what was asked (sizes unknown), and the fill went on to
        # a megabyte of 100 B records (all 6,000) once it had seen their sizes.
        assert len(trips) == 1
    async with AsyncConsumer("t", root=tmp_path, group_id="g", auto_offset_reset="earliest") as again:
        rest = (await again.getmany(timeout_ms=1000, max_records=6000))[tp]
        assert [r.offset for r in rest] == list(range(3000, 6000))


# -- send(topic, value) made in C: an awaitable already done, a coroutine to asyncio -------------


@pytest.mark.anyio
async def test_a_send_buffers_its_record_when_called_and_its_await_gives_the_future(tmp_path, anyio_backend):
    async with AsyncProducer(tmp_path) as producer:
        sends = [producer.send("t", b"%d" % i) for i in range(3)]  # buffered now, in call order
        deliveries = [await s for s in reversed(sends)]
        assert [(await d).offset for d in deliveries] == [2, 1, 0]
        with pytest.raises(RuntimeError, match="already awaited"):
            await sends[0]  # as a coroutine awaited twice
        keyed = producer.send("t", b"k", key=b"k")  # any other call: the async def, a coroutine
        assert inspect.iscoroutine(keyed)
        assert (await (await keyed)).offset == 3


@pytest.mark.anyio
async def test_a_sends_error_is_raised_by_its_await(tmp_path, anyio_backend):
    async with AsyncProducer(tmp_path) as producer:
        await producer.send_and_wait("t", b"first")  # the topic exists: the C path's route
        bad = producer.send("t", "not bytes")  # as an async def: nothing raised by the call
        with pytest.raises(RecordTypeError, match="must be bytes"):
            await bad
        assert (await producer.send_and_wait("t", b"next")).offset == 1  # nothing was written


@pytest.mark.anyio
async def test_an_fsync_always_send_gives_a_delivery_to_await(tmp_path, anyio_backend):
    async with AsyncProducer(tmp_path, fsync="always") as producer:
        delivery = await producer.send("t", b"durable")
        assert isinstance(delivery, RecordDelivery)
        assert (await delivery).offset == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_asyncio_takes_a_send_as_a_coroutine(tmp_path, anyio_backend):
    async with AsyncProducer(tmp_path) as producer:
        assert asyncio.iscoroutine(producer.send("t", b"0"))
        task = asyncio.create_task(producer.send("t", b"1"))
        assert (await (await task)).offset == 1
        gathered = await asyncio.gather(*[producer.send("t", b"%d" % i) for i in range(2, 6)])
        assert [(await d).offset for d in gathered] == [2, 3, 4, 5]
        closed = producer.send("t", b"6")
        closed.close()
        with pytest.raises(RuntimeError):
            await closed
        thrown = producer.send("t", b"7")
        with pytest.raises(ValueError, match="boom"):
            thrown.throw(ValueError("boom"))
        assert (await producer.send_and_wait("t", b"8")).offset == 8  # 6 and 7 were sent when called


@pytest.mark.anyio
async def test_without_the_c_build_send_is_the_async_def(tmp_path, anyio_backend, monkeypatch):
    monkeypatch.setattr(aio, "_CAsyncSend", None)
    async with AsyncProducer(tmp_path) as producer:
        first = producer.send("t", b"0")
        assert inspect.iscoroutine(first)
        assert (await (await first)).offset == 0
        assert [(await (await producer.send("t", b"%d" % i))).offset for i in range(1, 4)] == [1, 2, 3]
        with pytest.raises(RecordTypeError, match="must be bytes"):
            await producer.send("t", "not bytes")
