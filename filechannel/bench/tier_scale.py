"""``python -m filechannel.bench.tier_scale [--segments 100,10000,100000] [--out DIR]``: what reading history costs
as it grows, in one partition with N uploaded segments.

Each N gets a root of its own with one tiered partition (a folder tier) whose history is N
uploaded segments of ``RECORDS`` records each: real ``.seg.z`` objects, real manifests, a real
index (loaded in one transaction) and head, as a daemon leaves them, made directly (a daemon
uploading 100,000 segments would take the bench's time, not measure it). Then, with the
defaults a user gets:

- ``bounds``: ``Consumer.beginning_offsets`` + ``end_offsets`` of the partition (ms, median of 31);
- ``seek+read``: ``seek`` to a random offset in tier-2 and ``poll`` until its record arrives
  (ms, median of 21: each lands in another segment, so each fetches a table and a block);
- ``time search``: ``offsets_for_times`` of a timestamp in the newest uploaded segment, the one
  the index walks furthest to find (ms, median of 21);
- ``idle CPU``: a consumer's ``poll`` waiting at the end, CPU seconds / wall seconds (%);
- ``status``: ``tier_status`` of the root (ms, median of 11);
- ``idle pass``: a daemon pass with nothing to do (after its first: ms, median of 21; two fsyncs of
  its status file are most of it);
- ``fsck``: ``tier fsck`` (not deep) of the root, segments per second (linear by design).

Ratios are against the smallest N of the same run. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

RECORDS = 20  # records a segment: small objects, the index and manifests are what grow


def _build(root: str, tier_dir: str, segments: int) -> tuple[int, int]:
    """Lay out ``segments`` uploaded segments of topic ``t`` partition 0; return the tier's end
    offset and the first record's timestamp (record ``k``'s is that plus ``k``)."""
    from filechannel.client.topics import Admin
    from filechannel.engine.compressed import compress_segment
    from filechannel.engine.record import encode_frame, encode_payload
    from filechannel.engine.segment import MAX_FRAME_PAYLOAD, SegmentHeader, create_segment
    from filechannel.root import ROOT_METADATA, ROOT_TIER_DIR
    from filechannel.tiering import open_storage
    from filechannel.tiering.heads import ChannelHead, write_head
    from filechannel.tiering.layout import UPLOADED, SegmentRecord, encode_manifest, manifest_name, plan_chunks
    from filechannel.tiering.metadata import EpochRecord, TierMetadata
    from filechannel.tiering.ownership import PrefixGuard, root_identity

    url = f"file://{tier_dir}"
    Admin(root).create_topic("t", 1, tier=url, local_retention_bytes=0)
    scratch = os.path.join(root, "scratch")
    os.makedirs(scratch)
    first_ts = int(time.time() * 1000) - 3_600_000 - segments * RECORDS  # record k of the history: first_ts + k
    now = first_ts + segments * RECORDS
    records = []
    epoch = 1
    with open_storage(url) as storage:
        PrefixGuard(storage, root_identity(os.path.join(root, ROOT_TIER_DIR)), "bench", epoch).enter()
        for i in range(segments):
            base = i * RECORDS
            raw, z = os.path.join(scratch, "s.seg"), os.path.join(scratch, "s.seg.z")
            fd = create_segment(raw, SegmentHeader(i, base, now))
            try:
                os.write(
                    fd,
                    b"".join(
                        encode_frame(encode_payload(b"v%012d" % (base + k) + bytes(64), None, None, first_ts + base + k))
                        for k in range(RECORDS)
                    ),
                )
            finally:
                os.close(fd)
            info = compress_segment(raw, z, level=1, block_bytes=64 * 1024, max_payload=MAX_FRAME_PAYLOAD)
            data = open(z, "rb").read()  # noqa: SIM115 - a bench's scratch file
            os.unlink(raw)
            os.unlink(z)
            chunks = plan_chunks("t/0", base, epoch, len(data), 8 << 20)
            manifest = manifest_name("t/0", base, epoch)
            record = SegmentRecord(
                "t/0",
                base,
                info.end_offset,
                len(data),
                info.max_timestamp,
                UPLOADED,
                epoch,
                chunks,
                manifest,
            )
            storage.write(chunks[0].name, data)
            storage.write(manifest, encode_manifest(record))
            records.append(record)
        with TierMetadata(os.path.join(root, ROOT_METADATA)) as metadata:
            metadata.load([EpochRecord(epoch, "bench", now)], records)
        write_head(storage, ChannelHead("t/0", 0, segments * RECORDS, epoch))
    shutil.rmtree(scratch)
    return segments * RECORDS, first_ts


def _median_ms(fn: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def measure(segments: int, work: str) -> dict[str, Any]:
    from filechannel.client import Consumer, TopicPartition
    from filechannel.tiering.daemon import TieringDaemon
    from filechannel.tiering.fsck import fsck
    from filechannel.tiering.status import tier_status

    root, tier_dir = os.path.join(work, f"root-{segments}"), os.path.join(work, f"tier-{segments}")
    t0 = time.perf_counter()
    end, first_ts = _build(root, tier_dir, segments)
    built_s = time.perf_counter() - t0
    os.sync()  # the build's writeback would slow the daemon pass's fsyncs of its status file, not the code measured
    tp = TopicPartition("t", 0)
    consumer = Consumer(root=root, auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([tp])
    rng = random.Random(segments)
    try:
        consumer.beginning_offsets([tp])
        bounds = _median_ms(lambda: (consumer.beginning_offsets([tp]), consumer.end_offsets([tp])), 31)

        def seek_read() -> None:
            offset = rng.randrange(end)
            consumer.seek(tp, offset)
            while not (batch := consumer.poll(timeout_ms=5000, max_records=1)):
                pass
            assert batch[tp][0].offset == offset, (batch[tp][0].offset, offset)

        seek_read()
        seek = _median_ms(seek_read, 21)
        newest = end - RECORDS // 2

        def time_search() -> None:
            found = consumer.offsets_for_times({tp: first_ts + newest})[tp]
            assert found is not None and found.offset == newest, (found, newest)

        time_search()
        by_time = _median_ms(time_search, 21)
        consumer.seek(tp, end)
        consumer.poll(timeout_ms=100)
        c0, w0 = time.process_time(), time.perf_counter()
        consumer.poll(timeout_ms=3000)
        idle = 100 * (time.process_time() - c0) / (time.perf_counter() - w0)
    finally:
        consumer.close()
    tier_status(root)
    status = _median_ms(lambda: tier_status(root), 11)
    with TieringDaemon(root, progress=lambda line: None) as daemon:
        daemon.run_once()
        idle_pass = _median_ms(daemon.run_once, 21)
    t = time.perf_counter()
    report = fsck(root)
    fsck_s = time.perf_counter() - t
    assert not report.findings, [f.line() for f in report.findings[:3]]
    shutil.rmtree(root)
    shutil.rmtree(tier_dir)
    return {
        "segments": segments,
        "build_s": round(built_s, 1),
        "bounds_ms": round(bounds, 3),
        "seek_read_ms": round(seek, 3),
        "time_search_ms": round(by_time, 3),
        "idle_cpu_pct": round(idle, 2),
        "status_ms": round(status, 2),
        "idle_pass_ms": round(idle_pass, 2),
        "fsck_segments_per_s": round(segments / fsck_s),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m filechannel.bench.tier_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--segments", default="100,10000,100000", help="comma-separated uploaded segment counts")
    parser.add_argument("--out", help="write tier_scale.json there")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.segments.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="fc-tier-scale-") as work:
        measure(counts[0], work)  # a warm-up, not reported: the first root of a process pays its imports and caches
        for n in counts:
            rows.append(measure(n, work))
            print(json.dumps(rows[-1]), flush=True)
    base = rows[0]
    keys = ["bounds_ms", "seek_read_ms", "time_search_ms", "idle_cpu_pct", "status_ms", "idle_pass_ms"]
    print(f"\n| segments | {' | '.join(keys)} | fsck segments/s |")
    print("|" + " --- |" * (len(keys) + 2))
    for r in rows:
        cells = [f"{r[k]} ({r[k] / base[k]:.2f}x)" if base[k] else str(r[k]) for k in keys]
        print(f"| {r['segments']:,} | {' | '.join(cells)} | {r['fsck_segments_per_s']:,} |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "tier_scale.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
