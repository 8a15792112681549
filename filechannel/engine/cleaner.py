"""The log cleaner of a compacted channel (Kafka's ``cleanup.policy=compact``): sealed segments
rewritten to keep the last record of each key.

Invariants:

- It runs under ``maintenance.lock`` and touches sealed local segments only, never the active
  one (a compacted channel has no tier-2: ``ChannelConfig`` refuses the two together).
- Offsets never move: a kept record keeps its offset, timestamp, key, headers and its frame's
  bytes (CRC included); a removed record leaves a hole. A cleaned segment is a version-2
  ``.seg.z`` (compressed.py) whose table of runs says where the holes are; its base and end
  offsets are those of the segment it replaces, so offsets stay contiguous across segments.
- A record is removed only when a record of the same key with a higher offset exists in
  the mapped section (the key map proves it), or when it is a tombstone (value None) whose
  own timestamp is older than ``delete_retention_ms``. Records without a key (sent before the
  channel was compacted; sends without a key are refused now) are kept.
- The swap is crash-safe: the cleaned segment is written to ``B.seg.z.tmp`` and fsynced, then
  renamed onto ``B.seg.z`` (an atomic replace of a compressed segment; beside a raw ``B.seg``
  the ``.seg.z`` is the one listed), the folder fsynced, and only then is a raw segment and its
  indexes deleted. A crash before the rename leaves the old segment and a ``.tmp`` that
  :func:`.compression.finish_interrupted_compressions` removes; after it, the new segment,
  whose leftover raw copy the same recovery deletes. At no point are both, or neither, listed.

A pass (Kafka's): the dirty section is the sealed segments from the first one never cleaned
(not version 2); segments are mapped in order (key digest -> last offset), whole, while their
keys fit ``cleaner_dedupe_buffer_bytes`` and their newest record is older than
``min_compaction_lag_ms``; then every segment from the first up to the last one mapped is
rewritten. Keys that do not fit wait for the next pass: several passes clean what one map
cannot hold. Every segment in a cleaned section was mapped whole once, so a tombstone
removed there no longer hides an older value of its key.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError, CorruptRecordError, os_errors
from . import failpoints, names
from .clock import now_ms
from .compressed import Z_VERSION_RUNS, CompressedInfo, check_block, write_cleaned
from .compression import remove_raw
from .files import fsync_dir, opened, unlink_if_exists
from .readahead import LocalBlocks
from .record import FRAME_HEADER, FRAME_HEADER_SIZE, Record, decode_records
from .retention import segment_max_timestamp
from .segment import SEGMENT_HEADER_SIZE, SegmentHeader, read_segment_header

if TYPE_CHECKING:
    from .log import Log, SegmentRef

logger = logging.getLogger("filechannel")

# What one key of the map costs in memory: a 16-byte digest as a bytes object (49 bytes), an int
# offset (32), and its dict slot (about 40 with the table's spare room). The map holds at most
# cleaner_dedupe_buffer_bytes / KEY_ENTRY_BYTES keys.
KEY_ENTRY_BYTES = 128
# zstd level of a cleaned segment of a channel with compression="none": a cleaned segment is
# always a .seg.z (its table is where the holes are), and level 1 costs little CPU.
UNCOMPRESSED_LEVEL = 1
RAW_CHUNK = 1024 * 1024  # bytes of a raw segment read at once


def key_digest(key: bytes) -> bytes:
    """The key map's key: 16 bytes of BLAKE2b (Kafka's map keeps an MD5 of 16 bytes): a collision,
    which would drop a live record, is as unlikely as a random 128-bit match."""
    return hashlib.blake2b(key, digest_size=16).digest()


@dataclass(frozen=True)
class CleanedSegment:
    """One segment a pass rewrote: its base offset, and records and raw bytes before and after."""

    base_offset: int
    records_before: int
    records_after: int
    bytes_before: int
    bytes_after: int


@dataclass(frozen=True)
class _Sealed:
    ref: SegmentRef
    end_offset: int  # where the next segment begins
    clean: bool  # a version-2 .seg.z: mapped whole by an earlier pass
    raw_bytes: int  # bytes of its frames


def clean(log: Log, *, force: bool = False, at_ms: int | None = None) -> list[CleanedSegment]:
    """One cleaning pass over ``log``'s sealed segments (see the module docstring); return the
    segments rewritten. Caller holds ``maintenance.lock``.

    Without ``force`` it runs only when due: the dirty bytes are at least
    ``min_cleanable_dirty_ratio`` of the sealed bytes, or a dirty segment is older than
    ``max_compaction_lag_ms`` (by its creation time, which no record of it precedes). ``force``
    (``FileChannel.compact()``) cleans whatever is dirty; ``min_compaction_lag_ms`` holds either way.
    ``at_ms``: the time the lag and tombstone rules measure from (default now).
    """
    config = log.config
    if not config.compacted:
        return []
    now = now_ms() if at_ms is None else at_ms
    sealed = _sealed_segments(log)
    first_dirty = next((i for i, s in enumerate(sealed) if not s.clean), None)
    if first_dirty is None or not (force or _due(log, sealed, first_dirty, now)):
        return []
    key_map, mapped_end = _map_keys(log, sealed, first_dirty, now)
    if mapped_end == first_dirty:
        return []
    horizon = now - config.delete_retention_ms
    done = []
    for s in sealed[:mapped_end]:
        result = _rewrite(log, s, key_map, horizon)
        if result is not None:
            done.append(result)
    if done:
        log.refresh_local()
    return done


def _sealed_segments(log: Log) -> list[_Sealed]:
    refs = log.local_segments()
    out = []
    for ref, nxt in itertools.pairwise(refs):
        if ref.compressed:
            info = log.compressed_info(ref)
            out.append(_Sealed(ref, nxt.base_offset, info.version == Z_VERSION_RUNS, info.raw_size))
        else:
            with os_errors("stat", ref.path):
                size = os.path.getsize(ref.path)
            out.append(_Sealed(ref, nxt.base_offset, False, max(0, size - SEGMENT_HEADER_SIZE)))
    return out


def _due(log: Log, sealed: list[_Sealed], first_dirty: int, now: int) -> bool:
    """Kafka's rule: dirty ratio reached, or a dirty segment waited past max_compaction_lag_ms."""
    total = sum(s.raw_bytes for s in sealed)
    dirty = sum(s.raw_bytes for s in sealed[first_dirty:])
    if total and dirty / total >= log.config.min_cleanable_dirty_ratio:
        return True
    lag = log.config.max_compaction_lag_ms
    return lag is not None and any(_created_ms(log, s) <= now - lag for s in sealed[first_dirty:] if not s.clean)


def _created_ms(log: Log, s: _Sealed) -> int:
    if s.ref.compressed:
        return log.compressed_info(s.ref).created_ms
    with opened(s.ref.path, os.O_RDONLY, action="open segment") as fd:
        return read_segment_header(fd, s.ref.path).created_ms


def _map_keys(log: Log, sealed: list[_Sealed], first_dirty: int, now: int) -> tuple[dict[bytes, int], int]:
    """The key map of the dirty section, whole segments while they fit and are old enough; and
    the index of the first segment not mapped."""
    capacity = log.config.cleaner_dedupe_buffer_bytes // KEY_ENTRY_BYTES
    key_map: dict[bytes, int] = {}
    end = first_dirty
    for j in range(first_dirty, len(sealed)):
        s = sealed[j]
        if segment_max_timestamp(log, s.ref, s.end_offset) > now - log.config.min_compaction_lag_ms:
            break  # too young, and so is every later one (Kafka stops there too)
        latest = {key_digest(r.key): r.offset for r, _frame in segment_records(log, s.ref) if r.key is not None}
        if len(key_map) + sum(1 for k in latest if k not in key_map) > capacity:
            if j == first_dirty:
                raise ConfigError(
                    f"channel {log.path!r}: segment {os.path.basename(s.ref.path)!r} has {len(latest)} keys, more than "
                    f"the cleaner's key map holds ({capacity} keys in cleaner_dedupe_buffer_bytes="
                    f"{log.config.cleaner_dedupe_buffer_bytes}); raise cleaner_dedupe_buffer_bytes or lower segment_bytes"
                )
            break  # the next pass maps it
        key_map.update(latest)
        end = j + 1
    return key_map, end


def segment_records(log: Log, ref: SegmentRef) -> Iterator[tuple[Record, memoryview]]:
    """Every record of a sealed segment with its frame's bytes, oldest first, every CRC checked.
    Raises :class:`CorruptRecordError` for a damaged segment (the cleaner then leaves it be)."""
    if not ref.compressed:
        yield from _raw_records(ref)
        return
    blocks = LocalBlocks(ref.path)
    try:
        info = blocks.info
        for i in range(len(info.blocks)):
            data = memoryview(blocks.block(i))
            out: list[Record] = []
            _got, bad = check_block(data, info, i, ref.path, out)
            if bad is not None:
                raise bad
            yield from _with_frames(data, 0, out)
    finally:
        blocks.close()


def _raw_records(ref: SegmentRef) -> Iterator[tuple[Record, memoryview]]:
    """A sealed raw segment's records, read ``RAW_CHUNK`` bytes of whole frames at a time (a
    longer frame whole), so that memory holds a chunk, not the segment."""
    with opened(ref.path, os.O_RDONLY, action="open segment") as fd:
        header = read_segment_header(fd, ref.path)
        with os_errors("read", ref.path):
            size = os.fstat(fd).st_size
        position, offset = SEGMENT_HEADER_SIZE, header.base_offset
        while position < size:
            with os_errors("read", ref.path):
                head = os.pread(fd, FRAME_HEADER_SIZE, position)
                want = FRAME_HEADER_SIZE + FRAME_HEADER.unpack(head)[0] if len(head) == FRAME_HEADER_SIZE else 0
                data = memoryview(os.pread(fd, min(size - position, max(RAW_CHUNK, want)), position))
            out: list[Record] = []
            end, n = decode_records(data, 0, offset, len(data), out)
            if n == 0:
                raise CorruptRecordError(
                    f"segment {ref.path!r} ends in a partial or damaged frame at byte {position}; not cleaned"
                )
            yield from _with_frames(data, 0, out)
            position, offset = position + end, offset + n


def _with_frames(data: memoryview, position: int, records: list[Record]) -> Iterator[tuple[Record, memoryview]]:
    """Pair decoded ``records`` with their frames, back to back in ``data`` from ``position``."""
    for record in records:
        length = FRAME_HEADER_SIZE + FRAME_HEADER.unpack_from(data, position)[0]
        yield record, data[position : position + length]
        position += length


def _rewrite(log: Log, s: _Sealed, key_map: dict[bytes, int], horizon: int) -> CleanedSegment | None:
    """Rewrite one segment keeping what the rules keep and swap it in; None if it was left as it
    was (a clean segment losing nothing, or a damaged one: logged, not cleaned)."""
    ref = s.ref
    counts = [0, 0]  # records read, records kept

    def kept() -> Iterator[tuple[int, int, memoryview]]:
        """The kept records streamed into the writer: memory holds a block, not the segment."""
        for record, frame in segment_records(log, ref):
            counts[0] += 1
            if _keeps(record, key_map, horizon):
                counts[1] += 1
                yield record.offset, record.timestamp, frame

    target = log.compressed_path(ref.base_offset)
    tmp = target + names.TEMP_SUFFIX
    config = log.config
    level = config.compression_level if config.compression == "zstd" else UNCOMPRESSED_LEVEL
    try:
        origin: CompressedInfo | SegmentHeader
        if ref.compressed:
            origin = log.compressed_info(ref)
        else:
            with opened(ref.path, os.O_RDONLY, action="open segment") as fd:
                origin = read_segment_header(fd, ref.path)
        info = write_cleaned(tmp, origin, s.end_offset, kept(), level=level, block_bytes=config.compression_block_bytes)
    except CorruptRecordError as exc:
        unlink_if_exists(tmp)
        logger.error("channel %s: not cleaning %s: %s", log.path, ref.path, exc)
        return None
    except BaseException:
        unlink_if_exists(tmp)
        raise
    total = counts[0]
    if s.clean and counts[1] == total:  # nothing to remove: the segment stays as it is
        unlink_if_exists(tmp)
        return None
    failpoints.hit("cleaner-written")
    with os_errors("rename", tmp):
        os.rename(tmp, target)  # atomic: the old .seg.z or the new one, never neither
    fsync_dir(log.path)
    failpoints.hit("cleaner-renamed")
    if not ref.compressed:
        remove_raw(log, ref.base_offset)
    return CleanedSegment(ref.base_offset, total, counts[1], s.raw_bytes, info.raw_size)


def _keeps(record: Record, key_map: dict[bytes, int], horizon: int) -> bool:
    if record.key is None:
        return True
    latest = key_map.get(key_digest(record.key))
    if latest is not None and latest > record.offset:
        return False  # superseded by a later record of its key
    return record.value is not None or record.timestamp >= horizon
