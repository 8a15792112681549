"""format("filechannel") over a partly offloaded topic: Spark's tasks read tier-2 like local segments."""

import os

import pytest

from filechannel.client import Admin, Producer
from filechannel.tiering.daemon import TieringDaemon

from .helpers import available_now_to_parquet, read, stream

pytestmark = pytest.mark.spark


def test_batch_and_streaming_reads_of_a_partly_offloaded_topic_return_the_rows_of_before(spark, tmp_path):
    root = tmp_path / "root"
    Admin(root).create_topic(
        "tiered",
        partitions=2,
        tier=(tmp_path / "tier2").as_uri(),
        segment_bytes=8192,
        compression_block_bytes=1024,
        tier_chunk_bytes=1500,
        local_retention_bytes=16384,  # a few segments stay local, the older ones only in tier-2
    )
    n = 4000
    with Producer(root) as p:
        for i in range(n):
            p.send("tiered", f"row-{i:05d}".encode() * 4, partition=i % 2)
    before = sorted((r.partition, r.offset, bytes(r.value)) for r in read(spark, root, "tiered").collect())
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert report.failures == [] and report.deleted_local > 0
    for part in (0, 1):
        local = [f for f in os.listdir(root / "tiered" / str(part)) if f.endswith((".seg", ".seg.z"))]
        assert min(int(f.split(".")[0]) for f in local) > 0  # offset 0 is only in tier-2
    after = sorted((r.partition, r.offset, bytes(r.value)) for r in read(spark, root, "tiered").collect())
    assert len(before) == n and after == before
    out, ck = tmp_path / "out", tmp_path / "ck"
    df = stream(spark, root, "tiered", startingOffsets="earliest", maxOffsetsPerTrigger="1500")
    available_now_to_parquet(df.select("partition", "offset", "value"), out, ck)
    streamed = sorted((r.partition, r.offset, bytes(r.value)) for r in spark.read.parquet(str(out)).collect())
    assert streamed == before
