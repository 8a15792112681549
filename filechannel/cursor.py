"""A cursor: one reader's position in the log, and the buffered reads that advance it.

A cursor reads its current segment in large chunks (``pread`` of a raw segment, one
decompressed block of a compressed one) and decodes whole frames out of the chunk.
A partial frame at the end of a chunk is never kept: the next read starts at that
frame again, so bytes of a torn frame that a writer later trims are never trusted.

At the end of a raw segment it moves on only once the next segment exists, and reads
the old one once more after seeing it (a writer's last frames land before the roll).
On the last blocks of a compressed segment it opens the next one, if that is compressed
too, so that its first blocks decompress ahead (readahead.py). The cursor holds its
segment's file open, so a segment deleted or compressed under it stays readable until
the cursor moves on.

A read that meets damage (a bad frame, a block that does not decompress, a segment that
cannot be opened) returns the records before it, and the next read raises: nothing is
skipped, nothing already decoded is lost. Not thread-safe.
"""

from __future__ import annotations

import errno
import os

from .compressed import BlockData, CompressedSegment
from .errors import CorruptRecordError, FileChannelError, StorageError, os_errors
from .log import Log, SegmentRef
from .readahead import READAHEAD_BLOCKS, BlockReadahead
from .record import FRAME_HEADER, FRAME_HEADER_SIZE, Record, decode_records
from .segment import SEGMENT_HEADER_SIZE

READ_CHUNK = 256 * 1024


class _RawSource:
    def __init__(self, ref: SegmentRef) -> None:
        self.ref = ref
        with os_errors("open segment", ref.path):
            self.fd = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self, position: int, size: int) -> tuple[bytes, int]:
        with os_errors("read", self.ref.path):
            return os.pread(self.fd, size, position), 0

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        os.close(self.fd)


class _CompressedSource:
    """Serves raw-segment positions out of decompressed blocks; keeps the last block."""

    def __init__(self, ref: SegmentRef) -> None:
        self.ref = ref
        self.seg = CompressedSegment.open(ref.path)
        self.info = self.seg.info
        self._blocks = BlockReadahead(self.seg)
        self._block = -1
        self._data: BlockData = b""
        self._end = SEGMENT_HEADER_SIZE + self.info.raw_size

    @property
    def near_end(self) -> bool:
        """The reader is on a block from which readahead reaches this segment's end."""
        return self._block >= len(self.info.blocks) - READAHEAD_BLOCKS

    def start_readahead(self) -> None:
        self._blocks.start()

    def read(self, position: int, size: int) -> tuple[BlockData, int]:
        if position >= self._end:
            return b"", 0
        i = self.info.block_for_raw_position(position - SEGMENT_HEADER_SIZE)
        if i != self._block:
            self._data = self._blocks.block(i)
            self._block = i
        start = position - SEGMENT_HEADER_SIZE - self.info.blocks[i].raw_position
        return self._data, start

    def size(self) -> int:
        return self._end

    def close(self) -> None:
        self._blocks.close()
        self.seg.close()


class Cursor:
    """Reads records from a given offset onward (see the module docstring)."""

    def __init__(self, log: Log, offset: int) -> None:
        self._log = log
        self._source: _RawSource | _CompressedSource | None = None
        self._next: _CompressedSource | None = None  # the next segment, read ahead (see _fill)
        self._end: int | None = None  # end offset of the current segment once known sealed
        self._buf: BlockData = b""  # a raw chunk or a decompressed block
        self._bpos = 0
        self._pos = 0  # segment position of _buf[_bpos]
        self.offset = offset  # the next offset this cursor delivers
        self.seek(offset)

    @property
    def position(self) -> int:
        """The offset this cursor delivers next."""
        return max(self.offset, self._skip_to)

    def seek(self, offset: int) -> None:
        """Deliver ``offset`` next (records between the index entry and it are skipped on read)."""
        self._open(offset)
        self._skip_to = offset

    def _open(self, offset: int) -> None:
        """Position the cursor on ``offset``: segment by listing, byte by index, then a short scan."""
        nxt, self._next = self._next, None
        while True:
            ref, end = self._log.locate(offset)
            if nxt is not None and nxt.ref == ref:
                source: _RawSource | _CompressedSource = nxt
                nxt = None
                break
            try:
                source = _CompressedSource(ref) if ref.compressed else _RawSource(ref)
            except FileNotFoundError:
                continue  # compressed or collected between listing and opening: list again
            except StorageError as exc:
                if exc.errno == errno.ENOENT:
                    continue
                raise
            break
        if nxt is not None:
            nxt.close()
        self._close_source()
        self._source = source
        self._end = source.info.end_offset if isinstance(source, _CompressedSource) else end
        if isinstance(source, _CompressedSource):
            info = source.info
            b = info.blocks[info.block_for_offset(offset)] if info.blocks else None
            start_offset = b.first_offset if b else info.base_offset
            start_pos = SEGMENT_HEADER_SIZE + (b.raw_position if b else 0)
        elif ref.base_offset == offset:
            start_offset, start_pos = offset, SEGMENT_HEADER_SIZE
        else:
            idx = self._log.sealed_offset_index(ref) if end is not None else self._log.load_offset_index(ref.base_offset)
            start_offset, start_pos = idx.lookup(offset)
        self._buf, self._bpos, self._pos = b"", 0, start_pos
        self.offset = start_offset

    def read(self, max_records: int) -> list[Record]:
        """Up to ``max_records`` records that are in the files now (possibly none)."""
        while True:
            out = self._read(max_records + max(0, self._skip_to - self.offset))
            if self._skip_to <= (out[0].offset if out else self.offset):
                return out
            if out and out[-1].offset >= self._skip_to:
                return out[self._skip_to - out[0].offset :]
            if not out:
                return out

    def _read(self, max_records: int) -> list[Record]:
        out: list[Record] = []
        while len(out) < max_records:
            if self._bpos < len(self._buf):
                try:
                    newp, n = decode_records(self._buf, self._bpos, self.offset, max_records - len(out), out)
                except CorruptRecordError as exc:
                    self._advance(exc.position, exc.offset - self.offset)  # type: ignore[attr-defined]
                    try:
                        self._on_bad_frame(exc)
                    except CorruptRecordError:
                        if out:
                            break  # deliver the records before it; the next read raises again
                        raise
                    break
                self._advance(newp, n)
                if len(out) >= max_records:
                    break
            try:
                if not self._fill():
                    break
            except FileChannelError:
                if out:
                    break  # deliver what was read first; the next read raises again
                raise
        return out

    def _advance(self, newp: int, n: int) -> None:
        self._pos += newp - self._bpos
        self._bpos = newp
        self.offset += n

    def _on_bad_frame(self, exc: CorruptRecordError) -> None:
        """A CRC mismatch: real corruption unless it is the last frame of the active segment."""
        source = self._source
        assert source is not None
        length = FRAME_HEADER.unpack_from(self._buf, self._bpos)[0]
        frame_end = self._pos + FRAME_HEADER_SIZE + length
        sealed = self._end is not None or self._log.list_segments()[-1].base_offset > source.ref.base_offset
        if isinstance(source, _RawSource) and not sealed and frame_end >= source.size():
            self._buf, self._bpos = b"", 0  # maybe a frame a dead writer tore; recovery trims it
            return
        raise CorruptRecordError(
            f"corrupt record in {source.ref.path!r} at byte {self._pos} (offset {self.offset}): {exc}. "
            "Run `filechannel check` to list the damage; restore the segment or seek past it"
        ) from exc

    def _fill(self) -> bool:
        """Read the next chunk; False if there is nothing more in the files right now."""
        source = self._source
        assert source is not None
        left = len(self._buf) - self._bpos
        need = READ_CHUNK
        if left >= FRAME_HEADER_SIZE:
            need = max(need, FRAME_HEADER_SIZE + FRAME_HEADER.unpack_from(self._buf, self._bpos)[0])
        data, start = source.read(self._pos, need)
        if len(data) - start > left:
            self._buf, self._bpos = data, start
            if self._next is None and isinstance(source, _CompressedSource) and source.near_end:
                self._read_ahead_next(source)
            return True
        # Nothing new in this segment. Is it sealed?
        if self._end is None:
            # An empty segment is never sealed: a roll needs a record in the old segment.
            if self.offset == source.ref.base_offset or self._log.next_segment(self.offset) is None:
                if not os.path.exists(source.ref.path):
                    # Garbage collection deleted this segment and the ones after it while we
                    # read through the open file: raises OffsetOutOfRangeError if offset is gone.
                    self._log.locate(self.offset)
                self._buf, self._bpos = b"", 0
                return False
            self._end = self.offset
            data, start = source.read(self._pos, need)  # frames written before the roll
            if len(data) - start > left:
                self._buf, self._bpos = data, start
                return True
        if left or self.offset != self._end:
            raise CorruptRecordError(
                f"segment {source.ref.path!r} ends with {left} bytes of a partial frame at byte {self._pos} "
                f"(offset {self.offset}, segment end {self._end}); restore it from a copy or delete it"
            )
        self._open(self.offset)
        return True

    def _read_ahead_next(self, source: _CompressedSource) -> None:
        """Open the segment after ``source`` and start its readahead, if it is compressed.

        Best effort: a segment that cannot be opened now is left for :meth:`_open`, which
        raises what is wrong with it when the cursor gets there.
        """
        ref = self._log.next_segment(source.info.end_offset)
        if ref is None or not ref.compressed:
            return
        try:
            self._next = _CompressedSource(ref)
        except (OSError, FileChannelError):
            return
        self._next.start_readahead()

    def _close_source(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    def close(self) -> None:
        self._close_source()
        if self._next is not None:
            self._next.close()
            self._next = None
