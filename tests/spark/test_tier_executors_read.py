"""The two halves of a tier-2 read without a Spark session: the driver's plan and an executor's read.

Tier-2 is a folder here (file://): the executor's code sees only the storage, whatever it is;
tests/spark/test_tier_executors.py runs the same through Spark against a real S3 (SeaweedFS).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
from typing import Any

import pytest
import zstandard

from filechannel.client import Admin, Producer
from filechannel.errors import CorruptRecordError, RootUnavailableError
from filechannel.spark.errors import DataLossError
from filechannel.spark.options import SourceOptions
from filechannel.spark.ranges import OffsetRange
from filechannel.spark.source import FileChannelBatchReader, read_partition
from filechannel.spark.storages import storage_for
from filechannel.spark.tier import TierRange, _Segments, read_tier_range, snap
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.remote_segment import RemoteReader

pytestmark = pytest.mark.spark

N = 3000


@pytest.fixture
def root(tmp_path):
    """Topic "t", 2 partitions of N records, every sealed segment in tier-2, most deleted locally."""
    root = tmp_path / "root"
    Admin(root).create_topic(
        "t",
        partitions=2,
        tier=(tmp_path / "tier2").as_uri(),
        segment_bytes=8192,
        compression_block_bytes=1024,
        tier_chunk_bytes=1500,
        local_retention_bytes=16384,
    )
    with Producer(root) as p:
        for i in range(2 * N):
            p.send("t", f"v{i:05d}".encode() * 4, partition=i % 2)
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    return root


def tasks(root, **options):
    opts = SourceOptions.parse({"root": str(root), "subscribe": "t", **{k: str(v) for k, v in options.items()}}, batch=True)
    return FileChannelBatchReader(opts).partitions()


def offsets(task) -> list[tuple[Any, Any]]:  # to_pylist's items: Any, or None where null
    return [
        (p, o) for b in read_partition(task) for p, o in zip(b["partition"].to_pylist(), b["offset"].to_pylist(), strict=True)
    ]


@pytest.mark.parametrize(
    "options", [{}, {"minPartitions": 3}, {"minPartitions": 25}, {"minPartitions": 1000}, {"maxRecordsPerPartition": 400}]
)
def test_every_offset_is_read_once_in_order_whatever_the_cuts(root, options):
    plan = tasks(root, **options)
    tier = [t for t in plan if isinstance(t, TierRange)]
    assert tier and all(isinstance(t, TierRange | OffsetRange) for t in plan)
    for p in (0, 1):  # per partition: tier ranges from 0, back to back, then one local tail
        mine = [t for t in plan if t.partition == p]
        assert [type(t) for t in mine][-1] is OffsetRange and sum(isinstance(t, OffsetRange) for t in mine) == 1
        assert mine[0].start == 0 and mine[-1].end == N and all(a.end == b.start for a, b in itertools.pairwise(mine))
    got = []
    for t in plan:
        read = offsets(t)
        assert read == sorted(read) and len(read) == t.end - t.start
        got += read
    assert sorted(got) == [(p, o) for p in (0, 1) for o in range(N)]


def test_batches_from_tier2_are_bounded_in_bytes_as_well_as_rows(root):
    """As read_range's: a batch ends once its keys and values reach ``batch_bytes`` (here
    1,000 bytes: blocks of 1 KiB hold about 40 records of 24 bytes)."""
    task = next(t for t in tasks(root) if isinstance(t, TierRange) and t.partition == 0)
    batches = list(read_tier_range(task, batch_bytes=1000))
    values = [v for b in batches for v in b["value"].to_pylist()]
    assert [o for b in batches for o in b["offset"].to_pylist()] == list(range(task.start, task.end))
    assert values == [f"v{2 * o:05d}".encode() * 4 for o in range(task.start, task.end)]
    assert len(batches) > 1 and all(sum(len(v or b"") for v in b["value"].to_pylist()) < 1000 + 1024 for b in batches)


def test_cuts_snap_to_the_nearest_boundary_and_never_repeat():
    assert snap([10, 20, 30], [0, 12, 19, 31, 50]) == [12, 19, 31]
    assert snap([10, 11, 12], [0, 11, 40]) == [11]  # fewer pieces rather than an empty one
    assert snap([5], []) == []


def test_damage_in_tier2_fails_the_task_naming_the_object(root, tmp_path):
    task = next(t for t in tasks(root) if isinstance(t, TierRange) and t.partition == 0)
    chunk = task.segments[1].chunks[0]
    os.unlink(tmp_path / "tier2" / chunk.name)  # its manifest is still there: damage, not retention
    with pytest.raises(CorruptRecordError, match=rf"tier-2 object .*{chunk.name}.* is missing"):
        offsets(task)


def test_a_segment_deleted_by_retention_after_planning_is_data_loss(root, tmp_path):
    task = next(t for t in tasks(root) if isinstance(t, TierRange) and t.partition == 0)
    gone = task.segments[0]
    for name in [c.name for c in gone.chunks] + [gone.manifest]:  # as the daemon deletes: chunks, then the manifest
        os.unlink(tmp_path / "tier2" / name)
    with pytest.raises(DataLossError, match=r"t\[0\]: offset 0 is no longer there"):
        offsets(task)
    # failOnDataLoss=false goes on after the deleted segment, as Kafka's source does.
    rest = offsets(dataclasses.replace(task, fail_on_data_loss=False))
    assert rest == [(0, o) for o in range(gone.end_offset, task.end)]


def test_executor_code_never_needs_the_root(root, tmp_path):
    plan = tasks(root)
    moved = tmp_path / "moved"
    shutil.move(root, moved)  # what an executor on another machine sees: no such folder
    tier = [t for t in plan if isinstance(t, TierRange)]
    assert sum(len(offsets(t)) for t in tier) == sum(t.end - t.start for t in tier)
    with pytest.raises(RootUnavailableError, match=r"cannot see the root .*mount the root on the executors"):
        offsets(next(t for t in plan if isinstance(t, OffsetRange)))  # the local tail: one error saying why


def test_a_worker_keeps_one_storage_client_per_storage_across_tasks(root, tmp_path):
    plan = [t for t in tasks(root, minPartitions=6) if isinstance(t, TierRange)]
    first = storage_for(plan[0].storage_url, plan[0].storage_options)
    assert all(storage_for(t.storage_url, t.storage_options) is first for t in plan)
    for t in plan:  # a task leaves the shared client open for the next one
        offsets(t)
    assert first.exists(plan[0].segments[0].chunks[0].name)
    assert storage_for((tmp_path / "other").as_uri(), {}) is not first


def test_a_record_damaged_inside_a_block_fails_the_task_naming_the_object_and_block(root, tmp_path):
    """A block that still decompresses, to the right length, but with a changed byte: the
    executor checks every record's CRC as the cursor and ``check()`` do, and names where."""
    task = next(t for t in tasks(root) if isinstance(t, TierRange) and t.partition == 0)
    record = task.segments[1]
    reader = RemoteReader(storage_for(task.storage_url, task.storage_options), 1 << 20, 1)
    try:
        block = reader.info(record).blocks[0]
    finally:
        reader.close()
    chunk = next(c for c in record.chunks if c.position <= block.file_position < c.position + c.length)
    assert block.file_position + block.compressed_length <= chunk.position + chunk.length  # one object holds it
    path = tmp_path / "tier2" / chunk.name
    data = bytearray(path.read_bytes())
    start = chunk.object_offset + block.file_position - chunk.position
    original = zstandard.ZstdDecompressor().decompress(bytes(data[start : start + block.compressed_length]))
    for at in range(start + block.compressed_length - 1, start, -1):  # a literal byte near the end, found by trying
        damaged = bytearray(data)
        damaged[at] ^= 0x01
        try:
            raw = zstandard.ZstdDecompressor().decompress(bytes(damaged[start : start + block.compressed_length]))
        except zstandard.ZstdError:
            continue
        if len(raw) == len(original) and raw != original:
            break
    else:
        pytest.fail("no one-bit change of the block decompresses to other bytes of the same length")
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptRecordError, match=rf"{chunk.name}.*block 0"):
        offsets(task)


@pytest.mark.parametrize("cache_bytes", [1 << 30, 64 << 10, 1])
def test_segments_are_opened_ahead_only_within_a_quarter_of_the_cache(root, cache_bytes):
    """The next segment is started when the task asks; those after it only while their prefetch
    windows fit a quarter of the cache together (all of them with a large cache, none with none)."""
    [task, *_] = [t for t in tasks(root) if isinstance(t, TierRange) and t.partition == 0]
    assert len(task.segments) > 4
    reader = RemoteReader(storage_for(task.storage_url, task.storage_options), cache_bytes, 1)
    segments = _Segments(reader, task.segments)
    try:
        segments.open(0).close()
        segments.prepare(1)
        for _ in task.segments:  # one open at a time on the open thread, each queueing the next before it ends
            segments._pool.submit(lambda: None).result()
        started = dict(segments._started)
        assert 1 in started and sum(w for k, w in started.items() if k != 1) <= cache_bytes // 4
        assert sorted(started) == list(range(1, len(started) + 1))  # in order, from the next one
        if cache_bytes == 1 << 30:
            assert len(started) == len(task.segments) - 1
        if cache_bytes == 1:
            assert list(started) == [1]
        for k in range(1, len(task.segments)):  # then read in order: the same segments, none lost
            segment = segments.open(k)
            assert segment.record == task.segments[k] and segment.block(0)
            segment.close()
    finally:
        segments.close()
        reader.close()


def test_columns_decoded_in_c_equal_the_records_of_keys_tombstones_and_headers(tmp_path):
    """Without headers a tier read decodes blocks straight into the batch's columns (C); with
    them, into records. Both give the same rows over the same segments (keys, null values,
    headers skipped, a range starting and ending inside blocks)."""
    root = tmp_path / "root"
    Admin(root).create_topic(
        "t",
        partitions=1,
        tier=(tmp_path / "tier2").as_uri(),
        segment_bytes=4096,
        compression_block_bytes=1024,
        local_retention_bytes=0,
    )
    with Producer(root) as p:
        for i in range(1200):
            value = None if i % 37 == 0 else f"value {i}".encode() * (1 + i % 3)
            p.send("t", value, key=b"k%d" % (i % 40), headers=[("n", str(i).encode())] if i % 2 else None)
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    task = next(t for t in tasks(root) if isinstance(t, TierRange))
    inside = dataclasses.replace(task, start=task.start + 3, end=task.end - 5)
    for t in (task, inside):
        columns = [b for b in read_tier_range(t, batch_rows=100)]
        records = [b for b in read_tier_range(dataclasses.replace(t, include_headers=True), batch_rows=100)]
        fields = ["key", "value", "offset", "timestamp", "topic", "partition", "timestampType"]
        got = {f: [v for b in columns for v in b[f].to_pylist()] for f in fields}
        assert got == {f: [v for b in records for v in b[f].to_pylist()] for f in fields}
        offsets = got["offset"]
        assert offsets == list(range(t.start, t.end))
        assert None in got["value"] and None not in got["key"]
        assert all(b.num_rows <= 100 + 1024 // 14 for b in columns)  # a batch ends after the block reaching 100 rows
