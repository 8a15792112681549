"""A consumer-group member a test drives line by line, for the liveness tests.

    python driven_member.py ROOT GROUP TOPIC JSON_CONSUMER_SETTINGS

Reads commands on stdin, one a line, and answers each with one JSON line on stdout:

    poll MS     -> {"assigned": [p, ...], "records": n, "events": [[kind, [p, ...]], ...], "generation": g}
    sleep S     -> {"slept": S}          (no poll meanwhile: the heartbeat thread alone keeps it alive)
    commit      -> {"commit": "ok"} or {"commit": "failed", "reason": text}
    quit        -> closes the consumer and exits

Any other exception of a command is answered as {"error": class name, "message": text}, so a
test sees it rather than a traceback. "events" are the rebalance listener's calls since the
last poll's answer.
"""

import json
import sys
import time
from typing import Any

from filechannel.client import Consumer
from filechannel.errors import CommitFailedError

root, group, topic, settings = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
events: list[list[Any]] = []


class Listener:
    def on_partitions_revoked(self, revoked):
        events.append(["revoked", sorted(tp.partition for tp in revoked)])

    def on_partitions_assigned(self, assigned):
        events.append(["assigned", sorted(tp.partition for tp in assigned)])


consumer = Consumer(root=root, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False, **settings)
consumer.subscribe([topic], listener=Listener())


def answer(obj):
    print(json.dumps(obj), flush=True)


for line in sys.stdin:
    command, *args = line.split()
    try:
        if command == "poll":
            batch = consumer.poll(timeout_ms=int(args[0]))
            assert consumer.coordinator.member is not None  # a member of its group
            answer(
                {
                    "assigned": sorted(tp.partition for tp in consumer.assignment()),
                    "records": sum(map(len, batch.values())),
                    "events": events,
                    "generation": consumer.coordinator.member.generation,
                }
            )
            events = []
        elif command == "sleep":
            time.sleep(float(args[0]))
            answer({"slept": float(args[0])})
        elif command == "commit":
            try:
                consumer.commit()
                answer({"commit": "ok"})
            except CommitFailedError as exc:
                answer({"commit": "failed", "reason": str(exc)})
        elif command == "quit":
            break
    except Exception as exc:  # answered, so that the test fails on it with its name
        answer({"error": type(exc).__name__, "message": str(exc)})
consumer.close(autocommit=False)
