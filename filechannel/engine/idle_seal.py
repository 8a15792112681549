"""Sealing an idle or old active segment from outside the writer: how ``tier run --roll`` lets
the records of a quiet partition move to tier-2 before the segment reaches ``segment_bytes``,
and how the daemon keeps tier-2 within ``tier_after_ms`` of a slow writer.

Invariants:

- It seals only under ``writer.lock``, taken without waiting: a writer that holds it is
  writing (it holds the lock from assigning offsets until the records are written), and its
  partition is left alone. A writer that is alive but idle has let the lock go; its next
  send takes the lock, sees the newer segment (:func:`.recovery.current_state`) and
  appends there, as after another process's roll.
- It seals only a segment that holds records and either was not written to for ``idle_ms``
  (a steady writer's segment is left to its own rolls: ``segment_bytes``, ``segment_ms``),
  or whose first record is ``record_age_ms`` old (by its timestamp: a slow writer's segment,
  sealed once its oldest record has waited that long, so tier-2 is never further behind).
- The sealed segment is fsynced and the recovery point moved past it before the lock is
  let go (:func:`.roll.sync_sealed`): uploading a raw segment needs it below that point.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import os_errors
from .clock import now_ms
from .recovery import current_state
from .retention import segment_first_timestamp
from .roll import roll, sync_sealed

if TYPE_CHECKING:
    from .log import Log

SEALED = "sealed"  # idle for idle_ms
AGED = "aged"  # sealed: its first record was record_age_ms old
BUSY = "busy"  # a writer holds writer.lock
RECENT = "recent"  # written to within idle_ms
EMPTY = "empty"  # the active segment holds no record (or the folder has no segment)


def seal_idle(log: Log, idle_ms: int | None, record_age_ms: int | None = None) -> tuple[str, int, int]:
    """Seal the active segment of ``log`` if it holds records, no writer holds ``writer.lock``,
    and its file was not written to for ``idle_ms`` or its first record is ``record_age_ms``
    old (either None: that rule is off; see the module docstring).

    Returns ``(outcome, base, end)``: one of SEALED, AGED, BUSY, RECENT, EMPTY, and the offsets
    ``[base, end)`` of the segment sealed (0, 0 if none was).
    """
    refs = log.local_segments()
    if not refs or refs[-1].compressed:  # nothing to seal: a writer's recovery starts the next one
        return EMPTY, 0, 0
    now = now_ms()
    due = None
    if idle_ms is not None:
        with os_errors("stat segment", refs[-1].path):
            written_ms = os.stat(refs[-1].path).st_mtime_ns // 1_000_000
        due = SEALED if now - written_ms >= idle_ms else None
    if due is None and record_age_ms is not None:
        first = segment_first_timestamp(refs[-1])  # None: no whole record yet
        due = AGED if first is not None and now - first >= record_age_ms else None
    if due is None:
        return RECENT, 0, 0
    if not log.writer_lock.acquire(blocking=False):
        return BUSY, 0, 0
    try:
        state = current_state(log)
        if state.end_offset == state.segment_base:
            return EMPTY, 0, 0
        new = roll(log, state)
        sync_sealed(log, new.segment_base)
        return due, state.segment_base, new.segment_base
    finally:
        log.writer_lock.release()
