"""Second member of a group for the commit-then-resume test: reads what the group has left.

    python robust_resume.py ROOT GROUP TOPIC

Iterates with auto-commit, prints "R partition offset" per record, and exits (closing,
which commits) once its position has reached every partition's end offset.
"""

import sys
import time

from filechannel.client import Consumer

root, group, topic = sys.argv[1:4]
with Consumer(
    topic,
    root=root,
    group_id=group,
    auto_offset_reset="earliest",
    auto_commit_interval_ms=1,
    max_poll_records=10,
    consumer_timeout_ms=5000,
) as consumer:
    deadline = time.monotonic() + 60
    ends = consumer.end_offsets(consumer.assignment())
    print("S " + " ".join(f"{tp.partition}:{consumer.position(tp)}" for tp in sorted(ends)), flush=True)
    for record in consumer:
        print(f"R {record.partition} {record.offset}", flush=True)
        if all(consumer.position(tp) >= end for tp, end in ends.items()) or time.monotonic() > deadline:
            break
