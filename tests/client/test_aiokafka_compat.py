"""aiokafka's producer and consumer surface, as its documentation's examples use it.

Ported from aiokafka's README and docs (producer.rst: send, send_and_wait, batches;
consumer.rst: manual commits, seek_to_committed, positions) with ``root=`` instead of
``bootstrap_servers``; run under asyncio and trio.
"""

from __future__ import annotations

import threading

import anyio
import pytest

from filechannel.client import (
    Admin,
    AsyncConsumer,
    AsyncConsumerRecord,
    AsyncProducer,
    OffsetAndTimestamp,
    RecordMetadata,
    TopicPartition,
)
from filechannel.errors import ChannelClosedError, MessageTooLargeError, RecordTypeError

TP0 = TopicPartition("t", 0)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.mark.anyio
@pytest.mark.parametrize("fsync", ["never", "always"])
async def test_send_is_two_steps_and_send_and_wait_one(tmp_path, anyio_backend, fsync):
    Admin(tmp_path).create_topic("t", 2, fsync=fsync)
    producer = AsyncProducer(tmp_path, loop=None, max_batch_size=16384)  # aiokafka's own names
    await producer.start()
    try:
        delivery = await producer.send("t", b"Super message")
        md = await delivery
        assert isinstance(md, RecordMetadata) and md.topic_partition == (md.topic, md.partition)
        assert (md.timestamp_type, md.log_start_offset) == (0, -1)
        assert await delivery == md  # awaitable again
        # aiokafka's positional order: topic, value, key, partition, timestamp_ms, headers
        md2 = await producer.send_and_wait("t", b"v", b"k", 1, 1234, [("h", b"x")])
        assert (md2.partition, md2.timestamp, md2.serialized_key_size, md2.serialized_header_size) == (1, 1234, 1, 2)
        deliveries = [await producer.send("t", b"%d" % i, partition=0) for i in range(10)]
        offsets = []
        for d in deliveries:
            offsets.append((await d).offset)
        assert offsets == list(range(1, 11))
        assert deliveries[-1].done() and deliveries[-1].result().offset == 10
    finally:
        await producer.stop()


@pytest.mark.anyio
async def test_a_delivery_known_at_send_behaves_as_any_other(tmp_path, anyio_backend):
    # One partition, fsync "never": the producer's short path, whose done future is the
    # delivery itself (no wrapper). Awaited once or twice, asked done/result/exception,
    # gathered: the same as a wrapped delivery, and the metadata is what was written.
    Admin(tmp_path).create_topic("t", fsync="never")
    async with AsyncProducer(tmp_path) as producer:
        deliveries = [await producer.send("t", b"%d" % i) for i in range(5)]
        # The first send to a topic finds its route; the next ones take the short path.
        assert [type(d).__name__ for d in deliveries] == ["RecordDelivery"] + ["SentFuture"] * 4
        first = await deliveries[0]
        assert (first.topic, first.partition, first.offset, first.serialized_value_size) == ("t", 0, 0, 1)
        second = await deliveries[1]
        assert (second.offset, second.timestamp_type, second.serialized_key_size) == (1, 0, -1)
        assert await deliveries[1] == second == deliveries[1].result() and await deliveries[0] == first
        assert deliveries[4].done() and deliveries[4].exception() is None
        if anyio_backend == "asyncio":
            import asyncio

            metas = await asyncio.gather(*deliveries)
        else:
            metas = [await d for d in deliveries]
        assert [m.offset for m in metas] == list(range(5))
        wrapped = await producer.send("t", b"k", key=b"k")  # not the short path: a wrapped one, same answers
        assert (await wrapped).offset == 5 and wrapped.done() and wrapped.result().offset == 5
    async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest") as consumer:
        got = (await consumer.getmany(timeout_ms=1000))[TP0]
    assert [(r.offset, r.value) for r in got] == [(i, b"%d" % i) for i in range(5)] + [(5, b"k")]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_asyncio_gather_awaits_deliveries(tmp_path, anyio_backend):
    import asyncio

    Admin(tmp_path).create_topic("t", fsync="always")
    async with AsyncProducer(tmp_path) as producer:
        deliveries = [await producer.send("t", b"%d" % i) for i in range(20)]
        metas = await asyncio.gather(*deliveries)
    assert [m.offset for m in metas] == list(range(20))


@pytest.mark.anyio
@pytest.mark.parametrize("fsync", ["never", "always"])
async def test_a_too_large_record_fails_its_delivery(tmp_path, anyio_backend, fsync):
    Admin(tmp_path).create_topic("t", fsync=fsync, max_record_bytes=1024)
    async with AsyncProducer(tmp_path) as producer:
        delivery = await producer.send("t", b"x" * 2000)
        with pytest.raises(MessageTooLargeError):
            await delivery
        with pytest.raises(MessageTooLargeError):
            await producer.send_and_wait("t", b"x" * 2000)


@pytest.mark.anyio
async def test_batches_as_in_aiokafkas_documentation(tmp_path, anyio_backend):
    Admin(tmp_path).create_topic("t", 3)
    async with AsyncProducer(tmp_path, max_batch_size=100) as producer:
        partitions = await producer.partitions_for("t")
        assert partitions == {0, 1, 2}
        batch = producer.create_batch()
        sent = []
        i = 0
        while i < 10:
            metadata = batch.append(key=None, value=b"msg %016d" % i, timestamp=None)
            if metadata is None:  # full: send it and start another
                assert batch.record_count() > 0 and batch.size() <= 100
                sent.append(await producer.send_batch(batch, "t", partition=2))
                batch = producer.create_batch()
                continue
            assert metadata.offset == batch.record_count() - 1
            i += 1
        sent.append(await producer.send_batch(batch, "t", partition=2))
        firsts = [(await d).offset for d in sent]
        assert len(sent) > 1 and firsts[0] == 0 and firsts == sorted(firsts)
        assert batch.append(key=None, value=b"late", timestamp=None) is None  # sent batches are closed
    async with AsyncConsumer(root=tmp_path, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("t", 2)])
        batch_of = await consumer.getmany(timeout_ms=1000, max_records=100)
        assert [r.value for r in batch_of[TopicPartition("t", 2)]] == [b"msg %016d" % i for i in range(10)]


@pytest.mark.anyio
async def test_a_batch_holds_bytes_and_forgoes_the_producers_serializers(tmp_path, anyio_backend):
    """aiokafka: create_batch()/send_batch() forgo "the niceties of automatic serialization";
    a producer with serializers sends a batch's bytes as they are (they were serialized twice)."""
    Admin(tmp_path).create_topic("t")
    async with AsyncProducer(tmp_path, value_serializer=str.encode, key_serializer=str.encode) as producer:
        await producer.send_and_wait("t", "by send", key="k")  # send serializes
        batch = producer.create_batch()
        assert batch.append(key=b"k", value=b"raw bytes", timestamp=None) is not None
        await (await producer.send_batch(batch, "t", partition=0))
        refused = producer.create_batch()
        refused.append(key=None, value="a str", timestamp=None)
        with pytest.raises(RecordTypeError):
            await producer.send_batch(refused, "t", partition=0)
    async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest") as consumer:
        got = (await consumer.getmany(timeout_ms=1000))[TopicPartition("t", 0)]
    assert [(r.key, r.value) for r in got] == [(b"k", b"by send"), (b"k", b"raw bytes")]


@pytest.mark.anyio
async def test_consumer_surface_awaitable_where_aiokafkas_is(tmp_path, anyio_backend):
    Admin(tmp_path).create_topic("t", 2)
    async with AsyncProducer(tmp_path) as producer:
        for i in range(5):
            await producer.send_and_wait("t", b"v%d" % i, partition=0, timestamp_ms=1000 + i)
    consumer = AsyncConsumer(
        root=tmp_path,
        group_id="g",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        loop=None,
        group_instance_id="i-1",
        rebalance_timeout_ms=1000,
        max_poll_records=None,
    )
    await consumer.start()
    try:
        consumer.subscribe(["t"])
        assert consumer.subscription() == {"t"}
        assert consumer.assignment() == {TP0, TopicPartition("t", 1)}
        assert await consumer.topics() == {"t"}
        assert consumer.partitions_for_topic("t") == {0, 1}
        msg = await consumer.getone(TP0)
        assert (msg.offset, msg.timestamp_type, msg.checksum, msg.serialized_key_size) == (0, 0, None, -1)
        # aiokafka's manual commit example: commit the next offset to read
        await consumer.commit({TopicPartition(msg.topic, msg.partition): msg.offset + 1})
        assert await consumer.committed(TP0) == 1
        assert await consumer.position(TP0) == 1
        assert consumer.highwater(TP0) == 5 and consumer.last_stable_offset(TP0) == 5
        assert await consumer.beginning_offsets([TP0]) == {TP0: 0}
        assert await consumer.end_offsets([TP0]) == {TP0: 5}
        assert await consumer.offsets_for_times({TP0: 1003}) == {TP0: OffsetAndTimestamp(3, 1003)}
        await consumer.seek_to_end(TP0)
        assert await consumer.position(TP0) == 5
        assert await consumer.seek_to_committed(TP0) == {TP0: 1}
        assert await consumer.position(TP0) == 1
        await consumer.seek_to_beginning()
        assert await consumer.position(TP0) == 0
        consumer.seek(TP0, 3)
        consumer.pause(TP0)
        assert consumer.paused() == {TP0}
        assert await consumer.getmany(timeout_ms=50) == {}
        consumer.resume(TP0)
        assert [r.offset for r in (await consumer.getmany(timeout_ms=1000))[TP0]] == [3, 4]
        consumer.unsubscribe()
        assert consumer.assignment() == set()
        consumer.assign([TP0])
        assert consumer.assignment() == {TP0}
    finally:
        await consumer.stop()
    with pytest.raises(ChannelClosedError):
        await consumer.position(TP0)


@pytest.mark.anyio
async def test_awaitable_consumer_calls_run_off_the_event_loop_thread(tmp_path, anyio_backend):
    Admin(tmp_path).create_topic("t")
    async with AsyncConsumer("t", root=tmp_path, group_id="g") as consumer:
        loop_thread = threading.current_thread()
        seen: list[threading.Thread] = []
        real = consumer.consumer.committed

        def spy(*args, **kwargs):
            seen.append(threading.current_thread())
            return real(*args, **kwargs)

        consumer.consumer.committed = spy  # type: ignore[method-assign]
        assert await consumer.committed(TP0) is None
        assert await consumer.seek_to_committed() == {TP0: None}
        assert len(seen) == 2 and all(t is not loop_thread for t in seen)


@pytest.mark.anyio
async def test_async_for_yields_aiokafka_shaped_records(tmp_path, anyio_backend):
    async with AsyncProducer(tmp_path) as producer:
        await producer.send_and_wait("t", b"abc", key=b"k", headers=[("h", b"1")])
    async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest") as consumer:
        with anyio.fail_after(10):
            got = []
            async for msg in consumer:
                got.append(msg)
                break
    (msg,) = got
    assert type(msg) is AsyncConsumerRecord
    assert (msg.topic, msg.partition, msg.offset, msg.key, msg.value) == ("t", 0, 0, b"k", b"abc")
    assert (msg.serialized_key_size, msg.serialized_value_size, msg.headers) == (1, 3, (("h", b"1"),))
    assert type(msg.headers) is tuple  # aiokafka's fetcher: tuple(record.headers)


# aiokafka's aiokafka/structs.py: the ConsumerRecord dataclass's fields, in this order.
AIOKAFKA_CONSUMER_RECORD_FIELDS = (
    "topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value",
    "checksum", "serialized_key_size", "serialized_value_size", "headers",
)  # fmt: skip


@pytest.mark.anyio
async def test_consumer_record_is_aiokafkas_positionally(tmp_path, anyio_backend):
    assert AsyncConsumerRecord._fields == AIOKAFKA_CONSUMER_RECORD_FIELDS
    # Built by keyword as aiokafka's tests/test_fetcher.py builds one, and positionally as its fetcher does.
    by_name = AsyncConsumerRecord(
        topic="t", partition=0, offset=0, timestamp=7, timestamp_type=0, key=None, value=b"v",
        checksum=None, serialized_key_size=-1, serialized_value_size=1, headers=(),
    )  # fmt: skip
    assert by_name == AsyncConsumerRecord("t", 0, 0, 7, 0, None, b"v", None, -1, 1, ())
    async with AsyncProducer(tmp_path) as producer:
        await producer.send_and_wait("t", b"v", timestamp_ms=7)
    async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest") as consumer:
        with anyio.fail_after(10):
            msg = await consumer.getone()
    assert msg == by_name and msg.headers == ()
    async with AsyncConsumer(
        "t", root=tmp_path, auto_offset_reset="earliest", value_deserializer=bytes.decode, key_deserializer=bytes.decode
    ) as consumer:
        with anyio.fail_after(10):
            msg = await consumer.getone()
    assert type(msg) is AsyncConsumerRecord and msg == by_name._replace(value="v")  # sizes: of the stored bytes


@pytest.mark.anyio
async def test_a_tombstone_as_aiokafka_sends_it(tmp_path, anyio_backend):
    async with AsyncProducer(tmp_path) as producer:
        md = await producer.send_and_wait("t", None, b"deleted-key")  # value None, key required: a delete
        assert md.serialized_value_size == -1
    async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest") as consumer:
        with anyio.fail_after(10):
            msg = await consumer.getone()
    assert (msg.key, msg.value) == (b"deleted-key", None)
