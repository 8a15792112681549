"""A sealed segment compressed into independently decompressible blocks (``B.seg.z``).

Layout (little-endian), chosen so that a reader needs two ranged reads to reach any
offset: the fixed header, then the block table, then the one block it wants::

    offset 0   4s   magic b"FCHZ"
           4   u16  format version (1: dense offsets; 2: runs, see below)
           6   u8   method (1 = zstd)
           7   u8   reserved (0)
           8   u32  segment id
          12   u32  block count N
          16   u64  base offset
          24   u64  end offset (one past the last record)
          32   i64  created, ms since the epoch (from the raw segment's header)
          40   i64  max timestamp of any record in the segment
          48   u64  raw size: bytes of frames in the raw segment, header excluded
          56   N x [u64 first offset][i64 max timestamp through this block]
                   [u64 raw position][u64 file position][u32 raw length][u32 compressed length]
               u32  CRC-32C of everything above (header and table)
               the blocks: each one zstd frame of whole frames

A raw position counts from the first frame (raw segment position minus 32). Each block
holds whole frames exactly as they were in the raw segment, so the same frame decoder
reads both, and every record keeps its own CRC-32C. Blocks are written without zstd's
own checksum (an XXH64 of the block): readers check every frame's CRC-32C anyway, and
the second check cost a measurable share of decompression time (DESIGN.md,
"Compressed segment"). Blocks with the checksum (written before) still read, and zstd
still checks it.

Version 2 is a segment the cleaner rewrote (cleaner.py): its offsets have holes. After the
header (version 2) come a u32 run count R, the N block entries as above, then R run entries
``[u64 first offset][u64 raw position][u32 count]``: a run is ``count`` frames of offsets
``first..first+count-1`` back to back from that raw position. Runs lie inside one block, and
every block starts with a run (a block entry's first offset is its first run's). A reader
bisects the runs and hands each run to the same dense decoder as version 1; a version-1
file has one run per block, derived from the blocks (:attr:`CompressedInfo.runs`), so every
reader works on runs alike. The header's end offset stays one past the segment's last
offset before cleaning, where the next segment begins; the runs may end before it, and a
cleaned segment may have no run at all.

python-zstandard is imported where it is first used, not with this module: most processes
that import the engine never compress or decompress (a producer, most commands), and each
of the suite's thousand-odd processes paid for the import.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from ..errors import ChannelClosedError, CorruptRecordError, os_errors
from .checksum import crc32c
from .columns import RecordColumns
from .files import opened
from .record import Record, decode_records
from .segment import SEGMENT_HEADER_SIZE, FrameScanner, SegmentHeader, read_segment_header

if TYPE_CHECKING:
    import zstandard

Z_MAGIC = b"FCHZ"
Z_VERSION = 1  # dense offsets: a block's records run up to the next block's first offset
Z_VERSION_RUNS = 2  # a cleaned segment: offsets with holes, a table of runs
METHOD_ZSTD = 1
Z_HEADER = struct.Struct("<4sHBBIIQQqqQ")
Z_BLOCK = struct.Struct("<QqQQII")
Z_RUN_COUNT = struct.Struct("<I")
Z_RUN = struct.Struct("<QQI")
_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class Block:
    first_offset: int
    max_timestamp: int
    raw_position: int
    file_position: int
    raw_length: int
    compressed_length: int


@dataclass(frozen=True)
class Run:
    """``count`` records of offsets ``first_offset`` onward, frames back to back from ``raw_position``."""

    first_offset: int
    raw_position: int
    count: int

    @property
    def end_offset(self) -> int:
        return self.first_offset + self.count


@dataclass(frozen=True)
class CompressedInfo:
    """What the header and block table of a ``.seg.z`` file say.

    ``stored_runs`` is a version-2 file's run table (empty for version 1); :attr:`runs` is
    the runs of either version, which every reader uses (see the module docstring).
    """

    segment_id: int
    base_offset: int
    end_offset: int
    created_ms: int
    max_timestamp: int
    raw_size: int
    blocks: tuple[Block, ...]
    version: int = Z_VERSION
    stored_runs: tuple[Run, ...] = ()

    @property
    def table_size(self) -> int:
        if self.version == Z_VERSION:
            return Z_HEADER.size + Z_BLOCK.size * len(self.blocks) + _CRC.size
        return Z_HEADER.size + Z_RUN_COUNT.size + Z_BLOCK.size * len(self.blocks) + Z_RUN.size * len(self.stored_runs) + _CRC.size

    @cached_property
    def runs(self) -> tuple[Run, ...]:
        """The dense runs of offsets, oldest first: version 2's table, or one per block of version 1."""
        if self.version != Z_VERSION:
            return self.stored_runs
        ends = [b.first_offset for b in self.blocks[1:]] + [self.end_offset]
        return tuple(Run(b.first_offset, b.raw_position, end - b.first_offset) for b, end in zip(self.blocks, ends, strict=True))

    @cached_property
    def _run_firsts(self) -> list[int]:
        return [r.first_offset for r in self.runs]

    @cached_property
    def _run_positions(self) -> list[int]:
        return [r.raw_position for r in self.runs]

    def start_for(self, offset: int) -> tuple[int, int]:
        """Where a read of ``offset`` (in this segment) starts: the first offset and raw position
        of the run that holds it, or of the next run if it is in a hole (removed by the cleaner),
        or ``(end_offset, raw_size)`` if no record at or after it is left here."""
        i = bisect.bisect_right(self._run_firsts, offset) - 1
        if i < 0 or offset >= self.runs[i].end_offset:
            i += 1
        if i >= len(self.runs):
            return self.end_offset, self.raw_size
        return self.runs[i].first_offset, self.runs[i].raw_position

    def offset_at(self, raw_position: int, offset: int) -> int:
        """The offset of the frame at ``raw_position``, for a reader whose last frame ended there
        with the next offset ``offset``: a run's first offset where a run starts (past a hole),
        the end offset at the end of the segment, else ``offset`` (the run goes on)."""
        if raw_position >= self.raw_size:
            return self.end_offset
        i = bisect.bisect_left(self._run_positions, raw_position)
        return self.runs[i].first_offset if i < len(self.runs) and self.runs[i].raw_position == raw_position else offset

    def run_end(self, raw_position: int) -> int:
        """The raw position where the run holding ``raw_position`` ends (a dense decode stops there)."""
        i = bisect.bisect_right(self._run_positions, raw_position)
        return self.runs[i].raw_position if i < len(self.runs) else self.raw_size

    def runs_in_block(self, i: int) -> range:
        """Indexes of the runs inside block ``i``."""
        b = self.blocks[i]
        lo = bisect.bisect_left(self._run_positions, b.raw_position)
        return range(lo, bisect.bisect_left(self._run_positions, b.raw_position + b.raw_length))

    def offset_after(self, i: int, records: int) -> int:
        """The offset of record number ``records`` (from 0) of block ``i``: where a damaged block's
        unreadable offsets start after the ``records`` that decoded."""
        for r in self.runs_in_block(i):
            run = self.runs[r]
            if records < run.count:
                return run.first_offset + records
            records -= run.count
        following = self.blocks[i + 1].first_offset if i + 1 < len(self.blocks) else self.end_offset
        return following

    @property
    def blocks_end(self) -> int:
        """The byte where the last block ends: the size of a whole ``.seg.z`` file."""
        last = self.blocks[-1] if self.blocks else None
        return last.file_position + last.compressed_length if last is not None else self.table_size

    @cached_property
    def _raw_positions(self) -> list[int]:
        return [b.raw_position for b in self.blocks]

    @cached_property
    def _max_timestamps(self) -> list[int]:
        return [b.max_timestamp for b in self.blocks]

    def block_for_raw_position(self, raw_position: int) -> int:
        return max(0, bisect.bisect_right(self._raw_positions, raw_position) - 1)

    def block_for_time(self, timestamp: int) -> int | None:
        """Index of the first block with a record at or after ``timestamp``; None if there is none."""
        i = bisect.bisect_left(self._max_timestamps, timestamp)
        return i if i < len(self.blocks) else None


def compress_segment(raw_path: str, out_path: str, *, level: int, block_bytes: int, max_payload: int) -> CompressedInfo:
    """Compress the sealed raw segment at ``raw_path`` into ``out_path`` and fsync it.

    Every frame's CRC is checked on the way; a corrupt segment raises
    :class:`CorruptRecordError` and nothing is written to ``out_path``.
    """
    with opened(raw_path, os.O_RDONLY, action="open segment") as fd:
        header = read_segment_header(fd, raw_path)
        scanner = FrameScanner(fd, raw_path, SEGMENT_HEADER_SIZE, header.base_offset, max_payload)
        # Blocks start where marks every block_bytes fall; a block's max timestamp is that
        # of all records up to the next block's start (the mark's "max before").
        marks, _since, max_ts = scanner.scan(block_bytes)
        if scanner.stop != "end":
            raise scanner.corrupt_error(header.base_offset)
        end_pos, end_offset = scanner.end_position, scanner.end_offset
        starts = [(header.base_offset, SEGMENT_HEADER_SIZE)] + [(off, pos) for off, pos, _ts in marks]
        maxes = [before for _off, _pos, before in marks] + [max_ts]
        # (first offset, raw position, max ts through the block); none for an empty segment
        cuts = [(*start, mx) for start, mx in zip(starts, maxes, strict=True)] if end_pos > SEGMENT_HEADER_SIZE else []
        import zstandard  # on first use (the module docstring)

        compressor = zstandard.ZstdCompressor(level=level, write_checksum=False)
        bodies: list[bytes] = []
        lengths: list[int] = []
        for i, (_first, start, _ts) in enumerate(cuts):
            stop = cuts[i + 1][1] if i + 1 < len(cuts) else end_pos
            with os_errors("read", raw_path):
                raw = os.pread(fd, stop - start, start)
            bodies.append(compressor.compress(raw))
            lengths.append(stop - start)
    table_size = Z_HEADER.size + Z_BLOCK.size * len(cuts) + _CRC.size
    blocks = []
    file_pos = table_size
    for (first, start, ts), body, raw_len in zip(cuts, bodies, lengths, strict=False):
        blocks.append(Block(first, ts, start - SEGMENT_HEADER_SIZE, file_pos, raw_len, len(body)))
        file_pos += len(body)
    info = CompressedInfo(
        header.segment_id,
        header.base_offset,
        end_offset,
        header.created_ms,
        max_ts,
        end_pos - SEGMENT_HEADER_SIZE,
        tuple(blocks),
    )
    head = _encode_table(info)
    with os_errors("write compressed segment", out_path), open(out_path, "wb") as f:
        f.write(head)
        for body in bodies:
            f.write(body)
        f.flush()
        os.fsync(f.fileno())
    return info


def write_cleaned(
    out_path: str,
    origin: CompressedInfo | SegmentHeader,
    end_offset: int,
    frames: Iterable[tuple[int, int, bytes | memoryview]],
    *,
    level: int,
    block_bytes: int,
) -> CompressedInfo:
    """Write a cleaned segment (version 2) to ``out_path`` and fsync it: ``frames`` are the kept
    ``(offset, timestamp, frame bytes)``, offsets increasing, each frame exactly as it was (its
    CRC with it). ``origin`` is the segment it replaces (its id, base offset and creation time
    are kept), ``end_offset`` where that segment's offsets end.

    A block is cut once it holds ``block_bytes`` raw bytes; a run ends at a hole or a block's
    end, so runs lie inside one block (the module docstring)."""
    import zstandard  # on first use (the module docstring)

    compressor = zstandard.ZstdCompressor(level=level, write_checksum=False)
    blocks: list[Block] = []
    runs: list[Run] = []
    bodies: list[bytes] = []
    pending: list[bytes | memoryview] = []
    block_raw = raw_pos = file_pos = 0
    max_ts = run_max = -(2**63)
    block_first = next_offset = -1

    def cut() -> None:
        nonlocal block_raw, file_pos
        body = compressor.compress(b"".join(pending))
        blocks.append(Block(block_first, run_max, raw_pos - block_raw, file_pos, block_raw, len(body)))
        bodies.append(body)
        file_pos += len(body)
        pending.clear()
        block_raw = 0

    for offset, timestamp, frame in frames:
        if block_raw >= block_bytes:
            cut()
        if not pending:
            block_first = offset
        if not pending or offset != next_offset:
            runs.append(Run(offset, raw_pos, 0))
        runs[-1] = Run(runs[-1].first_offset, runs[-1].raw_position, runs[-1].count + 1)
        pending.append(frame)
        block_raw += len(frame)
        raw_pos += len(frame)
        next_offset = offset + 1
        max_ts = max(max_ts, timestamp)
        run_max = max_ts  # a block's max timestamp is that of every record through it (as version 1)
    if pending:
        cut()
    draft = CompressedInfo(
        origin.segment_id,
        origin.base_offset,
        end_offset,
        origin.created_ms,
        max_ts if runs else -(2**63),
        raw_pos,
        (),
        Z_VERSION_RUNS,
        tuple(runs),
    )
    shift = Z_HEADER.size + Z_RUN_COUNT.size + Z_BLOCK.size * len(blocks) + Z_RUN.size * len(runs) + _CRC.size
    placed = tuple(
        Block(b.first_offset, b.max_timestamp, b.raw_position, b.file_position + shift, b.raw_length, b.compressed_length)
        for b in blocks
    )
    info = dataclasses.replace(draft, blocks=placed)
    with os_errors("write cleaned segment", out_path), open(out_path, "wb") as f:
        f.write(_encode_table(info))
        for body in bodies:
            f.write(body)
        f.flush()
        os.fsync(f.fileno())
    return info


def _encode_table(info: CompressedInfo) -> bytes:
    parts = [
        Z_HEADER.pack(
            Z_MAGIC,
            info.version,
            METHOD_ZSTD,
            0,
            info.segment_id,
            len(info.blocks),
            info.base_offset,
            info.end_offset,
            info.created_ms,
            info.max_timestamp,
            info.raw_size,
        )
    ]
    if info.version != Z_VERSION:
        parts.append(Z_RUN_COUNT.pack(len(info.stored_runs)))
    parts.extend(
        Z_BLOCK.pack(b.first_offset, b.max_timestamp, b.raw_position, b.file_position, b.raw_length, b.compressed_length)
        for b in info.blocks
    )
    parts.extend(Z_RUN.pack(r.first_offset, r.raw_position, r.count) for r in info.stored_runs)
    body = b"".join(parts)
    return body + _CRC.pack(crc32c(body))


def decode_table(data: bytes, path: str) -> CompressedInfo:
    """Parse the header and block table from the first bytes of a ``.seg.z`` file.

    ``data`` must hold at least the header; raises :class:`CorruptRecordError` if the
    magic, version or table CRC is wrong, if ``data`` is too short for the table, or if
    the table is not one a writer makes: blocks back to back after the table, raw
    positions back to back up to the raw size, first offsets increasing from the base
    offset and below the end offset. (A block past the end of a truncated file is found
    when it is read, so the blocks before it stay readable.)
    """
    if len(data) < Z_HEADER.size:
        raise CorruptRecordError(f"compressed segment {path!r} is shorter than its header")
    magic, version, method, _r, seg_id, count, base, end, created, max_ts, raw_size = Z_HEADER.unpack_from(data, 0)
    if magic != Z_MAGIC or version not in (Z_VERSION, Z_VERSION_RUNS) or method != METHOD_ZSTD:
        raise CorruptRecordError(f"compressed segment {path!r} has a bad magic, version or method")
    length = table_length(data)
    if len(data) < length:
        raise CorruptRecordError(f"compressed segment {path!r} is shorter than its block table ({count} blocks)")
    table_end = length - _CRC.size
    (crc,) = _CRC.unpack_from(data, table_end)
    if crc32c(memoryview(data)[:table_end]) != crc:
        raise CorruptRecordError(f"compressed segment {path!r}: the CRC-32C of its header and block table does not match")
    at = Z_HEADER.size if version == Z_VERSION else Z_HEADER.size + Z_RUN_COUNT.size
    blocks = tuple(Block(*Z_BLOCK.unpack_from(data, at + i * Z_BLOCK.size)) for i in range(count))
    at += Z_BLOCK.size * count
    runs = tuple(Run(*Z_RUN.unpack_from(data, at + i * Z_RUN.size)) for i in range((table_end - at) // Z_RUN.size))
    info = CompressedInfo(seg_id, base, end, created, max_ts, raw_size, blocks, version, runs)
    _check_table(info, path)
    return info


def _check_table(info: CompressedInfo, path: str) -> None:
    """Raise :class:`CorruptRecordError` unless the table is consistent (see :func:`decode_table`)."""
    file_pos, raw_pos, first = info.table_size, 0, info.base_offset
    bad = None
    if info.end_offset < info.base_offset:
        bad = f"its end offset {info.end_offset} is below its base offset {info.base_offset}"
    for i, b in enumerate(info.blocks):
        if bad is not None:
            break
        if b.file_position != file_pos or b.compressed_length < 1:
            bad = f"block {i} ({b.compressed_length} bytes at byte {b.file_position}) is not where the file's blocks go"
        elif b.raw_position != raw_pos or b.raw_length < 1 or raw_pos + b.raw_length > info.raw_size:
            bad = f"block {i} ({b.raw_length} raw bytes at raw byte {b.raw_position}) does not fit its raw size {info.raw_size}"
        elif not first <= b.first_offset < info.end_offset or (
            i == 0 and info.version == Z_VERSION and b.first_offset != info.base_offset
        ):
            bad = f"block {i} starts at offset {b.first_offset}, out of order or outside {info.base_offset}-{info.end_offset}"
        file_pos += b.compressed_length
        raw_pos += b.raw_length
        first = b.first_offset + 1
    if bad is None and raw_pos != info.raw_size:
        bad = f"its blocks hold {raw_pos} raw bytes, not the {info.raw_size} its header says"
    if bad is None and not info.blocks and info.end_offset != info.base_offset and info.version == Z_VERSION:
        bad = f"it has no block but offsets {info.base_offset} to {info.end_offset}"
    if bad is None and info.version != Z_VERSION:
        bad = _bad_runs(info)
    if bad is not None:
        raise CorruptRecordError(f"compressed segment {path!r} is corrupt: {bad}; restore it from a copy")


def _bad_runs(info: CompressedInfo) -> str | None:
    """What is wrong with a version-2 run table, or None: runs at increasing raw positions from
    0, each inside one block, offsets increasing within base and end, each block starting with a run."""
    prev_end, prev_pos = info.base_offset, -1
    block_ends = [b.raw_position + b.raw_length for b in info.blocks]
    for j, r in enumerate(info.runs):
        if r.count < 1 or r.first_offset < prev_end or r.end_offset > info.end_offset:
            return (
                f"run {j} (offsets {r.first_offset} +{r.count}) is out of order or outside {info.base_offset}-{info.end_offset}"
            )
        if r.raw_position <= prev_pos or (j == 0 and r.raw_position != 0) or r.raw_position >= info.raw_size:
            return f"run {j} starts at raw byte {r.raw_position}, not after the run before it inside {info.raw_size} raw bytes"
        k = bisect.bisect_right(block_ends, r.raw_position)
        stop = info.runs[j + 1].raw_position if j + 1 < len(info.runs) else info.raw_size
        if k >= len(block_ends) or stop > block_ends[k]:
            return f"run {j} (raw bytes {r.raw_position} to {stop}) crosses the end of its block"
        prev_end, prev_pos = r.end_offset, r.raw_position
    starts = {r.raw_position: r.first_offset for r in info.runs}
    for i, b in enumerate(info.blocks):
        if starts.get(b.raw_position) != b.first_offset:
            return f"block {i} does not start with a run of its first offset {b.first_offset}"
    return None


def table_length(header: bytes) -> int:
    """From the first bytes of a ``.seg.z`` (``Z_HEADER.size``, and for version 2 the run
    count after it), how many bytes the header and table span."""
    version: int = Z_HEADER.unpack_from(header, 0)[1]
    count: int = Z_HEADER.unpack_from(header, 0)[5]
    if version != Z_VERSION_RUNS:
        return Z_HEADER.size + Z_BLOCK.size * count + _CRC.size
    if len(header) < Z_HEADER.size + Z_RUN_COUNT.size:
        return Z_HEADER.size + Z_RUN_COUNT.size + _CRC.size  # too short to say: at least this much
    runs: int = Z_RUN_COUNT.unpack_from(header, Z_HEADER.size)[0]
    return Z_HEADER.size + Z_RUN_COUNT.size + Z_BLOCK.size * count + Z_RUN.size * runs + _CRC.size


# A first read that holds the header and, usually, the whole table (256 blocks of a 64 MiB
# segment take 11 KiB), so that most tables take one read, local or remote.
TABLE_FIRST_READ = 64 * 1024


def read_table(read_at: Callable[[int, int], bytes], size: int, where: str, first_read: int = TABLE_FIRST_READ) -> CompressedInfo:
    """The header and block table of a compressed segment of ``size`` bytes, read through
    ``read_at(position, length)`` and checked by :func:`decode_table`.

    The one reader of a table, for a local file (a ``pread``) and an uploaded segment (its
    ranged reads) alike. The first read asks for ``first_read`` bytes (a remote reader keeps
    it within one object); the table's length, from the header's block count, is checked
    against ``size`` before it sizes a second read, so a damaged count never allocates what
    the segment cannot hold. ``where`` names the file or objects in errors.
    """
    head = read_at(0, min(size, max(first_read, Z_HEADER.size)))
    if len(head) < Z_HEADER.size:
        raise CorruptRecordError(f"compressed segment {where!r} ({size} bytes) is shorter than its header")
    length = table_length(head)
    if length > size:
        raise CorruptRecordError(
            f"compressed segment {where!r}: its header's block count needs a {length}-byte table "
            f"but it has {size} bytes; restore it from a copy"
        )
    return decode_table(head if length <= len(head) else read_at(0, length), where)


# A decompressed block: bytes from python-zstandard, a memoryview of a readahead job.
BlockData = bytes | memoryview

_local = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor: one may not be shared by threads, and making one per
    block would allocate zstd's context (over 100 KiB) each time."""
    dctx = getattr(_local, "dctx", None)
    if dctx is None:
        import zstandard  # on first use (the module docstring)

        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


class CompressedSegment:
    """Random access to a ``.seg.z`` file through an open descriptor.

    ``read_block`` is safe on any thread (each has its own decompressor), and against a
    concurrent ``close`` (it then raises :class:`ChannelClosedError`; ``close`` is
    idempotent and never closes the descriptor twice). Readahead jobs read through ``fd``
    too, so close a segment only after its ``BlockReadahead``.
    """

    def __init__(self, fd: int, path: str, info: CompressedInfo, size: int) -> None:
        self.fd = fd
        self.path = path
        self.info = info
        self.size = size  # a .seg.z never changes once renamed into place
        self._lock = threading.Lock()  # read_block's pread against close

    @classmethod
    def open(cls, path: str) -> CompressedSegment:
        """Open ``path`` and read its table, checked against the file's size before any
        count or length from it sizes a read."""
        with os_errors("open compressed segment", path):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with os_errors("read", path):
                size = os.fstat(fd).st_size
                info = read_table(lambda position, length: os.pread(fd, length, position), size, path)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path, info, size)

    def fits(self, i: int) -> bool:
        """Whether block ``i`` lies inside the file (not past the end of a truncated one):
        checked before its compressed length sizes a read."""
        b = self.info.blocks[i]
        return b.file_position + b.compressed_length <= self.size

    @staticmethod
    def cut_short() -> BlockData:
        """The fetch of a block that does not fit in the file (see :meth:`block_result`)."""
        raise ValueError("the file ends inside the block")

    def read_block(self, i: int) -> BlockData:
        """Decompress block ``i`` on this thread: whole frames, exactly as in the raw segment."""
        b = self.info.blocks[i]

        def fetch() -> bytes:
            if not self.fits(i):
                self.cut_short()
            with self._lock:
                if self.fd < 0:
                    raise ChannelClosedError(f"compressed segment {self.path!r} was closed by another thread")
                body = os.pread(self.fd, b.compressed_length, b.file_position)
            return decompress_block(body, b)

        return self.block_result(i, fetch)

    def block_result(self, i: int, fetch: Callable[[], BlockData]) -> BlockData:
        """Block ``i`` from ``fetch`` (see :func:`block_result`)."""
        return block_result(self.path, self.info, i, fetch)

    def close(self) -> None:
        with self._lock:
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def decompress_block(body: bytes, block: Block) -> bytes:
    """Decompress one block's bytes on this thread; ValueError if they do not decompress.

    Shared by local and remote segments (python-zstandard releases the GIL meanwhile)."""
    import zstandard  # (once imported, a lookup in sys.modules: per block, not per record)

    try:
        return _decompressor().decompress(body, max_output_size=block.raw_length)
    except zstandard.ZstdError as exc:
        raise ValueError(str(exc)) from exc


def block_result(path: str, info: CompressedInfo, i: int, fetch: Callable[[], BlockData]) -> BlockData:
    """Block ``i`` from ``fetch``, which raises OSError for a failed read and ValueError
    for a block that does not decompress; errors become ours, naming ``path`` and the block.

    The one check of a decompressed block, for local files and tier-2 chunks alike: ``path``
    names where the block's bytes came from (a file, or the tier-2 objects and bytes)."""
    b = info.blocks[i]
    try:
        with os_errors("read", path):
            raw = fetch()
    except ValueError as exc:
        raise CorruptRecordError(
            f"compressed segment {path!r}: block {i} (offsets from {b.first_offset}) does not decompress: {exc}"
        ) from exc
    if len(raw) != b.raw_length:
        raise CorruptRecordError(
            f"compressed segment {path!r}: block {i} decompressed to {len(raw)} bytes, expected {b.raw_length}"
        )
    return raw


def header_of(info: CompressedInfo) -> SegmentHeader:
    return SegmentHeader(info.segment_id, info.base_offset, info.created_ms)


def check_block(
    data: BlockData,
    info: CompressedInfo,
    i: int,
    where: str,
    out: list[Record] | RecordColumns,
    decode: Callable[..., tuple[int, int]] = decode_records,
) -> tuple[int, CorruptRecordError | None]:
    """Decode block ``i``'s records (its decompressed ``data``) into ``out`` and check them: every
    frame's CRC, and that each run of the block (one for a version-1 block) holds exactly its
    offsets, whole frames ending where the next run (or the block) starts.

    Returns how many records decoded before any damage, and the damage (None if the block is
    whole). The one check of a block's records, for ``check()``, ``tier fsck --deep`` and
    readers: ``decode`` is :func:`~.record.decode_records` for records in a list, or
    :func:`~.columns.decode_columns` for :class:`~.columns.RecordColumns`.
    """
    block = info.blocks[i]
    view = memoryview(data)
    before = len(out)
    got = 0
    for r in info.runs_in_block(i):
        run = info.runs[r]
        start = run.raw_position - block.raw_position
        stop = min(info.run_end(run.raw_position), block.raw_position + block.raw_length) - block.raw_position
        try:
            end, n = decode(view[:stop], start, run.first_offset, stop, out)
        except CorruptRecordError as exc:
            return len(out) - before, CorruptRecordError(
                f"compressed segment {where!r}: block {i} (offsets from {block.first_offset}): {exc}"
            )
        got += n
        if end != stop:
            return got, CorruptRecordError(
                f"compressed segment {where!r}: block {i} ends in a partial frame at offset {run.first_offset + n}"
            )
        if n != run.count:
            return got, CorruptRecordError(
                f"compressed segment {where!r}: block {i} holds offsets {run.first_offset} to "
                f"{run.first_offset + n - 1}, but its table says {run.first_offset} to {run.end_offset - 1}"
            )
    if got == 0:
        return got, CorruptRecordError(f"compressed segment {where!r}: block {i} holds no run of records")
    return got, None
