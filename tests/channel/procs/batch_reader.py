"""Read a channel twice in batches, in a fresh process; print the minor page faults of the
second pass per record, in the main thread and in a worker thread (tests/channel/test_heap.py).

argv: channel folder, records per batch.
"""

import resource
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


def main() -> None:
    path, batch = sys.argv[1], int(sys.argv[2])
    with FileChannel(path) as ch:
        read_all(ch, batch)
        before = faults(resource.RUSAGE_SELF)
        n = read_all(ch, batch)
        main_thread = (faults(resource.RUSAGE_SELF) - before) / n
        # A worker reads each batch (as the async consumer's fills), the main thread frees it.
        rx, held, worker_faults = ch.receiver("earliest"), [], []

        def fill() -> None:
            start = faults(resource.RUSAGE_THREAD)
            held.append(rx.recv_many(batch, timeout=0))
            worker_faults.append(faults(resource.RUSAGE_THREAD) - start)

        while True:
            worker = threading.Thread(target=fill)
            worker.start()
            worker.join()
            if not held.pop():
                break
        # The first fills fault the worker's new arena in; count the rest.
        steady = worker_faults[len(worker_faults) // 2 :]
        print(main_thread, sum(steady) / (len(steady) * batch))


if __name__ == "__main__":
    main()
