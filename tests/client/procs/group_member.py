"""A consumer-group member for the group tests: prints what it reads and commits.

    python group_member.py ROOT GROUP TOPIC

Prints "A p,p,..." on each assignment change, "R partition offset" per record,
"C partition offset" after each successful commit, "F" after a rejected one. Stops
when the file ROOT/stop exists. SIGUSR1 writes its threads' stacks to ROOT/stack.PID
(what a test reports about a member that stopped making progress).
"""

import faulthandler
import os
import signal
import sys
import time

from filechannel.client import Consumer
from filechannel.errors import CommitFailedError

root, group, topic = sys.argv[1:4]
stacks = open(os.path.join(root, f"stack.{os.getpid()}"), "w")  # noqa: SIM115 (open for the process's life)
faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
consumer = Consumer(
    topic,
    root=root,
    group_id=group,
    auto_offset_reset="earliest",
    enable_auto_commit=False,
    heartbeat_interval_ms=100,
    session_timeout_ms=5000,
)
last = None
while not os.path.exists(os.path.join(root, "stop")):
    batch = consumer.poll(timeout_ms=50, max_records=20)
    mine = sorted(tp.partition for tp in consumer.assignment())
    if mine != last:
        print("A " + ",".join(map(str, mine)), flush=True)
        last = mine
    lines = [f"R {tp.partition} {r.offset}" for tp, recs in batch.items() for r in recs]
    if lines:
        print("\n".join(lines), flush=True)
        offsets = {tp: recs[-1].offset + 1 for tp, recs in batch.items()}
        try:
            consumer.commit(offsets)
            print("\n".join(f"C {tp.partition} {off}" for tp, off in offsets.items()), flush=True)
        except CommitFailedError:
            print("F", flush=True)
    time.sleep(0.005)
consumer.close(autocommit=False)
