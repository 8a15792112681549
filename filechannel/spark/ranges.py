"""Offset ranges: what one Spark task reads, how a micro-batch is split, and reading one.

An :class:`OffsetRange` is picklable (Spark ships it to an executor's Python worker), names
the root, and says what to do if its first records were deleted in the meantime.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import operator
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pyspark.sql.datasource import InputPartition

from ..client.topics import TopicStore
from ..errors import OffsetOutOfRangeError, RootUnavailableError
from .errors import data_loss
from .schema import BatchBuilder
from .storages import PROCESS_STORAGES

if TYPE_CHECKING:
    import pyarrow as pa

BATCH_ROWS = 8192  # rows per Arrow batch: large enough to amortise, small enough to stream
# ... and about this many bytes of keys and values at most: 8,192 records of 1 MB would be an
# 8 GB batch, and a binary column of over 2 GiB does not fit one Arrow array.
BATCH_BYTES = 64 << 20
# Records are decoded this many at a time and gathered into columns (schema.BatchBuilder):
# Record objects for 8,192 rows at once fall out of the CPU cache, and pieces of 512 that
# stay in it read faster (DESIGN.md, "Spark").
DECODE_ROWS = 512
DECODE_BYTES = 1 << 20  # ... and about this many bytes of them (512 records of 1 MB: 512 MB)


@dataclass(repr=False)
class OffsetRange(InputPartition):
    root: str
    topic: str
    partition: int
    start: int
    end: int  # exclusive
    fail_on_data_loss: bool = True
    include_headers: bool = False

    @property
    def size(self) -> int:
        return self.end - self.start

    def pieces(self, parts: int) -> list[OffsetRange]:
        """This range cut into ``parts`` nearly equal pieces, in order."""
        step = self.size / parts
        bounds = [self.start + round(i * step) for i in range(parts)] + [self.end]
        return [dataclasses.replace(self, start=a, end=b) for a, b in itertools.pairwise(bounds)]


class Sized(Protocol):
    @property
    def size(self) -> int: ...


R = TypeVar("R", bound=Sized)


def _pieces(r: Any, parts: int) -> list[Any]:
    return list(r.pieces(parts))


def split(
    ranges: Sequence[R],
    min_partitions: int | None,
    max_records: int | None = None,
    cut: Callable[[R, int], list[R]] = _pieces,
    whole: Callable[[R], bool] = lambda r: False,
) -> list[R]:
    """Split ranges into tasks as Spark's Kafka source does.

    First every range larger than ``max_records`` (maxRecordsPerPartition) is cut into pieces
    of at most that many records; then, if that makes fewer than ``min_partitions`` tasks, each
    range gets a share of ``min_partitions`` proportional to its size (at least one) and is
    cut into that many nearly equal pieces. Empty ranges are dropped. ``cut(range, n)`` makes
    the pieces (a tier-2 range is cut only at segment or block boundaries, so it may give fewer
    or larger ones: see tier.py); a range for which ``whole(range)`` is true (the local tail
    of a partition read mostly from tier-2) gets no share of ``min_partitions``.
    """
    ranges = [r for r in ranges if r.size > 0]
    if max_records:
        ranges = [piece for r in ranges for piece in cut(r, -(-r.size // max_records))]
    kept = [whole(r) for r in ranges]
    total = sum(r.size for r, keep in zip(ranges, kept, strict=True) if not keep)
    if not min_partitions or min_partitions <= len(ranges) or total == 0:
        return ranges
    share = min_partitions - sum(kept)
    out = []
    for r, keep in zip(ranges, kept, strict=True):
        out.extend([r] if keep else cut(r, max(1, min(r.size, math.floor(r.size / total * share + 0.5)))))
    return out


def read_range(r: OffsetRange, batch_rows: int = BATCH_ROWS, batch_bytes: int = BATCH_BYTES) -> Iterator[pa.RecordBatch]:
    """The records of ``r`` as Arrow batches of ``batch_rows`` rows and about ``batch_bytes``
    at most (at least one record; a decode of about ``DECODE_BYTES`` past it), in offset order.

    Runs where the task runs: a root this machine cannot see (an executor of a cluster, the root
    on the driver's machine only) is one error saying so and what to do, not a missing topic."""
    if not os.path.isdir(r.root) or not os.listdir(r.root):  # missing, or an empty mount point
        raise RootUnavailableError(
            f"this Spark task ({socket.gethostname()}) cannot see the root {r.root!r} (missing or empty here), from which "
            f"the driver planned {r.topic}[{r.partition}] offsets {r.start} to {r.end - 1}: the local tail of a topic is read "
            "where its root is; mount the root on the executors (read-only is enough), or run the query in local mode "
            "on the root's machine (tier-2's records are read from the storage anywhere)"
        )
    with TopicStore(r.root).open_partition(r.topic, r.partition, read_only=True, tier_storages=PROCESS_STORAGES) as ch:
        start = r.start
        first = ch.first_offset
        if start < first:
            if r.fail_on_data_loss:
                raise data_loss(r.topic, r.partition, start, first)
            start = min(first, r.end)
        rx = ch.receiver(start)
        pos = start
        builder = BatchBuilder(r.topic, r.partition, r.include_headers)
        while pos < r.end:
            try:
                want = min(DECODE_ROWS, batch_rows - len(builder), r.end - pos)
                records = rx.recv_many(want, timeout=0, max_bytes=DECODE_BYTES)
            except OffsetOutOfRangeError:
                # Garbage collection or retention deleted the rest while we read.
                first = ch.first_offset
                if r.fail_on_data_loss:
                    raise data_loss(r.topic, r.partition, pos, first) from None
                pos = min(max(pos, first), r.end)
                rx.seek(pos)
                continue
            if not records:
                raise data_loss(r.topic, r.partition, pos, ch.end_offset, missing_tail=True)
            pos = records[-1].offset + 1
            if pos > r.end:  # past holes at the range's end (a compacted topic's offsets have holes)
                records = records[: bisect.bisect_left(records, r.end, key=operator.attrgetter("offset"))]
                pos = r.end
            if records:
                builder.add(records)
            if len(builder) >= batch_rows or builder.nbytes >= batch_bytes or pos >= r.end:
                yield builder.build()
