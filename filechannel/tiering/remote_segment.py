"""Reading an uploaded segment (a ``.seg.z`` cut into chunks) from tier-2 with ranged reads.

A remote segment is read like a local compressed one (compressed.py): its header and block
table first (the same reader, :func:`~filechannel.engine.compressed.read_table`), then the
blocks a reader needs. Its bytes are the local ``.seg.z`` bytes unchanged, cut into the
chunks the metadata lists, so byte ``p`` of the segment is byte
``p - chunk.position + chunk.object_offset`` of the object holding it (``object_offset`` is 0
unless defragmentation merged the chunk into a larger object), and a block spanning two
chunks takes two ranged reads.

Invariants:

- Damage is never skipped. A chunk that is missing (while the metadata still says the
  segment is uploaded: one that total retention deleted under the reader raises
  :class:`~filechannel.errors.OffsetOutOfRangeError`, as a local segment collected
  under a reader does), a read that returns fewer bytes than
  the metadata says the chunk holds, a table whose CRC or shape is wrong or that disagrees
  with the metadata, a block that does not decompress, all raise
  :class:`~filechannel.errors.CorruptRecordError` naming the object(s), the bytes and the
  offsets. (A missing object becomes CorruptRecordError, never a FileNotFoundError: a
  vanished local file means "listed again", a vanished uploaded chunk means data loss.)
- A segment marked "lost" (``tier fsck --repair`` found its objects missing or damaged,
  with no local copy) is listed like an uploaded one, so its offsets are never a silent
  hole: opening it raises :class:`~filechannel.errors.TierDataLostError` naming them,
  without asking the storage.
- A storage that cannot be reached raises :class:`~filechannel.errors.StorageUnavailableError`
  at the read that needed it (the storage binding retried already); nothing is consumed,
  and the same read can be retried.
- Memory is bounded: decompressed blocks live in one :class:`BlockCache` per reader of a
  channel (``tier_cache_bytes``), tables in a cache of at most ``TABLE_CACHE_ENTRIES``
  (a table is 44 bytes a block: 11 KiB for a 64 MiB segment of 256 KiB blocks), and each
  open segment holds at most ``depth`` prefetched blocks in flight, with ``depth`` chosen
  so that they fit in a quarter of the cache. So a reader holds at most the cache, plus a
  quarter of it per open segment (a cursor has two open near a segment's end), plus
  the block it decodes: under 1.5x ``tier_cache_bytes`` + tables.

Prefetch, in two stages as for local segments: a reader moving from block ``i`` to
``i + 1`` schedules the next ``depth`` blocks (up to ``MAX_PREFETCH_BLOCKS``: S3 answers in
milliseconds, a block decompresses in about one, so far more blocks are in flight than the
local readahead's four) on a thread pool shared by the channel (``2 x tier_concurrency``
threads, so several ranged GETs are in flight), adjacent blocks together in one GET of up
to ``MAX_GET_BYTES`` (a request costs the client about a millisecond of CPU, whatever its
size: as much as decompressing a block); a reader moving on by one block tops the window up
only once a whole GET's worth is wanted, while more than half of it is in flight, so GETs
stay large. A fetch thread only fetches: the bytes it
gets go to the C readahead workers (:func:`~filechannel.engine.readahead.decompress_fetched`),
which decompress without the GIL while the thread issues its next GET, so both CPUs
decompress as they do for a local segment. Without the C module, the reader's thread
decompresses with python-zstandard.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from ..engine.compressed import TABLE_FIRST_READ, BlockData, CompressedInfo, block_result, read_table
from ..engine.readahead import decompress_fetched
from ..errors import ChannelClosedError, CorruptRecordError, ObjectNotFoundError, OffsetOutOfRangeError, TierDataLostError
from .block_cache import BlockCache, DiskBlockCache
from .layout import LOST, SegmentRecord
from .storage import ChunkStorage, redact_url

TABLE_CACHE_ENTRIES = 1024
MAX_PREFETCH_BLOCKS = 32
# A prefetch GET covers adjacent blocks up to about this many bytes: a request costs its client
# about a millisecond of CPU whatever its size (botocore), as much as decompressing a block.
MAX_GET_BYTES = 1 << 20


class RemoteReader:
    """The read side of one channel's tier-2: tables, the block cache and the prefetch threads."""

    def __init__(
        self,
        storage: ChunkStorage,
        cache_bytes: int,
        concurrency: int,
        still_uploaded: Callable[[SegmentRecord], bool] | None = None,
        current: Callable[[SegmentRecord], SegmentRecord | None] | None = None,
        *,
        cache: BlockCache | DiskBlockCache | None = None,
    ) -> None:
        self.storage = storage
        # Asked when an object is missing: False means total retention deleted the segment
        # (OffsetOutOfRangeError, as for a local segment collected under a reader), not damage.
        self.still_uploaded = still_uploaded
        # Asked when an object is missing too: the segment's record now, if its chunks moved
        # (defragmentation merged them, and the old objects were deleted after the garbage
        # delay): the same bytes are then read from where they are now.
        self.current = current
        self.cache = cache if cache is not None else BlockCache(cache_bytes)  # of cache_bytes, in memory or files
        self._tables: OrderedDict[tuple[str, int, int], CompressedInfo] = OrderedDict()
        self._lock = threading.Lock()
        self.threads = max(2, 2 * concurrency)  # prefetch threads: reads in flight at most
        self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="filechannel-tier-read")
        self._closed = False

    def object_url(self, name: str) -> str:
        """Where an object is, for messages (never with a credential)."""
        return f"{redact_url(self.storage.url).rstrip('/')}/{name}"

    def info(self, record: SegmentRecord) -> CompressedInfo:
        """The segment's header and block table: two ranged reads at most, then cached."""
        if record.state == LOST:
            raise TierDataLostError(
                f"offsets {record.base_offset} to {record.end_offset - 1} of {record.channel!r} are lost: "
                f"'filechannel tier fsck --repair' found their tier-2 objects ({self.object_url(record.chunks[0].name)}...) "
                "missing or damaged and no local copy; restore them from a backup of the bucket, or seek past "
                f"offset {record.end_offset - 1}"
            )
        key = (record.channel, record.base_offset, record.epoch)
        with self._lock:
            info = self._tables.get(key)
            if info is not None:
                self._tables.move_to_end(key)
                return info
        info = self._read_table(record)
        with self._lock:
            self._tables[key] = info
            while len(self._tables) > TABLE_CACHE_ENTRIES:
                self._tables.popitem(last=False)
        return info

    def _read_table(self, record: SegmentRecord) -> CompressedInfo:
        """The table, read as a local one is (the first read within the first object, so one
        request), then checked against the record: a table that names other offsets, another
        size or another max timestamp is not the object the manifest names."""
        where = self.object_url(record.chunks[0].name)
        info = read_table(
            lambda position, length: read_range(self, record, position, length),
            record.size,
            where,
            first_read=min(record.chunks[0].length, TABLE_FIRST_READ),
        )
        said = (info.base_offset, info.end_offset, info.blocks_end, info.max_timestamp)
        if said != (record.base_offset, record.end_offset, record.size, record.max_timestamp):
            raise CorruptRecordError(
                f"tier-2 segment {where!r} holds offsets {info.base_offset} to {info.end_offset - 1} in {info.blocks_end} "
                f"bytes with records up to timestamp {info.max_timestamp}, but the metadata says {record.base_offset} "
                f"to {record.end_offset - 1} in {record.size} bytes up to timestamp {record.max_timestamp}"
            )
        return info

    def open(self, record: SegmentRecord) -> RemoteSegment:
        """A reader of one uploaded segment (reads its table now)."""
        if self._closed:
            raise ChannelClosedError(f"the tier-2 reader of {self.storage.url} is closed")
        return RemoteSegment(self, record, self.info(record))

    def prefetch(self, segment: RemoteSegment, run: Sequence[int]) -> list[Future[Callable[[], BlockData]]]:
        """Fetch the adjacent blocks ``run`` of ``segment`` with one read on a prefetch thread; each
        future's result is its block's decompression, queued (see :meth:`RemoteSegment.fetch`),
        and its error the read's. A future cancelled before the read starts is not read (none of
        the run: no read at all); close cancels those of reads not started."""
        futures: list[Future[Callable[[], BlockData]]] = [Future() for _ in run]

        def fetch() -> None:
            wanted = [f.set_running_or_notify_cancel() for f in futures]
            if not any(wanted):
                return
            try:
                fetched = segment.fetch_run(run)
            except BaseException as exc:  # (into the futures: raised at the read that waits for one)
                for f, w in zip(futures, wanted, strict=True):
                    if w:
                        f.set_exception(exc)
                return
            for f, w, result in zip(futures, wanted, fetched, strict=True):
                if w:
                    f.set_result(result)

        def cancelled(task: Future[None]) -> None:
            if task.cancelled():  # by close before it ran
                for f in futures:
                    f.cancel()

        with self._lock:  # against close: a closed pool refuses work with a RuntimeError
            if self._closed:
                raise ChannelClosedError(f"the tier-2 reader of {self.storage.url} is closed")
            self._pool.submit(fetch).add_done_callback(cancelled)
        return futures

    def close(self) -> None:
        """Stop the prefetch threads (waits for the reads in flight) and drop the caches."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.cache.clear()
        with self._lock:
            self._tables.clear()


def read_range(reader: RemoteReader, record: SegmentRecord, position: int, length: int) -> bytes:
    """Bytes ``[position, position + length)`` of the segment, read from the chunks that hold them.

    Every chunk must give exactly the bytes the metadata says it holds: a missing chunk or a
    short read raises :class:`CorruptRecordError` naming the object and the bytes.
    """
    chunks = record.chunks
    i = bisect.bisect_right([c.position for c in chunks], position) - 1
    parts = []
    end = min(position + length, record.size)
    while position < end and i < len(chunks):
        c = chunks[i]
        start, stop = position - c.position, min(end, c.position + c.length) - c.position
        try:
            data = reader.storage.read(c.name, c.object_offset + start, stop - start)
        except ObjectNotFoundError as exc:
            now = reader.current(record) if reader.current is not None else None
            if now is not None and now.chunks != record.chunks and now.size == record.size:
                parts.append(read_range(reader, now, position, end - position))  # the rest, from where it is now
                break
            if reader.still_uploaded is not None and not reader.still_uploaded(record):
                raise OffsetOutOfRangeError(
                    f"offsets {record.base_offset} to {record.end_offset - 1} of {record.channel!r} were deleted from "
                    "tier-2 by retention while being read; seek to the first offset or later"
                ) from exc
            raise CorruptRecordError(
                f"tier-2 object {reader.object_url(c.name)!r} is missing: it holds bytes {c.position} to "
                f"{c.position + c.length - 1} of the segment of offsets {record.base_offset} to {record.end_offset - 1} "
                f"of {record.channel!r}; restore it, or delete the segment's metadata to give up these offsets"
            ) from exc
        if len(data) != stop - start:
            raise CorruptRecordError(
                f"tier-2 object {reader.object_url(c.name)!r} is short: a read of its bytes {c.object_offset + start} to "
                f"{c.object_offset + stop - 1} "
                f"returned {len(data)} bytes (the metadata says it holds {c.length}); segment of offsets "
                f"{record.base_offset} to {record.end_offset - 1} of {record.channel!r}"
            )
        parts.append(data)
        position += len(data)
        i += 1
    return parts[0] if len(parts) == 1 else b"".join(parts)


class RemoteSegment:
    """Decompressed blocks of one uploaded segment, the next ones prefetched.

    The same role as a local :class:`~filechannel.engine.readahead.BlockReadahead` over a
    :class:`~filechannel.engine.compressed.CompressedSegment`: ``info``, ``path``, ``block(i)``,
    ``start()``, ``close()``. Used by one reader thread; ``close`` may come from any thread.
    """

    def __init__(self, reader: RemoteReader, record: SegmentRecord, info: CompressedInfo) -> None:
        self.reader = reader
        self.record = record
        self.info = info
        self.path = reader.object_url(record.chunks[0].name)
        largest = max((b.raw_length + b.compressed_length for b in info.blocks), default=1)
        self.depth = max(1, min(MAX_PREFETCH_BLOCKS, reader.cache.capacity // (4 * largest)))
        self._ahead: dict[int, Future[Callable[[], BlockData]]] = {}
        self._last = -1
        self._lock = threading.Lock()
        self._closed = False

    def where(self, i: int) -> str:
        """The objects and bytes block ``i`` is read from, for messages."""
        b = self.info.blocks[i]
        first, last = b.file_position, b.file_position + b.compressed_length - 1
        names = [
            f"{c.name} (its bytes {max(first, c.position) - c.position + c.object_offset} to "
            f"{min(last, c.position + c.length - 1) - c.position + c.object_offset})"
            for c in self.record.chunks
            if c.position <= last and first < c.position + c.length
        ]
        return f"{redact_url(self.reader.storage.url).rstrip('/')}/" + " + ".join(names)

    def block(self, i: int) -> BlockData:
        """Block ``i`` decompressed; raises CorruptRecordError / StorageUnavailableError (see the module)."""
        with self._lock:
            if self._closed:
                raise ChannelClosedError(f"the reader of tier-2 segment {self.path!r} was closed")
            sequential = i == self._last + 1
            if not sequential:
                self._drop()
            self._last = i
            fut = self._ahead.pop(i, None)
            if sequential:
                self._schedule(range(i + 1, min(i + 1 + self.depth, len(self.info.blocks))), eager=False)
        if fut is None:
            return self.load(i)
        return self._finish(i, fut.result)  # a fetch's error (damage, an unreachable storage) raises here, at the read

    def start(self) -> None:
        """Prefetch the first blocks now (a reader nearing the end of the segment before)."""
        with self._lock:
            if not self._closed and self._last == -1 and not self._ahead:
                self._schedule(range(min(self.depth, len(self.info.blocks))), eager=True)

    def _schedule(self, indexes: range, eager: bool) -> None:
        """Prefetch the blocks of ``indexes`` not in flight or cached, adjacent ones together in
        reads of up to ``MAX_GET_BYTES``, and in as many reads as there are prefetch threads
        when there are fewer bytes than that (small blocks are still read in parallel). Not
        ``eager`` (a read moving on by one block), while more than half the window is in flight,
        it waits until a whole read's worth (or the segment's last block) is wanted, then reads
        it at once, so that reads stay large."""
        blocks = self.info.blocks
        wanted = [j for j in indexes if j not in self._ahead and self.reader.cache.get(self._key(j)) is None]
        if not wanted:
            return
        size = sum(blocks[j].compressed_length for j in wanted)
        topping_up = not eager and len(self._ahead) > self.depth // 2
        if topping_up and size < MAX_GET_BYTES and wanted[-1] != len(blocks) - 1:
            return
        limit = MAX_GET_BYTES if topping_up else min(MAX_GET_BYTES, max(1, size // self.reader.threads))
        run: list[int] = []
        for j in wanted:
            if run and (
                j != run[-1] + 1
                or blocks[j].file_position != blocks[run[-1]].file_position + blocks[run[-1]].compressed_length
                or blocks[j].file_position + blocks[j].compressed_length - blocks[run[0]].file_position > limit
            ):
                self._ahead.update(zip(run, self.reader.prefetch(self, run), strict=True))
                run = []
            run.append(j)
        self._ahead.update(zip(run, self.reader.prefetch(self, run), strict=True))

    def _key(self, i: int) -> tuple[str, int, int, int]:
        return (self.record.channel, self.record.base_offset, self.record.epoch, i)

    def fetch(self, i: int) -> Callable[[], BlockData]:
        """Fetch block ``i``'s bytes (ranged reads) and queue their decompression; returns the
        call that waits for it. Runs on a prefetch thread, or the reader's."""
        return self.fetch_run([i])[0]

    def fetch_run(self, run: Sequence[int]) -> list[Callable[[], BlockData]]:
        """:meth:`fetch` of the adjacent blocks ``run`` (each starting where the one before ends)
        with one ranged read: their decompressions, queued, in order."""
        blocks = [self.info.blocks[i] for i in run]
        first = blocks[0].file_position
        data = read_range(self.reader, self.record, first, blocks[-1].file_position + blocks[-1].compressed_length - first)
        if len(blocks) == 1:
            return [decompress_fetched(data, blocks[0])]  # (no copy)
        at = [b.file_position - first for b in blocks]
        return [decompress_fetched(data[a : a + b.compressed_length], b) for a, b in zip(at, blocks, strict=True)]

    def load(self, i: int) -> BlockData:
        """Block ``i`` from the cache, or fetched and decompressed now and cached."""
        return self._finish(i, lambda: self.fetch(i))

    def _finish(self, i: int, fetched: Callable[[], Callable[[], BlockData]]) -> BlockData:
        """Block ``i`` from the cache, or from ``fetched`` (the fetch's result: the queued
        decompression), checked as every block is, then cached."""
        key = self._key(i)
        data = self.reader.cache.get(key)
        if data is not None:
            return data
        data = block_result(self.where(i), self.info, i, lambda: fetched()())
        self.reader.cache.put(key, data)
        return data

    def _drop(self) -> None:
        for fut in self._ahead.values():
            fut.cancel()  # one already running finishes into the cache; nobody waits for it
        self._ahead.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()
