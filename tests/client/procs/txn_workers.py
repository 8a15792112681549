"""Forks consume-transform-produce workers on demand, for the transactions crash storm.

    python txn_workers.py ROOT STATUS_DIR

Reads lines "SLOT POINT MODE" on stdin and forks a worker for each (printing its pid): a
worker takes transactional id ``MODE-SLOT`` (fencing an older worker of the slot), and in
transactions of at most three records writes each input record upper-cased to topic "out"
(header ``source`` = "PARTITION/OFFSET") with its consumed offset. MODE "assign": it reads
input partition SLOT from the group "storm"'s committed offset, and is done once it has
drained it. MODE "group": it is a member of group "gstorm" subscribed to "in" (offsets sent
with ``group_metadata()``, so a member that lost a partition commits nothing of it: it
aborts and seeks back), and is done once the file STATUS_DIR/stop exists and it has read
nothing for half a second. POINT is a failpoint to arm in the worker ("-": none). A worker
that is done writes "done" to STATUS_DIR/PID, one fenced by a newer worker of its slot
"fenced", one that failed otherwise its traceback; a killed one writes nothing. Forking from this process, which imported filechannel once and runs no
thread, makes a worker cost a fork instead of an interpreter start, so a storm of hundreds
of SIGKILLs fits in seconds; children are reaped by the kernel (SIGCHLD ignored).
"""

import os
import signal
import sys
import time
import traceback

from filechannel.client import Consumer, Producer, TopicPartition
from filechannel.engine import failpoints
from filechannel.errors import CommitFailedError, ProducerFencedError

root, status_dir = sys.argv[1:3]


def work_in_group(slot: int) -> str:
    producer = Producer(root, transactional_id=f"group-{slot}")
    producer.init_transactions()
    consumer = Consumer(
        "in",
        root=root,
        group_id="gstorm",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=3,
        heartbeat_interval_ms=50,
        session_timeout_ms=5000,
    )
    idle_since = time.monotonic()
    while True:
        batch = consumer.poll(timeout_ms=50)
        if not batch:
            if os.path.exists(os.path.join(status_dir, "stop")) and time.monotonic() - idle_since > 0.5:
                return "done"
            continue
        idle_since = time.monotonic()
        producer.begin_transaction()
        try:
            for tp, records in batch.items():
                for r in records:
                    source = f"{tp.partition}/{r.offset}".encode()
                    producer.send("out", r.value.upper(), key=r.key, headers=[("source", source)], partition=r.offset % 3)
            offsets = {tp: records[-1].offset + 1 for tp, records in batch.items()}
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            producer.commit_transaction()
        except CommitFailedError:  # a rebalance took one of those partitions: process them again
            producer.abort_transaction()
            for tp in consumer.assignment():
                committed = consumer.committed(tp)
                consumer.seek(tp, committed or 0)


def work(slot: int) -> str:
    tp = TopicPartition("in", slot)
    producer = Producer(root, transactional_id=f"assign-{slot}")
    producer.init_transactions()  # first: an older worker of the slot can commit nothing once its offsets are read
    consumer = Consumer(root=root, group_id="storm", enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=3)
    consumer.assign([tp])
    while True:
        records = consumer.poll(timeout_ms=100).get(tp, [])
        if not records:
            return "done"
        producer.begin_transaction()
        for r in records:
            source = f"{slot}/{r.offset}".encode()
            producer.send("out", r.value.upper(), key=r.key, headers=[("source", source)], partition=r.offset % 3)
        producer.send_offsets_to_transaction({tp: records[-1].offset + 1}, "storm")
        producer.commit_transaction()


signal.signal(signal.SIGCHLD, signal.SIG_IGN)
for line in sys.stdin:
    slot, point, mode = line.split()
    pid = os.fork()
    if pid == 0:
        status = "error"
        try:
            if point != "-":
                folder = os.path.join(status_dir, f"points.{os.getpid()}")
                os.mkdir(folder)
                open(os.path.join(folder, point), "w").close()
                os.environ[failpoints.ENV] = folder
            status = work(int(slot)) if mode == "assign" else work_in_group(int(slot))
        except ProducerFencedError:
            status = "fenced"
        except BaseException:
            status = traceback.format_exc()
        finally:
            # Written whole, then renamed: a SIGKILL between creating the file and writing it left
            # an empty status, which the test took for a failure (once in a run under load).
            done = os.path.join(status_dir, str(os.getpid()))
            with open(f"{done}.tmp", "w") as f:
                f.write(status)
            os.rename(f"{done}.tmp", done)
            os._exit(0)
    print(pid, flush=True)
