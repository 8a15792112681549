"""Futures of produced records: real ``concurrent.futures.Future`` objects, made light.

``Producer.send`` returns a future per record, so a future's cost counts per record. A plain
``Future`` allocates a ``Condition`` (with its lock and waiter deque) and two lists:
six objects the garbage collector tracks. With thousands of durable records in flight,
CPython 3.11's collector walking them took a large share of a durable producer's CPU
(DESIGN.md, "Durable futures").

A :class:`RecordFuture` is a ``Future`` subclass, so ``result()``, ``wait()``,
``as_completed()`` and ``asyncio.wrap_future`` work, but it shares the condition of its
producer's partition, creates its waiter and callback lists only when someone asks for
them, and a whole fsync's worth of them is completed under one lock with one notify
(:meth:`RecordFuture.complete_many`). Waiting loops until its own future is done, since one notify wakes
the waiters of many futures.

It is also kafka-python's ``FutureRecordMetadata``: ``get(timeout)``, ``add_callback`` /
``add_errback`` / ``add_both`` (chainable, extra arguments first, as kafka-python calls
them), ``succeeded()``, ``failed()``, ``is_done``, ``value``. One name cannot be both:
kafka-python's ``exception`` is an attribute, ``concurrent.futures.Future.exception`` a
method that ``asyncio.wrap_future`` calls; it stays the method (``future.exception()``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures._base import FINISHED, PENDING  # the states Future's own methods test
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..errors import Timeout
from .records import RecordMetadata, TopicPartition

if TYPE_CHECKING:
    from concurrent.futures._base import _Waiter

T = TypeVar("T")


class RecordFuture(Future[T]):
    """A future of one record (of its :class:`RecordMetadata`, as ``Producer.send`` returns it);
    ``condition`` is shared by the futures completed together."""

    def __init__(self, condition: threading.Condition) -> None:  # Future.__init__ is not called: see the module
        self._condition = condition
        self._state = PENDING
        self._result = None
        self._exception = None

    @classmethod
    def resolved(cls, result: T) -> RecordFuture[T]:
        """A future that is done already (a record whose offset is known on send)."""
        future = cls(_DONE)
        future._result = result
        future._state = FINISHED
        return future

    @classmethod
    def rejected(cls, error: BaseException) -> RecordFuture[T]:
        """A future that failed already (a record refused on send)."""
        future = cls(_DONE)
        future._exception = error
        future._state = FINISHED
        return future

    @staticmethod
    def complete_many(
        condition: threading.Condition, done: Iterable[tuple[RecordFuture[Any], object]], error: BaseException | None
    ) -> None:
        """Complete many futures sharing ``condition``: with their results, or all with ``error``."""
        called: list[RecordFuture[Any]] = []
        with condition:
            for item, result in done:
                future: RecordFuture[Any] = item  # (typed: a future of this class, whose fields it sets)
                if error is None:
                    future._result = result
                else:
                    future._exception = error
                future._state = FINISHED
                extra = future.__dict__
                if "_waiter_list" in extra:  # someone is in concurrent.futures.wait()/as_completed()
                    for waiter in extra["_waiter_list"]:
                        waiter.add_result(future) if error is None else waiter.add_exception(future)
                if "_callback_list" in extra:
                    called.append(future)
            condition.notify_all()
        for future in called:
            RecordFuture._invoke_callbacks(future)

    # Future's methods append to these under the condition; most futures never need them.
    @property
    def _waiters(self) -> list[_Waiter]:
        waiters: list[_Waiter] = self.__dict__.setdefault("_waiter_list", [])
        return waiters

    @_waiters.setter  # Future.__init__ would set it (it is not called)
    def _waiters(self, waiters: list[_Waiter]) -> None:
        self.__dict__["_waiter_list"] = waiters

    @property
    def _done_callbacks(self) -> list[Callable[[Future[T]], object]]:
        callbacks: list[Callable[[Future[T]], object]] = self.__dict__.setdefault("_callback_list", [])
        return callbacks

    if TYPE_CHECKING:  # Future's own (CPython's concurrent/futures/_base.py), which typeshed leaves out

        def _invoke_callbacks(self) -> None: ...

    def cancel(self) -> bool:
        """A record handed to the producer cannot be recalled: always False."""
        return False

    def result(self, timeout: float | None = None) -> T:
        self._wait(timeout)
        if self._exception is not None:
            raise self._exception
        return cast(T, self._result)  # finished without an exception: _result is what the future was completed with

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._exception

    # -- kafka-python's FutureRecordMetadata ---------------------------------------------------

    def get(self, timeout: float | None = None) -> T:
        """The result, waiting up to ``timeout`` s; :class:`Timeout` (a ``TimeoutError``) if not done by then."""
        try:
            return self.result(timeout)
        except FutureTimeout:
            raise Timeout(f"the record was not written within {timeout} s") from None

    @property
    def is_done(self) -> bool:
        return self._state == FINISHED

    @property
    def value(self) -> T | None:
        """The result once succeeded, else None (kafka-python's attribute)."""
        return self._result if self._state == FINISHED else None

    def succeeded(self) -> bool:
        return self._state == FINISHED and self._exception is None

    def failed(self) -> bool:
        return self._state == FINISHED and self._exception is not None

    def add_callback(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> RecordFuture[T]:
        """Call ``fn(*args, result, **kwargs)`` once the record is written (at once if it is); returns self."""
        call = functools.partial(fn, *args, **kwargs)

        def on_done(f: Future[T]) -> None:
            if f.exception() is None:  # (done: neither call waits)
                call(f.result())

        self.add_done_callback(on_done)
        return self

    def add_errback(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> RecordFuture[T]:
        """Call ``fn(*args, exception, **kwargs)`` if the record fails (at once if it did); returns self."""
        call = functools.partial(fn, *args, **kwargs)

        def on_done(f: Future[T]) -> None:
            error = f.exception()  # (done: it does not wait)
            if error is not None:
                call(error)

        self.add_done_callback(on_done)
        return self

    def add_both(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> RecordFuture[T]:
        """``fn`` as both callback and errback; returns self."""
        return self.add_callback(fn, *args, **kwargs).add_errback(fn, *args, **kwargs)

    def _wait(self, timeout: float | None) -> None:
        if self._state == FINISHED:
            return
        with self._condition:
            if not self._condition.wait_for(lambda: self._state == FINISHED, timeout):
                raise FutureTimeout()


_DONE = threading.Condition()  # of futures created done: nobody ever waits on it


if TYPE_CHECKING:

    class _Sent:
        _at: tuple[int, int]
        _size: int

else:
    try:  # the C extension's: the offset, timestamp and size as C fields, made into objects when read
        from ..engine._codec import SentCore as _Sent
    except ImportError:

        class _Sent:
            __slots__ = ("_at", "_size")


class SentFuture(_Sent, RecordFuture[RecordMetadata]):
    """The done future of a record buffered by ``Producer.send``'s common case: it keeps
    where the record went and builds the :class:`RecordMetadata` only when asked.

    Most producers never look at the future of every record; building the 11-field
    metadata and a full future per send cost more than the append itself (DESIGN.md,
    "Producer.send's short path"). ``_route`` is the partition's
    ``(topic, partition, TopicPartition)``, ``_at`` the append's ``(offset, timestamp)``,
    ``_size`` the value's length. Everything else is the class's: done, no exception.
    With the C extension, ``_at`` and ``_size`` are its ``SentCore``'s C fields, which
    ``_codec.ProducerSend`` sets without making the tuple and ints a send never reads
    (they were a fifth of a 100 B send).
    """

    __slots__ = ("_route",)
    _route: tuple[str, int, TopicPartition]
    _condition = _DONE
    _state = FINISHED
    _exception = None

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        """The metadata at once: done at send, so ``AsyncProducer.send`` hands this future out
        as the delivery to await (no :class:`~.aio.RecordDelivery` around it: that object
        and its coroutine cost a seventh of an async send at 100 B)."""
        return self._result
        yield  # a generator that never suspends: awaiting it does not reach the event loop

    @staticmethod
    def sent(route: tuple[str, int, TopicPartition], at: tuple[int, int], size: int) -> SentFuture:
        """The future of a record the producer's Python short path appended (the C one,
        ``_codec.ProducerSend``, fills the same fields itself)."""
        future: SentFuture = _new_sent(SentFuture)
        future._route, future._at, future._size = route, at, size
        return future

    @property
    def _result(self) -> RecordMetadata:  # read by result(), value and Future's own methods
        topic, partition, tp = self._route
        offset, timestamp = self._at
        # tuple.__new__: the namedtuple's Python-level __new__ with 11 arguments costs more
        return _new_tuple(RecordMetadata, (topic, partition, tp, offset, timestamp, None, -1, self._size, -1, 0, -1))

    @_result.setter  # Future's attribute is writable; this future is done at send, with its result
    def _result(self, result: RecordMetadata | None) -> None:
        raise AttributeError("a SentFuture is done at send: its result cannot be set")


_new_tuple = tuple.__new__
_new_sent = SentFuture.__new__  # SentCore's (object's without the C extension): no __init__ call
