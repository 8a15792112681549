"""Where a Kafka-like consumer's time goes, per record: ``python -m filechannel.bench.consumer_parts [--records N] [--size B]``.

The bench's client rows give ``Consumer.poll`` and ``AsyncConsumer.getmany`` as ratios of
``recv_many``; this splits them, in one process, on one partition of N records of B bytes
(``compression="none"``, fsync "never", as the client rows' topic), each part best of
``--rounds``, in ns per record:

- ``recv_many``: the receiver's batches (2,000 records), the channel's own read;
- ``as client``: the same read decoding straight into kafka-python's 13-field
  ``ConsumerRecord`` (a new headers list each), as a consumer's receiver does;
- ``poll``: ``Consumer.poll(max_records=2000)``: that read, plus the consumer's bookkeeping;
- ``fill+take``: the same fetch the async consumer makes, run in the calling thread;
- ``getmany``: ``AsyncConsumer.getmany(max_records=2000)`` under asyncio: ``fill+take``
  plus a trip to a worker thread per fill (a fill fetches about a megabyte of records).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable

BATCH = 2000


def _best(rounds: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(rounds))


def measure(records: int, size: int, rounds: int = 3) -> dict[str, float]:
    """ns per record of each part (see the module docstring)."""
    from filechannel import FileChannel
    from filechannel.client import Admin, AsyncConsumer, Consumer, Producer
    from filechannel.client.fetcher import FETCH_BYTES
    from filechannel.client.records import KAFKA_PYTHON_RECORDS

    with tempfile.TemporaryDirectory(prefix="fc-consumer-parts-") as root:
        Admin(root).create_topic("t", 1, fsync="never", compression="none")
        with Producer(root) as producer:
            value = os.urandom(size)
            for _ in range(records):
                producer.send("t", value)
        part = os.path.join(root, "t", "0")

        def consumer() -> Consumer:
            return Consumer("t", root=root, auto_offset_reset="earliest", enable_auto_commit=False)

        def recv_many() -> float:
            with FileChannel(part) as ch:
                rx, got, t0 = ch.receiver(0), 0, time.perf_counter()
                while got < records:
                    got += len(rx.recv_many(BATCH, timeout=0))
                return time.perf_counter() - t0

        def as_client() -> float:
            layout = KAFKA_PYTHON_RECORDS.layout("t", 0)
            with FileChannel(part) as ch:
                rx, got, t0 = ch.receiver(0), 0, time.perf_counter()
                while got < records:
                    got += len(rx.read_now(BATCH, layout, FETCH_BYTES))
                return time.perf_counter() - t0

        def poll() -> float:
            with consumer() as c:
                got, t0 = 0, time.perf_counter()
                while got < records:
                    got += sum(map(len, c.poll(timeout_ms=1000, max_records=BATCH).values()))
                return time.perf_counter() - t0

        def fill_take() -> float:
            with consumer() as c:
                got, t0 = 0, time.perf_counter()
                while got < records:
                    taken = sum(map(len, c.fetcher.take(BATCH, None).values()))
                    if not taken:
                        c.fetcher.fill(1000, None, BATCH, ahead=True)
                    got += taken
                return time.perf_counter() - t0

        def getmany() -> float:
            async def run() -> float:
                async with AsyncConsumer("t", root=root, auto_offset_reset="earliest", enable_auto_commit=False) as c:
                    got, t0 = 0, time.perf_counter()
                    while got < records:
                        got += sum(map(len, (await c.getmany(timeout_ms=1000, max_records=BATCH)).values()))
                    return time.perf_counter() - t0

            return asyncio.run(run())

        parts = {"recv_many": recv_many, "as client": as_client, "poll": poll, "fill+take": fill_take, "getmany": getmany}
        return {name: _best(rounds, run) / records * 1e9 for name, run in parts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m filechannel.bench.consumer_parts", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    ns = measure(args.records, args.size, args.rounds)
    print(f"{args.records:,} records of {args.size} B, best of {args.rounds}, ns per record:")
    for name, value in ns.items():
        print(f"  {name:<10} {value:8.0f}")
    print(f"  poll / recv_many: {ns['recv_many'] / ns['poll']:.2f}x; getmany / recv_many: {ns['recv_many'] / ns['getmany']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
