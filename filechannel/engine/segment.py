"""A raw segment file: its header, and the scanner that walks and checks its frames.

Layout of ``B.seg`` (little-endian)::

    offset 0   4s   magic b"FCHS"
           4   u16  format version (1)
           6   u16  flags (0)
           8   u32  segment id (0 for the first segment, +1 per roll)
          12   u32  CRC-32C of bytes 0-11 and 16-31 (0 in files written before it existed)
          16   u64  base offset: the offset of the first record in this segment
          24   i64  created, milliseconds since the epoch (drives ``segment_ms``)
          32        frames: [u32 length][u32 CRC-32C of payload][payload], back to back

A segment is append-only. It is *sealed* once a segment with a larger base offset
exists; the offset of its last record plus one is then that segment's base offset.

The base offset is also in the file name. Every read of a header checks the two agree
and checks the header's CRC, so a damaged header is refused (``CorruptRecordError``
naming the file) rather than copied into a compressed segment's table, where it would
renumber records. A CRC field of 0 is a header written before the CRC existed: its base
offset is still checked against the name.

A *torn tail* is a partial or bad last frame with nothing valid after it: a writer died
in the middle of a write, or the machine lost pages that were never written back. A bad
frame followed by a valid one is *corruption*. :func:`find_valid_frame` tells them apart.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass

from ..errors import CorruptRecordError, os_errors
from . import names
from .checksum import crc32c
from .record import ATTR_KNOWN, FRAME_HEADER, FRAME_HEADER_SIZE, RECORD_PREFIX, RECORD_PREFIX_SIZE, _codec, decode_payload

SEGMENT_MAGIC = b"FCHS"
MAX_FRAME_PAYLOAD = 0x7FFFFFFF  # the largest payload a frame may declare (its length is a u31)
FORMAT_VERSION = 1
SEGMENT_HEADER = struct.Struct("<4sHHIIQq")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size
_HEADER_CRC = struct.Struct("<I")
_HEADER_CRC_AT = 12
_SCAN_CHUNK = 1 << 20


@dataclass(frozen=True)
class SegmentHeader:
    segment_id: int
    base_offset: int
    created_ms: int

    def encode(self) -> bytes:
        raw = SEGMENT_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0, self.segment_id, 0, self.base_offset, self.created_ms)
        return raw[:_HEADER_CRC_AT] + _HEADER_CRC.pack(_header_crc(raw)) + raw[_HEADER_CRC_AT + 4 :]


def _header_crc(raw: bytes) -> int:
    return crc32c(raw[_HEADER_CRC_AT + 4 :], crc32c(raw[:_HEADER_CRC_AT]))


def create_segment(path: str, header: SegmentHeader) -> int:
    """Create a new segment file holding only its header; return an append-only fd.

    Fails if the file exists: segments are created under the writer lock, so an existing
    file means the caller's view of the log is stale.
    """
    with os_errors("create segment", path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            os.write(fd, header.encode())
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
    return fd


def read_segment_header(fd: int, path: str, base_offset: int | None = None) -> SegmentHeader:
    """Read and check a raw segment's header: magic, version, CRC, and base offset.

    The base offset must be ``base_offset`` or, if None, the one in the file's name (a
    file whose name is not a segment's is checked on its CRC alone). Raises
    :class:`CorruptRecordError` naming the file on any mismatch.
    """
    with os_errors("read segment header of", path):
        raw = os.pread(fd, SEGMENT_HEADER_SIZE, 0)
    if len(raw) < SEGMENT_HEADER_SIZE:
        raise CorruptRecordError(f"segment file {path!r} is shorter than its {SEGMENT_HEADER_SIZE}-byte header")
    magic, version, _flags, segment_id, crc, base, created = SEGMENT_HEADER.unpack(raw)
    if magic != SEGMENT_MAGIC:
        raise CorruptRecordError(f"segment file {path!r} does not start with the segment magic {SEGMENT_MAGIC!r}")
    if version != FORMAT_VERSION:
        raise CorruptRecordError(f"segment file {path!r} has format version {version}; this filechannel reads {FORMAT_VERSION}")
    if crc != 0 and crc != _header_crc(raw):
        raise CorruptRecordError(
            f"segment file {path!r} has a damaged header (its CRC-32C does not match); "
            "restore the file from a copy, or cut the log before it with `filechannel repair`"
        )
    if base_offset is None:
        parsed = names.parse_segment_file(os.path.basename(path))
        base_offset = parsed[0] if parsed is not None else base
    if base != base_offset:
        raise CorruptRecordError(
            f"segment file {path!r} says its base offset is {base}, its name says {base_offset}: the header is damaged; "
            "restore the file from a copy, or cut the log before it with `filechannel repair`"
        )
    return SegmentHeader(segment_id, base, created)


Mark = tuple[int, int, int]  # (offset, position, max timestamp of the records before it)
NO_MARKS = 2**62  # an interval no segment reaches: scan without marking


def scan_frames_py(
    buf: bytes, pos: int, offset: int, max_payload: int, interval: int, since: int, max_ts: int, marks: list[Mark]
) -> tuple[int, int, int, int, bool]:
    """Walk the whole frames of ``buf`` (read at file position ``pos``), checking each.

    A frame that starts ``interval`` bytes or more after the last mark (``since``: the
    bytes before ``buf``) gets a mark, appended to ``marks``. Returns ``(p, offset, since,
    max_ts, invalid)``: where in ``buf`` the walk stopped (its end, an incomplete frame, or
    a bad one if ``invalid``) and the counters there. ``_codec.scan_frames`` in Python: its
    reference, and the code used without the extension.
    """
    view = memoryview(buf)
    p, n = 0, len(buf)
    while p + FRAME_HEADER_SIZE <= n:
        length, crc = FRAME_HEADER.unpack_from(buf, p)
        if length < RECORD_PREFIX_SIZE or length > max_payload:
            return p, offset, since, max_ts, True
        stop = p + FRAME_HEADER_SIZE + length
        if stop > n:
            break
        if crc32c(view[p + FRAME_HEADER_SIZE : stop]) != crc:
            return p, offset, since, max_ts, True
        if since >= interval:
            marks.append((offset, pos + p, max_ts))
            since = 0
        since += stop - p
        ts = RECORD_PREFIX.unpack_from(buf, p + FRAME_HEADER_SIZE)[1]
        if ts > max_ts:
            max_ts = ts
        offset += 1
        p = stop
    return p, offset, since, max_ts, False


_scan_frames = _codec.scan_frames if _codec is not None else scan_frames_py


class FrameScanner:
    """Walks the frames of a raw segment from a position, checking every length and CRC.

    ``scan`` walks to the end of the file or to the first frame that is incomplete or
    fails its check; afterwards ``end_position``/``end_offset`` say where the valid part
    ends and ``stop`` says why: ``"end"``, ``"incomplete"`` or ``"invalid"``.
    """

    def __init__(self, fd: int, path: str, position: int, offset: int, max_payload: int, limit: int | None = None):
        self.fd = fd
        self.path = path
        self.end_position = position
        self.end_offset = offset
        self.max_payload = max_payload
        self.limit = limit
        self.stop = "end"

    def scan(self, interval: int = NO_MARKS, since: int = 0, max_ts: int = -(2**63)) -> tuple[list[Mark], int, int]:
        """Walk the frames; return the marks every ``interval`` bytes (the index entries the
        writer makes, or compressed blocks' starts), and ``since``/``max_ts`` at the end."""
        with os_errors("stat", self.path):
            size = os.fstat(self.fd).st_size if self.limit is None else self.limit
        marks: list[Mark] = []
        need = _SCAN_CHUNK
        while self.end_position < size:
            pos = self.end_position
            want = min(max(need, _SCAN_CHUNK), size - pos)
            with os_errors("read", self.path):
                buf = os.pread(self.fd, want, pos)
            p, self.end_offset, since, max_ts, invalid = _scan_frames(
                buf, pos, self.end_offset, self.max_payload, interval, since, max_ts, marks
            )
            self.end_position = pos + p
            if invalid:
                self.stop = "invalid"
                break
            if p:
                need = _SCAN_CHUNK
            elif len(buf) < want or want == size - pos:
                self.stop = "incomplete"  # not even one whole frame in what is left of the file
                break
            else:  # one frame longer than a chunk
                need = FRAME_HEADER_SIZE + FRAME_HEADER.unpack_from(buf, 0)[0]
        return marks, since, max_ts

    def corrupt_error(self, base_offset: int) -> CorruptRecordError:
        """The error for a frame that should have been whole and valid."""
        return CorruptRecordError(
            f"segment file {self.path!r} has a{' truncated' if self.stop == 'incomplete' else 'n invalid'} "
            f"frame at byte {self.end_position} (offset {self.end_offset}; segment base offset {base_offset}); "
            "the data past it cannot be trusted: restore the file from a copy or delete the segment"
        )


def frame_is_valid(frame: bytes | memoryview) -> bool:
    """Whether ``frame`` (a frame header and exactly its payload) is a frame a writer made:
    its CRC matches and its record decodes."""
    crc = FRAME_HEADER.unpack_from(frame, 0)[1]
    payload = memoryview(frame)[FRAME_HEADER_SIZE:]
    if crc32c(payload) != crc:
        return False
    try:
        decode_payload(payload, 0)
    except CorruptRecordError:
        return False
    return True


def valid_frame_at(fd: int, path: str, at: int, size: int, max_payload: int = 0x7FFFFFFF) -> bool:
    """Whether a valid frame (:func:`frame_is_valid`) starts at file position ``at`` and ends by ``size``."""
    with os_errors("read", path):
        head = os.pread(fd, FRAME_HEADER_SIZE, at)
    if len(head) < FRAME_HEADER_SIZE:
        return False
    length = FRAME_HEADER.unpack(head)[0]
    if not RECORD_PREFIX_SIZE <= length <= min(max_payload, size - at - FRAME_HEADER_SIZE):
        return False
    with os_errors("read", path):
        frame = os.pread(fd, FRAME_HEADER_SIZE + length, at)
    return len(frame) == FRAME_HEADER_SIZE + length and frame_is_valid(frame)


def damage_after(fd: int, path: str, position: int, size: int) -> int | None:
    """Where a valid frame follows the bad or partial frame at ``position`` of a segment that a
    writer may still be appending to: the frame is then damage, not a torn tail.

    None if nothing valid follows it (a torn tail, or a frame still being written), or if the
    frame at ``position`` became whole meanwhile (its writer finished it). Readers and
    ``check()`` decide with this; only the damage path calls it, never a per-record one.
    """
    found = find_valid_frame(fd, path, position + 1, size)
    if found is None:
        return None
    with os_errors("stat", path):
        now = os.fstat(fd).st_size
    return None if valid_frame_at(fd, path, position, now) else found


def find_valid_frame(fd: int, path: str, start: int, size: int | None = None, max_payload: int = 0x7FFFFFFF) -> int | None:
    """The first position at or after ``start`` where a valid frame begins; None if none does.

    The resync scan that tells a torn tail (nothing valid after a bad frame) from
    corruption (valid frames after it). A candidate position needs a length that is sane
    (a record prefix at least, at most ``max_payload``) and fits in the file, known
    attribute bits, a matching CRC and a record that decodes. Candidates are found by a
    regular expression over each chunk (C speed); a run of zero bytes, which is what a
    filesystem leaves in blocks it lost, is skipped in one step. Reads the file from
    ``start`` to ``size`` (its size if None) once, in chunks.
    """
    if size is None:
        with os_errors("stat", path):
            size = os.fstat(fd).st_size
    top = min(0xFF, min(size, max_payload) >> 24)
    # [4-byte length, top byte small][4-byte CRC][attributes: known bits only]
    candidate = re.compile(b"(?=[\\x00-\\xff]{3}[\\x00-\\x%02x][\\x00-\\xff]{4}[\\x00-\\x%02x])" % (top, ATTR_KNOWN))
    nonzero = re.compile(b"[^\\x00]")
    chunk_start = start
    while chunk_start + FRAME_HEADER_SIZE + RECORD_PREFIX_SIZE <= size:
        with os_errors("read", path):
            buf = os.pread(fd, min(_SCAN_CHUNK, size - chunk_start), chunk_start)
        if len(buf) < FRAME_HEADER_SIZE + RECORD_PREFIX_SIZE:  # the file shrank since its size was taken
            return None
        last = len(buf) - FRAME_HEADER_SIZE - RECORD_PREFIX_SIZE  # candidates whose prefix is in buf
        p = 0
        while p <= last:
            m = candidate.search(buf, p, last + FRAME_HEADER_SIZE + 1)
            if m is None:
                break
            p = m.start()
            pos = chunk_start + p
            length = FRAME_HEADER.unpack_from(buf, p)[0]
            if length < RECORD_PREFIX_SIZE:
                z = nonzero.search(buf, p)
                # a frame's length has a nonzero byte among its first four
                p = min(max(p + 1, z.start() - 3), last + 1) if z is not None else last + 1
                continue
            stop = pos + FRAME_HEADER_SIZE + length
            if length <= max_payload and stop <= size:
                if p + FRAME_HEADER_SIZE + length <= len(buf):
                    frame: bytes | memoryview = memoryview(buf)[p : p + FRAME_HEADER_SIZE + length]
                else:
                    with os_errors("read", path):
                        frame = os.pread(fd, FRAME_HEADER_SIZE + length, pos)
                if len(frame) == FRAME_HEADER_SIZE + length and frame_is_valid(frame):
                    return pos
            p += 1
        chunk_start += max(p, last + 1)
    return None
