"""The wall clock in milliseconds since the epoch: :func:`now_ms`, the package's one reading of it.

What it dates: a record's timestamp, a segment's ``created``, retention's cutoffs, and the times
the tier-2 metadata, claims and exports record. Durations (hold limits, flush deadlines) are
measured on the monotonic clock instead (see :mod:`.appender`).

Integer arithmetic on ``time.time_ns()``: exact, where ``int(time.time() * 1000)`` rounds through
a float. A call costs no more than that expression written out, so a caller on a per-record
path loses nothing by calling it.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

# The clock itself, bound once. The appender reads it too (bound in its module as ``_wall_ns``)
# for the wall clock's lead over the monotonic one, from which the C path stamps records.
wall_ns = time.time_ns


def now_ms() -> int:
    """Now, on the wall clock, in milliseconds since the epoch."""
    return wall_ns() // 1_000_000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def datetime_ms(when: datetime, *, naive_is_utc: bool = False) -> int:
    """``when`` in milliseconds since the epoch, floored, in integer arithmetic (exact for any date).

    A naive datetime is read in the machine's zone (what a user types) or, with
    ``naive_is_utc``, as UTC (what storage servers report). Raises OverflowError or OSError for a
    time the platform cannot place in a zone.
    """
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC) if naive_is_utc else when.astimezone()
    return (when - _EPOCH) // _MS
