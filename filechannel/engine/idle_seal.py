"""Sealing an idle active segment from outside the writer: how ``tier run --roll`` lets the
records of a quiet partition move to tier-2 before the segment reaches ``segment_bytes``.

Invariants:

- It seals only under ``writer.lock``, taken without waiting: a writer that holds it is
  writing (it holds the lock from assigning offsets until the records are written), and its
  partition is left alone. A writer that is alive but idle has let the lock go; its next
  send takes the lock, sees the newer segment (:func:`.recovery.current_state`) and
  appends there, as after another process's roll.
- It seals only a segment that holds records and was not written to for ``idle_ms``, so a
  steady writer's segment is left to its own rolls (``segment_bytes``, ``segment_ms``).
- The sealed segment is fsynced and the recovery point moved past it before the lock is
  let go (:func:`.roll.sync_sealed`): uploading a raw segment needs it below that point.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import os_errors
from .clock import now_ms
from .recovery import current_state
from .roll import roll, sync_sealed

if TYPE_CHECKING:
    from .log import Log

SEALED = "sealed"
BUSY = "busy"  # a writer holds writer.lock
RECENT = "recent"  # written to within idle_ms
EMPTY = "empty"  # the active segment holds no record (or the folder has no segment)


def seal_idle(log: Log, idle_ms: int) -> tuple[str, int, int]:
    """Seal the active segment of ``log`` if it holds records, no writer holds ``writer.lock``
    and its file was not written to for ``idle_ms`` (see the module docstring).

    Returns ``(outcome, base, end)``: one of SEALED, BUSY, RECENT, EMPTY, and the offsets
    ``[base, end)`` of the segment sealed (0, 0 if none was).
    """
    refs = log.local_segments()
    if not refs or refs[-1].compressed:  # nothing to seal: a writer's recovery starts the next one
        return EMPTY, 0, 0
    with os_errors("stat segment", refs[-1].path):
        written_ms = os.stat(refs[-1].path).st_mtime_ns // 1_000_000
    if now_ms() - written_ms < idle_ms:
        return RECENT, 0, 0
    if not log.writer_lock.acquire(blocking=False):
        return BUSY, 0, 0
    try:
        state = current_state(log)
        if state.end_offset == state.segment_base:
            return EMPTY, 0, 0
        new = roll(log, state)
        sync_sealed(log, new.segment_base)
        return SEALED, state.segment_base, new.segment_base
    finally:
        log.writer_lock.release()
