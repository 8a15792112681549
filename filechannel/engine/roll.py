"""Rolls: sealing the active segment and starting the next one, and starting the first.

Invariants:

- Only a holder of ``writer.lock`` starts a segment (:func:`roll`, :func:`create_first_segment`,
  and recovery, which starts one where a folder has none or a lost roll left a sealed one
  last): the new segment's header and the writer state in ``writer.lock`` are written
  before any record is appended to it.
- A roll fsyncs nothing on the append path but, with ``fsync="always"``, the folder (so
  an acknowledged record's segment is never lost). The sealed segments are fsynced
  later, off the append path (:func:`sync_sealed`, run by :mod:`.sealer`'s thread), and
  only then does the recovery point (:mod:`.recovery_point`) move past them.
- An empty folder of a tiered channel starts at the tier's end offset, never below
  what was uploaded.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from . import names
from .clock import now_ms
from .files import fsync_dir, fsync_if_exists
from .index import MIN_TIMESTAMP
from .recovery_point import read_recovery_point, write_recovery_point
from .segment import SEGMENT_HEADER_SIZE, SegmentHeader, create_segment
from .writer_state import WriterState, write_state

if TYPE_CHECKING:
    from .log import Log


def create_first_segment(log: Log) -> None:
    """Create segment 0 of an empty folder, so readers have a segment to wait on; the
    caller holds ``writer.lock``. Does nothing if a writer made one meanwhile."""
    if not log.local_segments():
        base = log.tier_end_offset()
        start_segment(log, base, 0, sync_dir=log.config.fsync != "never")
        write_recovery_point(log.recovery_point_path, base)
        log.refresh_local()


def roll(log: Log, state: WriterState) -> WriterState:
    """Seal the active segment and start a new one at ``state.end_offset`` (under writer.lock).

    Nothing is fsynced here but, with ``fsync="always"``, the folder (so an acknowledged
    record's segment is never lost): :func:`sync_sealed` does the rest in the background.
    """
    new = start_segment(log, state.end_offset, state.segment_id + 1, sync_dir=log.config.fsync == "always")
    log.refresh_local()
    return new


def start_segment(log: Log, base_offset: int, segment_id: int, sync_dir: bool) -> WriterState:
    """Create the active segment ``segment_id`` at ``base_offset`` (its header) and record it
    as the writer state; the caller holds ``writer.lock``. Returns that state."""
    now = now_ms()
    fd = create_segment(log.segment_path(base_offset), SegmentHeader(segment_id, base_offset, now))
    os.close(fd)
    if sync_dir:
        fsync_dir(log.path)
    state = WriterState(base_offset, segment_id, SEGMENT_HEADER_SIZE, base_offset, 0, MIN_TIMESTAMP, now)
    write_state(log.writer_lock.fd, log.writer_lock.path, state)
    return state


def sync_sealed(log: Log, upto: int) -> None:
    """fsync the sealed raw segments below ``upto`` not yet known to be on disk (their
    files and the folder), then move the recovery point to ``upto``. Needs no lock:
    sealed segments no longer change, and a concurrent older point only means more
    checking after a machine crash."""
    point = read_recovery_point(log.recovery_point_path)
    start = point.offset if point is not None and point.this_boot else 0
    if start >= upto:
        return
    for ref in log.local_segments():
        if start <= ref.base_offset < upto and not ref.compressed:  # compressed files were fsynced
            for suffix in (names.SEGMENT_SUFFIX, names.OFFSET_INDEX_SUFFIX, names.TIME_INDEX_SUFFIX):
                fsync_if_exists(log.file(ref.base_offset, suffix))
    fsync_dir(log.path)
    point = read_recovery_point(log.recovery_point_path)
    if point is None or not point.this_boot or point.offset < upto:
        write_recovery_point(log.recovery_point_path, upto)
