"""The bucket-only consumer's throughput against raw ranged GETs of the same objects (issue 37).

A root tiers one partition of random 1 KiB records (the tiering rows' plan, :func:`.tiering.plan`)
to a bucket of a SeaweedFS server on 127.0.0.1, and keeps no local copy of its sealed segments.
Then, alternating, best of the plan's turns, each in a fresh process:

- ``Consumer(tier=URL, state_dir=D)`` with no root (a new state folder each turn, so every turn
  indexes the bucket from nothing) reads every uploaded record from ``earliest``, the timed part
  starting after the consumer is made and assigned (its construction lists the bucket once);
- ranged GETs of the same chunk objects, in ranges of one compression block, as many in flight
  as the reader's prefetch threads (``2 x tier_concurrency``), bodies read and dropped: what
  moving the bytes costs, with no check and no decoding.

Both read the same bytes; the consumer also checks every CRC and decodes every record. MB/s are
``.seg.z`` bytes per second on both sides.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from .measure import Row, in_child
from .tiering import SERVER, TierPlan, Turn, _client, _raw_get, fill_sealed, plan

WORKLOAD = "tier read, bucket only (no root)"


def _fill(root: str, p: TierPlan, url: str, options: dict[str, Any]) -> None:
    """Topic ``t`` (one partition, tiered to ``url``): records until ``p.segments`` segments are
    sealed, all uploaded and deleted locally by one daemon pass."""
    from filechannel.client import Admin
    from filechannel.client.topics import TopicStore
    from filechannel.tiering.daemon import TieringDaemon

    Admin(root).create_topic(
        "t",
        1,
        segment_bytes=p.segment_bytes,
        compression="zstd",
        compression_block_bytes=p.block_bytes,
        tier=url,
        tier_options=options,
        tier_chunk_bytes=p.chunk_bytes,
        tier_concurrency=p.concurrency,
        local_retention_bytes=0,
    )
    with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch:
        fill_sealed(ch, p)
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    if report.failures or not report.deleted_local:
        raise RuntimeError(f"the daemon did not offload the topic: {report.failures or 'nothing deleted locally'}")


def _consume(url: str, options: dict[str, Any], state_dir: str, want: int) -> dict[str, Any]:
    """In a fresh process: every uploaded record of ``t/0`` by a bucket-only consumer; count, bytes, time."""
    from filechannel.client import Consumer, TopicPartition

    tp = TopicPartition("t", 0)
    with Consumer(tier=url, tier_options=options, state_dir=state_dir, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        n = got = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while n < want:
            for records in consumer.poll(1000, max_records=10_000).values():
                n += len(records)
                got += sum(len(r.value) for r in records)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"n": n, "bytes": got, "secs": secs, "cpu_s": cpu}


def run_bucket_consumer(quick: bool) -> list[dict[str, Any]]:
    """The two rows (see the module docstring)."""
    from filechannel.tiering.bindings import open_storage
    from filechannel.tiering.metadata import TierMetadata

    from .seaweed import running_seaweed

    p = plan(quick)
    with running_seaweed() as server, tempfile.TemporaryDirectory(prefix="fc-bench-bucket-") as folder:
        # The binding and the consumer read credentials from boto3's chain, never from settings.
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = server.access_key, server.secret_key
        bucket = server.new_bucket()
        url, options = f"s3://{bucket}/fc", {"endpoint_url": server.endpoint, "region_name": "us-east-1"}
        root = os.path.join(folder, "root")
        _fill(root, p, url, options)
        with open_storage(url, **options) as storage:
            chunks = [o for o in storage.list("t/0/") if o.name.endswith(".chunk")]
        ranges = [
            (f"fc/{c.name}", start, min(p.block_bytes, c.length - start))
            for c in chunks
            for start in range(0, c.length, p.block_bytes)
        ]
        segz_bytes = sum(c.length for c in chunks)
        with TierMetadata(os.path.join(root, ".tier", "metadata.db")) as metadata:
            uploaded = sum(r.end_offset - r.base_offset for r in metadata.segments("t/0", states=("uploaded",)))
        client = _client(server, p)
        ours: list[Turn] = []
        raw: list[Turn] = []
        try:
            for turn in range(p.turns):
                read = in_child(_consume, url, options, os.path.join(folder, f"reader-{turn}"), uploaded)
                if (read["n"], read["bytes"]) != (uploaded, uploaded * p.record_bytes):
                    raise RuntimeError(f"the bucket consumer read {read['n']} records, not {uploaded}")
                ours.append(Turn(read["secs"], read["cpu_s"]))
                got_turn, got = _raw_get(client, bucket, ranges, 2 * p.concurrency)
                if got != segz_bytes:
                    raise RuntimeError(f"the ranged GETs returned {got} bytes, not {segz_bytes}")
                raw.append(got_turn)
        finally:
            client.close()
    sizes = {
        "segments": len({c.name.split(".")[0] for c in chunks}),
        "segment_mb": p.segment_bytes / 2**20,
        "seg_z_mb": segz_bytes / 1e6,
        "chunk_mb": p.chunk_bytes / 2**20,
        "block_kb": p.block_bytes // 1024,
        "in_flight": 2 * p.concurrency,
        "runs": p.turns,
        "server": SERVER,
        "cpus": os.cpu_count(),
    }

    def row(backend: str, turns: list[Turn], is_ours: bool, **extra: Any) -> dict[str, Any]:
        best = min(turns, key=lambda t: t.secs)
        return Row(
            WORKLOAD,
            backend,
            SERVER,
            p.record_bytes,
            uploaded,
            uploaded / best.secs,
            segz_bytes / best.secs / 1e6,
            ours=is_ours,
            extra={**sizes, **extra, "client_cpu_s": best.cpu_s, "wall_s": best.secs},
        ).to_json()

    return [
        row("filechannel Consumer(tier=URL), no root", ours, True),
        row("boto3 ranged get_object (raw, no decoding)", raw, False, ranges=len(ranges)),
    ]


if __name__ == "__main__":
    import sys

    for r in run_bucket_consumer("--quick" in sys.argv):
        print(f"{r['backend']:45} {r['n']:>9} records {r['msgs_per_s']:>12,.0f} msgs/s {r['mb_per_s']:>8.1f} MB/s")
