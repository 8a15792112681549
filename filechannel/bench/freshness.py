"""Freshness of tier-2: how long after its send a record is visible to a reader of the bucket.

One SeaweedFS server (seaweed.py) on 127.0.0.1, stopped and removed at the end. A topic
with ``tier_after_ms`` (1 s in the row of record) and a segment size it never reaches, so the
daemon, not the writer, seals each segment (DESIGN.md "Tier-2: uploads, retention and the
daemon", step 0). A slow writer sends one record every ``gap`` seconds; the daemon runs its
passes every ``interval`` seconds on a thread; a watcher reads the partition's head in the
bucket (``head.json``: what a bucket reader polls, one GET) every 10 ms. A record is visible
once the head's end offset is past it: its latency is that moment minus its send. The bound
the design gives is ``tier_after_ms`` + a pass interval + an upload.

``python -m filechannel.bench.freshness [--quick]`` prints the row; ``filechannel bench`` runs it with the rest.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from typing import Any

TIER_AFTER_MS = 1000
INTERVAL_S = 0.2  # the daemon's passes (`tier run --interval`)
GAP_S = 0.05  # one record every 50 ms: 20 records/s, a slow writer


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_freshness(quick: bool) -> list[dict[str, Any]]:
    """The freshness row: produce -> visible in tier-2, p50/p99 (ms)."""
    from filechannel.client import Admin
    from filechannel.client.topics import TopicStore
    from filechannel.tiering.bindings import open_storage
    from filechannel.tiering.daemon import TieringDaemon
    from filechannel.tiering.heads import read_head

    from .seaweed import running_seaweed

    seconds = 2.5 if quick else 20.0
    with running_seaweed() as server, tempfile.TemporaryDirectory(prefix="fc-bench-fresh-") as folder:
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = server.access_key, server.secret_key
        url = f"s3://{server.new_bucket()}/fc"
        options = {"endpoint_url": server.endpoint, "region_name": "us-east-1"}
        root = os.path.join(folder, "root")
        Admin(root).create_topic("t", 1, tier=url, tier_options=options, segment_bytes=64 << 20, tier_after_ms=TIER_AFTER_MS)
        sent: list[float] = []  # monotonic time of the send of offset i
        visible: list[float] = []  # monotonic time offset i was first seen in the head
        done = threading.Event()

        def watch() -> None:
            with open_storage(url, **options) as storage:
                while not done.is_set() or len(visible) < len(sent):
                    head = read_head(storage, "t/0")
                    now = time.monotonic()
                    while head is not None and len(visible) < head.end_offset:
                        visible.append(now)
                    time.sleep(0.01)

        daemon = TieringDaemon(root, interval=INTERVAL_S, progress=lambda line: None)
        daemon.start()
        passes = threading.Thread(target=daemon.run, name="bench-daemon")
        watcher = threading.Thread(target=watch, name="bench-watcher")
        passes.start()
        watcher.start()
        try:
            with TopicStore(root).open_partition("t", 0) as ch, ch.sender() as tx:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    tx.send(b"%08d" % len(sent))
                    tx.flush()
                    sent.append(time.monotonic())
                    time.sleep(GAP_S)
            done.set()
            watcher.join(60 + 10 * TIER_AFTER_MS / 1000)
        finally:
            done.set()
            daemon.stop()
            passes.join(60)
            daemon.close()
        if watcher.is_alive() or len(visible) < len(sent):
            raise RuntimeError(f"{len(visible)} of {len(sent)} records became visible in tier-2 within a minute")
    lags = [(v - s) * 1000 for s, v in zip(sent, visible, strict=False)]
    return [
        {
            "workload": f"freshness: produce -> visible in tier-2, tier_after_ms={TIER_AFTER_MS}",
            "backend": "filechannel + SeaweedFS",
            "durability": "uploaded",
            "size": 8,
            "n": len(lags),
            "ours": True,
            "extra": {
                "p50_ms": round(_percentile(lags, 0.5), 1),
                "p99_ms": round(_percentile(lags, 0.99), 1),
                "max_ms": round(max(lags), 1),
                "tier_after_ms": TIER_AFTER_MS,
                "interval_s": INTERVAL_S,
                "records_per_s": round(1 / GAP_S),
                "seconds": seconds,
            },
        }
    ]


if __name__ == "__main__":
    for row in run_freshness("--quick" in sys.argv):
        print(row["workload"], row["n"], "records:", row["extra"])
