"""A channel whose old segments are only in tier-2 reads as one log (file:// and S3 on SeaweedFS).

Segments are uploaded by the tiering uploader, then their local copies removed as local
retention does; every read then goes through the listing, the cursor and check() as a user's.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from filechannel import FileChannel
from filechannel.client import Admin, AsyncConsumer, Consumer, ConsumerRecord, Producer, TopicPartition
from filechannel.errors import CorruptRecordError, MissingSegmentError, OffsetOutOfRangeError, StorageUnavailableError
from filechannel.tiering.context import TierContext
from filechannel.tiering.daemon import TieringDaemon

from .read_helpers import offload, read_all, tier_of

N = 3000


def payload(i: int) -> bytes:
    return f"record-{i:06d}-".encode() * 3


@pytest.fixture(params=["file", "s3"])
def tier(request: pytest.FixtureRequest, tmp_path, monkeypatch) -> Iterator[dict[str, Any]]:
    """Tier settings of a channel: a local folder, or a bucket on the session's SeaweedFS
    (credentials from the environment, as boto3's chain finds them: never in the config)."""
    if request.param == "file":
        yield {"tier": (tmp_path / "tier2").as_uri()}
        return
    server = request.getfixturevalue("seaweed")
    bucket = server.new_bucket()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    yield {"tier": f"s3://{bucket}/fc", "tier_options": {"endpoint_url": server.endpoint, "region_name": "us-east-1"}}


def settings(tier: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "segment_bytes": 8192,
        "compression_block_bytes": 1024,
        "maintenance_interval": 0,
        "tier_chunk_bytes": 1500,  # blocks of about 300 bytes: many span two chunks
        **tier,
        **more,
    }


def filled(path: str, tier: dict[str, Any], n: int = N, **more: Any) -> FileChannel:
    ch = FileChannel(path, **settings(tier, **more))
    with ch.sender() as tx:
        for i in range(n):
            tx.send(payload(i), timestamp=1_000_000 + i)
        tx.flush()
    ch.compress_sealed()
    return ch


def test_receiver_from_earliest_reads_every_record_once_across_tiers(tmp_path, tier) -> None:
    with filled(str(tmp_path / "ch"), tier) as ch:
        uploaded = offload(ch, keep_local=2)
        assert len(uploaded) >= 5
        local = ch._log.local_segments()
        remote = [r for r in ch._log.list_segments() if r.remote is not None]
        assert len(remote) == len(uploaded) - 1  # the last uploaded one is still local: read locally
        assert remote[-1].remote is not None
        assert remote[-1].remote.end_offset == local[0].base_offset  # the old segments are only in tier-2
        assert ch.first_offset == 0 == uploaded[0].base_offset
        records = read_all(ch.receiver("earliest"), N)
        assert [r.offset for r in records] == list(range(N))
        assert [r.value for r in records] == [payload(i) for i in range(N)]
        assert ch.check() == N


def test_seek_and_offset_for_time_land_inside_remote_segments(tmp_path, tier) -> None:
    with filled(str(tmp_path / "ch"), tier) as ch:
        uploaded = offload(ch, keep_local=2)
        inside = uploaded[2].base_offset + (uploaded[2].end_offset - uploaded[2].base_offset) // 2
        with ch.receiver(inside) as rx:
            got = rx.recv(timeout=5)
            assert got.offset == inside and got.value == payload(inside)
            rx.seek(uploaded[0].base_offset + 7)
            got = rx.recv(timeout=5)
            assert got.offset == 7 and got.value == payload(7)
        assert ch.offset_for_time(1_000_000 + inside) == inside
        assert ch.offset_for_time(0) == 0
        assert ch.offset_for_time(1_000_000 + N) is None


def test_a_search_by_time_reads_only_the_uploaded_segment_that_holds_the_answer(tmp_path) -> None:
    """The index says which uploaded segment first holds a record at or after the time (its
    newest record's timestamp), so the older segments' objects are never read: here they are
    gone from the bucket, and the search still answers (a read of any of them would raise)."""
    tier2 = tmp_path / "tier2"
    with filled(str(tmp_path / "ch"), {"tier": tier2.as_uri()}) as ch:
        uploaded = offload(ch, keep_local=2)
        target = uploaded[-3]
        wanted = target.base_offset + 5
        for record in uploaded[:-3]:
            for chunk in record.chunks:
                (tier2 / chunk.name).unlink(missing_ok=True)
        assert ch.offset_for_time(1_000_000 + wanted) == wanted
        assert ch.offset_for_time(1_000_000 + uploaded[-1].end_offset) == uploaded[-1].end_offset  # local
        with pytest.raises(CorruptRecordError, match="is missing"):
            ch.offset_for_time(0)  # the first segment does hold it, and its object is gone


def test_an_empty_folder_of_a_tiered_channel_starts_at_the_tiers_end(tmp_path, tier) -> None:
    path = str(tmp_path / "ch")
    meta = str(tmp_path / "meta" / "metadata.db")
    with filled(path, tier, tier_metadata=meta) as ch:
        uploaded = offload(ch, keep_local=0)
        end = uploaded[-1].end_offset
    shutil.rmtree(path)  # the disk was lost: tier-2 and its metadata remain
    with FileChannel(path, tier_metadata=meta, **settings(tier)) as ch:
        assert ch.end_offset == end  # never 0: new records must not reuse uploaded offsets
        assert ch.first_offset == 0
        with ch.sender() as tx:
            tx.send(b"after", timestamp=5)
            tx.flush()
        records = read_all(ch.receiver("earliest"), end + 1)
        assert [r.offset for r in records] == list(range(end + 1))
        assert records[-1].value == b"after"


def _flip(ctx: TierContext, name: str, position: int) -> None:
    data = bytearray(ctx.storage.read(name, 0, ctx.storage.info(name).length))
    data[position] ^= 0x40
    ctx.storage.write(name, bytes(data))


def test_a_flipped_byte_in_a_chunk_raises_naming_the_object(tmp_path, tier) -> None:
    with filled(str(tmp_path / "ch"), tier) as ch:
        uploaded = offload(ch, keep_local=2)
        seg = uploaded[1]
        chunk = seg.chunks[-1]
        # a byte inside the last block's body (past the table): a record's CRC or zstd catches it
        _flip(tier_of(ch), chunk.name, chunk.length - 20)
        with pytest.raises(CorruptRecordError) as info:
            ch.check()
        assert chunk.name in str(info.value)
        with ch.receiver("earliest") as rx, pytest.raises(CorruptRecordError) as info:
            while True:
                assert rx.recv(timeout=5).offset < seg.end_offset  # nothing after the damage
        assert chunk.name in str(info.value)


def test_a_missing_chunk_raises_naming_the_object_and_the_offsets(tmp_path, tier) -> None:
    with filled(str(tmp_path / "ch"), tier) as ch:
        uploaded = offload(ch, keep_local=2)
        seg = uploaded[2]
        gone = seg.chunks[1]
        tier_of(ch).storage.delete(gone.name)
        with pytest.raises(CorruptRecordError) as info:
            ch.check()
        assert gone.name in str(info.value) and "missing" in str(info.value)
        assert f"offsets {seg.base_offset} to {seg.end_offset - 1}" in str(info.value)
        with ch.receiver(seg.base_offset) as rx, pytest.raises(CorruptRecordError, match="missing"):
            while True:
                rx.recv(timeout=5)
        # the segments before it read whole, in order, up to the damage and no further
        with ch.receiver("earliest") as rx:
            seen = 0
            with pytest.raises(CorruptRecordError):
                while True:
                    assert rx.recv(timeout=5).offset == seen
                    seen += 1
            assert uploaded[1].end_offset <= seen <= seg.end_offset


def test_offsets_below_the_tiers_first_are_out_of_range(tmp_path, tier) -> None:
    with filled(str(tmp_path / "ch"), tier) as ch:
        uploaded = offload(ch, keep_local=2, drop_first=1)  # total retention removed the first from tier-2 too
        assert ch.first_offset == uploaded[0].base_offset > 0
        with pytest.raises(OffsetOutOfRangeError):
            ch.receiver(uploaded[0].base_offset - 1)


def test_the_block_cache_stays_within_its_bound(tmp_path, tier) -> None:
    cache = 4096
    with filled(str(tmp_path / "ch"), tier, tier_cache_bytes=cache) as ch:
        uploaded = offload(ch, keep_local=1)
        records = read_all(ch.receiver("earliest"), N)
        assert [r.offset for r in records] == list(range(N))
        reader = tier_of(ch).reader
        assert 0 < reader.cache.peak_bytes <= cache
        assert sum(s.size for s in uploaded) > 5 * cache  # far more was read than the cache holds


def test_an_unreachable_storage_raises_at_the_read_and_the_read_can_be_retried(tmp_path, seaweed, proxy_factory, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    proxy = proxy_factory(seaweed.s3_port)
    tier = {
        "tier": f"s3://{seaweed.new_bucket()}/fc",
        "tier_options": {"endpoint_url": proxy.endpoint, "region_name": "us-east-1", "max_attempts": 2},
    }
    with filled(str(tmp_path / "ch"), tier) as ch:
        offload(ch, keep_local=1)
        # every read is refused, on pooled connections too (the uploads left some open)
        proxy.reset_requests_containing(b"GET ")
        with pytest.raises(StorageUnavailableError):
            ch.receiver("earliest")  # positioning it reads the first segment's table
        assert proxy.resets_done >= 2  # the binding retried before it gave up
        proxy.reset_requests_containing(None)
        with ch.receiver("earliest") as rx:
            proxy.reset_requests_containing(b"GET ")
            with pytest.raises(StorageUnavailableError):
                rx.recv(timeout=5)  # the first block's read
            proxy.reset_requests_containing(None)
            got = read_all(rx, N)  # the same read, retried: nothing lost, skipped or repeated
        assert [r.value for r in got] == [payload(i) for i in range(N)]


def test_connections_cut_mid_body_resume_with_the_right_bytes(tmp_path, seaweed, proxy_factory, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    proxy = proxy_factory(seaweed.s3_port)
    tier = {
        "tier": f"s3://{seaweed.new_bucket()}/fc",
        "tier_options": {"endpoint_url": proxy.endpoint, "region_name": "us-east-1", "max_attempts": 3},
    }
    # big chunks, so a ranged read of a block has a body to cut
    big = {"compression_block_bytes": 4096, "tier_chunk_bytes": 1 << 20}
    with filled(str(tmp_path / "ch"), tier, **big) as ch:
        offload(ch, keep_local=1)
    proxy.reset_after(600, connections=6)  # the headers and part of the body, then a reset
    with FileChannel(tmp_path / "ch", **settings(tier, **big)) as ch:  # a new client: every connection is new
        records = read_all(ch.receiver("earliest"), N)
    assert [r.value for r in records] == [payload(i) for i in range(N)]
    assert proxy.resets_done >= 2


def test_a_segment_both_local_and_uploaded_is_read_locally(tmp_path, tier) -> None:
    with filled(str(tmp_path / "ch"), tier) as ch:
        uploaded = offload(ch, keep_local=len(ch._log.local_segments()))  # uploads, deletes nothing
        assert uploaded
        assert all(r.remote is None for r in ch._log.list_segments())
        for seg in uploaded:
            for c in seg.chunks:
                tier_of(ch).storage.delete(c.name)  # tier-2 copies gone: reads never touch them
        assert ch.check() == N
        assert len(read_all(ch.receiver("earliest"), N)) == N


def test_a_gap_between_tiers_is_a_hole(tmp_path, tier) -> None:
    with filled(str(tmp_path / "ch"), tier) as ch:
        uploaded = offload(ch, keep_local=2)
        # the metadata of the last segment only in tier-2 removed: offsets between the tiers are missing
        ctx = tier_of(ch)
        last = uploaded[-2]
        epoch = ctx.metadata.take_epoch("test")
        ctx.metadata.begin_delete(epoch, ctx.name, last.base_offset)
        ctx.metadata.finish_delete(epoch, ctx.name, last.base_offset)
        with pytest.raises(MissingSegmentError, match=f"offsets {last.base_offset} to {last.end_offset - 1}"):
            ch.check()
        with ch.receiver("earliest") as rx, pytest.raises(MissingSegmentError):
            while True:
                assert rx.recv(timeout=5).offset < last.base_offset


def test_an_ack_receiver_reads_across_tiers_and_resumes_where_it_acked(tmp_path, tier) -> None:
    path = str(tmp_path / "ch")
    with filled(path, tier) as ch:
        uploaded = offload(ch, keep_local=2)
        half = uploaded[1].base_offset + 5  # inside a segment only in tier-2
        with ch.ack_receiver("g") as rx:
            got = [rx.recv(timeout=5) for _ in range(half)]
            assert [r.offset for r in got] == list(range(half))
            rx.ack(half)
    with FileChannel(path, **settings(tier)) as ch, ch.ack_receiver("g") as rx:
        rest = read_all(rx, N - half)
        assert [r.value for r in rest] == [payload(i) for i in range(half, N)]


def test_a_consumer_of_a_tiered_topic_reads_every_record_once_in_order(tmp_path, tier) -> None:
    root = str(tmp_path / "root")
    topic = {k: v for k, v in settings(tier).items() if k != "maintenance_interval"}  # a writer's setting
    Admin(root).create_topic("t", 2, **topic)
    with Producer(root) as p:
        for i in range(N):
            p.send("t", payload(i), partition=i % 2, timestamp_ms=1_000_000 + i)
    remote: dict[int, list] = {}
    for part in (0, 1):
        with Admin(root).open_partition("t", part, maintenance_interval=0) as ch:
            ch.compress_sealed()
            remote[part] = offload(ch, keep_local=1)
            assert tier_of(ch).name == f"t/{part}"
            assert remote[part] and os.path.exists(os.path.join(root, ".tier", "metadata.db"))
    with Consumer("t", root=root, auto_offset_reset="earliest", max_poll_records=500) as c:
        recs = []
        while batch := c.poll(timeout_ms=1000):
            for part_recs in batch.values():
                recs.extend(part_recs)
            if len(recs) >= N:
                break
    for part in (0, 1):
        mine = [r for r in recs if r.partition == part]
        assert [r.value for r in mine] == [payload(i) for i in range(part, N, 2)]
        assert [r.offset for r in mine] == list(range(len(mine)))
    tp = TopicPartition("t", 1)
    with Consumer(root=root) as c:
        c.assign([tp])
        assert c.beginning_offsets([tp]) == {tp: 0}
        seg = remote[1][1]
        inside = seg.base_offset + 3
        found = c.offsets_for_times({tp: 1_000_000 + 2 * inside + 1})[tp]  # partition 1 holds records 1, 3, 5...
        assert found is not None and found.offset == inside and found.timestamp == 1_000_000 + 2 * inside + 1
        c.seek(tp, inside)
        assert c.poll(timeout_ms=1000)[tp][0].value == payload(2 * inside + 1)


def test_the_daemon_offloads_and_a_group_consumer_reads_across_tiers_in_another_process(tmp_path, tier) -> None:
    root = tmp_path / "root"
    topic = {k: v for k, v in settings(tier).items() if k != "maintenance_interval"}
    Admin(root).create_topic("t", 1, local_retention_bytes=0, **topic)
    with Producer(root) as p:
        for i in range(N):
            p.send("t", payload(i), partition=0, timestamp_ms=1_000_000 + i)
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    segments = [n for n in os.listdir(root / "t" / "0") if n.endswith((".seg", ".seg.z"))]
    assert len(segments) == 1  # local retention 0: every uploaded local copy went, the active segment stays
    half = N // 2
    with Consumer("t", root=root, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        got: list[ConsumerRecord] = []
        while len(got) < half:
            batch = c.poll(timeout_ms=5000, max_records=half - len(got))
            assert batch, f"no record within 5 s after {len(got)}"
            for recs in batch.values():
                got.extend(recs)
        c.commit()
    assert [r.value for r in got] == [payload(i) for i in range(half)]
    # another process of the group goes on from the committed offset, inside tier-2
    code = (
        "import sys; from filechannel.client import Consumer\n"
        "with Consumer('t', root=sys.argv[1], group_id='g', auto_offset_reset='earliest') as c:\n"
        "    n = 0; first = None\n"
        f"    while n < {N - half}:\n"
        "        for recs in c.poll(timeout_ms=5000).values():\n"
        "            first = recs[0].offset if first is None else first\n"
        "            for r in recs:\n"
        "                assert r.value == (b'record-%06d-' % r.offset) * 3, r\n"
        "            n += len(recs)\n"
        "    print(first, n)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.split() == [str(half).encode(), str(N - half).encode()]


def test_the_s3_server_killed_and_restarted_mid_read(tmp_path, private_seaweed, monkeypatch) -> None:
    server = private_seaweed
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    bucket = server.new_bucket()
    tier = {
        "tier": f"s3://{bucket}/fc",
        "tier_options": {"endpoint_url": server.endpoint, "region_name": "us-east-1", "max_attempts": 2},
    }
    with filled(str(tmp_path / "ch"), tier, tier_cache_bytes=4096) as ch:  # a small cache: reads keep going to S3
        uploaded = offload(ch, keep_local=1)
        got: list = []
        failures = 0
        with ch.receiver("earliest") as rx:
            got.extend(rx.recv_many(100, timeout=5))
            server.kill()
            while len(got) < N:
                try:
                    got.extend(rx.recv_many(N - len(got), timeout=5))
                except StorageUnavailableError:
                    failures += 1
                    assert failures == 1, "the read failed again once the server was back"
                    server.start()
                    server.wait_until_serving(bucket, f"fc/{uploaded[-1].chunks[0].name}")
        assert failures == 1
        assert [r.offset for r in got] == list(range(N))  # nothing lost, skipped or repeated
        assert [r.value for r in got] == [payload(i) for i in range(N)]


def test_an_endpoint_that_is_down_fails_remote_reads_only(tmp_path, seaweed, unused_port, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    bucket = seaweed.new_bucket()
    options = {"region_name": "us-east-1", "max_attempts": 2}
    path = str(tmp_path / "ch")
    with filled(path, {"tier": f"s3://{bucket}/fc", "tier_options": {"endpoint_url": seaweed.endpoint, **options}}) as ch:
        uploaded = offload(ch, keep_local=2)
    down = {"tier": f"s3://{bucket}/fc", "tier_options": {"endpoint_url": f"http://127.0.0.1:{unused_port}", **options}}
    with FileChannel(path, **settings(down)) as ch:
        assert ch.first_offset == 0  # the listing needs the metadata only
        local_first = uploaded[-1].base_offset  # uploaded and still local: read locally
        with ch.receiver(local_first) as rx:
            assert [r.offset for r in read_all(rx, N - local_first)] == list(range(local_first, N))
        with pytest.raises(StorageUnavailableError, match=str(unused_port)):
            ch.receiver("earliest")
        assert len(ch._log.local_segments()) == 2  # nothing was deleted


def test_total_retention_deleting_a_segment_under_a_reader_is_out_of_range_not_damage(tmp_path, tier) -> None:
    with filled(str(tmp_path / "ch"), tier, tier_cache_bytes=1024) as ch:  # no block of it stays cached
        uploaded = offload(ch, keep_local=2)
        first = uploaded[0]
        with ch.receiver("earliest") as rx:  # positioned on the first segment: its table is read
            # total retention, as the daemon applies it: "deleting", then the objects, then the row
            ctx = tier_of(ch)
            epoch = ctx.metadata.take_epoch("retention")
            ctx.metadata.begin_delete(epoch, ctx.name, first.base_offset)
            for c in first.chunks:
                ctx.storage.delete(c.name)
            ctx.metadata.finish_delete(epoch, ctx.name, first.base_offset)
            with pytest.raises(OffsetOutOfRangeError, match="deleted from tier-2 by retention"):
                rx.recv(timeout=5)
            assert ch.first_offset == first.end_offset
            rx.seek(ch.first_offset)
            assert [r.offset for r in read_all(rx, N - first.end_offset)] == list(range(first.end_offset, N))


def test_check_skips_what_total_retention_deletes_while_it_runs(tmp_path, tier) -> None:
    with filled(str(tmp_path / "ch"), tier) as ch:
        uploaded = offload(ch, keep_local=2)
        ctx = tier_of(ch)
        calls = []

        def retention_after_the_first_segment(done: int, total: int) -> None:
            calls.append(done)
            if len(calls) == 1:  # the first segment was checked: retention deletes it and the next
                epoch = ctx.metadata.take_epoch("retention")
                for seg in uploaded[:2]:
                    ctx.metadata.begin_delete(epoch, ctx.name, seg.base_offset)
                    for c in seg.chunks:
                        ctx.storage.delete(c.name)
                    ctx.metadata.finish_delete(epoch, ctx.name, seg.base_offset)

        assert ch.check(progress=retention_after_the_first_segment) == N - (uploaded[1].end_offset - uploaded[1].base_offset)


def test_an_async_consumer_reads_a_tiered_topic_from_earliest(tmp_path, tier) -> None:
    root = tmp_path / "root"
    topic = {k: v for k, v in settings(tier).items() if k != "maintenance_interval"}
    Admin(root).create_topic("t", 1, **topic)
    with Producer(root) as p:
        for i in range(N):
            p.send("t", payload(i), partition=0)
    with Admin(root).open_partition("t", 0, maintenance_interval=0) as ch:
        ch.compress_sealed()
        assert offload(ch, keep_local=1)

    async def consume() -> list:
        got: list = []
        async with AsyncConsumer("t", root=root, auto_offset_reset="earliest") as c:
            while len(got) < N:
                batch = await c.getmany(timeout_ms=5000)
                assert batch, f"no record within 5 s after {len(got)}"
                for recs in batch.values():
                    got.extend(recs)
        return got

    got = asyncio.run(consume())
    assert [r.offset for r in got] == list(range(N)) and got[-1].value == payload(N - 1)
