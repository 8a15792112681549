"""Offset ranges in tier-2, planned on the driver and read on executors straight from the storage.

Once a partition's segments are uploaded (DESIGN.md "Tier-2"), any machine that can reach
the bucket can read them: the driver, next to the channel, plans; the executors read with
ranged GETs and never open the channel's folder. Only the part of a range that is not
uploaded yet (the local tail) is read through the channel, as an :class:`OffsetRange`.

Invariants:

- A :class:`TierRange` carries all its executor needs and nothing secret: the storage URL
  (credentials stripped by ``redact_url``; the config refuses them in ``s3://`` URLs anyway),
  the topic's ``tier_options`` (the config refuses credential-like names in them), and the
  uploaded :class:`~filechannel.tiering.layout.SegmentRecord` of every segment it touches,
  pickled whole, so a field added to the records (or their chunks) reaches the executor with
  no change here. It has no root: executor code cannot open the channel. Credentials come
  from the executor's environment (``spark.executorEnv.*``) or boto3's default chain.
- The offsets of a topic-partition are covered exactly once: the uploaded run holding the
  start is cut into tier ranges at segment boundaries, or at block boundaries when more
  tasks are asked than there are segments, and the rest of the range is one local range.
  Tasks never share an offset, and each yields its rows in offset order.
- Planning reads only tier-2 metadata (the root's ``ROOT/.tier/metadata.db``, or a bucket's
  indexes for a query of a tier URL alone: spark/bucket.py); it fetches
  a segment's header and block table (one ranged GET) only for a segment cut inside, which
  happens only when ``minPartitions``/``maxRecordsPerPartition`` ask for more tasks than
  there are segments.
- Damage is never skipped (as for any tier-2 read): a missing chunk, a short read, a bad
  table, a block that does not decompress or a record whose CRC fails raises
  :class:`~filechannel.errors.CorruptRecordError` naming the objects. A chunk missing
  because retention deleted its segment after planning (its manifest is gone too) is data
  loss: the task fails unless ``failOnDataLoss=false``, which skips that segment.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import itertools
import logging
import operator
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition

from ..client.topics import TopicStore
from ..config import ChannelConfig
from ..engine.columns import decode_columns
from ..engine.compressed import check_block
from ..engine.readahead import READAHEAD_BLOCKS
from ..engine.record import Record
from ..errors import AccessDeniedError, OffsetOutOfRangeError
from ..root import ROOT_METADATA, partition_name
from ..tiering.layout import SegmentRecord
from ..tiering.metadata import TierMetadata
from ..tiering.reindex import open_index
from ..tiering.remote_segment import RemoteReader, RemoteSegment
from ..tiering.storage import redact_url
from .errors import data_loss
from .ranges import BATCH_BYTES, BATCH_ROWS, DECODE_ROWS, OffsetRange
from .schema import BatchBuilder
from .storages import PROCESS_STORAGES, storage_for

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

# Default task size of an offloaded range (compressed bytes): enough to amortise a task's
# start (a Python worker, a storage client, tables), small enough that a backfill of months
# spreads across executors. Two default segments (64 MiB each).
TASK_BYTES = 128 * 1024 * 1024


@dataclass(repr=False)
class TierRange(InputPartition):
    """Offsets ``[start, end)`` of one topic-partition, read from tier-2 alone (see the module)."""

    storage_url: str
    storage_options: dict[str, Any]
    topic: str
    partition: int
    start: int
    end: int  # exclusive
    segments: tuple[SegmentRecord, ...]  # the uploaded segments holding [start, end), in order
    cache_bytes: int = ChannelConfig.tier_cache_bytes
    concurrency: int = ChannelConfig.tier_concurrency
    fail_on_data_loss: bool = True
    include_headers: bool = False
    origin: str | None = None  # the origin column's value (a query of a tier URL), None: no such column

    @property
    def size(self) -> int:
        return self.end - self.start

    def cut(self, bounds: Sequence[int]) -> list[TierRange]:
        """This range cut at ``bounds`` (increasing offsets strictly inside it), each piece with its segments."""
        edges = [self.start, *bounds, self.end]
        pairs = itertools.pairwise(edges)
        return [dataclasses.replace(self, start=a, end=b, segments=_holding(self.segments, a, b)) for a, b in pairs]

    def __repr__(self) -> str:  # never the options (they are not secret, but they are noise in Spark's logs)
        origin = "" if not self.origin else f"{self.origin}."
        where = f"{origin}{self.topic}[{self.partition}] {self.start}..{self.end - 1}"
        return f"TierRange({where} from {redact_url(self.storage_url)}, {len(self.segments)} segment(s))"


def _holding(segments: Sequence[SegmentRecord], start: int, end: int) -> tuple[SegmentRecord, ...]:
    """The segments holding some offset of ``[start, end)``."""
    return tuple(s for s in segments if s.base_offset < end and start < s.end_offset)


def snap(ideal: Sequence[int], candidates: Sequence[int]) -> list[int]:
    """For each ideal cut, the nearest candidate; increasing, without repeats (so maybe fewer)."""
    out: list[int] = []
    for c in ideal:
        i = bisect.bisect_left(candidates, c)
        near = [candidates[j] for j in (i - 1, i) if 0 <= j < len(candidates)]
        if not near:
            continue
        best = min(near, key=lambda x: abs(x - c))
        if not out or best > out[-1]:
            out.append(best)
    return out


class SegmentPlanner(ABC):
    """Cuts offset ranges into tier ranges over uploaded segments: what a planner of tier-2 tasks
    does, wherever its segments come from. A subclass answers :meth:`tier_config` and
    :meth:`uploaded` (a root's index: :class:`TierPlanner`; a bucket read alone:
    :class:`~filechannel.spark.bucket.BucketPlanner`) and may name a topic's rows
    (:meth:`labels`). Opens a storage (with its reader) only for a segment it must cut inside.
    Close it after planning."""

    def __init__(self) -> None:
        self._readers: dict[str, RemoteReader] = {}

    @abstractmethod
    def tier_config(self, topic: str) -> dict[str, Any] | None:
        """The topic's settings (``tier``, ``tier_options``...) if it has a tier, else None."""

    @abstractmethod
    def uploaded(self, topic: str, partition: int) -> list[SegmentRecord]:
        """The partition's segments in state uploaded, by offset (none if nothing was ever uploaded)."""

    def labels(self, topic: str) -> tuple[str, str | None]:
        """The ``topic`` column of ``topic``'s rows and their ``origin`` column (None: no such column)."""
        return topic, None

    def split_tiers(self, r: OffsetRange) -> list[TierRange | OffsetRange]:
        """``r`` as tier ranges of at most about :data:`TASK_BYTES` over its uploaded run, then the local rest."""
        config = self.tier_config(r.topic)
        if config is None or r.size <= 0:
            return [r]
        run = _run_from(self.uploaded(r.topic, r.partition), r.start)
        if not run:
            return [r]
        upto = min(r.end, run[-1].end_offset)
        topic, origin = self.labels(r.topic)
        whole = TierRange(
            redact_url(config["tier"]),
            dict(config.get("tier_options") or {}),
            topic,
            r.partition,
            r.start,
            upto,
            _holding(run, r.start, upto),
            cache_bytes=config.get("tier_cache_bytes", ChannelConfig.tier_cache_bytes),
            concurrency=config.get("tier_concurrency", ChannelConfig.tier_concurrency),
            fail_on_data_loss=r.fail_on_data_loss,
            include_headers=r.include_headers,
            origin=origin,
        )
        bounds, total = [], 0
        for s in whole.segments[:-1]:
            total += s.size
            if total >= TASK_BYTES:
                bounds.append(s.end_offset)
                total = 0
        pieces: list[TierRange | OffsetRange] = list(whole.cut(bounds))
        if upto < r.end:
            pieces.append(dataclasses.replace(r, start=upto))
        return pieces

    def pieces(self, r: TierRange | OffsetRange, parts: int) -> list[TierRange | OffsetRange]:
        """``r`` cut into about ``parts`` pieces of nearly equal records: a local range anywhere, a
        tier range at segment boundaries, or block boundaries when there are too few of those."""
        if isinstance(r, OffsetRange):
            return list(r.pieces(parts))
        step = r.size / parts
        ideal = [r.start + round(i * step) for i in range(1, parts)]
        candidates = [s.base_offset for s in r.segments if r.start < s.base_offset < r.end]
        if len(candidates) < parts - 1:
            candidates = [o for s in r.segments for o in self._block_starts(r, s) if r.start < o < r.end]
        return list(r.cut(snap(ideal, candidates)))

    def _block_starts(self, r: TierRange, segment: SegmentRecord) -> list[int]:
        reader = self._readers.get(r.storage_url)
        if reader is None:
            storage = storage_for(r.storage_url, r.storage_options)
            reader = self._readers[r.storage_url] = RemoteReader(storage, 1024 * 1024, 1)
        return [b.first_offset for b in reader.info(segment).blocks]

    def close(self) -> None:
        readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            reader.close()  # its storage is this process's (storage_for): kept open


class TierPlanner(SegmentPlanner):
    """The driver's view of the root's tier-2: which offsets are uploaded (its index,
    ``ROOT/.tier/metadata.db``, opened on first use), and block bounds on demand."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root
        self.store = TopicStore(root)
        self._metadata: TierMetadata | None = None

    def tier_config(self, topic: str) -> dict[str, Any] | None:
        config = self.store.tier_config(self.store.meta(topic).get("config", {}))
        return config if config.get("tier") is not None else None

    def uploaded(self, topic: str, partition: int) -> list[SegmentRecord]:
        path = os.path.join(self.root, ROOT_METADATA)
        if self._metadata is None:
            if not os.path.exists(path):
                return []  # nothing was ever uploaded under this root
            self._metadata = open_index(path)  # a damaged index is moved aside and rebuilt, not a failed query
        return self._metadata.segments(partition_name(topic, partition))

    def close(self) -> None:
        metadata, self._metadata = self._metadata, None
        try:
            super().close()
        finally:
            if metadata is not None:
                metadata.close()


def uploaded_end_offsets(root: str, topics: Sequence[str]) -> dict[str, dict[str, int]]:
    """``{"topic": {"partition": offset}}``: where each partition's records in tier-2, from its
    first offset on, end (its first offset if none are uploaded). As ``endingOffsets`` of a batch
    from ``earliest``, a read that executors do from tier-2 alone, with no task on the channel
    (what ``option("endingOffsets", "uploaded")`` does)."""
    store = TopicStore(root)
    return uploaded_ends(root, {topic: list(range(store.partitions(topic))) for topic in topics})


def uploaded_ends(root: str, partitions: Mapping[str, Sequence[int]]) -> dict[str, dict[str, int]]:
    """:func:`uploaded_end_offsets` of the given partitions of each topic (on the driver: it
    reads the root's index and opens each partition read-only for its first offset)."""
    planner = TierPlanner(root)
    try:
        out: dict[str, dict[str, int]] = {}
        for topic, parts in partitions.items():
            out[topic] = {}
            for p in parts:
                with planner.store.open_partition(topic, p, read_only=True, tier_storages=PROCESS_STORAGES) as ch:
                    first = ch.first_offset
                run = _run_from(planner.uploaded(topic, p), first) if planner.tier_config(topic) else []
                out[topic][str(p)] = run[-1].end_offset if run else first
        return out
    finally:
        planner.close()


def _run_from(uploaded: list[SegmentRecord], offset: int) -> list[SegmentRecord]:
    """The uploaded segments from the one holding ``offset`` on, while each starts where the last ended."""
    i = bisect.bisect_right([s.base_offset for s in uploaded], offset) - 1
    if i < 0 or uploaded[i].end_offset <= offset:
        return []
    run = [uploaded[i]]
    for s in uploaded[i + 1 :]:
        if s.base_offset != run[-1].end_offset:
            break
        run.append(s)
    return run


class _Segments:
    """Opens a task's segments in order, those after the current one ahead: their tables and
    first blocks are fetched while the current one's last blocks are fetched and decoded, so a
    task's GETs do not pause at each segment for a table read and a round trip.

    Bound (remote_segment.py's: the cache, plus a quarter of it per open segment, for a cursor
    has two open near a segment's end): the next segment is always started when the current one
    nears its end, as by a cursor; further ones are started earlier only while the prefetch
    windows of the segments started ahead (each one's first ``depth`` blocks, raw and
    compressed) fit in a quarter of the cache together. So segments of a few blocks are fetched
    several ahead, and one of 64 MiB (whose window alone takes the quarter) only when the
    current one nears its end. A segment opened ahead but not started holds only its table."""

    def __init__(self, reader: RemoteReader, records: Sequence[SegmentRecord]) -> None:
        self.reader, self.records = reader, records
        self._budget = reader.cache.capacity // 4
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="filechannel-tier-open")
        self._lock = threading.Lock()
        self._ahead: dict[int, Future[RemoteSegment]] = {}  # opened (or opening) ahead, by index
        self._started: dict[int, int] = {}  # of those, the ones started (or to be): their windows' bytes
        self._closed = False

    def open(self, k: int) -> RemoteSegment:
        with self._lock:
            future = self._ahead.pop(k, None)
            self._started.pop(k, None)
        if future is not None:
            return future.result()  # its error (retention, damage, access) raises here
        self._drop()
        return self.reader.open(self.records[k])

    def prepare(self, k: int) -> None:
        """Start segment ``k`` now (the current one nears its end), opening it if need be."""
        self._submit(k, force=True)

    def _submit(self, k: int, force: bool) -> None:
        with self._lock:
            if k >= len(self.records) or k in self._started or self._closed:
                return
            if force:
                self._started[k] = 0  # (its window once opened): asked again, nothing more to do
            opened = self._ahead.get(k)
            self._ahead[k] = self._pool.submit(self._open_started, k, opened, force)

    def _open_started(self, k: int, opened: Future[RemoteSegment] | None, force: bool) -> RemoteSegment:
        """On the open thread: segment ``k`` (``opened`` already, or now), started if ``force`` or
        within the bound, and then the next one opened ahead (started if that fits too)."""
        segment = opened.result() if opened is not None else self.reader.open(self.records[k])
        window = sum(b.raw_length + b.compressed_length for b in segment.info.blocks[: segment.depth])
        with self._lock:
            fits = force or sum(self._started.values()) + window <= self._budget
            if fits and k in self._ahead:  # (not if the task took it meanwhile)
                self._started[k] = window
        if fits:
            segment.start()
            self._submit(k + 1, force=False)
        return segment

    def _drop(self) -> None:
        with self._lock:
            futures, self._ahead = list(self._ahead.values()), {}
            self._started.clear()
        for future in futures:
            with contextlib.suppress(Exception):  # never read: its error does not matter
                future.result().close()

    def close(self) -> None:
        with self._lock:
            self._closed = True  # nothing new is submitted
        self._pool.shutdown(wait=True)  # the opens in flight end first
        self._drop()


def read_tier_range(r: TierRange, batch_rows: int = BATCH_ROWS, batch_bytes: int = BATCH_BYTES) -> Iterator[pa.RecordBatch]:
    """On an executor: the records of ``r`` from tier-2 as Arrow batches (as ``read_range``
    makes them: ``batch_rows`` rows, about ``batch_bytes`` at most), in offset order."""
    try:
        storage = storage_for(r.storage_url, r.storage_options)
    except AccessDeniedError as exc:
        raise _no_access(r, exc) from exc

    def still_uploaded(record: SegmentRecord) -> bool:
        # Retention deletes the chunks, then the manifest: a missing chunk whose manifest is
        # still there is damage (or a deletion half done, which a retried task tells apart).
        return record.manifest is None or storage.exists(record.manifest)

    reader = RemoteReader(storage, r.cache_bytes, r.concurrency, still_uploaded)
    records = _holding(r.segments, r.start, r.end)
    segments = _Segments(reader, records)
    try:
        builder = BatchBuilder(r.topic, r.partition, r.include_headers, r.origin)
        pos = r.start
        for k, record in enumerate(records):
            try:
                segment = segments.open(k)
                try:
                    near_end = functools.partial(segments.prepare, k + 1)
                    yield from _segment_batches(segment, pos, r.end, builder, batch_rows, batch_bytes, near_end)
                finally:
                    segment.close()
            except OffsetOutOfRangeError:
                if r.fail_on_data_loss:
                    raise data_loss(r.topic, r.partition, pos, record.end_offset) from None
                gone = (r.topic, r.partition, pos, record.end_offset - 1)
                log.warning("%s[%d]: offsets %d to %d were deleted from tier-2; going on", *gone)
            except AccessDeniedError as exc:
                raise _no_access(r, exc) from exc
            pos = min(r.end, record.end_offset)
        if pos < r.end:
            raise data_loss(r.topic, r.partition, pos, pos, missing_tail=True)
        if len(builder):
            yield builder.build()
    finally:
        segments.close()
        reader.close()


def _segment_batches(
    segment: RemoteSegment,
    start: int,
    end: int,
    builder: BatchBuilder,
    batch_rows: int,
    batch_bytes: int,
    near_end: Callable[[], None],
) -> Iterator[pa.RecordBatch]:
    """The records ``[start, end)`` of one remote segment into ``builder``, yielding full batches;
    ``near_end()`` is called once the prefetch window (``segment.depth`` blocks ahead) holds the
    segment's last block, to open the next segment ahead: its GETs then follow this one's with no
    gap, where waiting for the decoding to reach the last blocks left the connections idle for a
    table read and a round trip at every segment (about a third of a read of 4 MB segments).

    Each block is decoded and checked whole by the check every reader of a compressed block
    uses (:func:`~filechannel.engine.compressed.check_block`: every record's CRC, the block
    ending whole where the next one starts). Without headers, straight into the batch's columns
    (``BatchBuilder.decoded``: no Python object per record, which cost more than the rest of
    the read; the records outside ``[start, end)`` checked and left out), a batch ending after
    the block that reaches ``batch_rows`` rows or ``batch_bytes``; with headers, into records
    added ``DECODE_ROWS`` at a time, a batch ending at ``batch_rows`` rows or soon after
    ``batch_bytes``, as ``read_range``'s do."""
    info = segment.info
    i = info.block_for_raw_position(info.start_for(start)[1])
    while i < len(info.blocks) and info.blocks[i].first_offset < end:
        if i >= len(info.blocks) - 1 - max(READAHEAD_BLOCKS, segment.depth):
            near_end()  # the prefetch window reaches the segment's end: fetch on into the next one
        data = segment.block(i)  # prefetches the next blocks
        if builder.include_headers:
            records: list[Record] = []
            _, bad = check_block(data, info, i, segment.where(i), records)
            if bad is not None:
                raise bad
            # by offset, not by count: a cleaned segment's offsets have holes
            k, stop = bisect.bisect_left(records, start, key=_offset), bisect.bisect_left(records, end, key=_offset)
            while k < stop:
                take = min(DECODE_ROWS, batch_rows - len(builder), stop - k)
                builder.add(records[k : k + take])
                k += take
                if len(builder) >= batch_rows or builder.nbytes >= batch_bytes:
                    yield builder.build()
        else:
            builder.decoded.keep = (start, end)
            _, bad = check_block(data, info, i, segment.where(i), builder.decoded, decode_columns)
            if bad is not None:
                raise bad
            if len(builder) >= batch_rows or builder.nbytes >= batch_bytes:
                yield builder.build()
        i += 1


_offset = operator.attrgetter("offset")


def _no_access(r: TierRange, exc: AccessDeniedError) -> AccessDeniedError:
    return AccessDeniedError(
        f"this executor cannot read tier-2 storage {redact_url(r.storage_url)} ({r.topic}[{r.partition}] offsets "
        f"{r.start} to {r.end - 1}): {exc}. Give the executors credentials (spark.executorEnv.AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, an instance profile or web identity), or read through the channel with "
        'option("tierDirectReads", "false")'
    )
