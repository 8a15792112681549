"""The search of a log by time (``FileChannel.offset_for_time``): the first offset whose record
has a timestamp at or after a given one.

The log's time indexes (:meth:`.log.Log.time_start`: a bisect per segment, the block table
of a compressed one) say where in a segment to start; a cursor then scans a short run of
records from there, never the whole log. Of tier-2 only the one segment that holds the
answer is read (:meth:`.log.Log.segments_from_time`), whatever the history's length.
"""

from __future__ import annotations

from ..errors import FileChannelError, OffsetOutOfRangeError
from .cursor import Cursor
from .log import Log, SegmentRef, vanished
from .record import Record, checked_timestamp

# About the most a time search decodes at once: 4,096 records of 1 MB would be 4 GB.
_SCAN_BYTES = 1 << 20
# Records decoded by a search's first read, doubled at each next one up to _MOST_SCAN: the answer is
# usually within one index interval of where the time index says to start.
_FIRST_SCAN, _MOST_SCAN = 64, 4096


def offset_for_time(log: Log, timestamp_ms: int) -> int | None:
    """The first offset of ``log`` whose record has a timestamp >= ``timestamp_ms``; None if none yet.

    A segment compressed or collected while it is looked at is normal on a live channel:
    the folder is listed again and the search goes on with the ``.seg.z`` that replaced it,
    or past what garbage collection deleted. A timestamp that is not an int of 64 bits
    raises :class:`~filechannel.errors.RecordTypeError`.
    """
    timestamp_ms = checked_timestamp(timestamp_ms)
    refs = log.segments_from_time(timestamp_ms)
    i = 0
    while i < len(refs):
        ref = refs[i]
        segment_end = refs[i + 1].base_offset if i + 1 < len(refs) else None
        try:
            found = _time_in_segment(log, ref, segment_end, timestamp_ms)
        except (OSError, FileChannelError) as exc:
            if not vanished(ref, exc):
                raise
            refs, i = log.relisted(ref, exc, log.segments_from_time(timestamp_ms))
            continue
        if found is not None:
            return found
        i += 1
    return None


def _time_in_segment(log: Log, ref: SegmentRef, segment_end: int | None, timestamp_ms: int) -> int | None:
    start = log.time_start(ref, timestamp_ms)
    if start is None:
        return None
    try:
        cursor = Cursor(log, start)
    except OffsetOutOfRangeError:
        return None  # collected meanwhile: later segments may still hold it
    rec: Record  # (the cursor's default layout)
    count = _FIRST_SCAN
    try:
        while True:
            if segment_end is not None:  # never a record past the segment: crossing into the next one lists the folder
                count = min(count, segment_end - cursor.position)
                if count <= 0:
                    return None
            batch = cursor.read(count, max_bytes=_SCAN_BYTES)
            if not batch:
                return None
            count = min(2 * count, _MOST_SCAN)
            for rec in batch:
                if segment_end is not None and rec.offset >= segment_end:
                    return None
                if rec.timestamp >= timestamp_ms:
                    return rec.offset
    finally:
        cursor.close()
