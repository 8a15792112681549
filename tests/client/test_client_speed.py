"""Producer.send's short path (one-partition topic, plain bytes, no key/headers/partition/timestamp)
means exactly what the whole path means: the futures, the metadata, the errors, the order.

No speed is asserted here (filechannel/bench/ measures it); these pin the guarantees the short path must keep.
"""

import asyncio
import concurrent.futures
import threading
import tracemalloc
from typing import Any, cast

import pytest

import filechannel.client.producer as producer_module
from filechannel import Record
from filechannel.client import (
    Admin,
    AsyncConsumer,
    AsyncConsumerRecord,
    Consumer,
    ConsumerRecord,
    Producer,
    RecordMetadata,
    TopicPartition,
)
from filechannel.client.futures import SentFuture

try:
    from filechannel.engine import _codec
except ImportError:  # the pure-Python build
    _codec = None  # type: ignore[assignment]
from filechannel.errors import ChannelClosedError, ConfigError, MessageTooLargeError


@pytest.fixture(params=["c", "python"])
def short_path(request, monkeypatch):
    """Each test runs with send's short path in C (ProducerSend) and in Python (as without the C build)."""
    if request.param == "python":
        monkeypatch.setattr(producer_module, "_CSend", None)
    return request.param


@pytest.fixture
def root(tmp_path, short_path):
    Admin(tmp_path).create_topic("t", partitions=1, fsync="never", max_record_bytes=1024)
    Admin(tmp_path).create_topic("three", partitions=3, fsync="never")
    return tmp_path


def _read(root, topic="t"):
    with Consumer(topic, root=root, auto_offset_reset="earliest", enable_auto_commit=False) as c:
        out = []
        while batch := c.poll(timeout_ms=200):
            for recs in batch.values():
                out += recs
        return out


def test_short_path_metadata_is_what_the_consumer_reads(root):
    with Producer(root) as p:
        futures = [p.send("t", bytes([i]) * (i + 1)) for i in range(50)]
        keyed = p.send("t", b"k", key=b"key")  # the whole path, between short ones
        futures += [p.send("t", b"after")]
    assert type(futures[-1]) is SentFuture  # the short path was taken
    records = _read(root)
    assert [r.offset for r in records] == list(range(52))  # one order: short and whole paths interleave
    by_offset = {r.offset: r for r in records}
    for f in futures:
        meta = f.get(timeout=0)
        assert type(meta) is RecordMetadata and f.value == meta and f.succeeded() and not f.failed()
        assert f.done() and f.is_done and f.exception() is None and not f.cancel()
        rec = by_offset[meta.offset]
        assert (meta.topic, meta.partition, meta.topic_partition) == ("t", 0, TopicPartition("t", 0))
        assert meta.timestamp == rec.timestamp and meta.serialized_value_size == len(rec.value)
        assert (meta.checksum, meta.serialized_key_size, meta.serialized_header_size) == (None, -1, -1)
        assert (meta.timestamp_type, meta.log_start_offset) == (0, -1)
    assert keyed.get().serialized_key_size == 3
    assert p.metrics()["producer-metrics"]["record-send-total"] == 52.0


def test_short_path_futures_work_with_callbacks_wait_and_asyncio(root):
    with Producer(root) as p:
        p.send("t", b"warm")  # the first send takes the whole path and opens the route
        f = p.send("t", b"x")
        assert type(f) is SentFuture
        seen: list[Any] = []  # the value, then the callback's offset
        f.add_callback(seen.append).add_errback(lambda e: seen.append(("err", e)))
        f.add_done_callback(lambda fut: seen.append(fut.result().offset))
        done, not_done = concurrent.futures.wait([f], timeout=0)
        assert done == {f} and not not_done
        assert list(concurrent.futures.as_completed([f], timeout=0)) == [f]

        async def wrapped():
            return await asyncio.wrap_future(f)

        assert asyncio.run(wrapped()).offset == 1
    assert seen == [f.value, 1]


def test_a_sent_futures_fields_hold_any_offset_timestamp_and_size_and_refuse_what_is_not_one():
    """SentFuture keeps (offset, timestamp) and the size as C fields (SentCore) where the
    extension is built: they give back what was set, at the ends of their ranges too."""
    route = ("t", 0, TopicPartition("t", 0))
    far = SentFuture.sent(route, (2**63 - 1, -(2**63)), 2**31)
    meta = far.get(timeout=0)
    assert (meta.offset, meta.timestamp, meta.serialized_value_size) == (2**63 - 1, -(2**63), 2**31)
    assert far._at == (2**63 - 1, -(2**63)) and far._size == 2**31
    if _codec is not None:  # (the C build's fields: the pure-Python build keeps them as slots)
        assert isinstance(far, _codec.SentCore)
        for bad in [(1,), (1, "2"), [1, 2], None, (2**63, 0)]:
            with pytest.raises((TypeError, OverflowError)):
                far._at = bad  # type: ignore[assignment]
        with pytest.raises(TypeError):
            far._size = "3"  # type: ignore[assignment]
        assert far._at == (2**63 - 1, -(2**63)) and far._size == 2**31  # unchanged by the refused writes
        with pytest.raises(TypeError, match="subclass of SentCore"):
            _codec.ProducerSend({}, cast(Any, print), RecordMetadata)


def test_short_path_too_large_fails_the_future_not_the_call(root):
    with Producer(root) as p:
        p.send("t", b"warm")
        big = p.send("t", b"x" * 2000)  # over the topic's max_record_bytes
        assert big.failed() and isinstance(big.exception(), MessageTooLargeError)
        with pytest.raises(MessageTooLargeError):
            big.get()
        assert p.send("t", b"ok").get().offset == 1  # the refusal wrote nothing
    assert [r.value for r in _read(root)] == [b"warm", b"ok"]


def test_short_path_refuses_after_close(root):
    p = Producer(root)
    p.send("t", b"warm")
    p.close()
    with pytest.raises(ChannelClosedError, match="producer is closed"):
        p.send("t", b"late")


def test_short_path_not_taken_where_it_would_differ(root):
    """Several partitions (the partitioner spreads records), serializers, explicit partition,
    timestamp, headers: the whole path, with its own results."""
    with Producer(root) as p:
        spread = [p.send("three", b"v").get().partition for _ in range(6)]
        assert sorted(spread) == [0, 0, 1, 1, 2, 2]
        stamped = p.send("t", b"v", timestamp_ms=1234)
        assert stamped.get().timestamp == 1234
        assert p.send("t", b"v", headers=[("h", b"1")]).get().serialized_header_size == 2
    with Producer(root, value_serializer=str.encode) as p:
        assert p.send("t", "text").get().serialized_value_size == 4
    assert [r.value for r in _read(root)][-1] == b"text"


def test_short_path_from_many_threads_keeps_every_record_once(root):
    """8 threads sending at once: dense offsets, each thread's records in its own order."""
    per = 2000
    results: dict[int, list] = {}
    with Producer(root) as p:
        p.send("t", b"warm")

        def loop(i):
            results[i] = [p.send("t", b"%d-%d" % (i, j)) for j in range(per)]

        threads = [threading.Thread(target=loop, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    offsets = sorted(f.get().offset for fs in results.values() for f in fs)
    assert offsets == list(range(1, 8 * per + 1))
    for fs in results.values():
        mine = [f.get().offset for f in fs]
        assert mine == sorted(mine)  # a thread's records land in the order it sent them
    values = [r.value for r in _read(root)[1:]]
    assert sorted(values) == sorted(b"%d-%d" % (i, j) for i in range(8) for j in range(per))


def test_poll_reads_about_a_mebibyte_per_partition_and_loses_nothing(tmp_path):
    """A fetch reads about 1 MiB of a partition (Kafka's max_partition_fetch_bytes default, at
    least one record), the first one too: sizes need not be seen first. The rest comes next,
    in order."""
    Admin(tmp_path).create_topic("big", fsync="never")
    big = [bytes([i]) * (600 << 10) for i in range(8)]
    with Producer(tmp_path) as p, Consumer("big", root=tmp_path, auto_offset_reset="earliest") as c:
        for v in big:
            p.send("big", v)
        p.flush()
        sizes: list[int] = []
        got: list[ConsumerRecord] = []
        while len(got) < 8:
            recs = c.poll(timeout_ms=1000, max_records=100)[TopicPartition("big", 0)]
            sizes.append(len(recs))
            got += recs
        # the second record of 600 KiB reaches the mebibyte: two a poll, the first poll too
        assert sizes == [2, 2, 2, 2] and [r.value for r in got] == big and [r.offset for r in got] == list(range(8))


def test_max_partition_fetch_bytes_sets_what_a_fetch_reads(tmp_path):
    """kafka-python's max_partition_fetch_bytes is honoured: about that many bytes of a
    partition a fetch (at least one record); a bad value is a ConfigError."""
    Admin(tmp_path).create_topic("big", fsync="never", compression="none")
    values = [bytes([i]) * (100 << 10) for i in range(60)]  # 6 MB
    with Producer(tmp_path) as p:
        for v in values:
            p.send("big", v)
    tp = TopicPartition("big", 0)

    def first_poll(**kwargs):
        with Consumer("big", root=tmp_path, auto_offset_reset="earliest", enable_auto_commit=False, **kwargs) as c:
            return c.poll(timeout_ms=1000)[tp]

    assert len(first_poll()) <= 13  # 1 MiB (and one 256 KiB read) of 100 KiB records
    assert 40 <= len(first_poll(max_partition_fetch_bytes=4 << 20)) <= 44
    assert len(first_poll(max_partition_fetch_bytes=1)) <= 2  # one 256 KiB read holds two
    for bad in (0, -1, True, 1.5, "1"):
        with pytest.raises(ConfigError, match="max_partition_fetch_bytes"):
            Consumer("big", root=tmp_path, max_partition_fetch_bytes=bad)  # type: ignore[arg-type]


def _peak_bytes(fn):
    """fn's result and the most memory Python held while it ran (every thread's), less what it held before."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_a_consumers_iterator_reads_ahead_about_8_mib_of_large_records_not_max_poll_records(tmp_path):
    """Iteration reads ahead (records wait as pending, positions do not move past them), about
    8 MiB at most: max_poll_records (500) of 1 MB records would have held 500 MB."""
    Admin(tmp_path).create_topic("big", fsync="never", compression="none")
    big = [bytes([i]) * (256 << 10) for i in range(80)]  # 20 MiB
    with Producer(tmp_path) as p:
        for v in big:
            p.send("big", v)
    with Consumer("big", root=tmp_path, auto_offset_reset="earliest", enable_auto_commit=False) as c:
        first, peak = _peak_bytes(lambda: next(c))
        assert first.value == big[0] and c.position(TopicPartition("big", 0)) == 1
        assert peak < 12 << 20, peak
        assert [r.value for r in [first, *(next(c) for _ in big[1:])]] == big


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_getmany_fetches_past_one_fetch_in_a_trip_up_to_about_8_mib(tmp_path, anyio_backend):
    """A getmany's trip to the worker thread fetches again without waiting past one fetch (about
    1 MiB of a partition) while max_records is not met, up to about 8 MiB: max_poll_records
    (500) of 1 MB records would have held 500 MB. Records come in order, none lost."""
    from filechannel.client import AsyncConsumer

    tp = TopicPartition("big", 0)
    Admin(tmp_path).create_topic("big", fsync="never", compression="none")
    big = [bytes([i]) * (256 << 10) for i in range(80)]  # 20 MiB
    with Producer(tmp_path) as p:
        for v in big:
            p.send("big", v)
    async with AsyncConsumer("big", root=tmp_path, auto_offset_reset="earliest", enable_auto_commit=False) as c:
        sizes: list[int] = []
        got: list[AsyncConsumerRecord] = []
        peak = 0
        tracemalloc.start()
        try:
            while len(got) < len(big):
                before = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                recs = (await c.getmany(timeout_ms=1000))[tp]
                peak = max(peak, tracemalloc.get_traced_memory()[1] - before)
                sizes.append(len(recs))
                got += recs
                del recs
        finally:
            tracemalloc.stop()
    assert [r.value for r in got] == big
    assert max(sizes) > 4  # past one fetch (four records of 256 KiB) in one trip
    assert peak < 12 << 20, (peak, sizes)


def test_c_shaped_sizes_agree_with_python_when_records_share_sizes():
    """The C conversion reuses one int per repeated size; every record still gets its own sizes."""
    from filechannel.client.records import KAFKA_PYTHON_RECORDS as shape
    from filechannel.engine import record

    assert record._codec is not None
    values = [b"x" * 1024] * 3 + [b"y" * 300, None, b"z" * 1024, b"", b"w" * 5000, b"w" * 5000]
    keys = [None, b"k" * 400, b"k" * 400, None, b"kk", None, None, b"k" * 400, None]
    headers = [(), (("h", b"v" * 700),), (), (), (("a", None),), (), (), (), (("h", b"v" * 700),)]
    # ("a", None): a header without a value, as a Kafka record may carry one
    recs = [record.Record(i, 1000 + i, k, v, h) for i, (k, v, h) in enumerate(zip(keys, values, headers, strict=True))]  # type: ignore[arg-type]
    kind, template = shape.record_type, ("t", 0, *shape.template[2:])
    rest = (shape.slots, shape.size_slots, shape.headers_type)
    c: list[Any] = record._codec.shaped(kind, template, recs, *rest)  # kafka-python's records
    assert c == record.shaped_py(kind, template, recs, *rest)
    assert [r.serialized_value_size for r in c] == [1024, 1024, 1024, 300, -1, 1024, 0, 5000, 5000]
    assert [r.serialized_key_size for r in c] == [-1, 400, 400, -1, 2, -1, -1, 400, -1]
    with pytest.raises(TypeError):  # an error after sizes were cached releases them and raises
        record._codec.shaped(kind, template, [*recs, [1, 2]], *rest)  # type: ignore[type-var]


def test_records_sent_from_threads_are_written_without_flush(tmp_path):
    """Records found due while a drain is in flight are left to the next drain, not waited for:
    every one still reaches the file without flush() (the flusher or a later send writes it)."""
    from filechannel import FileChannel

    per, threads = 3000, 8
    with FileChannel(tmp_path / "ch", fsync="never", flush_interval=0.0001, maintenance_interval=0) as ch:
        rx = ch.receiver("earliest")

        def loop(i):
            send = ch.sender().send
            for j in range(per):
                send(b"%d-%d" % (i, j))

        workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        got: list[Record] = []
        while len(got) < per * threads:  # no flush: the background flusher writes the rest
            batch = rx.recv_many(10_000, timeout=10)
            assert batch, f"only {len(got)} of {per * threads} records written"
            got += batch
    assert [r.offset for r in got] == list(range(per * threads))
    assert sorted(r.value or b"" for r in got) == sorted(b"%d-%d" % (i, j) for i in range(threads) for j in range(per))


def test_fetch_max_bytes_bounds_a_fetch_over_all_partitions(tmp_path):
    """kafka-python's fetch_max_bytes is honoured: about that many bytes a fetch, all
    partitions together, at least one record; the async consumer's read-ahead holds no more
    either; a bad value is a ConfigError."""
    Admin(tmp_path).create_topic("two", 2, fsync="never", compression="none")
    values = {p: [bytes([p, i]) * (5 << 10) for i in range(100)] for p in (0, 1)}  # 1 MB a partition
    with Producer(tmp_path) as producer:
        for p, vs in values.items():
            for v in vs:
                producer.send("two", v, partition=p)

    def consumer(**kwargs):
        return Consumer("two", root=tmp_path, auto_offset_reset="earliest", enable_auto_commit=False, **kwargs)

    with consumer(max_partition_fetch_bytes=512 << 10) as c:  # Kafka's 50 MiB: both partitions a poll
        assert sorted(tp.partition for tp in c.poll(timeout_ms=1000, max_records=1000)) == [0, 1]
    with consumer(max_partition_fetch_bytes=512 << 10, fetch_max_bytes=100 << 10) as c:
        got: dict[int, list[bytes]] = {0: [], 1: []}
        while batch := c.poll(timeout_ms=200, max_records=1000):
            assert sum(map(len, batch.values())) <= 52  # 100 KiB, and at most one 256 KiB read beyond
            first, *others = ([len(r.value) + 17 for r in recs] for recs in batch.values())
            # A partition's read that reached the bound ends the fetch: the other waits. Only one
            # that ended short of it (the last records of its partition) leaves room to the other.
            assert not others or sum(first) < 100 << 10
            for tp, recs in batch.items():
                got[tp.partition] += [r.value for r in recs]
        assert got == values  # nothing lost, in order
    with consumer(fetch_max_bytes=1) as c:  # at least one record
        assert sum(map(len, c.poll(timeout_ms=1000).values())) >= 1
    for bad in (0, -1, True, 1.5, "1"):
        with pytest.raises(ConfigError, match="fetch_max_bytes"):
            Consumer("two", root=tmp_path, fetch_max_bytes=bad)  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_fetch_max_bytes_bounds_the_async_consumers_read_ahead(tmp_path, anyio_backend):
    Admin(tmp_path).create_topic("t", fsync="never", compression="none")
    with Producer(tmp_path) as producer:
        for i in range(2000):
            producer.send("t", b"%04d" % i + b"x" * 1020)  # 2 MB of 1 KiB records
    async with AsyncConsumer("t", root=tmp_path, auto_offset_reset="earliest", fetch_max_bytes=300 << 10) as c:
        got = [r.offset for r in (await c.getmany(timeout_ms=1000, max_records=1))[TopicPartition("t", 0)]]
        pending = sum(len(part.pending) for part in c.consumer._subscription.parts.values())
        # A trip read about 300 KiB ahead (and at most one 256 KiB read more), not 8 MiB (all 2,000)
        assert got == [0] and 0 < pending <= 560
