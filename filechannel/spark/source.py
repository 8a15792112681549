"""The ``filechannel`` source: batch reads of offset ranges and a streaming reader.

Offsets, as Spark checkpoints them, are ``{"topic": {"partition": next offset}}``. The
checkpoint, not :meth:`FileChannelStreamReader.commit`, is what makes a restarted query
resume exactly where it stopped: Spark calls ``commit`` one batch late, and we use it only to
advance an optional consumer group so garbage collection can free what Spark processed.

A query reads a root, or a tier URL alone (option ``tier``): then every function here takes the
reader's :class:`~.bucket.BucketCatalog` (``catalog``; None for a root), whose partitions are
tier-2 only channels, so the same resolving and planning give tier tasks only.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from ..channel import FileChannel
from ..client import Consumer, TopicPartition
from ..client.topics import TopicStore
from ..client.transaction_log import recover_transactions
from ..errors import ConfigError
from . import worker_heap
from .bucket import BucketCatalog, BucketPlanner
from .errors import data_loss
from .options import EARLIEST, LATEST, UPLOADED, Bound, Offsets, SourceOptions
from .ranges import OffsetRange, read_range, split
from .storages import PROCESS_STORAGES
from .tier import SegmentPlanner, TierPlanner, TierRange, read_tier_range, uploaded_ends

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


def topics_of(opts: SourceOptions, catalog: BucketCatalog | None) -> TopicStore | BucketCatalog:
    """Where the partitions read are opened: the root's topics, or the tier URL's (``catalog``)."""
    if catalog is not None:
        return catalog
    assert opts.root is not None
    return TopicStore(opts.root)


def open_read_only(store: TopicStore | BucketCatalog, topic: str, partition: int) -> FileChannel:
    """A partition read on the driver, read-only; a root's takes its tier-2 client from this
    process's (spark/storages.py: a query opens each partition several times), a tier URL's
    shares its catalog's."""
    if isinstance(store, TopicStore):
        return store.open_partition(topic, partition, read_only=True, tier_storages=PROCESS_STORAGES)
    return store.open_partition(topic, partition)


def open_catalog(opts: SourceOptions) -> contextlib.AbstractContextManager[BucketCatalog | None]:
    """A new view of the tier URL of a query of option ``tier`` (closed on exit); None for a root."""
    return opts.catalog() if opts.tier is not None else contextlib.nullcontext()


def partition_bounds(opts: SourceOptions, catalog: BucketCatalog | None) -> dict[str, dict[str, tuple[int, int]]]:
    """(first offset, end offset) of every partition read, as the files (or the bucket) show them now."""
    store = topics_of(opts, catalog)
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for topic, parts in opts.partitions(catalog).items():
        out[topic] = {}
        for p in parts:
            with open_read_only(store, topic, p) as ch:
                out[topic][str(p)] = (ch.first_offset, ch.end_offset)
    return out


def settle_transactions(opts: SourceOptions) -> None:
    """With ``kafka.isolation.level=read_committed``: finish the commits dead transactional
    producers of the root left half applied, so no offset planned falls between two parts of one
    transaction (a transaction's records reach the partitions only once committed: there is no
    other uncommitted record to hide). One ``listdir`` when there is nothing to do."""
    if opts.read_committed and opts.root is not None:  # (only committed records are ever uploaded)
        recover_transactions(TopicStore(opts.root))


def resolve(opts: SourceOptions, catalog: BucketCatalog | None, bound: Bound, *, starting: bool) -> Offsets:
    """``bound`` as concrete offsets of every partition.

    A timestamp becomes the first offset whose record's timestamp is at least it (Kafka's
    ``offsetsForTimes``). Where no record is that recent, an ending bound is the partition's
    end (as in Kafka); a starting one fails, or is the end with
    ``startingOffsetsByTimestampStrategy=latest``.

    With ``opts.uploaded_only`` (endingOffsets or latestOffset ``uploaded``), "latest" and the
    end are each partition's uploaded end, and an ending timestamp found past it is that end.
    With ``opts.read_committed``, after :func:`settle_transactions`.
    """
    settle_transactions(opts)
    parts = opts.partitions(catalog)
    spec = opts.spec(bound, parts)
    store = topics_of(opts, catalog)
    uploaded = uploaded_ends(opts.root, parts) if opts.uploaded_only and opts.root is not None else None
    out: Offsets = {}
    for topic, offsets in spec.items():
        out[topic] = {}
        for p, value in offsets.items():
            with open_read_only(store, topic, int(p)) as ch:
                first, end = ch.first_offset, ch.end_offset
                if uploaded is not None:
                    end = uploaded.get(topic, {}).get(p, first)
                if bound.kind == "offsets":
                    off = first if value == EARLIEST else end if value in (LATEST, UPLOADED) else value
                else:
                    found = ch.offset_for_time(value)
                    if found is None and starting and not opts.no_match_latest:
                        raise ConfigError(
                            f"{bound.option}: no record of {topic}[{p}] has a timestamp >= {value} (the partition "
                            f'ends at offset {end}); set option("startingOffsetsByTimestampStrategy", "latest") to start '
                            "at its end instead"
                        )
                    off = end if found is None else max(found, first)
                    if not starting:
                        off = min(off, end)
            out[topic][p] = off
    return out


def end_offsets(opts: SourceOptions, catalog: BucketCatalog | None) -> Offsets:
    """Where each partition ends now: its end offset, or its uploaded end with ``opts.uploaded_only``
    (a tier URL's partitions end there anyway).

    With ``opts.read_committed``, first :func:`settle_transactions`.
    """
    settle_transactions(opts)
    if opts.uploaded_only and opts.root is not None:
        return uploaded_ends(opts.root, opts.partitions(catalog))
    return {t: {p: end for p, (_, end) in ps.items()} for t, ps in partition_bounds(opts, catalog).items()}


def plan(opts: SourceOptions, catalog: BucketCatalog | None, start: Offsets, end: Offsets) -> list[InputPartition]:
    """The tasks that read ``start`` to ``end``; checks that no record in between is gone.

    A partition missing from ``start`` (a topic or partition created since the query began)
    is read from its first offset, as Kafka's source reads newly discovered partitions.
    With ``tierDirectReads`` (the default), the part of a range already uploaded to tier-2
    becomes :class:`~.tier.TierRange` tasks that executors read from the storage alone, and
    only the rest (the local tail) is read through the channel, in one task (tier.py). A tier
    URL's partitions (``catalog``) have no local tail: every task is a tier range (bucket.py).
    """
    bounds = partition_bounds(opts, catalog)
    ranges = []
    for topic, ends in end.items():
        for p, stop in ends.items():
            if p not in bounds.get(topic, {}):
                raise data_loss(topic, int(p), stop - 1, 0, missing_tail=True)
            first, last = bounds[topic][p]
            begin = start.get(topic, {}).get(p, first)
            if stop > last:
                raise data_loss(topic, int(p), stop - 1, last, missing_tail=True)
            if begin < first:
                if opts.fail_on_data_loss:
                    raise data_loss(topic, int(p), begin, first)
                log.warning("%s[%s]: offsets %d to %d are gone; going on from %d", topic, p, begin, first - 1, first)
                begin = min(first, stop)
            # (with a tier URL, no root: its planner turns the whole range into tier ranges)
            root = opts.root or ""
            ranges.append(OffsetRange(root, topic, int(p), begin, stop, opts.fail_on_data_loss, opts.include_headers))
    if not opts.tier_direct_reads:
        return list(split(ranges, opts.min_partitions, opts.max_records_per_partition))
    planner: SegmentPlanner = BucketPlanner(catalog) if catalog is not None else TierPlanner(opts.root or "")
    try:
        tasks = [piece for r in ranges for piece in planner.split_tiers(r)]
        tiered = {(t.topic, t.partition) for t in tasks if isinstance(t, TierRange)}

        def tail(r: OffsetRange | TierRange) -> bool:
            return isinstance(r, OffsetRange) and (r.topic, r.partition) in tiered

        return list(split(tasks, opts.min_partitions, opts.max_records_per_partition, planner.pieces, tail))
    finally:
        planner.close()


def read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """On an executor: a local range through the channel, a tier-2 range from the storage alone."""
    worker_heap.settle()
    if isinstance(partition, TierRange):
        return read_tier_range(partition)
    if isinstance(partition, OffsetRange):
        return read_range(partition)
    return iter(())  # nothing to read: pyspark plans one empty InputPartition(None) for a batch


def limit_rows(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """At most ``max_rows`` records past ``start``, shared in proportion to each partition's lag."""
    lags = {(t, p): max(0, off - start.get(t, {}).get(p, 0)) for t, ps in latest.items() for p, off in ps.items()}
    total = sum(lags.values())
    if total <= max_rows:
        return latest
    take = {tp: lag * max_rows // total for tp, lag in lags.items()}
    left = max_rows - sum(take.values())
    for tp in sorted(lags, key=lambda tp: lags[tp] - take[tp], reverse=True)[:left]:
        take[tp] += 1
    return {t: {p: min(off, start.get(t, {}).get(p, 0) + take[(t, p)]) for p, off in ps.items()} for t, ps in latest.items()}


class FileChannelBatchReader(DataSourceReader):
    """``spark.read.format("filechannel")``: the records from startingOffsets to endingOffsets."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        with open_catalog(self.opts) as catalog:  # (made and removed here: this reader is pickled to the executors)
            return self._plan(catalog)

    def _plan(self, catalog: BucketCatalog | None) -> list[InputPartition]:
        start = resolve(self.opts, catalog, self.opts.starting, starting=True)
        end = resolve(self.opts, catalog, self.opts.ending, starting=False)
        for topic, offsets in start.items():
            for p, off in offsets.items():
                if off > end[topic][p]:  # a timestamp found past the end, or an offset past it
                    raise ConfigError(
                        f"{topic}[{p}]: the query would start at offset {off}, after where it ends ({end[topic][p]}); "
                        "check startingOffsets/endingOffsets (or their timestamp forms)"
                    )
        return plan(self.opts, catalog, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)


class FileChannelStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("filechannel")``, with admission control and availableNow.

    Admission control is Kafka's source's: ``maxOffsetsPerTrigger`` caps a micro-batch;
    ``minOffsetsPerTrigger`` holds a micro-batch back (``latestOffset`` returns its start,
    which Spark takes as "no new data") until that many records are waiting or
    ``maxTriggerDelay`` has passed since the last batch. pyspark has no limit carrying a
    delay, so the reader keeps the time of the last batch itself (Spark keeps one reader
    alive for the whole query). An availableNow run never waits: it reads what is there.

    A query of a tier URL keeps one :class:`~.bucket.BucketCatalog` for the reader's life (its
    indexes follow each partition's head, so a trigger reads only what was uploaded since),
    closed at :meth:`stop`.
    """

    def __init__(self, opts: SourceOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.opts = opts
        self._target: Offsets | None = None  # the end of an availableNow run
        self._clock = clock
        self._last_trigger: float | None = None  # clock() of the last batch let through
        self._catalog: BucketCatalog | None = None  # made on first use (option tier)
        self._seen: Offsets | None = None  # the ends the last latestOffset read, for reportLatestOffset

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_catalog"] = None  # pyspark pickles the reader to run read(): the driver's catalog stays here
        return state

    def catalog(self) -> BucketCatalog | None:
        """The view of the tier URL (option tier), made on first use; None for a root."""
        if self._catalog is None and self.opts.tier is not None:
            self._catalog = self.opts.catalog()
        return self._catalog

    def stop(self) -> None:
        catalog, self._catalog = self._catalog, None
        if catalog is not None:
            catalog.close()

    def initialOffset(self) -> Offsets:
        return resolve(self.opts, self.catalog(), self.opts.starting, starting=True)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        if n:
            return ReadMaxRows(n)
        m = self.opts.min_offsets_per_trigger
        return ReadMinRows(m) if m else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = end_offsets(self.opts, self.catalog())

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        if self._target is not None:
            latest = self._target
        else:
            latest = self._seen = end_offsets(self.opts, self.catalog())
        if self.opts.uploaded_only:  # a start past the uploaded end (a timestamp found in the local tail) waits there
            latest = {t: {p: max(off, start.get(t, {}).get(p, off)) for p, off in ps.items()} for t, ps in latest.items()}
        if isinstance(limit, ReadAllAvailable):  # the highest priority, as in Kafka's source
            return latest
        if self.opts.min_offsets_per_trigger is not None and self._target is None and self._delay(start, latest):
            return start
        if isinstance(limit, ReadMaxRows):
            latest = limit_rows(start, latest, limit.max_rows)
        return latest

    def _delay(self, start: Offsets, latest: Offsets) -> bool:
        """Kafka's ``delayBatch``: hold back while fewer than minOffsetsPerTrigger records wait, up to maxTriggerDelay."""
        now = self._clock()
        assert self.opts.min_offsets_per_trigger is not None
        if self._last_trigger is None or (now - self._last_trigger) * 1000 >= self.opts.max_trigger_delay_ms:
            self._last_trigger = now
            return False
        waiting = sum(max(0, off - start.get(t, {}).get(p, 0)) for t, ps in latest.items() for p, off in ps.items())
        if waiting < self.opts.min_offsets_per_trigger:
            return True
        self._last_trigger = now
        return False

    def reportLatestOffset(self) -> Offsets | None:
        """The ends the trigger's :meth:`latestOffset` just read (before admission control), for
        the query's progress; the files (or the bucket) are asked again only without one since.

        Spark asks right after each ``latestOffset``, and with the default trigger an idle query
        asks every 10 ms (``spark.sql.streaming.pollingDelay``): reading the ends again opened
        every partition a second time per ask."""
        seen, self._seen = self._seen, None
        return seen if seen is not None else end_offsets(self.opts, self.catalog())

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        return plan(self.opts, self.catalog(), start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)

    def commit(self, end: Offsets) -> None:
        """Advance the consumer group named by option groupId (lets GC free processed segments)."""
        if self.opts.group_id is None:
            return
        assert self.opts.root is not None  # (option groupId is refused with option tier)
        offsets = {TopicPartition(t, int(p)): off for t, ps in end.items() for p, off in ps.items()}
        consumer = Consumer(root=self.opts.root, group_id=self.opts.group_id, enable_auto_commit=False)
        try:
            consumer.assign(offsets)
            consumer.commit(offsets)
        finally:
            consumer.close()
