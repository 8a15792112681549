"""Forks consume-transform-produce workers on demand, for the transactions crash storm.

    python txn_workers.py ROOT STATUS_DIR

Reads lines "SLOT POINT" on stdin and forks a worker for each (printing its pid): a worker
takes transactional id ``slot-SLOT`` (fencing an older worker of the slot), reads input
partition SLOT from the group "storm"'s committed offset, and in transactions of at most
three records writes each record upper-cased to topic "out" (header ``source`` =
"SLOT/OFFSET") with its consumed offset. POINT is a failpoint to arm in the worker ("-":
none). A worker that drains its partition writes "done" to STATUS_DIR/PID, one fenced by a
newer worker of its slot "fenced", one that failed otherwise its traceback; a killed one
writes nothing. Forking from this process, which imported filechannel once and runs no
thread, makes a worker cost a fork instead of an interpreter start, so a storm of hundreds
of SIGKILLs fits in seconds; children are reaped by the kernel (SIGCHLD ignored).
"""

import os
import signal
import sys
import traceback

from filechannel.client import Consumer, Producer, TopicPartition
from filechannel.engine import failpoints
from filechannel.errors import ProducerFencedError

root, status_dir = sys.argv[1:3]


def work(slot: int) -> str:
    tp = TopicPartition("in", slot)
    producer = Producer(root, transactional_id=f"slot-{slot}")
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
    slot, point = line.split()
    pid = os.fork()
    if pid == 0:
        status = "error"
        try:
            if point != "-":
                folder = os.path.join(status_dir, f"points.{os.getpid()}")
                os.mkdir(folder)
                open(os.path.join(folder, point), "w").close()
                os.environ[failpoints.ENV] = folder
            status = work(int(slot))
        except ProducerFencedError:
            status = "fenced"
        except BaseException:
            status = traceback.format_exc()
        finally:
            with open(os.path.join(status_dir, str(os.getpid())), "w") as f:
                f.write(status)
            os._exit(0)
    print(pid, flush=True)
