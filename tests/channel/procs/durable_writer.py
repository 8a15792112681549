"""A writer for the crash tests: sends with fsync="always" and reports each acknowledged offset.

    python durable_writer.py PATH SEED [compress|producer]

Prints "offset seed index" once send/send_many has returned for that record, i.e. once the
record is on disk. Values are derived from (seed, index), so a checker can verify them.
Runs until killed. With "producer", PATH is a root: a Producer sends to partition 0 of topic
"t" (fsync="always") and a record is reported when its future completes.
"""

import hashlib
import os
import sys
from collections import deque
from concurrent.futures import Future
from functools import partial

from filechannel import FileChannel
from filechannel.client import Admin, Producer, RecordMetadata


def value(seed: int, index: int) -> bytes:
    return hashlib.sha256(b"%d-%d" % (seed, index)).digest() * (1 + index % 9)


def report(seed: int, index: int, future: Future[RecordMetadata]) -> None:
    os.write(1, b"%d %d %d\n" % (future.result().offset, seed, index))


def produce_with_futures(root: str, seed: int) -> None:
    Admin(root).create_topic("t", exist_ok=True, fsync="always", segment_bytes=64 * 1024)
    producer = Producer(root)
    window: deque[Future[RecordMetadata]] = deque()
    i = 0
    while True:
        future = producer.send("t", value(seed, i))
        # Callbacks run in the thread that completes the future (or here): one write(2)
        # per line, so lines from two threads never interleave.
        future.add_done_callback(partial(report, seed, i))
        window.append(future)
        if len(window) > 500:
            window.popleft().result()
        i += 1


if __name__ == "__main__":
    path, seed = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3 and sys.argv[3] == "producer":
        produce_with_futures(path, seed)
    compress = len(sys.argv) > 3 and sys.argv[3] == "compress"
    with FileChannel(path, fsync="always", segment_bytes=64 * 1024, maintenance_interval=0.02 if compress else 0) as ch:
        sender = ch.sender()
        i = 0
        while True:
            if i % 4 == 0:
                offsets = sender.send_many([value(seed, i + k) for k in range(4)])
                print("\n".join(f"{off} {seed} {i + k}" for k, off in enumerate(offsets)), flush=True)
                i += 4
            else:
                off = sender.send(
                    value(seed, i), key=b"k%d" % i if i % 3 else None, headers=[("i", b"%d" % i)] if i % 5 == 0 else None
                )
                print(f"{off} {seed} {i}", flush=True)
                i += 1
