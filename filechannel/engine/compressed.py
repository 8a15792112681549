"""A sealed segment compressed into independently decompressible blocks (``B.seg.z``).

Layout (little-endian), chosen so that a reader needs two ranged reads to reach any
offset: the fixed header, then the block table, then the one block it wants::

    offset 0   4s   magic b"FCHZ"
           4   u16  format version (1)
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
"""

from __future__ import annotations

import bisect
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import zstandard
from crc32c import crc32c

from ..errors import ChannelClosedError, CorruptRecordError, os_errors
from .files import opened
from .record import Record, decode_records
from .segment import SEGMENT_HEADER_SIZE, FrameScanner, SegmentHeader, read_segment_header

Z_MAGIC = b"FCHZ"
Z_VERSION = 1
METHOD_ZSTD = 1
Z_HEADER = struct.Struct("<4sHBBIIQQqqQ")
Z_BLOCK = struct.Struct("<QqQQII")
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
class CompressedInfo:
    """What the header and block table of a ``.seg.z`` file say."""

    segment_id: int
    base_offset: int
    end_offset: int
    created_ms: int
    max_timestamp: int
    raw_size: int
    blocks: tuple[Block, ...]

    @property
    def table_size(self) -> int:
        return Z_HEADER.size + Z_BLOCK.size * len(self.blocks) + _CRC.size

    @property
    def blocks_end(self) -> int:
        """The byte where the last block ends: the size of a whole ``.seg.z`` file."""
        last = self.blocks[-1] if self.blocks else None
        return last.file_position + last.compressed_length if last is not None else self.table_size

    @cached_property
    def _first_offsets(self) -> list[int]:
        return [b.first_offset for b in self.blocks]

    @cached_property
    def _raw_positions(self) -> list[int]:
        return [b.raw_position for b in self.blocks]

    @cached_property
    def _max_timestamps(self) -> list[int]:
        return [b.max_timestamp for b in self.blocks]

    def block_for_offset(self, offset: int) -> int:
        """Index of the block holding ``offset`` (which must lie in the segment)."""
        return max(0, bisect.bisect_right(self._first_offsets, offset) - 1)

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


def _encode_table(info: CompressedInfo) -> bytes:
    parts = [
        Z_HEADER.pack(
            Z_MAGIC,
            Z_VERSION,
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
    parts.extend(
        Z_BLOCK.pack(b.first_offset, b.max_timestamp, b.raw_position, b.file_position, b.raw_length, b.compressed_length)
        for b in info.blocks
    )
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
    if magic != Z_MAGIC or version != Z_VERSION or method != METHOD_ZSTD:
        raise CorruptRecordError(f"compressed segment {path!r} has a bad magic, version or method")
    table_end = Z_HEADER.size + Z_BLOCK.size * count
    if len(data) < table_end + _CRC.size:
        raise CorruptRecordError(f"compressed segment {path!r} is shorter than its block table ({count} blocks)")
    (crc,) = _CRC.unpack_from(data, table_end)
    if crc32c(memoryview(data)[:table_end]) != crc:
        raise CorruptRecordError(f"compressed segment {path!r}: the CRC-32C of its header and block table does not match")
    blocks = tuple(Block(*Z_BLOCK.unpack_from(data, Z_HEADER.size + i * Z_BLOCK.size)) for i in range(count))
    info = CompressedInfo(seg_id, base, end, created, max_ts, raw_size, blocks)
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
        elif not first <= b.first_offset < info.end_offset or (i == 0 and b.first_offset != info.base_offset):
            bad = f"block {i} starts at offset {b.first_offset}, out of order or outside {info.base_offset}-{info.end_offset}"
        file_pos += b.compressed_length
        raw_pos += b.raw_length
        first = b.first_offset + 1
    if bad is None and raw_pos != info.raw_size:
        bad = f"its blocks hold {raw_pos} raw bytes, not the {info.raw_size} its header says"
    if bad is None and not info.blocks and info.end_offset != info.base_offset:
        bad = f"it has no block but offsets {info.base_offset} to {info.end_offset}"
    if bad is not None:
        raise CorruptRecordError(f"compressed segment {path!r} is corrupt: {bad}; restore it from a copy")


def table_length(header: bytes) -> int:
    """From the first ``Z_HEADER.size`` bytes, how many bytes the header and table span."""
    count: int = Z_HEADER.unpack_from(header, 0)[5]
    return Z_HEADER.size + Z_BLOCK.size * count + _CRC.size


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
    data: BlockData, info: CompressedInfo, i: int, where: str, out: list[Record]
) -> tuple[int, CorruptRecordError | None]:
    """Decode block ``i``'s records (its decompressed ``data``) into ``out`` and check them: every
    frame's CRC, and that they end whole exactly where the next block (or the segment) starts.

    Returns how many records decoded before any damage, and the damage (None if the block is
    whole). The one check of a block's records, for ``check()`` and ``tier fsck --deep``.
    """
    block = info.blocks[i]
    following = info.blocks[i + 1].first_offset if i + 1 < len(info.blocks) else info.end_offset
    before = len(out)
    try:
        end, got = decode_records(data, 0, block.first_offset, len(data), out)
    except CorruptRecordError as exc:
        return len(out) - before, CorruptRecordError(
            f"compressed segment {where!r}: block {i} (offsets from {block.first_offset}): {exc}"
        )
    if end != len(data):
        return got, CorruptRecordError(
            f"compressed segment {where!r}: block {i} ends in a partial frame at offset {block.first_offset + got}"
        )
    if block.first_offset + got != following:
        return got, CorruptRecordError(
            f"compressed segment {where!r}: block {i} holds offsets {block.first_offset} to "
            f"{block.first_offset + got - 1}, but the next block or the segment's end is at {following}"
        )
    return got, None
