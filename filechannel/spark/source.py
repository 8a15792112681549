"""The ``filechannel`` source: batch reads of offset ranges and a streaming reader.

Offsets, as Spark checkpoints them, are ``{"topic": {"partition": next offset}}``. The
checkpoint, not :meth:`FileChannelStreamReader.commit`, is what makes a restarted query
resume exactly where it stopped: Spark calls ``commit`` one batch late, and we use it only to
advance an optional consumer group so garbage collection can free what Spark processed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from ..client import Consumer, TopicPartition
from ..client.topics import TopicStore
from .errors import data_loss
from .options import EARLIEST, LATEST, Offsets, SourceOptions
from .ranges import OffsetRange, read_range, split

log = logging.getLogger(__name__)


def partition_bounds(opts: SourceOptions) -> dict[str, dict[str, tuple[int, int]]]:
    """(first offset, end offset) of every subscribed partition, as the files show them now."""
    store = TopicStore(opts.root)
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for topic, n in opts.partitions.items():
        out[topic] = {}
        for p in range(n):
            with store.open_partition(topic, p, read_only=True) as ch:
                out[topic][str(p)] = (ch.first_offset, ch.end_offset)
    return out


def resolve(opts: SourceOptions, name: str, raw: str) -> Offsets:
    """Option ``name`` (earliest, latest or JSON) as concrete offsets of every partition."""
    bounds = partition_bounds(opts)
    out: Offsets = {}
    for topic, offsets in opts.spec(name, raw).items():
        out[topic] = {}
        for p, off in offsets.items():
            first, end = bounds[topic][p]
            out[topic][p] = first if off == EARLIEST else end if off == LATEST else off
    return out


def end_offsets(opts: SourceOptions) -> Offsets:
    return {t: {p: end for p, (_, end) in ps.items()} for t, ps in partition_bounds(opts).items()}


def plan(opts: SourceOptions, start: Offsets, end: Offsets) -> list[InputPartition]:
    """The tasks that read ``start`` to ``end``; checks that no record in between is gone."""
    bounds = partition_bounds(opts)
    ranges = []
    for topic, ends in end.items():
        for p, stop in ends.items():
            begin = start.get(topic, {}).get(p, 0)
            first, last = bounds[topic][p]
            if stop > last:
                raise data_loss(topic, int(p), stop - 1, last, missing_tail=True)
            if begin < first:
                if opts.fail_on_data_loss:
                    raise data_loss(topic, int(p), begin, first)
                log.warning("%s[%s]: offsets %d to %d are gone; going on from %d", topic, p, begin, first - 1, first)
                begin = min(first, stop)
            ranges.append(OffsetRange(opts.root, topic, int(p), begin, stop, opts.fail_on_data_loss))
    return list(split(ranges, opts.min_partitions))


def limit_rows(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """At most ``max_rows`` records past ``start``, shared in proportion to each partition's lag."""
    lags = {(t, p): max(0, off - start.get(t, {}).get(p, off)) for t, ps in latest.items() for p, off in ps.items()}
    total = sum(lags.values())
    if total <= max_rows:
        return latest
    take = {tp: lag * max_rows // total for tp, lag in lags.items()}
    left = max_rows - sum(take.values())
    for tp in sorted(lags, key=lambda tp: lags[tp] - take[tp], reverse=True)[:left]:
        take[tp] += 1
    return {t: {p: start.get(t, {}).get(p, off) + take[(t, p)] for p, off in ps.items()} for t, ps in latest.items()}


class FileChannelBatchReader(DataSourceReader):
    """``spark.read.format("filechannel")``: the records from startingOffsets to endingOffsets."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        start = resolve(self.opts, "startingOffsets", self.opts.starting)
        end = resolve(self.opts, "endingOffsets", self.opts.ending)
        return plan(self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return iter(())  # nothing to read: pyspark plans one empty InputPartition(None)
        return read_range(partition)


class FileChannelStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("filechannel")``, with admission control and availableNow."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._target: Offsets | None = None  # the end of an availableNow run

    def initialOffset(self) -> dict:
        return resolve(self.opts, "startingOffsets", self.opts.starting)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = end_offsets(self.opts)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self._target if self._target is not None else end_offsets(self.opts)
        if isinstance(limit, ReadMaxRows):
            latest = limit_rows(start, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> dict | None:
        return end_offsets(self.opts)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return plan(self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(partition)

    def commit(self, end: dict) -> None:
        """Advance the consumer group named by option groupId (lets GC free processed segments)."""
        if self.opts.group_id is None:
            return
        offsets = {TopicPartition(t, int(p)): off for t, ps in end.items() for p, off in ps.items()}
        consumer = Consumer(root=self.opts.root, group_id=self.opts.group_id, enable_auto_commit=False)
        try:
            consumer.assign(offsets)
            consumer.commit(offsets)
        finally:
            consumer.close()
