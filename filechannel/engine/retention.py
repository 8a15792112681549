"""Garbage collection of a channel folder: which sealed segments go, and their deletion.

Invariants: it runs under ``maintenance.lock``; only a prefix of the sealed segments is
ever deleted (oldest first, so a crash midway leaves a shorter prefix, never a hole),
never the active segment. With a tier, :func:`collect_garbage` deletes nothing: only
the tiering daemon deletes segments, and only once they are uploaded (see
filechannel/tiering/daemon.py), so no retention rule or reader position can delete a
segment that exists nowhere else.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import os_errors
from . import names
from .clock import now_ms
from .compressed import CompressedSegment
from .files import fsync_dir, opened, unlink_if_exists
from .log_start import read_log_start
from .record import FRAME_HEADER_SIZE, RECORD_PREFIX, RECORD_PREFIX_SIZE
from .segment import (
    MAX_FRAME_PAYLOAD,
    SEGMENT_HEADER_SIZE,
    FrameScanner,
    valid_frame_at,
)

if TYPE_CHECKING:
    from .log import Log, SegmentRef

logger = logging.getLogger("filechannel")


def segment_bytes_on_disk(ref: SegmentRef) -> int:
    """The size of a segment's file, 0 if it is gone (collected or compressed meanwhile)."""
    try:
        return os.path.getsize(ref.path)
    except FileNotFoundError:
        return 0


def segment_max_timestamp(log: Log, ref: SegmentRef, end_offset: int) -> int:
    """The largest timestamp in a sealed segment (from its checked time index and a
    scan of the frames after its last entry)."""
    if ref.compressed:
        return log.compressed_info(ref).max_timestamp
    idx, tix = log.sealed_indexes(ref)
    offset, position, max_ts = (idx.offsets[-1], idx.positions[-1], tix.max_before[-1]) if len(idx) else idx.start
    with opened(ref.path, os.O_RDONLY, action="open segment") as fd:
        _marks, _since, max_ts = FrameScanner(fd, ref.path, position, offset, MAX_FRAME_PAYLOAD).scan(max_ts=max_ts)
    return max_ts


def segment_first_timestamp(ref: SegmentRef) -> int | None:
    """The timestamp of a segment's first record: the first frame of a raw segment (None while
    it holds no whole, valid frame: empty, or its writer is writing it), or of the first block
    of a ``.seg.z``. How old a segment's oldest record is (records carry their producer's
    timestamps, so it is the first record's, not the smallest); ``tier_after_ms`` goes by it."""
    if ref.compressed:
        segment = CompressedSegment.open(ref.path)
        try:
            if not segment.info.blocks:
                return None
            data = segment.read_block(0)
        finally:
            segment.close()
        if len(data) < FRAME_HEADER_SIZE + RECORD_PREFIX_SIZE:
            return None
        return int(RECORD_PREFIX.unpack_from(data, FRAME_HEADER_SIZE)[1])
    with opened(ref.path, os.O_RDONLY, action="open segment") as fd, os_errors("read", ref.path):
        size = os.fstat(fd).st_size
        if not valid_frame_at(fd, ref.path, SEGMENT_HEADER_SIZE, size):
            return None
        prefix = os.pread(fd, RECORD_PREFIX_SIZE, SEGMENT_HEADER_SIZE + FRAME_HEADER_SIZE)
    return int(RECORD_PREFIX.unpack_from(prefix, 0)[1])


def collect_garbage(log: Log, hold: int | None) -> list[int]:
    """Delete the oldest sealed segments that every rule allows; return their base offsets.

    A sealed segment goes when all of its records lie below ``hold`` (the smallest
    durable reader position, None if there is none) or below the log start offset
    (:mod:`.log_start`), or when retention says so.
    Only a prefix of the sealed segments is ever deleted. Caller holds maintenance.lock.
    With a tier it deletes nothing: the tiering daemon deletes, uploaded segments only.
    """
    if log.tier is not None:
        return []
    refs = log.local_segments()
    sealed = refs[:-1]
    if not sealed:
        return []
    ends = [r.base_offset for r in refs[1:]]
    k = 0
    start = read_log_start(log.path)
    hold = start if hold is None else max(hold, start)
    while k < len(sealed) and ends[k] <= hold:
        k += 1
    limit_bytes, limit_ms = log.config.retention_bytes, log.config.retention_ms
    if limit_bytes is not None or limit_ms is not None:
        sizes = [segment_bytes_on_disk(r) for r in refs] if limit_bytes is not None else [0] * len(refs)
        j = past_retention(
            sizes[:-1], sum(sizes), lambda i: segment_max_timestamp(log, sealed[i], ends[i]), limit_bytes, limit_ms
        )
        k = max(k, j)
    return delete_sealed_prefix(log, ends[k - 1]) if k else []


def past_retention(
    sizes: Sequence[int], total: int, max_timestamp: Callable[[int], int], limit_bytes: int | None, limit_ms: int | None
) -> int:
    """How many of the oldest segments retention deletes: the longest prefix of them in which
    each is past ``limit_bytes`` (the log, ``total`` bytes, is still larger than that less the
    segments before it) or past ``limit_ms`` (its newest record, ``max_timestamp(i)``, is older
    than that); a None limit never applies.

    ``sizes`` (oldest first) are those of the segments that may go: sealed ones, up to the
    first the caller must keep. ``max_timestamp`` is asked only for a segment the bytes do not
    already doom, oldest first (it may read the segment). Used by garbage collection here and
    by the tiering daemon's local and total retention.
    """
    cutoff = None if limit_ms is None else now_ms() - limit_ms
    k = 0
    for i, size in enumerate(sizes):
        by_bytes = limit_bytes is not None and total > limit_bytes
        if not (by_bytes or (cutoff is not None and max_timestamp(i) < cutoff)):
            break
        total -= size
        k = i + 1
    return k


def delete_sealed_prefix(log: Log, upto: int) -> list[int]:
    """Delete the sealed segments whose records all lie below ``upto``, oldest first (a crash
    midway leaves a shorter prefix, never a hole); never the active segment. Return their
    base offsets. Caller holds maintenance.lock."""
    refs = log.local_segments()  # local files only: with a tier, the listing also holds remote segments
    deleted = []
    for ref, end in zip(refs[:-1], [r.base_offset for r in refs[1:]], strict=True):
        if end > upto:
            break
        for suffix in (names.COMPRESSED_SUFFIX, names.SEGMENT_SUFFIX, names.OFFSET_INDEX_SUFFIX, names.TIME_INDEX_SUFFIX):
            unlink_if_exists(log.file(ref.base_offset, suffix))
        deleted.append(ref.base_offset)
    if deleted:
        fsync_dir(log.path)
        log.refresh_local()
        logger.info("channel %s: deleted %d sealed segment(s) below offset %d", log.path, len(deleted), upto)
    return deleted
