"""Helpers shared by the daemon tests: a tiered topic with small segments, and an oracle that reads
back what tier-2 holds (chunks joined into a .seg.z, decoded with the engine's own decoder).

Also the child process of the crash and fencing tests: ``python tier_helpers.py daemon ROOT [--once]``
runs a TieringDaemon and prints one line per action, flushed (the parent waits on those lines);
``defrag-daemon``, ``producer`` and ``reader`` likewise (a child imports this module, never pytest).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from filechannel.client.topics import Admin, TopicStore
from filechannel.engine.compressed import CompressedSegment
from filechannel.engine.record import Record, decode_records
from filechannel.tiering import ChunkStorage
from filechannel.tiering.defrag import DefragSettings
from filechannel.tiering.layout import SegmentRecord, parse_object_name
from filechannel.tiering.metadata import TierMetadata

SMALL: dict[str, Any] = {"segment_bytes": 4096, "compression_block_bytes": 1024, "tier_chunk_bytes": 1024}
# test_defrag's SIGKILL test: merges of two 1 KiB chunks at a time (many small merges, so most kills land inside one)
DEFRAG_KILL_SETTINGS = DefragSettings(merge_below_bytes=3000, target_bytes=3000, garbage_delay_ms=0)


def make_topic(root: Path, tier: str, partitions: int = 1, **settings: Any) -> None:
    Admin(root).create_topic("t", partitions, tier=tier, **{**SMALL, **settings})


def produce(root: Path, values: list[bytes], partition: int = 0, timestamp: int | None = None) -> None:
    """Send ``values`` one by one (one frame each, so small segments roll often)."""
    with TopicStore(root).open_partition("t", partition, maintenance_interval=0) as ch, ch.sender() as tx:
        for value in values:
            tx.send(value, timestamp=timestamp)


def manifest_of(segment: SegmentRecord) -> str:
    """The name of an uploaded segment's manifest (an uploaded segment has one)."""
    assert segment.manifest is not None, f"segment {segment.base_offset} of {segment.channel} has no manifest"
    return segment.manifest


def segment_objects(storage: ChunkStorage, prefix: str) -> set[str]:
    """Names of the chunks, manifests and merged objects under ``prefix`` (not the channel's head.json)."""
    return {o.name for o in storage.list(prefix) if parse_object_name(o.name) is not None}


def local_bases(root: Path, partition: int = 0) -> list[int]:
    folder = root / "t" / str(partition)
    return sorted({int(n.split(".")[0]) for n in os.listdir(folder) if n.endswith((".seg", ".seg.z"))})


def tier2_records(storage: ChunkStorage, metadata: TierMetadata, channel: str) -> list[Record]:
    """Every record of the uploaded segments of ``channel``, read back from the chunks."""
    out: list[Record] = []
    for record in metadata.segments(channel):
        data = b"".join(storage.read(c.name, 0, c.length) for c in record.chunks)
        assert len(data) == record.size
        with tempfile.NamedTemporaryFile(suffix=".seg.z") as f:
            f.write(data)
            f.flush()
            segment = CompressedSegment.open(f.name)
            try:
                assert (segment.info.base_offset, segment.info.end_offset) == (record.base_offset, record.end_offset)
                offset = record.base_offset
                for i in range(len(segment.info.blocks)):
                    raw = segment.read_block(i)
                    _pos, n = decode_records(raw, 0, offset, 1 << 30, out)
                    offset += n
                assert offset == record.end_offset
            finally:
                segment.close()
    return out


def _daemon_main(argv: list[str]) -> int:
    from filechannel.tiering.daemon import TieringDaemon

    root, once = argv[0], "--once" in argv
    grace: dict[str, Any] = {"orphan_grace_ms": int(argv[argv.index("--grace-ms") + 1])} if "--grace-ms" in argv else {}

    def progress(line: str) -> None:
        print(line, flush=True)

    with TieringDaemon(root, progress=progress, interval=0.01, **grace) as daemon:
        print(f"started epoch {daemon.epoch}", flush=True)
        report = daemon.run(once=once)
    print(f"done uploaded={report.uploaded} failures={len(report.failures)}", flush=True)
    return 1 if report.failures else 0


def _defrag_daemon_main(root: str) -> None:
    """A daemon that defragments when idle (one merge a pass), printing each action, until killed."""
    from filechannel.tiering.daemon import TieringDaemon

    def progress(line: str) -> None:
        print(line, flush=True)

    with TieringDaemon(root, interval=0.005, defrag=DEFRAG_KILL_SETTINGS, max_merges=1, progress=progress) as daemon:
        daemon.run()


def _producer_main(root: str, tag: str, count: int) -> int:
    """Send ``count`` records ``TAG-i`` to partition 0 of topic t, printing ``acked TAG-i`` once each is durable."""
    from filechannel.client import Producer

    with Producer(root=root, acks="all", linger_ms=0) as producer:
        for start in range(0, count, 20):
            futures = [
                (f"{tag}-{i}", producer.send("t", f"{tag}-{i}".encode(), partition=0))
                for i in range(start, min(count, start + 20))
            ]
            producer.flush()
            for value, future in futures:
                future.get(timeout=30)
                print(f"acked {value}", flush=True)
    return 0


def _reader_main(root: str) -> int:
    """Read partition 0 of topic t from the start, over and over; print ``BAD ...`` on a record out of
    order or read twice in one pass (the parent kills it at a random moment)."""
    from filechannel.client import Consumer, TopicPartition

    tp = TopicPartition("t", 0)
    while True:
        consumer = Consumer(root=root, auto_offset_reset="earliest", enable_auto_commit=False)
        consumer.assign([tp])
        seen: set[bytes] = set()
        last = -1
        try:
            while batch := consumer.poll(timeout_ms=100, max_records=500):
                for r in batch.get(tp, []):
                    if (r.offset != last + 1 and last >= 0) or r.value in seen:
                        print(f"BAD offset {r.offset} after {last}, value {r.value!r}", flush=True)
                    last = r.offset
                    seen.add(r.value)
            print(f"read {len(seen)}", flush=True)
        except Exception as exc:  # an error is reported, never a wrong record
            print(f"error {type(exc).__name__}: {exc}", flush=True)
        finally:
            consumer.close()


if __name__ == "__main__":
    faulthandler.enable()  # a test that gives up on a child aborts it (SIGABRT): its stacks are printed first
    if sys.argv[1] == "daemon":
        sys.exit(_daemon_main(sys.argv[2:]))
    if sys.argv[1] == "defrag-daemon":
        sys.exit(_defrag_daemon_main(sys.argv[2]))
    if sys.argv[1] == "producer":
        sys.exit(_producer_main(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    if sys.argv[1] == "reader":
        sys.exit(_reader_main(sys.argv[2]))
    raise SystemExit(f"unknown command {sys.argv[1]!r}")
