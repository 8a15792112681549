"""Upload one sealed, compressed segment (``B.seg.z``) to tier-2: chunks, then manifest, then metadata.

The order of the metadata states around the storage calls (see :mod:`.metadata`):

1. ``begin_upload`` commits the segment "uploading" with every chunk name it will write;
2. the chunks are written (``tier_concurrency`` in flight, paced to ``tier_upload_bytes_per_s``),
   then the manifest beside them;
3. ``finish_upload`` commits "uploaded". Only from this commit on may the local copy go.

A failure in step 2 or 3 (storage unreachable, disk error...) abandons the attempt in
the same epoch (:func:`abandon`): the objects the row names are deleted (missing is
success), then the row is dropped; if the deletes fail too, the row stays "uploading"
and the next pass abandons it. A crash leaves the "uploading" row: the next daemon (a
newer epoch) abandons it the same way before uploading again. A
:class:`~filechannel.errors.FencedError` changes no row (the fenced epoch can change
nothing; the newer epoch abandons it) but deletes the objects of the attempt, which no
committed row names. Before each object write the epoch is checked again, so an
uploader paused and overtaken stops at its next write, not only at its next commit; a
write already in flight when the pause began completes on resume, and is then deleted
with the rest of the attempt (all writes of the attempt have returned by then). If those
deletes fail, the next daemon's listing sweep deletes them (their epoch names no row).

The segment's bytes go to tier-2 unchanged; each chunk is read from the open file with
``pread`` just before it is written, so memory holds at most ``concurrency`` chunks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..engine.compressed import Z_HEADER, CompressedInfo, decode_table, table_length
from ..errors import CorruptRecordError, FencedError, StorageError, os_errors
from .layout import UPLOADED, UPLOADING, SegmentRecord, encode_manifest, manifest_name, plan_chunks
from .metadata import TierMetadata
from .storage import ChunkStorage

log = logging.getLogger("filechannel")


class RateLimiter:
    """Paces byte transfers to ``bytes_per_s`` across threads (a token bucket of one second's bytes).

    ``None`` means unlimited. The bucket starts empty, so the rate holds from the first
    byte (a daemon restarted in a loop never bursts). A transfer larger than the bucket
    waits until its bytes have accrued, so the long-run rate holds for any chunk size.
    Thread-safe.
    """

    def __init__(self, bytes_per_s: int | None) -> None:
        self.bytes_per_s = bytes_per_s
        self._lock = threading.Lock()
        self._available = 0.0
        self._stamp = time.monotonic()

    def acquire(self, nbytes: int) -> None:
        """Wait until ``nbytes`` may be sent (at once when unlimited)."""
        if self.bytes_per_s is None:
            return
        with self._lock:  # one waiter at a time keeps the pacing fair and the arithmetic simple
            now = time.monotonic()
            self._available = min(float(self.bytes_per_s), self._available + (now - self._stamp) * self.bytes_per_s)
            self._stamp = now
            self._available -= nbytes
            debt = -self._available / self.bytes_per_s if self._available < 0 else 0.0
            if debt > 0:
                time.sleep(debt)  # pacing, not synchronisation: the rate limit is a wait by definition
                self._available = 0.0
                self._stamp = time.monotonic()


@dataclass(frozen=True)
class SegmentToUpload:
    """A sealed segment in its ``.seg.z`` form: the file, and what its header says."""

    path: str
    base_offset: int
    end_offset: int
    max_timestamp: int

    @classmethod
    def of(cls, path: str, info: CompressedInfo) -> SegmentToUpload:
        """The segment at ``path`` whose table is ``info``."""
        return cls(path, info.base_offset, info.end_offset, info.max_timestamp)


def checked_size(fd: int, segment: SegmentToUpload) -> int:
    """The size of the open ``.seg.z``, once its table (CRC-checked) says the same segment and
    ends its last block exactly there: a damaged copy is never uploaded, since tier-2 may
    become the only copy."""
    with os_errors("read", segment.path):
        size = os.fstat(fd).st_size
        head = os.pread(fd, Z_HEADER.size, 0)
    length = table_length(head) if len(head) == Z_HEADER.size else size + 1
    if length > size:
        raise CorruptRecordError(
            f"compressed segment {segment.path} ({size} bytes) is shorter than its header and table: not uploading it; "
            "run 'filechannel check' on the channel"
        )
    with os_errors("read", segment.path):
        info = decode_table(os.pread(fd, length, 0), segment.path)
    last = info.blocks[-1] if info.blocks else None
    end = last.file_position + last.compressed_length if last is not None else info.table_size
    if (info.base_offset, info.end_offset) != (segment.base_offset, segment.end_offset) or end != size:
        raise CorruptRecordError(
            f"compressed segment {segment.path} is {size} bytes and holds offsets [{info.base_offset}, "
            f"{info.end_offset}) but its block table ends at byte {end} and [{segment.base_offset}, "
            f"{segment.end_offset}) was to be uploaded: not uploading it; run 'filechannel check' on the channel"
        )
    return size


def upload_segment(
    storage: ChunkStorage,
    metadata: TierMetadata,
    epoch: int,
    channel: str,
    segment: SegmentToUpload,
    *,
    chunk_bytes: int,
    concurrency: int = 4,
    limiter: RateLimiter | None = None,
) -> SegmentRecord:
    """Upload ``segment`` of ``channel`` as epoch ``epoch``; return its record, state "uploaded".

    On any failure but :class:`FencedError`, the attempt is abandoned (row dropped, objects
    deleted) before the error is raised again.
    """
    with os_errors("open segment", segment.path):
        fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = checked_size(fd, segment)
        chunks = plan_chunks(channel, segment.base_offset, epoch, size, chunk_bytes)
        metadata.begin_upload(epoch, channel, segment.base_offset, segment.end_offset, size, segment.max_timestamp, chunks)
        try:
            pace = limiter or RateLimiter(None)

            def put(i: int) -> None:
                chunk = chunks[i]
                with os_errors("read", segment.path):
                    data = os.pread(fd, chunk.length, chunk.position)
                if len(data) != chunk.length:
                    raise StorageError(
                        f"{segment.path} ended at byte {chunk.position + len(data)} while uploading it, not at "
                        f"{size}: it changed under the uploader; nothing was deleted, the next pass retries"
                    )
                pace.acquire(chunk.length)
                check_fence(metadata, epoch)
                storage.write(chunk.name, data)

            if concurrency <= 1 or len(chunks) == 1:
                for i in range(len(chunks)):
                    put(i)
            else:
                with ThreadPoolExecutor(min(concurrency, len(chunks)), thread_name_prefix="filechannel-upload") as pool:
                    futures = [pool.submit(put, i) for i in range(len(chunks))]
                    try:
                        for future in futures:
                            future.result()
                    except BaseException:
                        for future in futures:  # the chunks not started yet are not written (nor retried)
                            future.cancel()
                        raise  # leaving the pool waits for the writes in flight: the abandon runs after them
            manifest = manifest_name(channel, segment.base_offset, epoch)
            record = SegmentRecord(
                channel,
                segment.base_offset,
                segment.end_offset,
                size,
                segment.max_timestamp,
                UPLOADED,
                epoch,
                chunks,
                manifest,
            )
            check_fence(metadata, epoch)
            storage.write(manifest, encode_manifest(record))
            return metadata.finish_upload(epoch, channel, segment.base_offset, chunks, manifest)
        except FencedError:
            # Overtaken: the row is the new epoch's to abandon, but what this attempt wrote
            # (names unique to this epoch, named by no committed row) it deletes itself, so
            # a paused uploader leaves no object behind even if it resumed mid-write.
            try:
                delete_objects(storage, [c.name for c in chunks] + [manifest_name(channel, segment.base_offset, epoch)])
            except Exception as exc:
                log.warning("tier: fenced upload of %s@%d left objects to sweep: %s", channel, segment.base_offset, exc)
            raise
        except BaseException:
            try:
                abandon(storage, metadata, epoch, metadata_row(metadata, channel, segment.base_offset))
            except Exception as exc:  # the original error is the one the caller must see
                log.warning("tier: the failed upload of %s@%d stays to be abandoned: %s", channel, segment.base_offset, exc)
            raise
    finally:
        os.close(fd)


def check_fence(metadata: TierMetadata, epoch: int) -> None:
    """Raise :class:`FencedError` if a newer epoch than ``epoch`` was taken."""
    current = metadata.current_epoch()
    if current != epoch:
        raise FencedError(
            f"tier uploader of epoch {epoch} was overtaken by epoch {current} (another daemon took over "
            f"{metadata.path}): this one stops; the newer one cleans up what it left"
        )


def metadata_row(metadata: TierMetadata, channel: str, base_offset: int) -> SegmentRecord | None:
    """The "uploading" row of ``channel`` at ``base_offset``, or None."""
    for record in metadata.segments(channel, states=(UPLOADING,)):
        if record.base_offset == base_offset:
            return record
    return None


def abandon(storage: ChunkStorage, metadata: TierMetadata, epoch: int, record: SegmentRecord | None) -> None:
    """Delete every object an "uploading" ``record`` (of any epoch) may have written, then drop its row.

    Objects first: if a delete fails, the row stays and still names them for the next try.
    """
    if record is None:
        return
    names = [c.name for c in record.chunks] + [manifest_name(record.channel, record.base_offset, record.epoch)]
    delete_objects(storage, names)
    metadata.abandon_upload(epoch, record.channel, record.base_offset)


def delete_objects(storage: ChunkStorage, names: list[str]) -> None:
    """Delete ``names`` (missing is success); the first failure is raised after trying them all."""
    first: Exception | None = None
    for name in names:
        try:
            storage.delete(name)
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first
