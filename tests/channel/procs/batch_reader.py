"""Read a channel in batches, in a fresh process; print the minor page faults a record of the
steady passes, in the main thread and in a worker thread (tests/channel/test_heap.py).

argv: channel folder, records per batch.

The worker's figure is the median over its steady fills, not their mean: a fill that finds
its thread on a new glibc arena (one a background thread took meanwhile: how often depends
on the machine's load) faults that arena's pages in once, which is not what is measured.
"""

import resource
import statistics
import sys
import threading

from filechannel import FileChannel


def faults(who: int) -> int:
    return resource.getrusage(who).ru_minflt


def read_all(ch: FileChannel, batch: int) -> int:
    rx = ch.receiver("earliest")
    n = 0
    while got := len(rx.recv_many(batch, timeout=0)):  # each batch freed before the next is read
        n += got
    return n


def worker_fills(ch: FileChannel, batch: int) -> list[float]:
    """Faults a record of each non-empty fill of one pass, a new worker thread a fill (as the
    async consumer's fills), the main thread freeing each batch."""
    rx, held, per_record = ch.receiver("earliest"), [], []

    def fill() -> None:
        start = faults(resource.RUSAGE_THREAD)
        held.append(rx.recv_many(batch, timeout=0))
        if held[-1]:
            per_record.append((faults(resource.RUSAGE_THREAD) - start) / len(held[-1]))

    while True:
        worker = threading.Thread(target=fill)
        worker.start()
        worker.join()
        if not held.pop():
            return per_record


def main() -> None:
    path, batch = sys.argv[1], int(sys.argv[2])
    with FileChannel(path) as ch:
        read_all(ch, batch)
        before = faults(resource.RUSAGE_SELF)
        n = read_all(ch, batch)
        main_thread = (faults(resource.RUSAGE_SELF) - before) / n
        worker_fills(ch, batch)  # the first fills fault the worker's new arena in
        steady = worker_fills(ch, batch) + worker_fills(ch, batch)
        print(main_thread, statistics.median(steady))


if __name__ == "__main__":
    main()
