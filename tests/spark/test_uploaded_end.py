"""Queries that stop at the uploaded end (``endingOffsets``/``latestOffset`` ``uploaded``): every task
reads tier-2, so executors never need the root; a later trigger reads what was uploaded since, once."""

from __future__ import annotations

import itertools
import shutil

import pytest

from filechannel.client import Admin, Producer
from filechannel.errors import ConfigError
from filechannel.spark import uploaded_end_offsets
from filechannel.spark.options import SourceOptions
from filechannel.spark.source import FileChannelBatchReader, FileChannelStreamReader, read_partition
from filechannel.spark.tier import TierRange
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.rebuild import rebuild_root

from .helpers import available_now_to_parquet, read, stream

pytestmark = pytest.mark.spark

N = 2000  # records per partition before the first upload


def value(partition: int, offset: int) -> bytes:
    return f"p{partition}-{offset:05d}".encode() * 4


def produce(root, start: int, stop: int) -> None:
    with Producer(root) as p:
        for o in range(start, stop):
            for part in (0, 1):
                p.send("t", value(part, o), partition=part)


def upload(root, *, roll: bool = False) -> None:
    with TieringDaemon(root, roll_idle_ms=0 if roll else None) as daemon:
        assert daemon.run(once=True).failures == []


@pytest.fixture
def root(tmp_path):
    """Topic "t", 2 partitions of N records: the sealed segments uploaded, the active one (the tail) only local."""
    root = tmp_path / "root"
    Admin(root).create_topic(
        "t", partitions=2, tier=(tmp_path / "tier2").as_uri(), segment_bytes=8192, compression_block_bytes=1024
    )
    produce(root, 0, N)
    upload(root)
    ends = uploaded_end_offsets(str(root), ["t"])["t"]
    assert all(0 < int(ends[p]) < N for p in ("0", "1"))  # some uploaded, a tail not
    return root


def expected(ends: dict[str, int], since: dict[str, int] | None = None) -> list[tuple[int, int, bytes]]:
    since = since or {}
    return [(int(p), o, value(int(p), o)) for p, end in sorted(ends.items()) for o in range(since.get(p, 0), end)]


def rows(df) -> list[tuple[int, int, bytes]]:
    return sorted((r.partition, r.offset, bytes(r.value)) for r in df.select("partition", "offset", "value").collect())


def test_a_stream_to_the_uploaded_end_plans_tier_tasks_only_and_reads_them_without_the_root(root, tmp_path):
    opts = SourceOptions.parse(
        {"root": str(root), "subscribe": "t", "startingOffsets": "earliest", "latestOffset": "uploaded"}, batch=False
    )
    reader = FileChannelStreamReader(opts)
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == uploaded_end_offsets(str(root), ["t"])
    tasks = reader.partitions(start, end)
    assert tasks and all(isinstance(t, TierRange) for t in tasks)  # nothing for the channel's folder
    shutil.move(root, tmp_path / "elsewhere")  # what an executor without the root sees
    got = sorted(
        (p, o)
        for t in tasks
        for b in read_partition(t)
        for p, o in zip(b["partition"].to_pylist(), b["offset"].to_pylist(), strict=True)
    )
    assert got == [(int(p), o) for p, e in sorted(end["t"].items()) for o in range(e)]


def test_a_batch_to_the_uploaded_end_plans_tier_tasks_only(root):
    opts = SourceOptions.parse(
        {"root": str(root), "subscribe": "t", "endingOffsets": "uploaded", "minPartitions": "5"}, batch=True
    )
    tasks = FileChannelBatchReader(opts).partitions()
    ends = uploaded_end_offsets(str(root), ["t"])["t"]
    tier = [t for t in tasks if isinstance(t, TierRange)]
    assert tier == tasks and len(tier) >= 5
    for p in (0, 1):
        mine = [t for t in tier if t.partition == p]
        assert mine[0].start == 0 and mine[-1].end == ends[str(p)]
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))


def test_a_partition_with_nothing_uploaded_reads_nothing_and_needs_no_task(tmp_path):
    root = tmp_path / "root"
    Admin(root).create_topic("t", partitions=2, tier=(tmp_path / "tier2").as_uri())
    produce(root, 0, 10)  # nothing sealed, nothing uploaded
    opts = SourceOptions.parse({"root": str(root), "subscribe": "t", "endingOffsets": "uploaded"}, batch=True)
    assert FileChannelBatchReader(opts).partitions() == []


@pytest.mark.parametrize(
    ("options", "batch", "message"),
    [
        ({"latestOffset": "uploaded"}, True, r'"latestOffset" is for streams; .*"endingOffsets", "uploaded"'),
        ({"latestOffset": "tier"}, False, r'"latestOffset" must be latest or uploaded'),
        ({"startingOffsets": "uploaded"}, None, r'startingOffsets cannot be "uploaded"'),
        ({"endingOffsets": "uploaded"}, False, r'not valid in streaming queries .*"latestOffset", "uploaded"'),
        ({"endingOffsets": "{bad"}, True, r'"endingOffsets" is neither earliest, latest, uploaded nor JSON'),
    ],
)
def test_misplaced_uploaded_bounds_are_refused_saying_where_they_go(root, options, batch, message):
    with pytest.raises(ConfigError, match=message):
        SourceOptions.parse({"root": str(root), "subscribe": "t", **options}, batch=batch)


def test_an_available_now_stream_reads_the_uploaded_offsets_then_later_uploads_once(spark, root, tmp_path):
    out, ck = tmp_path / "out", tmp_path / "ck"

    def run_available_now() -> None:
        df = stream(spark, root, "t", startingOffsets="earliest", latestOffset="uploaded", maxOffsetsPerTrigger="700")
        available_now_to_parquet(df.select("partition", "offset", "value"), out, ck)

    first = {p: e for p, e in uploaded_end_offsets(str(root), ["t"])["t"].items()}
    run_available_now()
    assert rows(spark.read.parquet(str(out))) == expected(first)  # exactly the uploaded offsets, not the tail
    produce(root, N, N + 300)
    upload(root, roll=True)  # everything written so far, the tail included
    second = uploaded_end_offsets(str(root), ["t"])["t"]
    assert second == {"0": N + 300, "1": N + 300}
    run_available_now()
    assert rows(spark.read.parquet(str(out))) == expected(second)  # the rest, each offset once
    # and a batch to the uploaded end reads the same
    assert rows(read(spark, root, "t", endingOffsets="uploaded")) == expected(second)


def test_a_replica_root_is_read_by_spark_from_tier2_alone(spark, root, tmp_path):
    """A replica (tier rebuild --replica) has no local segment: every task of a query over it is
    a tier range, and it reads exactly what the owner had uploaded when it was made."""
    replica = tmp_path / "replica"
    rebuild_root(replica, (tmp_path / "tier2").as_uri(), replica=True)
    ends = uploaded_end_offsets(str(root), ["t"])["t"]
    assert uploaded_end_offsets(str(replica), ["t"])["t"] == ends
    opts = SourceOptions.parse({"root": str(replica), "subscribe": "t"}, batch=True)
    assert all(isinstance(t, TierRange) for t in FileChannelBatchReader(opts).partitions())
    assert rows(read(spark, replica, "t")) == expected(ends)
