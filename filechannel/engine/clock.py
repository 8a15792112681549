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

# The clock itself, bound once. The appender reads it too (bound in its module as ``_wall_ns``)
# for the wall clock's lead over the monotonic one, from which the C path stamps records.
wall_ns = time.time_ns


def now_ms() -> int:
    """Now, on the wall clock, in milliseconds since the epoch."""
    return wall_ns() // 1_000_000
