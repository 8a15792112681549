"""A small end-to-end demo of the Tier-1 channel: two processes, one producing, one consuming.

The consumer starts first and blocks in ``recv``; the producer, a separate process,
appends page-view events; the consumer wakes on each flush (watchdog/inotify), acks
what it processed durably, and prints what it saw.

    python examples/demo.py [--records N] [--dir PATH]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from collections import Counter

from filechannel import FileChannel

PAGES = ["/", "/products", "/products/42", "/cart", "/checkout", "/about"]


def produce(path: str, n: int) -> None:
    with FileChannel(path) as ch:
        sender = ch.sender()
        for i in range(n):
            event = {"user": i % 97, "page": PAGES[i % len(PAGES)], "seq": i}
            sender.send(json.dumps(event).encode(), key=str(event["user"]).encode())
        sender.flush()


def consume(path: str, n: int, ready: mp.Event, out: mp.Queue) -> None:
    with FileChannel(path) as ch:
        rx = ch.ack_receiver("demo")
        ready.set()
        pages: Counter[str] = Counter()
        first_latency = None
        seen = 0
        while seen < n:
            batch = rx.recv_many(1000, timeout=30)
            if not batch:
                break
            if first_latency is None:
                first_latency = time.time() * 1000 - batch[0].timestamp
            for rec in batch:
                pages[json.loads(rec.value)["page"]] += 1
            seen += len(batch)
            rx.ack(len(batch))
        out.put((seen, dict(pages), first_latency, rx.acked))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--dir", default=None, help="channel folder (default: a temp dir, removed afterwards)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="filechannel-demo-") as tmp:
        path = args.dir or f"{tmp}/events"
        ctx = mp.get_context("spawn")
        ready, out = ctx.Event(), ctx.Queue()
        consumer = ctx.Process(target=consume, args=(path, args.records, ready, out))
        consumer.start()
        ready.wait(30)
        start = time.perf_counter()
        producer = ctx.Process(target=produce, args=(path, args.records))
        producer.start()
        producer.join()
        seen, pages, first_latency, acked = out.get(timeout=120)
        consumer.join()
        elapsed = time.perf_counter() - start
        print(f"producer process sent {args.records:,} records; consumer process received {seen:,} and acked {acked:,}")
        print(
            f"end to end in {elapsed:.2f} s ({seen / elapsed:,.0f} records/s); "
            f"first record arrived {first_latency:.1f} ms after it was sent"
        )
        print("page views seen by the consumer:")
        for page, count in sorted(pages.items(), key=lambda kv: -kv[1]):
            print(f"  {page:<14} {count:>8,}")
        if seen != args.records:
            raise SystemExit(f"lost records: expected {args.records}, got {seen}")


if __name__ == "__main__":
    main()
