"""FileLock excludes other processes and the other threads of its own process (issue 17).

An flock alone belongs to the open file description every thread shares: a second thread
"took" a lock another thread held, and one thread's release freed it for all, so a user's
compress_sealed() raced the maintenance thread on the same segment.
"""

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from filechannel import FileChannel
from filechannel.engine.lock import FileLock

PROCS = Path(__file__).parent / "procs"
DEADLINE = 20
LOCKS = ["writer_lock", "maintenance_lock"]


def _in_thread(call):
    """Run ``call`` on another thread and return its result (or raise its error)."""
    out: list = []

    def run() -> None:
        try:
            out.append(("ok", call()))
        except BaseException as exc:
            out.append(("error", exc))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(DEADLINE)
    assert not thread.is_alive(), "the call did not return"
    kind, value = out[0]
    if kind == "error":
        raise value
    return value


@pytest.mark.parametrize("name", LOCKS)
def test_another_thread_cannot_take_a_lock_this_thread_holds(tmp_path, name):
    with FileChannel(tmp_path / "ch", maintenance_interval=0) as ch:
        lock = getattr(ch._log, name)
        assert lock.acquire(blocking=False)
        try:
            assert _in_thread(lambda: lock.acquire(blocking=False)) is False
        finally:
            lock.release()
        assert _in_thread(lambda: lock.acquire(blocking=False)) is True
        lock.release()  # any thread may release what another took (the flusher does)
        assert lock.acquire(blocking=False)
        lock.release()


@pytest.mark.parametrize("name", LOCKS)
def test_a_blocking_acquire_waits_until_the_holding_thread_releases(tmp_path, name):
    with FileChannel(tmp_path / "ch", maintenance_interval=0) as ch:
        lock = getattr(ch._log, name)
        holder_holds = threading.Event()
        waiting = threading.Event()
        acquired = threading.Event()
        seen: list[bool] = []

        def waiter() -> None:
            waiting.set()
            lock.acquire()
            seen.append(holder_holds.is_set())  # must be False: the holder let go first
            acquired.set()
            lock.release()

        lock.acquire()
        holder_holds.set()
        thread = threading.Thread(target=waiter)
        thread.start()
        try:
            assert waiting.wait(DEADLINE)
            # With correct exclusion this never happens; a lock shared by the threads
            # is taken at once, well within this wait.
            assert not acquired.wait(0.5), "a second thread took the lock this thread holds"
        finally:
            holder_holds.clear()
            lock.release()
            thread.join(DEADLINE)
        assert not thread.is_alive()
        assert seen == [False]


@pytest.mark.parametrize("name", LOCKS)
def test_threads_taking_turns_never_overlap(tmp_path, name):
    with FileChannel(tmp_path / "ch", maintenance_interval=0) as ch:
        lock = getattr(ch._log, name)
        inside = []
        overlaps = []
        counter = [0]

        def worker() -> None:
            for _ in range(300):
                with lock.holding():
                    inside.append(1)
                    if len(inside) > 1:
                        overlaps.append(len(inside))
                    value = counter[0]
                    time.sleep(0)  # hand the GIL to the others while inside (a yield, not a wait)
                    counter[0] = value + 1
                    inside.pop()

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE)
        assert not any(t.is_alive() for t in threads)
        assert overlaps == []
        assert counter[0] == 1200


def test_a_second_lock_object_of_this_process_is_excluded(tmp_path):
    path = str(tmp_path / "x.lock")
    first, second = FileLock(path), FileLock(path)
    try:
        assert first.acquire(blocking=False)
        assert second.acquire(blocking=False) is False
        first.release()
        assert second.acquire(blocking=False)
        second.release()
    finally:
        first.close()
        second.close()


class _Holder:
    """procs/writer_lock_holder.py: another process taking and dropping one lock file."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PROCS / "writer_lock_holder.py"), str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        try:
            self.proc.communicate(timeout=DEADLINE)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        assert self.proc.returncode == 0


@pytest.mark.parametrize("name", LOCKS)
def test_two_processes_exclude_each_other(tmp_path, name):
    with FileChannel(tmp_path / "ch", maintenance_interval=0) as ch:
        lock = getattr(ch._log, name)
        other = _Holder(Path(lock.path))
        try:
            assert other.ask("take") == "took"
            assert lock.acquire(blocking=False) is False
            assert other.ask("drop") == "dropped"
            assert lock.acquire(blocking=False) is True
            assert other.ask("try") == "False"
            lock.release()
            assert other.ask("try") == "True"
            assert lock.acquire(blocking=False) is False
            assert other.ask("drop") == "dropped"
        finally:
            other.close()
        assert lock.acquire(blocking=False)
        lock.release()


def _read(receiver, n: int) -> list:
    records: list = []
    while len(records) < n:
        batch = receiver.recv_many(n - len(records), timeout=5)
        assert batch, f"only {len(records)} of {n} records could be read"
        records.extend(batch)
    return records


def test_user_maintenance_calls_racing_the_maintenance_thread_lose_nothing(tmp_path, caplog):
    # Many sealed raw segments; then the maintenance thread (woken every millisecond) and a
    # user thread calling compress_sealed() / collect_garbage() work on them at once, while
    # records keep arriving. Both once compressed the same segment into one .seg.z.tmp.
    caplog.set_level(logging.WARNING, logger="filechannel")
    path = tmp_path / "ch"
    values = [b"%06d" % i + b"." * 300 for i in range(6000)]
    settings: dict[str, Any] = dict(segment_bytes=4096, compression_block_bytes=1024, fsync="never")
    with FileChannel(path, maintenance_interval=0, **settings) as ch:
        sender = ch.sender()
        for i in range(0, 4000, 10):  # a batch is never split: about a segment a batch
            sender.send_many(values[i : i + 10])
        acker = ch.ack_receiver("gc")
        _read(acker, 1000)
        acker.ack(1000)  # collect_garbage may delete the segments wholly below offset 1000
    errors: list[BaseException] = []
    with FileChannel(path, maintenance_interval=0.001, **settings) as ch:
        sender = ch.sender()

        def send_more() -> None:
            for i in range(4000, 6000, 10):
                sender.send_many(values[i : i + 10])

        feeder = threading.Thread(target=send_more)
        feeder.start()
        rounds = 0
        try:
            while feeder.is_alive() or rounds < 5:
                rounds += 1
                try:
                    ch.compress_sealed()
                    ch.collect_garbage()
                except Exception as exc:
                    errors.append(exc)
        finally:
            feeder.join(DEADLINE)
    with FileChannel(path, maintenance_interval=0, **settings) as ch:
        first = ch.first_offset
        records = _read(ch.receiver("earliest"), 6000 - first)
    assert errors == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert 0 < first <= 1000
    assert [r.offset for r in records] == list(range(first, 6000))
    assert [r.value for r in records] == values[first:]
