"""The check of a log's segments (``FileChannel.check``): every record's CRC, in both tiers.

Damage is raised, or, with ``on_damage``, reported as :class:`DamagedRange` values while the
check goes on. Segments compressed or collected under the check are normal on a live
channel (the listing is read again, :meth:`.log.Log.relisted`); it modifies no file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import CorruptRecordError, FileChannelError, MissingSegmentError, os_errors
from .compressed import check_block
from .files import opened
from .log import CompressedBlocks, Log, SegmentRef, vanished
from .retention import segment_bytes_on_disk
from .segment import MAX_FRAME_PAYLOAD, SEGMENT_HEADER_SIZE, FrameScanner, damage_after, read_segment_header

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class DamagedRange:
    """Offsets ``first`` up to ``readable_after`` (exclusive) that cannot be read, found by
    :meth:`FileChannel.check`; ``readable_after`` is the first offset after them that can be
    read (None: none, the log ends in the damage). ``message`` names the file and byte or block."""

    first: int
    readable_after: int | None
    message: str


class _SegmentDamage(FileChannelError):
    """Inside ``check``: damage from offset ``first`` to the end of a segment (``error`` says what)."""

    def __init__(self, first: int, error: CorruptRecordError) -> None:
        super().__init__(str(error))
        self.first = first
        self.error = error


def check_log(log: Log, progress: Progress | None = None, on_damage: Callable[[DamagedRange], None] | None = None) -> int:
    """Verify the CRC of every record of ``log``, in both tiers; return how many there are.
    What is reported, raised and skipped: :meth:`filechannel.channel.FileChannel.check`, which
    calls this."""
    refs = log.list_segments()
    total = sum(_segment_bytes(r) for r in refs)
    done = count = 0
    active = refs[-1].base_offset if refs else None
    expected: int | None = None  # where the records of the segment checked before end
    i = 0
    while i < len(refs):
        ref = refs[i]
        after = refs[i + 1].base_offset if i + 1 < len(refs) else None
        try:
            n, end = _check_segment(log, ref, ref.base_offset != active, after, on_damage)
        except (OSError, FileChannelError) as exc:
            if vanished(ref, exc):
                refs, i = log.relisted(ref, exc)
                active = refs[-1].base_offset if refs else None  # a roll may have come meanwhile
                if i < len(refs) and refs[i].base_offset != ref.base_offset:
                    expected = None  # collected, with every segment before it: no hole there
                continue
            if not isinstance(exc, _SegmentDamage):
                raise
            if on_damage is None:  # the error as check raised it before it could go on
                raise exc.error from exc.error.__cause__
            on_damage(DamagedRange(exc.first, after, str(exc.error)))
            n, expected = exc.first - ref.base_offset, None  # its later offsets are unknown: no hole check
        else:
            if expected is not None and ref.base_offset != expected:
                missing = MissingSegmentError(
                    f"offsets {expected} to {ref.base_offset - 1} are missing from channel {log.path!r}: "
                    f"no segment begins at {expected}, where the one before {os.path.basename(ref.path)!r} "
                    "ends (a segment file was deleted or lost); restore it from a copy"
                )
                if on_damage is None:
                    raise missing
                on_damage(DamagedRange(expected, ref.base_offset, str(missing)))
            expected = end
        count += n
        done += _segment_bytes(ref)
        if progress is not None:
            progress(done, total)
        i += 1
    return count


def _segment_bytes(ref: SegmentRef) -> int:
    """Bytes ``check`` reads of a segment: its file, or its chunks in tier-2."""
    return ref.remote.size if ref.remote is not None else segment_bytes_on_disk(ref)


def checked_blocks(blocks: CompressedBlocks) -> Iterator[tuple[int, int, CorruptRecordError | None]]:
    """Every block of a compressed segment (local or in tier-2), read and its records checked
    (:func:`~.compressed.check_block`): yields ``(i, records, damage)``, ``records`` being how
    many decoded before any damage and ``damage`` None for a whole block. A block that does not
    decompress is damage too, and the next block is still read: the blocks are compressed
    apart. The one walk of a segment's blocks, for ``check()`` and ``tier fsck --deep``."""
    info = blocks.info
    for i, block in enumerate(info.blocks):
        where = blocks.where(i)
        try:
            data = blocks.block(i)
        except CorruptRecordError as exc:
            yield i, 0, CorruptRecordError(f"compressed segment {where!r}: block {i} (offsets from {block.first_offset}): {exc}")
            continue
        yield (i, *check_block(data, info, i, where, []))


def _check_segment(
    log: Log, ref: SegmentRef, sealed: bool, after: int | None, on_damage: Callable[[DamagedRange], None] | None
) -> tuple[int, int]:
    """Check every frame of one segment; return its number of records (readable ones, with
    ``on_damage``: a bad compressed block is reported and the next block checked) and the
    offset where its records end. Raises
    :class:`_SegmentDamage` for damage past which the segment's offsets are unknown."""
    if ref.compressed:
        try:
            blocks = log.open_compressed(ref)  # a local .seg.z, or one uploaded to tier-2
        except CorruptRecordError as exc:  # its table: no block can be found
            raise _SegmentDamage(ref.base_offset, exc) from exc
        try:
            info = blocks.info
            n = 0
            for i, got, bad in checked_blocks(blocks):
                if bad is not None:
                    if on_damage is None:
                        raise bad
                    # the blocks are compressed apart: the next one is read from its own first offset
                    following = info.blocks[i + 1].first_offset if i + 1 < len(info.blocks) else after
                    on_damage(DamagedRange(info.offset_after(i, got), following, str(bad)))
                n += got
            if info.base_offset != ref.base_offset:
                raise _SegmentDamage(
                    ref.base_offset,
                    CorruptRecordError(
                        f"compressed segment {ref.path!r} says its base offset is {info.base_offset}, not the "
                        f"{ref.base_offset} of its name; restore it from a copy"
                    ),
                )
            return n, info.end_offset
        finally:
            blocks.close()
    with opened(ref.path, os.O_RDONLY, action="open segment") as fd:
        with os_errors("stat", ref.path):
            size = os.fstat(fd).st_size
        if size < SEGMENT_HEADER_SIZE and not sealed:
            return 0, ref.base_offset  # a torn header, or a roll's new segment before its header: the tail a writer trims
        try:
            header = read_segment_header(fd, ref.path)
        except CorruptRecordError as exc:
            raise _SegmentDamage(ref.base_offset, exc) from exc
        scanner = FrameScanner(fd, ref.path, SEGMENT_HEADER_SIZE, header.base_offset, MAX_FRAME_PAYLOAD)
        scanner.scan()
        n = scanner.end_offset - header.base_offset
        if scanner.stop == "end":
            return n, scanner.end_offset
        if sealed:
            raise _SegmentDamage(scanner.end_offset, scanner.corrupt_error(header.base_offset))
        # The active segment ends in a bad or partial frame: torn, or still being written (then
        # it is whole by now), unless a valid frame follows it: damage in the middle of the log.
        found = damage_after(fd, ref.path, scanner.end_position, size)
        if found is not None:
            raise _SegmentDamage(
                scanner.end_offset,
                CorruptRecordError(
                    f"segment file {ref.path!r} has a damaged frame at byte {scanner.end_position} "
                    f"(offset {scanner.end_offset}) followed by a valid frame at byte {found}: the records "
                    f"from that offset on cannot be read; see `filechannel repair {log.path} --after OFFSET`"
                ),
            )
        return n, scanner.end_offset
