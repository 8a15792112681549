"""Transactions (issue 38): transactional produce against durable produce, and an exactly-once loop.

    python -m filechannel.bench.transactions [--quick] [--seconds S]

Rows (each in a fresh process when run by the harness, ``filechannel bench --only transaction``):

- ``transactional produce, N per transaction``: a transactional ``Producer`` sending 100 B or
  1 KiB records to one partition, ``N`` = 1, 100 or 10,000 records per transaction, each
  commit fsyncing its commit record and the partition (durable when ``commit_transaction``
  returns), for ``S`` seconds;
- next to it, measured the same way: ``Producer`` durable futures (``acks="all"``, 1 thread)
  and one write + fsync per message (``workloads._durable``, ``workloads._fsync_per_message``);
- ``consume-transform-produce``: a consumer group member polling 500 records, a transaction
  sending each transformed to a second topic with the consumed offsets; records/s end to end.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

from .measure import QUICK_SECONDS, Row, in_child
from .workloads import _durable, _fsync_per_message

TXN_SIZES = (100, 1024)
PER_TRANSACTION = (1, 100, 10_000)
DURABILITY = "fsync on commit"


def _transactional(size: int, per_txn: int, seconds: float) -> list[dict[str, Any]]:
    """Records committed per second in transactions of ``per_txn`` records of ``size`` bytes."""
    from filechannel.client import Admin, Producer

    payload = os.urandom(size)
    n = 0
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        Admin(folder).create_topic("t")
        producer = Producer(folder, transactional_id="bench")
        producer.init_transactions()
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            producer.begin_transaction()
            for _ in range(per_txn):
                producer.send("t", payload)
            producer.commit_transaction()
            n += per_txn
        secs = time.perf_counter() - t0
        producer.close()
    return [
        Row(
            f"transactional produce, {per_txn:,} per transaction",
            "filechannel Producer (transactions)",
            DURABILITY,
            size,
            n,
            n / secs,
            n * size / secs / 1e6,
            ours=True,
        ).to_json()
    ]


def _consume_transform_produce(size: int, n: int) -> list[dict[str, Any]]:
    """An exactly-once loop over ``n`` records: poll 500, send each transformed and the offsets, commit."""
    from filechannel.client import Admin, Consumer, Producer

    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        admin = Admin(folder)
        admin.create_topic("in")
        admin.create_topic("out")
        with Producer(folder) as plain:
            for _ in range(n):
                plain.send("in", os.urandom(size))
        producer = Producer(folder, transactional_id="loop")
        producer.init_transactions()
        consumer = Consumer(
            "in", root=folder, group_id="loop", enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=500
        )
        done = 0
        t0 = time.perf_counter()
        while done < n:
            batch = consumer.poll(timeout_ms=1000)
            producer.begin_transaction()
            offsets = {}
            for tp, records in batch.items():
                for r in records:
                    producer.send("out", r.value[::-1])
                offsets[tp] = records[-1].offset + 1
                done += len(records)
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            producer.commit_transaction()
        secs = time.perf_counter() - t0
        consumer.close(autocommit=False)
        producer.close()
    return [
        Row(
            "consume-transform-produce, 500 per transaction",
            "filechannel Consumer + Producer (transactions)",
            DURABILITY,
            size,
            n,
            n / secs,
            n * size / secs / 1e6,
            ours=True,
        ).to_json()
    ]


def workloads(quick: bool, seconds: float | None = None, references: bool = True) -> list[tuple[str, Any, tuple[Any, ...]]]:
    """(name, function, args) of the rows above. The harness adds them to its own without the
    ``references`` (its table has those rows already: ``--only transaction,durable`` shows both)."""
    secs = seconds if seconds is not None else (QUICK_SECONDS if quick else 3.0)
    out: list[tuple[str, Any, tuple[Any, ...]]] = []
    for size in TXN_SIZES:
        out += [("transactional produce", _transactional, (size, k, secs)) for k in PER_TRANSACTION]
        if references:
            out.append(("transactional produce (durable futures)", _durable, (size, 1, secs, "producer")))
            out.append(("transactional produce (one fsync per message)", _fsync_per_message, (size, secs)))
        out.append(("transactional consume-transform-produce", _consume_transform_produce, (size, 4_000 if quick else 40_000)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m filechannel.bench.transactions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="0.3 s per row, a tenth of the loop's records")
    parser.add_argument("--seconds", type=float, help="seconds per produce row (default 3, --quick 0.3)")
    args = parser.parse_args()
    print("| workload | backend | size | records | records/s | MB/s |\n| --- | --- | --- | --- | --- | --- |")
    for _, fn, fargs in workloads(args.quick, args.seconds):
        for r in in_child(fn, *fargs):
            print(
                f"| {r['workload']} | {r['backend']} | {r['size']} | {r['n']:,} | {r['msgs_per_s']:,.0f} | {r['mb_per_s']:.1f} |"
            )


if __name__ == "__main__":
    main()
