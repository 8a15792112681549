"""Receivers: independent readers of a channel, and ack receivers with durable positions."""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Iterator
from itertools import islice
from operator import length_hint
from typing import TYPE_CHECKING, Any, Self, SupportsIndex

from .engine.cursor import Cursor
from .engine.names import validate_name
from .engine.record import RECORDS, Record, RecordLayout
from .errors import AckError, ChannelClosedError, ConfigError, Timeout

if TYPE_CHECKING:
    from typing import Protocol

    from .engine.log import Log
    from .engine.position import PositionStore
    from .engine.wakeup import Wakeup

    class _Channel(Protocol):
        """What a receiver uses of its channel besides the log and wakeup it is handed: a
        :class:`~filechannel.channel.FileChannel`, which makes receivers (this module does not
        import it). A type only: nothing checks it at run time."""

        path: str
        positions: PositionStore

        @property
        def closed(self) -> bool: ...


_BATCH = 512  # records a recv() reads at a time, at most ...
# ... and about this many bytes of them (the cursor's bound: Cursor.read). Its values are
# decoded into new bytes objects, and a batch past the CPU cache is written out to memory and
# read back from it: recv() of 16 KiB records, 512 at a time, ran faster with this bound than
# without (DESIGN.md, "Reading"); 512 records of 1 MiB would have held half a gigabyte for
# one recv().
_BATCH_BYTES = 1 << 20


def _checked_timeout(timeout: float | None) -> float | None:
    """``timeout`` as seconds to wait, None for ever (None or ``inf``); ConfigError for a
    negative, NaN or non-number timeout, which would otherwise hang or fail later."""
    if timeout is None:
        return None
    if (type(timeout) is float or type(timeout) is int) and timeout >= 0:  # NaN fails ">= 0"
        return None if timeout == math.inf else timeout
    if not isinstance(timeout, bool) and isinstance(timeout, (int, float)) and timeout >= 0:
        return None if timeout == math.inf else float(timeout)
    raise ConfigError(f"timeout must be None or a number of seconds >= 0 (inf waits for ever), not {timeout!r}")


def _checked_count(value: SupportsIndex, what: str) -> int:
    """``value`` as an int >= 1 (anything with ``__index__`` but a bool), else ConfigError."""
    if type(value) is int and value >= 1:
        return value
    try:
        n = operator.index(value)
    except TypeError:
        n = 0
    if isinstance(value, bool) or n < 1:
        raise ConfigError(f"{what} must be an int >= 1, not {value!r}")
    return n


class Receiver:
    """Reads records from an offset onward; fan-out: each receiver has its own position.

    ``recv`` blocks until a record has been flushed by any sender, in this process or
    another. Not thread-safe: use one receiver per thread; but ``close`` (of the receiver
    or its channel) may come from any thread at any moment: a read in progress then
    returns what it had or raises :class:`ChannelClosedError`.
    """

    def __init__(self, channel: _Channel, log: Log, wakeup: Wakeup, offset: int) -> None:
        self._channel = channel
        self._wakeup = wakeup
        self._cursor = Cursor(log, offset)
        self._batch: list[Record] = []
        self._rest: Iterator[Record] = iter(())  # the undelivered part of _batch
        self._closed = False

    @property
    def position(self) -> int:
        """The offset of the next record this receiver delivers."""
        left = length_hint(self._rest)
        if left:
            return self._batch[len(self._batch) - left].offset
        return self._cursor.position

    def seek(self, offset: int) -> None:
        """Deliver from ``offset`` next (OffsetOutOfRangeError if retention deleted it)."""
        self._check_open()
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"offset must be an int >= 0, not {offset!r}")
        self._cursor.seek(offset)
        self._batch, self._rest = [], iter(())

    def recv(self, timeout: float | None = None) -> Record:
        """The next record; waits for one. Raises :class:`Timeout` if none came in ``timeout`` s.

        ``timeout`` None or ``inf`` waits for ever; a negative or NaN one raises :class:`ConfigError`
        whenever the call reads (not when it hands out a record of the batch it already read:
        that path costs nothing per record).
        """
        try:
            return next(self._rest)  # the per-record path: nothing else on it
        except StopIteration:
            pass
        got = self._wait(_BATCH, _checked_timeout(timeout), max_bytes=_BATCH_BYTES)
        if not got:
            raise Timeout(f"no record arrived within {timeout} s at offset {self.position} of {self._channel.path!r}")
        self._batch = got
        self._rest = iter(got)
        return next(self._rest)

    def recv_many(self, max_records: int, timeout: float | None = None, *, max_bytes: int | None = None) -> list[Record]:
        """Up to ``max_records`` records: what is there now, else waits for some (``[]`` on timeout).

        ``timeout=0`` never waits; None or ``inf`` waits for ever. With ``max_bytes``, about
        that many bytes of records at most: at least one record, and at most one read past
        the bound (a 256 KiB chunk, or one longer record), so that a batch of large records
        stays small in memory.
        """
        max_records = _checked_count(max_records, "max_records")
        timeout = _checked_timeout(timeout)
        if max_bytes is not None:
            max_bytes = _checked_count(max_bytes, "max_bytes")
        if length_hint(self._rest):
            return list(islice(self._rest, max_records))
        return self._wait(max_records, timeout, max_bytes=max_bytes)

    def read_now(self, max_records: int, layout: RecordLayout, max_bytes: int, nowait: bool = False) -> list[Any]:
        """``recv_many(max_records, timeout=0)`` with the records decoded as ``layout`` says (a
        Kafka-like consumer's records made as they are read, not from a :class:`Record` each)
        and about ``max_bytes`` of them at most (see :meth:`Cursor.read`). ``nowait``: only
        what is in memory, else :class:`WouldBlock` (an event loop's read: ``Cursor.read``).
        The client's fetcher reads through this; it is not part of the documented API."""
        if length_hint(self._rest):
            rest = list(islice(self._rest, max_records))
            return rest if layout.convert is None else layout.convert(rest)
        if nowait:
            self._check_open()
            return self._cursor.read(max_records, layout, max_bytes, nowait=True)
        return self._wait(max_records, 0.0, layout, max_bytes)

    def _wait(
        self, max_records: int, timeout: float | None, layout: RecordLayout = RECORDS, max_bytes: int | None = None
    ) -> list[Any]:
        self._check_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            seq = self._wakeup.seq
            got = self._cursor.read(max_records, layout, max_bytes)
            if got:
                return got
            self._check_open()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return got
            self._wakeup.wait(seq, remaining)

    def __iter__(self) -> Iterator[Record]:
        """Yields records forever, waiting for new ones."""
        while True:
            yield self.recv()

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError("this receiver is closed")
        if self._channel.closed:
            raise ChannelClosedError(f"the channel {self._channel.path!r} is closed")

    def close(self) -> None:
        """Release the receiver's files; idempotent, safe from any thread (see the class)."""
        self._closed = True
        self._cursor.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AckReceiver(Receiver):
    """A receiver whose acknowledged position survives restarts (at-least-once delivery).

    ``ack(n)`` acknowledges the next ``n`` delivered records and stores the position
    durably (see :mod:`filechannel.engine.position`). A new ack receiver of the same name
    resumes at the first unacknowledged record. Its position holds back garbage
    collection: no segment it has not acknowledged past is deleted.
    """

    def __init__(self, channel: _Channel, log: Log, wakeup: Wakeup, name: str, on_ack: Callable[[], None]) -> None:
        self.name = validate_name(name, "ack receiver name")
        self._key = f"ack.{name}"
        self._on_ack = on_ack  # wakes the channel's maintenance: garbage collection may go further
        stored = channel.positions.get(self._key)
        start = log.first_offset if stored is None else stored
        if stored is None:
            channel.positions.set(self._key, start)
        self._acked = start
        self._ack_log = log
        super().__init__(channel, log, wakeup, start)

    @property
    def acked(self) -> int:
        """The first offset not yet acknowledged."""
        return self._acked

    def ack(self, n: int = 1) -> None:
        """Acknowledge the next ``n`` delivered records (durably)."""
        n = _checked_count(n, "n")
        self._check_open()
        delivered = self.position
        if self._acked + n > delivered:
            raise AckError(
                f"ack receiver {self.name!r} was asked to acknowledge {n} records but only "
                f"{delivered - self._acked} delivered records are unacknowledged"
            )
        self._acked = self._after(n, delivered) if self._ack_log.config.compacted else self._acked + n
        self._channel.positions.set(self._key, self._acked)
        self._on_ack()

    def _after(self, n: int, delivered: int) -> int:
        """Where acknowledging ``n`` records leaves the position on a compacted channel, whose
        offsets have holes: one past the ``n``-th record from the acknowledged position, read
        again (cached pages: they were just delivered). Records the cleaner removed meanwhile
        count as acknowledged, never past what was delivered."""
        cursor = Cursor(self._ack_log, self._acked)
        try:
            records = [r for r in cursor.read(n) if r.offset < delivered]
        finally:
            cursor.close()
        return records[n - 1].offset + 1 if len(records) == n else delivered

    def seek(self, offset: int) -> None:
        """Deliver from ``offset`` next; acknowledgements restart there too."""
        super().seek(offset)
        self._acked = offset
