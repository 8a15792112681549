"""A cursor: one reader's position in the log, and the buffered reads that advance it.

A cursor reads its current segment in large chunks (``pread`` of a raw segment, one
decompressed block of a compressed one) and decodes whole frames out of the chunk.
A partial frame at the end of a chunk is never kept: the next read starts at that
frame again, so bytes of a torn frame that a writer later trims are never trusted.
So that this rereads little, a chunk is a whole number of the last such frame's length:
records of one size then end where a chunk ends. With 256 KiB chunks of 64 KiB records,
every chunk read held three records and the head of a fourth, read again with the next: a
third more bytes copied from the page cache than the records. A chunk holds
``CHUNK_FRAMES`` such frames, and at least ``READ_CHUNK`` and at most ``READ_CHUNK_MAX``
bytes: small records read 256 KiB at a time, and 64 KiB records 15 at a time, not three
(which made ``recv_many`` of them faster: DESIGN.md, "Reading"); a frame
longer than ``READ_CHUNK_MAX`` is read whole, alone. A read bounded in bytes asks for no
more whole frames of that length than reach its bound.

At the end of a raw segment it moves on only once the next segment exists, and reads
the old one once more after seeing it (a writer's last frames land before the roll).
On the last blocks of a compressed segment it opens the next one, if that is compressed
too, so that its first blocks decompress ahead (readahead.py). The cursor holds its
segment's file open, so a segment deleted or compressed under it stays readable until
the cursor moves on. A segment only in tier-2 is read the same way, its blocks fetched
by ranged reads and prefetched (``Log.open_compressed``); one deleted from tier-2 by
retention under the cursor raises :class:`OffsetOutOfRangeError`, as one collected here
before the cursor opened it does.

Offsets are contiguous across segments: a segment's offsets end exactly where the next
segment begins. Inside a segment the cleaner of a compacted channel leaves holes (offsets
whose records it removed): a cleaned segment's runs (compressed.py) say where each dense
run of offsets starts, and the cursor takes a run's first offset when it reaches its first
frame, a read of a run stopping at its end. A seek into a hole reads from the next record.
A cursor that finds no segment where the previous one ended while a later one exists (a
hole: a segment file deleted or lost) raises
:class:`MissingSegmentError` naming the missing offsets; it never goes back.

A read that meets damage (a bad frame, a block that does not decompress, a segment that
cannot be opened, a hole) returns the records before it, and the next read raises:
nothing is skipped, nothing already decoded is lost. A bad or partial last frame of the
active segment may be a frame a writer is still writing or a dead writer tore, and is
waited on, unless a valid frame follows it (a forward scan, run only then): that is
corruption, and raises.

A read with ``nowait=True`` (an event loop's, see client/aio.py) does no file work but
read bytes already in the page cache (``preadv`` with ``RWF_NOWAIT``, which never waits for
the disk): where a read would wait for the disk, decompress a block, fetch from tier-2,
look for the next segment or check a damaged tail, it returns the records decoded so far,
or raises :class:`WouldBlock` if there are none, with the cursor where it was. At the end of
what the current segment holds, it returns none, as a read at the end of the log does.

One thread reads at a time; :meth:`Cursor.close` may be called from any thread at any
moment: a read in progress finishes first, and later reads raise
:class:`ChannelClosedError`.
"""

from __future__ import annotations

import bisect
import errno
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import (
    ChannelClosedError,
    CorruptRecordError,
    FileChannelError,
    MissingSegmentError,
    file_vanished,
    os_errors,
)
from .compressed import BlockData
from .heap import make_room
from .log import Log, SegmentRef
from .readahead import READAHEAD_BLOCKS
from .record import FRAME_HEADER, FRAME_HEADER_SIZE, RECORDS, RecordLayout, decode_records
from .segment import SEGMENT_HEADER_SIZE, damage_after

READ_CHUNK = 256 * 1024  # bytes of a raw chunk read, and the least a chunk of whole frames holds
READ_CHUNK_MAX = 1024 * 1024  # the most a chunk of whole frames holds (15 frames of 64 KiB records)
CHUNK_FRAMES = 16  # frames a chunk of long frames holds, within those bounds
_UNBOUNDED = 1 << 62  # a read's byte bound when it has none
_RELIST_INTERVAL = 1.0  # seconds: how often a reader waiting at a segment's end lists the folder
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)  # Linux 4.14+; elsewhere a nowait read always raises WouldBlock
_NO_NOWAIT = (errno.EOPNOTSUPP, errno.EINVAL)  # a filesystem without RWF_NOWAIT reads (as if nothing were cached)


def _pread_nowait_py(fd: int, size: int, position: int) -> bytearray:
    """``_codec.pread_nowait`` without the C build: the same read into a bytearray (zeroed first)."""
    buf = bytearray(size)
    del buf[os.preadv(fd, [buf], position, _RWF_NOWAIT) :]
    return buf


_pread_nowait: Callable[[int, int, int], bytes | bytearray]
try:
    from ._codec import pread_nowait as _pread_nowait
except ImportError:  # no C build, or a platform without RWF_NOWAIT
    _pread_nowait = _pread_nowait_py


def _offset_of(record: Any) -> int:
    return int(record.offset)


class WouldBlock(Exception):
    """A read with ``nowait=True`` would have to wait for the disk or do file work beyond
    reading cached bytes (see the module docstring); read again without ``nowait``, off the
    event loop. Never reaches a user: the client that asks for ``nowait`` catches it.

    ``segment_end``: the read stopped at the end of what its segment holds (the seal to find,
    the next segment to open, a partial tail to check), which a read of one record gets past;
    otherwise pages were not cached, or the segment is compressed or in tier-2. ``partition``:
    whose read it was, where a client reading several says (``Consumer._fetch``)."""

    def __init__(self, segment_end: bool = False) -> None:
        super().__init__()
        self.segment_end = segment_end
        self.partition: object = None


class _RawSource:
    def __init__(self, ref: SegmentRef) -> None:
        self.ref = ref
        with os_errors("open segment", ref.path):
            self.fd = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self, position: int, size: int) -> tuple[bytes, int]:
        with os_errors("read", self.ref.path):
            return os.pread(self.fd, size, position), 0

    def read_cached(self, position: int, size: int) -> tuple[bytes | bytearray, int]:
        """What of the ``size`` bytes at ``position`` the page cache holds from there on (b""
        at the end of the file); :class:`WouldBlock` if the first is not cached."""
        if not _RWF_NOWAIT:
            raise WouldBlock
        try:
            return _pread_nowait(self.fd, size, position), 0
        except BlockingIOError:
            raise WouldBlock from None
        except OSError as exc:
            if exc.errno in _NO_NOWAIT:
                raise WouldBlock from None
            with os_errors("read", self.ref.path):
                raise

    def size(self) -> int:
        with os_errors("stat", self.ref.path):
            return os.fstat(self.fd).st_size

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class _CompressedSource:
    """Serves raw-segment positions out of decompressed blocks; keeps the last block.

    The blocks come from a local ``.seg.z`` or, for a segment only in tier-2, from its
    chunks (:meth:`Log.open_compressed`): the cursor reads both alike."""

    def __init__(self, log: Log, ref: SegmentRef) -> None:
        self.ref = ref
        self._blocks = log.open_compressed(ref)
        self.info = self._blocks.info
        self._block = -1
        self._data: BlockData = b""
        self._end = SEGMENT_HEADER_SIZE + self.info.raw_size

    def where(self) -> str:
        """Where the current block's bytes are (the file, or the tier-2 objects and bytes)."""
        return self._blocks.where(self._block) if self._block >= 0 else self.ref.path

    @property
    def near_end(self) -> bool:
        """The reader is on a block from which readahead reaches this segment's end."""
        return self._block >= len(self.info.blocks) - READAHEAD_BLOCKS

    def start_readahead(self) -> None:
        self._blocks.start()

    def offset_at(self, position: int, offset: int) -> int:
        """The offset of the frame at ``position`` for a reader at ``offset`` (past a hole of a
        cleaned segment, the next run's first offset: :meth:`CompressedInfo.offset_at`)."""
        return self.info.offset_at(position - SEGMENT_HEADER_SIZE, offset)

    def read(self, position: int, size: int) -> tuple[BlockData, int]:
        """The decompressed block holding ``position``, cut where the run holding it ends (so a
        dense decode never runs across a hole of a cleaned segment), and where in it to start."""
        if position >= self._end:
            return b"", 0
        raw = position - SEGMENT_HEADER_SIZE
        i = self.info.block_for_raw_position(raw)
        if i != self._block:
            self._data = self._blocks.block(i)
            self._block = i
        b = self.info.blocks[i]
        stop = self.info.run_end(raw) - b.raw_position
        data = self._data if stop >= len(self._data) else memoryview(self._data)[:stop]
        return data, raw - b.raw_position

    def size(self) -> int:
        return self._end

    def close(self) -> None:
        self._blocks.close()


class Cursor:
    """Reads records from a given offset onward (see the module docstring)."""

    def __init__(self, log: Log, offset: int) -> None:
        make_room()  # batches of values freed without glibc giving the heap back (heap.py)
        self._log = log
        self._lock = threading.Lock()  # held by read, seek and close: close waits for a read
        self._closed = False
        self._source: _RawSource | _CompressedSource | None = None
        self._next: _CompressedSource | None = None  # the next segment, read ahead (see _fill)
        self._end: int | None = None  # end offset of the current segment once known sealed
        self._buf: BlockData | bytearray = b""  # a raw chunk (a bytearray from _pread_nowait_py) or a decompressed block
        self._chunk = READ_CHUNK  # bytes a raw chunk read asks for (see the module docstring)
        self._frame = 0  # the length of the frames _chunk holds whole (0: not known yet)
        self._bpos = 0
        self._pos = 0  # segment position of _buf[_bpos]
        self._tail_seen: tuple[int, int] | None = None  # (position, file size) of a bad tail found alone
        self._listed_at = -_RELIST_INTERVAL  # when _find_seal last listed the folder (monotonic)
        self.offset = offset  # the next offset this cursor delivers
        self.seek(offset)

    @property
    def position(self) -> int:
        """The offset this cursor delivers next."""
        return max(self.offset, self._skip_to)

    def seek(self, offset: int) -> None:
        """Deliver ``offset`` next (records between the index entry and it are skipped on read).

        Raises :class:`MissingSegmentError` if ``offset`` lies in a hole of the log; the
        cursor then stays where it was.
        """
        with self._lock:
            self._check_open()
            self._open(offset)
            self._skip_to = offset

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"this reader of channel {self._log.path!r} is closed")

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
                source = _CompressedSource(self._log, ref) if ref.compressed else _RawSource(ref)
            except (OSError, FileChannelError) as exc:
                if file_vanished(exc):
                    continue  # compressed or collected between listing and opening: list again
                raise
            break
        if nxt is not None:
            nxt.close()
        if isinstance(source, _CompressedSource) and offset >= source.info.end_offset and end is not None:
            source.close()
            raise self._hole(source.info.end_offset, end, ref)
        self._close_source()
        self._source = source
        self._end = source.info.end_offset if isinstance(source, _CompressedSource) else end
        self._tail_seen = None
        if isinstance(source, _CompressedSource):
            info = source.info
            # the run holding offset, the next one past a hole, or the end (a lost roll's last segment)
            start_offset, raw = info.start_for(offset)
            start_pos = SEGMENT_HEADER_SIZE + raw
        elif ref.base_offset == offset:
            start_offset, start_pos = offset, SEGMENT_HEADER_SIZE
        else:
            try:
                idx = self._log.sealed_offset_index(ref) if end is not None else self._log.load_offset_index(ref.base_offset)
                start_offset, start_pos = idx.lookup(offset)
            except (OSError, FileChannelError) as exc:
                if not file_vanished(exc):
                    raise
                # Compressed meanwhile (its index went with it): scan the open file from its start.
                start_offset, start_pos = ref.base_offset, SEGMENT_HEADER_SIZE
        self._buf, self._bpos, self._pos = b"", 0, start_pos
        self.offset = start_offset

    def _hole(self, first: int, next_base: int, ref: SegmentRef) -> MissingSegmentError:
        return MissingSegmentError(
            f"offsets {first} to {next_base - 1} are missing from channel {self._log.path!r}: segment "
            f"{os.path.basename(ref.path)!r} ends at offset {first} but the next segment starts at {next_base} "
            "(a segment file was deleted or lost); restore it from a copy, or seek to "
            f"{next_base} to read on past the hole"
        )

    def read(
        self, max_records: int, layout: RecordLayout = RECORDS, max_bytes: int | None = None, nowait: bool = False
    ) -> list[Any]:
        """Up to ``max_records`` records that are in the files now (possibly none), decoded as
        ``layout`` says (:class:`Record` by default; any layout's records have ``offset``).

        With ``max_bytes``, the read also ends once its frames reach that many bytes: at least
        one record, and at most one read (a chunk, or one frame longer than a chunk) past the
        bound. What a batch holds in memory is then bounded whatever the records' size.
        With ``nowait``, only what is in memory (the module docstring): :class:`WouldBlock`
        if that is no record and more may be on disk."""
        with self._lock:
            self._check_open()
            while True:
                out = self._read(max_records + max(0, self._skip_to - self.offset), layout, max_bytes, nowait)
                if self._skip_to <= (out[0].offset if out else self.offset):
                    return out
                if out and out[-1].offset >= self._skip_to:
                    # by offset, not by count: a cleaned segment's offsets have holes
                    return out[bisect.bisect_left(out, self._skip_to, key=_offset_of) :]
                if not out:
                    return out

    def _read(self, max_records: int, layout: RecordLayout, max_bytes: int | None, nowait: bool) -> list[Any]:
        out: list[Any] = []
        room = _UNBOUNDED if max_bytes is None else max_bytes  # frame bytes this read may still decode
        while len(out) < max_records:
            if self._bpos < len(self._buf):
                try:
                    newp, n = decode_records(self._buf, self._bpos, self.offset, max_records - len(out), out, layout)
                except CorruptRecordError as exc:
                    self._advance(exc.position, exc.offset - self.offset)
                    try:
                        self._on_bad_frame(exc)
                    except CorruptRecordError:
                        if out:
                            break  # deliver the records before it; the next read raises again
                        raise
                    break
                room -= newp - self._bpos
                self._advance(newp, n)
                if len(out) >= max_records or room <= 0:
                    break
            try:
                if not self._fill(nowait, room):
                    break
            except (FileChannelError, WouldBlock):
                if out:
                    break  # deliver what was read first; the next read raises again
                raise
        return out

    def _advance(self, newp: int, n: int) -> None:
        self._pos += newp - self._bpos
        self._bpos = newp
        self.offset += n

    def _on_bad_frame(self, exc: CorruptRecordError) -> None:
        """A CRC mismatch: real corruption unless it may be a torn last frame of the active segment."""
        source = self._source
        assert source is not None  # only called from _read, on the source it read
        length = FRAME_HEADER.unpack_from(self._buf, self._bpos)[0]
        frame_end = self._pos + FRAME_HEADER_SIZE + length
        if isinstance(source, _RawSource) and self._end is None and frame_end >= source.size():
            self._find_seal(source, relist=True)
            if self._end is None:
                self._check_tail(source)
                self._buf, self._bpos = b"", 0  # maybe a frame a dead writer tore; recovery trims it
                return
        raise self._corrupt(source, str(exc)) from exc

    def _corrupt(self, source: _RawSource | _CompressedSource, what: str) -> CorruptRecordError:
        where = source.where() if isinstance(source, _CompressedSource) else source.ref.path
        return CorruptRecordError(
            f"corrupt record in {where!r} at byte {self._pos} (offset {self.offset}): {what}. "
            "Run `filechannel check` to list the damage; restore the segment or seek past it"
        )

    def _find_seal(self, source: _RawSource, relist: bool) -> None:
        """Set ``_end`` if ``source`` is sealed: its records end where the next segment begins.

        Two stats find the next segment where this one's read ends (a roll). A hole after
        this segment, or garbage collection having deleted it, shows only in a listing of
        the folder, which costs more on a folder of many segments: it is done when
        ``relist`` (the damage path) or at most once per ``_RELIST_INTERVAL`` of waiting.
        """
        if self.offset != source.ref.base_offset and self._log.next_segment(self.offset) is not None:
            self._end = self.offset
            return
        now = time.monotonic()
        if not relist and now - self._listed_at < _RELIST_INTERVAL:
            return
        self._listed_at = now
        following = self._log.following(source.ref.base_offset)
        if following is not None:
            self._end = following

    def _check_tail(self, source: _RawSource) -> None:
        """The active segment ends in a bad or partial frame at ``_pos``: raise if a valid frame
        follows it (corruption); otherwise it may be torn or still being written: wait.
        A tail found alone is not scanned again until the file grows."""
        size = source.size()
        if self._tail_seen == (self._pos, size) or self._pos >= size:
            return
        found = damage_after(source.fd, source.ref.path, self._pos, size)
        if found is None:  # torn or still being written: wait (a frame completed meanwhile grew the file)
            self._tail_seen = (self._pos, size)
            return
        raise self._corrupt(
            source, f"the frame there is damaged and a valid frame follows at byte {found}, so it is not a torn tail"
        )

    def _fill(self, nowait: bool = False, room: int = _UNBOUNDED) -> bool:
        """Read the next chunk; False if there is nothing more in the files right now.
        ``nowait``: only a raw segment's cached bytes, else :class:`WouldBlock` (nothing changed).
        ``room``: frame bytes the read may still decode; a raw chunk of frames of a known
        length asks for no more whole frames than cover it (at least one)."""
        source = self._source
        assert source is not None  # the lock and _check_open keep a closed cursor out
        left = len(self._buf) - self._bpos
        need = self._chunk
        if left >= FRAME_HEADER_SIZE:
            want = FRAME_HEADER_SIZE + FRAME_HEADER.unpack_from(self._buf, self._bpos)[0]
            if want > READ_CHUNK_MAX:  # a frame longer than a chunk, or a damaged length: never past the file
                if nowait:
                    raise WouldBlock
                need = max(left, min(want, source.size() - self._pos))
            else:  # chunks of whole frames of this length from here on (the module docstring)
                chunk = min(READ_CHUNK_MAX, max(READ_CHUNK, CHUNK_FRAMES * want))
                self._chunk, self._frame = chunk - chunk % want, want
                need = self._chunk
        if self._frame and room < need <= self._chunk:  # not past the whole frames that cover room
            need = max(self._frame, room + -room % self._frame)
        data: BlockData | bytearray
        if nowait:
            if not isinstance(source, _RawSource):
                raise WouldBlock
            data, start = source.read_cached(self._pos, need)
        else:
            if isinstance(source, _CompressedSource) and not left:  # at a frame boundary: maybe past a hole
                self.offset = source.offset_at(self._pos, self.offset)
            data, start = source.read(self._pos, need)
        if len(data) - start > left:
            self._buf, self._bpos = data, start
            if self._next is None and isinstance(source, _CompressedSource) and source.near_end:
                self._read_ahead_next(source)
            return True
        if nowait:  # the end of what this file holds now: a seal, a tail or the next segment are file work
            if left or self._end is not None:
                raise WouldBlock(segment_end=True)
            self._buf, self._bpos = b"", 0
            return False
        # Nothing new in this segment. Is it sealed?
        if self._end is None:
            assert isinstance(source, _RawSource)  # a compressed segment's end is known at once
            self._find_seal(source, relist=False)
            if self._end is None:  # the active segment (as far as we know): wait for more
                if left:
                    self._check_tail(source)
                self._buf, self._bpos = b"", 0
                return False
            data, start = source.read(self._pos, need)  # frames written before the roll
            if len(data) - start > left:
                self._buf, self._bpos = data, start
                return True
        if left or self.offset != self._end:
            # Garbage collection deleted this segment and the ones after it while we read
            # through the open file: OffsetOutOfRangeError if the offset is gone.
            self._log.locate(self.offset)
            if left:
                raise CorruptRecordError(
                    f"segment {source.ref.path!r} ends with {left} bytes of a partial frame at byte {self._pos} "
                    f"(offset {self.offset}, segment end {self._end}); restore it from a copy or delete it"
                )
            if isinstance(source, _CompressedSource):
                raise CorruptRecordError(
                    f"compressed segment {source.ref.path!r} holds records up to offset {self.offset}, but its "
                    f"table says up to {self._end}; restore it from a copy"
                )
            raise self._hole(self.offset, self._end, source.ref)
        ref, end = self._log.locate(self.offset)
        if ref.base_offset != self.offset:
            if end is None:  # the last segment is this compressed one (a lost roll): wait for the writer
                self._buf, self._bpos = b"", 0
                return False
            raise self._hole(self.offset, end, source.ref)
        self._open(self.offset)
        return True

    def _read_ahead_next(self, source: _CompressedSource) -> None:
        """Open the segment after ``source`` and start its readahead, if it is compressed.

        Best effort: a segment that cannot be opened now is left for :meth:`_open`, which
        raises what is wrong with it when the cursor gets there.
        """
        ref = self._log.next_segment(source.info.end_offset, remote=True)
        if ref is None or not ref.compressed:
            return
        try:
            self._next = _CompressedSource(self._log, ref)
        except (OSError, FileChannelError):
            return
        self._next.start_readahead()

    def _close_source(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    def close(self) -> None:
        """Release the files; idempotent, and safe while another thread reads (it waits for it)."""
        with self._lock:
            self._closed = True
            self._close_source()
            if self._next is not None:
                self._next.close()
                self._next = None
