"""Compression of sealed segments into the ``.seg.z`` block form (:mod:`.compressed` is that
format and its reader; this module is the maintenance that makes them), and the roll-forward
or roll-back of a compression a dead process left behind. Not Kafka's log compaction, which
keeps the newest record of each key: that is cleaner.py, whose swaps the same recovery
finishes or rolls back (a cleaned segment is a ``.seg.z`` written the same way).

Invariants: it runs under ``maintenance.lock`` and touches sealed segments only. A
``.seg.z`` is written to a temporary name, fsynced, renamed, and only then is the raw
segment removed: at every moment one whole copy of each segment exists, and
:func:`finish_interrupted_compressions` tells a whole ``.seg.z`` from a torn one by its
block table and length alone.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from ..errors import (
    CorruptRecordError,
    StorageError,
    file_vanished,
    os_errors,
)
from . import names
from .compressed import compress_segment, read_table
from .files import fsync_dir, opened, unlink_if_exists
from .segment import (
    MAX_FRAME_PAYLOAD,
)

if TYPE_CHECKING:
    from .log import Log

logger = logging.getLogger("filechannel")


def finish_interrupted_compressions(log: Log) -> None:
    """Roll back or finish compressions a dead process left behind."""
    with os_errors("list", log.path):
        files = os.listdir(log.path)
    for f in files:
        if f.endswith(names.COMPRESSED_SUFFIX + names.TEMP_SUFFIX):
            logger.warning("channel %s: removing %s left by an interrupted compression", log.path, f)
            unlink_if_exists(os.path.join(log.path, f))
    for ref in log.local_segments():
        raw = log.segment_path(ref.base_offset)
        if ref.compressed and os.path.exists(raw):
            if _valid_compressed(ref.path):
                logger.warning("channel %s: finishing the interrupted compression of %s", log.path, raw)
                remove_raw(log, ref.base_offset)
            else:
                logger.warning("channel %s: rolling back the interrupted compression of %s", log.path, raw)
                unlink_if_exists(ref.path)
    log.refresh_local()


def compress_sealed(log: Log) -> list[int]:
    """Compress every sealed raw segment; return their base offsets. Caller holds maintenance.lock."""
    if log.config.compression == "none":
        return []
    done = []
    refs = log.local_segments()
    for ref in refs[:-1]:
        if ref.compressed:
            continue
        out = ref.path + ".z" + names.TEMP_SUFFIX
        try:
            compress_segment(
                ref.path,
                out,
                level=log.config.compression_level,
                block_bytes=log.config.compression_block_bytes,
                max_payload=MAX_FRAME_PAYLOAD,
            )
        except StorageError as exc:  # os_errors wraps the ENOENT of a segment collected meanwhile
            unlink_if_exists(out)
            if file_vanished(exc):
                continue
            raise
        except CorruptRecordError as exc:
            unlink_if_exists(out)
            logger.error("channel %s: not compressing %s: %s", log.path, ref.path, exc)
            continue
        if not os.path.exists(ref.path):  # collected while we compressed
            unlink_if_exists(out)
            continue
        with os_errors("rename", out):
            os.rename(out, log.compressed_path(ref.base_offset))
        fsync_dir(log.path)
        remove_raw(log, ref.base_offset)
        done.append(ref.base_offset)
    if done:
        log.refresh_local()
    return done


def remove_raw(log: Log, base_offset: int) -> None:
    """Delete a raw segment and its indexes once its ``.seg.z`` (compressed or cleaned) is in place."""
    for suffix in (names.SEGMENT_SUFFIX, names.OFFSET_INDEX_SUFFIX, names.TIME_INDEX_SUFFIX):
        unlink_if_exists(log.file(base_offset, suffix))
    fsync_dir(log.path)


def _valid_compressed(path: str) -> bool:
    """Whether a ``.seg.z`` file is whole: its table checks out and its last block is all there."""
    try:
        with opened(path, os.O_RDONLY) as fd:
            size = os.fstat(fd).st_size
            info = read_table(lambda position, length: os.pread(fd, length, position), size, path)
    except (OSError, CorruptRecordError):
        return False
    return size == info.blocks_end
