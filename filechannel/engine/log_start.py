"""The log start offset: below it a channel's records are deleted (Kafka's ``delete_records``).

Retention deletes whole segments, so the first offset is normally the first segment's base.
``delete_records`` moves the start to any offset, also inside a segment: the offset is kept in
the channel folder's ``log-start`` file, and the log's first offset is the larger of the two
(:attr:`filechannel.engine.log.Log.first_offset`). Reads below it are out of range, as reads of
a deleted segment are; whole segments below it go at the next garbage collection.

Invariants: the offset only ever moves up (:func:`advance_log_start` writes the larger of the
old and the new, under ``maintenance.lock``); the file is replaced atomically (temp, fsync,
rename, fsync of the folder), so a crash leaves the old offset or the new one, never a torn
file; no file means 0. Layout: ``{"log_start_offset": N}``, one JSON object.
"""

from __future__ import annotations

import json
import os

from ..errors import CorruptRecordError
from .files import read_if_exists, write_atomically

FILE_NAME = "log-start"


def read_log_start(folder: str) -> int:
    """The log start offset kept in ``folder`` (0 if none was ever set)."""
    path = os.path.join(folder, FILE_NAME)
    data = read_if_exists(path, "log start offset")
    if data is None:
        return 0
    try:
        offset = json.loads(data)["log_start_offset"]
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"{offset!r} is not an offset")
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecordError(
            f'{path!r} is damaged ({exc}): write {{"log_start_offset": N}} in it with the first offset to keep '
            "(0 keeps every record), or delete it to keep every record"
        ) from exc
    return offset


def advance_log_start(folder: str, offset: int) -> int:
    """Move the log start offset of ``folder`` up to ``offset`` (never down); return it. Caller
    holds ``maintenance.lock``, so two moves cannot lose the larger one."""
    current = read_log_start(folder)
    if offset <= current:
        return current
    write_atomically(os.path.join(folder, FILE_NAME), json.dumps({"log_start_offset": offset}).encode())
    return offset
