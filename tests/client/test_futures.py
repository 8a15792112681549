"""RecordFuture: a lighter concurrent.futures.Future that the standard tools still accept."""

import asyncio
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from filechannel.client.futures import RecordFuture


def test_a_group_completes_at_once_and_wakes_each_waiter_with_its_own_result():
    cond = threading.Condition()
    futures = [RecordFuture[int](cond) for _ in range(6)]
    got = {}

    def waiter(i):
        got[i] = futures[i].result(timeout=10)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.05)  # most likely every waiter is blocked by now; the test holds either way
    RecordFuture.complete_many(cond, [(f, i * 10) for i, f in enumerate(futures[:3])], None)
    for t in threads[:3]:
        t.join(10)
    assert sorted(got) == [0, 1, 2]
    assert all(t.is_alive() for t in threads[3:])  # woken too, they saw their future pending
    RecordFuture.complete_many(cond, [(f, i * 10) for i, f in enumerate(futures[3:], 3)], None)
    for t in threads:
        t.join(10)
    assert got == {i: i * 10 for i in range(6)}
    assert all(isinstance(f, Future) and f.done() and not f.cancelled() for f in futures)


def test_errors_timeouts_and_cancel():
    cond = threading.Condition()
    f = RecordFuture[int](cond)
    with pytest.raises(FutureTimeout):
        f.result(timeout=0.01)
    assert not f.cancel()
    boom = OSError("disk")
    RecordFuture.complete_many(cond, [(f, None)], boom)
    assert f.exception() is boom
    with pytest.raises(OSError, match="disk"):
        f.result()
    single = RecordFuture[int](cond)
    single.set_exception(ValueError("too large"))  # Future's own method works on it
    assert isinstance(single.exception(), ValueError)


def test_wait_as_completed_and_callbacks():
    cond = threading.Condition()
    a, b = RecordFuture[int](cond), RecordFuture[int](cond)
    seen = []
    a.add_done_callback(lambda f: seen.append(("a", f.result())))
    threading.Timer(0.05, RecordFuture.complete_many, args=(cond, [(a, 1)], None)).start()
    done, pending = wait([a, b], timeout=10, return_when=FIRST_COMPLETED)
    assert done == {a} and pending == {b}
    assert seen == [("a", 1)]
    threading.Timer(0.05, RecordFuture.complete_many, args=(cond, [(b, 2)], None)).start()
    assert [f.result() for f in as_completed([a, b], timeout=10)] in ([1, 2], [2, 1])
    b.add_done_callback(lambda f: seen.append(("b", f.result())))  # done already: called at once
    assert seen == [("a", 1), ("b", 2)]
    resolved = RecordFuture.resolved("meta")
    assert resolved.done() and resolved.result(timeout=0) == "meta"


def test_asyncio_can_await_it():
    cond = threading.Condition()
    f = RecordFuture[int](cond)

    async def main():
        threading.Timer(0.05, RecordFuture.complete_many, args=(cond, [(f, "x")], None)).start()
        return await asyncio.wait_for(asyncio.wrap_future(f), 10)

    assert asyncio.run(main()) == "x"
