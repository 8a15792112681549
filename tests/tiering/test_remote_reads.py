"""Reading one uploaded segment: ranged reads of its chunks, the table cache, prefetch, and the CLI's check.

The storage here is the real local binding; :class:`WatchedStorage` only records the reads
it serves and, on request, holds them at a gate until enough are in flight at once (a
condition with a deadline), so "several requests in flight" is observed, never timed.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from filechannel import FileChannel
from filechannel.client import Admin, Producer
from filechannel.errors import CorruptRecordError
from filechannel.tiering.layout import SegmentRecord
from filechannel.tiering.local_storage import LocalStorage
from filechannel.tiering.remote_segment import RemoteReader

from ..cli_helpers import fc
from .read_helpers import offload


class WatchedStorage(LocalStorage):
    """The local binding, recording each read; with ``gate`` set, a read waits (up to 10 s)
    until ``gate`` reads are in flight together, and ``peak`` says how many ever were."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.reads: list[tuple[str, int, int]] = []
        self.gate = 0
        self.peak = 0
        self._inside = 0
        self._cond = threading.Condition()

    def _do_read(self, name: str, offset: int, length: int) -> bytes:
        with self._cond:
            self.reads.append((name, offset, length))
            self._inside += 1
            self.peak = max(self.peak, self._inside)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._inside >= self.gate, timeout=10)
        try:
            return super()._do_read(name, offset, length)
        finally:
            with self._cond:
                self._inside -= 1


@pytest.fixture
def uploaded(tmp_path) -> list[SegmentRecord]:
    """Segments of a channel uploaded to tmp_path/tier2 (chunks of 1500 bytes, blocks of about 300)."""
    with FileChannel(
        tmp_path / "ch",
        segment_bytes=16384,
        compression_block_bytes=1024,
        maintenance_interval=0,
        tier=(tmp_path / "tier2").as_uri(),
        tier_chunk_bytes=1500,
    ) as ch:
        with ch.sender() as tx:
            for i in range(3000):
                tx.send(f"record-{i:06d}-".encode() * 3, timestamp=i)
        ch.compress_sealed()
        return offload(ch, keep_local=1)


def test_a_block_spanning_two_chunks_takes_one_ranged_read_of_each(tmp_path, uploaded) -> None:
    storage = WatchedStorage(str(tmp_path / "tier2"))
    reader = RemoteReader(storage, cache_bytes=1 << 20, concurrency=1)
    try:
        record = uploaded[0]
        seg = reader.open(record)
        assert storage.reads == [(record.chunks[0].name, 0, record.chunks[0].length)]  # header and table at once
        cut = record.chunks[1].position
        i = next(i for i, b in enumerate(seg.info.blocks) if b.file_position < cut < b.file_position + b.compressed_length)
        b = seg.info.blocks[i]
        storage.reads.clear()
        data = seg.load(i)
        assert len(data) == b.raw_length
        assert storage.reads == [
            (record.chunks[0].name, b.file_position, cut - b.file_position),
            (record.chunks[1].name, 0, b.file_position + b.compressed_length - cut),
        ]
        storage.reads.clear()
        assert seg.load(i) is data and storage.reads == []  # served by the cache
        seg.close()
        reader.open(record).close()
        assert storage.reads == []  # the table is cached too
    finally:
        reader.close()


def test_adjacent_blocks_are_fetched_together_each_byte_once(tmp_path, uploaded) -> None:
    """A segment read in order has adjacent blocks share a read (a GET), and every byte of its
    blocks is read exactly once."""
    storage = WatchedStorage(str(tmp_path / "tier2"))
    reader = RemoteReader(storage, cache_bytes=1 << 20, concurrency=1)
    try:
        record = uploaded[0]
        seg = reader.open(record)
        blocks = seg.info.blocks
        storage.reads.clear()
        for i in range(len(blocks)):
            assert len(seg.block(i)) == blocks[i].raw_length
        seg.close()
        by_chunk = {c.name: c.position for c in record.chunks}
        spans = sorted((by_chunk[name] + offset, length) for name, offset, length in storage.reads)
        position = blocks[0].file_position
        for start, length in spans:
            assert start == position  # back to back: nothing read twice, nothing skipped
            position += length
        assert position == blocks[-1].file_position + blocks[-1].compressed_length
        assert any(sum(start <= b.file_position < start + length for b in blocks) >= 2 for start, length in spans)
    finally:
        reader.close()


def test_prefetch_keeps_several_ranged_reads_in_flight(tmp_path, uploaded) -> None:
    storage = WatchedStorage(str(tmp_path / "tier2"))
    reader = RemoteReader(storage, cache_bytes=1 << 20, concurrency=4)
    try:
        seg = reader.open(uploaded[0])
        assert seg.depth >= 4
        storage.gate = 4  # each read waits until four are in flight together
        first = seg.block(0)  # read on this thread; it schedules the next blocks at once
        assert len(first) == seg.info.blocks[0].raw_length
        nxt = seg.block(1)  # the prefetch threads were reading 1, 2, 3, 4... together
        assert storage.peak >= 4
        assert len(nxt) == seg.info.blocks[1].raw_length
        storage.gate = 0
        for i in range(2, len(seg.info.blocks)):
            assert len(seg.block(i)) == seg.info.blocks[i].raw_length
        seg.close()
    finally:
        reader.close()


def test_the_cache_bound_holds_over_many_segments(tmp_path, uploaded) -> None:
    storage = WatchedStorage(str(tmp_path / "tier2"))
    cache = 8192
    reader = RemoteReader(storage, cache_bytes=cache, concurrency=2)
    try:
        total = 0
        for record in uploaded:
            seg = reader.open(record)
            for i in range(len(seg.info.blocks)):
                total += len(seg.block(i))
            seg.close()
            assert reader.cache.nbytes <= cache
        assert total > 10 * cache and 0 < reader.cache.peak_bytes <= cache
    finally:
        reader.close()


def test_a_short_chunk_raises_naming_the_object_and_bytes(tmp_path, uploaded) -> None:
    record = uploaded[1]
    chunk = record.chunks[-1]
    path = tmp_path / "tier2" / chunk.name
    path.write_bytes(path.read_bytes()[:-10])
    reader = RemoteReader(LocalStorage(str(tmp_path / "tier2")), cache_bytes=1 << 20, concurrency=2)
    try:
        seg = reader.open(record)
        with pytest.raises(CorruptRecordError, match="is short") as info:
            for i in range(len(seg.info.blocks)):
                seg.block(i)
        assert chunk.name in str(info.value) and f"offsets {record.base_offset} to {record.end_offset - 1}" in str(info.value)
        seg.close()
    finally:
        reader.close()


def test_cli_check_reports_a_flipped_byte_in_a_chunk(tmp_path) -> None:
    root = tmp_path / "root"
    tier = (tmp_path / "tier2").as_uri()
    Admin(root).create_topic("t", 1, tier=tier, segment_bytes=8192, compression_block_bytes=1024, tier_chunk_bytes=1500)
    with Producer(root) as p:
        for i in range(2000):
            p.send("t", f"record-{i:06d}".encode() * 3, partition=0)
    with Admin(root).open_partition("t", 0, maintenance_interval=0) as ch:
        ch.compress_sealed()
        uploaded = offload(ch, keep_local=1)
    ok = fc(root, "check", check=False)
    assert ok.returncode == 0, ok.stderr.decode()
    assert b"2,000 records" in ok.stdout
    chunk = uploaded[2].chunks[0]
    obj = tmp_path / "tier2" / chunk.name
    data = bytearray(obj.read_bytes())
    data[-30] ^= 0x08  # inside a block's body
    obj.write_bytes(bytes(data))
    bad = fc(root, "check", check=False)
    err = bad.stderr.decode()
    assert bad.returncode == 1 and chunk.name in err and "Traceback" not in err


def test_an_object_whose_table_says_another_segment_is_refused(tmp_path, uploaded) -> None:
    """A read checks that the object is the segment its record names (offsets, size and max
    timestamp from the CRC-checked table), never trusting the name alone."""
    record = uploaded[1]
    reader = RemoteReader(LocalStorage(str(tmp_path / "tier2")), cache_bytes=1 << 20, concurrency=2)
    try:
        for other in (
            dataclasses.replace(record, max_timestamp=record.max_timestamp + 1),
            dataclasses.replace(record, end_offset=record.end_offset + 1),
        ):
            with pytest.raises(CorruptRecordError, match="but the metadata says") as info:
                reader.open(other)
            assert record.chunks[0].name in str(info.value)
        reader.open(record).close()  # the true record still reads
    finally:
        reader.close()
