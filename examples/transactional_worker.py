"""An exactly-once consume-transform-produce worker: run as many as you like, kill any of them.

Each worker is a member of one consumer group reading the input topic, and a transactional
producer writing the output topic. For every batch it polls, it begins a transaction, sends
one output record per input record (the value upper-cased, the key kept, a ``source``
header naming the input record), commits its consumed offsets with the transaction and
commits: the output records and the group's offsets are written together or not at all. A
worker killed at any point (SIGKILL included) and started again (with the same ``--id``, or
not at all: the others take its partitions) leaves every input record in the output
exactly once.

    python examples/transactional_worker.py --root data/eos --id 0 &
    python examples/transactional_worker.py --root data/eos --id 1 &

``--demo`` runs the whole story in a temp folder: it writes input records, starts three
workers, SIGKILLs one of them midway and starts it again, waits for them to finish and
checks that the output holds each input record exactly once.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

from filechannel.client import Admin, Consumer, Producer, TopicPartition
from filechannel.errors import CommitFailedError, TransactionAbortedError


def transform(value: bytes) -> bytes:
    """The work: here, upper-casing the value."""
    return value.upper()


def rewind(consumer: Consumer) -> None:
    """After an aborted transaction: back to the group's committed offsets, to process those records again."""
    for tp in consumer.assignment():
        committed = consumer.committed(tp)
        if committed is None:
            consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, committed)


def run_worker(root: str, worker_id: str, source: str, sink: str, group: str, max_records: int, idle_exit_ms: int | None) -> int:
    """Process records until none came for ``idle_exit_ms`` (None: for ever); return how many."""
    producer = Producer(root, transactional_id=f"{group}-worker-{worker_id}", transaction_timeout_ms=60_000)
    # First: an older process of this id is fenced, and what it committed applied, before our offsets are read.
    producer.init_transactions()
    consumer = Consumer(
        source,
        root=root,
        group_id=group,
        enable_auto_commit=False,  # offsets are committed by the transactions only
        auto_offset_reset="earliest",
        max_poll_records=max_records,
        heartbeat_interval_ms=100,
        session_timeout_ms=10_000,
    )
    done = 0
    last = time.monotonic()
    try:
        while idle_exit_ms is None or time.monotonic() - last < idle_exit_ms / 1000:
            batch = consumer.poll(timeout_ms=100)
            if not batch:
                continue
            last = time.monotonic()
            producer.begin_transaction()
            try:
                offsets = {}
                for tp, records in batch.items():
                    for r in records:
                        header = ("source", f"{tp.topic}/{tp.partition}/{r.offset}".encode())
                        producer.send(sink, transform(r.value), key=r.key, headers=[header])
                    offsets[tp] = records[-1].offset + 1
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
                producer.commit_transaction()
                done += sum(len(records) for records in batch.values())
            except (CommitFailedError, TransactionAbortedError):
                producer.abort_transaction()  # a rebalance took a partition, or the transaction timed out
                rewind(consumer)
    finally:
        producer.close()
        consumer.close(autocommit=False)
    return done


def setup(root: str, source: str, sink: str, records: int, partitions: int = 3) -> None:
    """The topics, and ``records`` input records."""
    admin = Admin(root)
    admin.create_topic(source, partitions=partitions, exist_ok=True)
    admin.create_topic(sink, partitions=partitions, exist_ok=True)
    with Producer(root) as producer:
        for i in range(records):
            producer.send(source, f"record-{i}".encode(), key=str(i % 7).encode())


def output_sources(root: str, sink: str) -> Counter[str]:
    """How many times each input record (its ``source`` header) is in the output."""
    seen: Counter[str] = Counter()
    with Consumer(sink, root=root, auto_offset_reset="earliest", isolation_level="read_committed") as consumer:
        while batch := consumer.poll(timeout_ms=500):
            for records in batch.values():
                for r in records:
                    seen[dict(r.headers)["source"].decode()] += 1
    return seen


def demo(records: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "root")
        setup(root, "input", "output", records)
        argv = [sys.executable, __file__, "--root", root, "--idle-exit-ms", "1500", "--max-records", "20"]
        workers = [subprocess.Popen([*argv, "--id", str(i)]) for i in range(3)]
        time.sleep(0.5)  # let them get going (a demo; nothing waits on this)
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
        print("worker 0 killed with SIGKILL; starting it again")
        workers[0] = subprocess.Popen([*argv, "--id", "0"])
        for w in workers:
            w.wait()
        # They stop once idle; one more pass here picks up anything a slow rebalance left over.
        run_worker(root, "0", "input", "output", "workers", 500, idle_exit_ms=1000)
        seen = output_sources(root, "output")
        twice = [s for s, n in seen.items() if n > 1]
        with Consumer(root=root, group_id="workers", enable_auto_commit=False) as check:
            committed = sum(check.committed(TopicPartition("input", p)) or 0 for p in range(3))
        print(f"{records} input records, {len(seen)} in the output, {len(twice)} more than once; {committed} committed")
        if len(seen) != records or twice or committed != records:
            raise SystemExit("not exactly once")
        print("exactly once")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="the root folder of the topics")
    parser.add_argument("--id", default="0", help="this worker's id: one transactional id per worker (default 0)")
    parser.add_argument("--input", default="input", help="topic to read (default input)")
    parser.add_argument("--output", default="output", help="topic to write (default output)")
    parser.add_argument("--group", default="workers", help="consumer group of the workers (default workers)")
    parser.add_argument("--max-records", type=int, default=500, help="most records per transaction (default 500)")
    parser.add_argument("--idle-exit-ms", type=int, default=None, help="exit after this long with nothing to read")
    parser.add_argument("--setup", type=int, metavar="N", help="create the topics and N input records, then exit")
    parser.add_argument("--demo", action="store_true", help="run three workers in a temp folder, kill one, check the output")
    parser.add_argument("--records", type=int, default=3000, help="input records of --demo (default 3000)")
    args = parser.parse_args()
    if args.demo:
        demo(args.records)
        return
    if not args.root:
        parser.error("--root is required (or --demo)")
    if args.setup is not None:
        setup(args.root, args.input, args.output, args.setup)
        return
    done = run_worker(args.root, args.id, args.input, args.output, args.group, args.max_records, args.idle_exit_ms)
    print(f"worker {args.id}: {done} records processed")


if __name__ == "__main__":
    main()
