"""Helpers shared by the daemon tests: a tiered topic with small segments, and an oracle that reads
back what tier-2 holds (chunks joined into a .seg.z, decoded with the engine's own decoder).

Also the child process of the crash and fencing tests: ``python tier_helpers.py daemon ROOT [--once]``
runs a TieringDaemon and prints one line per action, flushed (the parent waits on those lines).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from filechannel.client.topics import Admin, TopicStore
from filechannel.engine.compressed import CompressedSegment
from filechannel.engine.record import Record, decode_records
from filechannel.tiering import ChunkStorage
from filechannel.tiering.metadata import TierMetadata

SMALL = {"segment_bytes": 4096, "compression_block_bytes": 1024, "tier_chunk_bytes": 1024}


def make_topic(root: Path, tier: str, partitions: int = 1, **settings: Any) -> None:
    Admin(root).create_topic("t", partitions, tier=tier, **{**SMALL, **settings})


def produce(root: Path, values: list[bytes], partition: int = 0, timestamp: int | None = None) -> None:
    """Send ``values`` one by one (one frame each, so small segments roll often)."""
    with TopicStore(root).open_partition("t", partition, maintenance_interval=0) as ch, ch.sender() as tx:
        for value in values:
            tx.send(value, timestamp=timestamp)


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

    def progress(line: str) -> None:
        print(line, flush=True)

    with TieringDaemon(root, progress=progress, interval=0.01) as daemon:
        print(f"started epoch {daemon.epoch}", flush=True)
        report = daemon.run(once=once)
    print(f"done uploaded={report.uploaded} failures={len(report.failures)}", flush=True)
    return 1 if report.failures else 0


if __name__ == "__main__":
    if sys.argv[1] == "daemon":
        sys.exit(_daemon_main(sys.argv[2:]))
    raise SystemExit(f"unknown command {sys.argv[1]!r}")
