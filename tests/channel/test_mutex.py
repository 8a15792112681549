"""``Mutex`` (filechannel/engine/_codec.c), the appender's lock: threading.Lock's behaviour,
which threading.Condition and ``with`` rely on, and a blocking acquire that signal handlers
can interrupt, as Lock.acquire's can."""

import signal
import threading

import pytest

from filechannel import FileChannel

Mutex = pytest.importorskip("filechannel.engine._codec", reason="the C extension is not built (see test_codec.py)").Mutex


@pytest.mark.parametrize("make", [threading.Lock, lambda: Mutex()], ids=["threading.Lock", "Mutex"])
def test_it_behaves_as_threading_lock(make):
    m = make()
    assert not m.locked()
    assert m.acquire() is True and m.locked()
    assert m.acquire(False) is False
    assert m.acquire(blocking=False) is False
    assert m.acquire(True, 0.01) is False
    assert m.acquire(timeout=0) is False
    m.release()
    assert not m.locked()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        m.release()
    with pytest.raises(ValueError, match="can't specify a timeout for a non-blocking call"):
        m.acquire(False, 1)
    with pytest.raises(ValueError, match="timeout value must be"):
        m.acquire(timeout=-2)
    with pytest.raises(TypeError):
        m.acquire(nonsense=1)
    with m:
        assert m.locked()
    assert not m.locked()


def test_another_thread_may_release_it_and_a_waiter_then_gets_it():
    m = Mutex()
    m.acquire()
    got = []
    waiter = threading.Thread(target=lambda: got.append(m.acquire(timeout=30)))
    waiter.start()
    threading.Thread(target=m.release).start()
    waiter.join(30)
    assert got == [True] and m.locked()


def test_it_excludes_threads_from_each_other():
    m, counter = Mutex(), [0]

    def add() -> None:
        for _ in range(20_000):
            with m:
                value = counter[0]
                counter[0] = value + 1  # lost updates if two threads were inside at once

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter[0] == 80_000


def test_a_condition_over_it_waits_and_is_notified():
    m = Mutex()
    cond = threading.Condition(m)
    items: list[int] = []

    def produce() -> None:
        with cond:
            items.append(1)
            cond.notify()

    with cond:
        assert cond.wait(0.01) is False  # nothing notifies: times out, the mutex held again
        assert m.locked()
        threading.Thread(target=produce).start()
        assert cond.wait_for(lambda: items, 30)
    assert not m.locked()


class _Interrupted(Exception):
    pass


def test_a_signal_handler_interrupts_a_blocking_acquire():
    m = Mutex()
    m.acquire()

    def handler(signum, frame):
        raise _Interrupted

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(_Interrupted):
            m.acquire()  # held by this very thread: only the handler ends the wait
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert m.locked()
    m.release()


def test_a_channel_s_appender_uses_it(tmp_path):
    with FileChannel(tmp_path / "c", fsync="never") as ch:
        sender = ch.sender()
        assert type(sender.appender._mutex) is Mutex
        assert [sender.send(b"x") for _ in range(3)] == [0, 1, 2]
        assert not sender.appender._mutex.locked()
