"""Upload one sealed, compressed segment (``B.seg.z``) to tier-2: chunks, then manifest, then metadata.

The order of the metadata states around the storage calls (see :mod:`.metadata`):

1. ``begin_upload`` commits the segment "uploading" with every chunk name it will write;
2. the chunks are written on a pool of writers (``tier_concurrency`` in flight, shared by the
   segments a daemon has under way, paced to ``tier_upload_bytes_per_s``), then the manifest
   beside them;
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
``pread`` just before it is written, so memory holds at most one chunk per writer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from ..engine.compressed import CompressedInfo, read_table
from ..errors import CorruptRecordError, FencedError, NotOwnerError, StorageError, os_errors
from .layout import UPLOADED, UPLOADING, ChunkRecord, SegmentRecord, encode_manifest, manifest_name, plan_chunks
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
    advice = "not uploading it; run 'filechannel check' on the channel"
    try:
        with os_errors("read", segment.path):
            size = os.fstat(fd).st_size
            info = read_table(lambda position, length: os.pread(fd, length, position), size, segment.path)
    except CorruptRecordError as exc:
        raise CorruptRecordError(f"{exc}; {advice}") from exc
    end = info.blocks_end
    if (info.base_offset, info.end_offset) != (segment.base_offset, segment.end_offset) or end != size:
        raise CorruptRecordError(
            f"compressed segment {segment.path} is {size} bytes and holds offsets [{info.base_offset}, "
            f"{info.end_offset}) but its block table ends at byte {end} and [{segment.base_offset}, "
            f"{segment.end_offset}) was to be uploaded: {advice}"
        )
    return size


class SegmentUpload:
    """One segment's upload under way: begun in the metadata, its chunks submitted to a pool.

    Made by :func:`start_upload`; then exactly one of :meth:`finish` (wait for the chunks,
    write the manifest, commit "uploaded") or :meth:`abandon` (undo it: an earlier upload
    failed), which closes the segment's file. Several may be under way on one pool, so a
    daemon keeps the pool's writes in flight across segment boundaries; it finishes them in
    offset order and abandons every later one when one fails, so the "uploaded" rows of a
    channel only ever grow at the end of its tier-2 range.

    On any failure but :class:`FencedError`, ``finish`` abandons the attempt (objects
    deleted, row dropped) before raising; a fenced attempt deletes its objects and leaves
    the row to the newer epoch.
    """

    def __init__(
        self,
        storage: ChunkStorage,
        metadata: TierMetadata,
        epoch: int,
        channel: str,
        segment: SegmentToUpload,
        fd: int,
        chunks: list[ChunkRecord],
        guard: Callable[[], None] | None = None,
    ) -> None:
        self.storage = storage
        self.guard = guard
        self.metadata = metadata
        self.epoch = epoch
        self.channel = channel
        self.segment = segment
        self.chunks = chunks
        self._fd = fd
        self._futures: list[Future[None]] = []

    @property
    def chunks_left(self) -> int:
        """Chunks submitted and not yet written (queued or in flight)."""
        return sum(1 for f in self._futures if not f.done())

    def submit(self, pool: Executor, limiter: RateLimiter) -> None:
        """Queue the write of every chunk on ``pool``, paced by ``limiter`` (once, by :func:`start_upload`)."""
        size = self.chunks[-1].position + self.chunks[-1].length

        def put(chunk: ChunkRecord) -> None:
            with os_errors("read", self.segment.path):
                data = os.pread(self._fd, chunk.length, chunk.position)
            if len(data) != chunk.length:
                raise StorageError(
                    f"{self.segment.path} ended at byte {chunk.position + len(data)} while uploading it, not at "
                    f"{size}: it changed under the uploader; nothing was deleted, the next pass retries"
                )
            limiter.acquire(chunk.length)
            check_fence(self.metadata, self.epoch)
            self.storage.write(chunk.name, data)

        for chunk in self.chunks:
            self._futures.append(pool.submit(put, chunk))

    def _stop_writes(self) -> None:
        """Cancel the chunks not started (they are not written, nor retried) and wait for those in flight."""
        for future in self._futures:
            future.cancel()
        wait(self._futures)

    def finish(self) -> SegmentRecord:
        """Wait for the chunks, write the manifest, commit "uploaded"; return the record."""
        seg = self.segment
        try:
            try:
                for future in self._futures:
                    future.result()
            except BaseException:
                self._stop_writes()  # the abandon runs after every write of the attempt has returned
                raise
            manifest = manifest_name(self.channel, seg.base_offset, self.epoch)
            record = SegmentRecord(
                self.channel,
                seg.base_offset,
                seg.end_offset,
                self.chunks[-1].position + self.chunks[-1].length,
                seg.max_timestamp,
                UPLOADED,
                self.epoch,
                tuple(self.chunks),
                manifest,
            )
            check_fence(self.metadata, self.epoch)
            self.storage.write(manifest, encode_manifest(record))
            if self.guard is not None:
                self.guard()  # a write, then a verify: still the prefix's owner, at its newest epoch
            return self.metadata.finish_upload(self.epoch, self.channel, seg.base_offset, self.chunks, manifest)
        except NotOwnerError:
            raise  # another root owns the prefix now: its objects and rows are its business, ours stay as they are
        except FencedError:
            self._delete_fenced()
            raise
        except BaseException:
            self._abandon_quietly()
            raise
        finally:
            self._close()

    def abandon(self) -> None:
        """Stop this upload and undo it (objects deleted, row dropped): an earlier one failed.
        Never raises: what cannot be undone now, the next pass (or daemon) undoes."""
        try:
            self._stop_writes()
            self._abandon_quietly()  # objects first; if fenced, the row is the newer epoch's to drop
        finally:
            self._close()

    def _delete_fenced(self) -> None:
        # Overtaken: the row is the new epoch's to abandon, but what this attempt wrote
        # (names unique to this epoch, named by no committed row) it deletes itself, so
        # a paused uploader leaves no object behind even if it resumed mid-write.
        seg = self.segment
        try:
            names = [c.name for c in self.chunks] + [manifest_name(self.channel, seg.base_offset, self.epoch)]
            delete_objects(self.storage, names)
        except Exception as exc:
            log.warning("tier: fenced upload of %s@%d left objects to sweep: %s", self.channel, seg.base_offset, exc)

    def _abandon_quietly(self) -> None:
        # The error that stopped the upload is the one the caller must see, not this one's.
        try:
            abandon(self.storage, self.metadata, self.epoch, metadata_row(self.metadata, self.channel, self.segment.base_offset))
        except Exception as exc:
            log.warning("tier: the failed upload of %s@%d stays to be abandoned: %s", self.channel, self.segment.base_offset, exc)

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def start_upload(
    storage: ChunkStorage,
    metadata: TierMetadata,
    epoch: int,
    channel: str,
    segment: SegmentToUpload,
    *,
    chunk_bytes: int,
    pool: Executor,
    limiter: RateLimiter | None = None,
    guard: Callable[[], None] | None = None,
) -> SegmentUpload:
    """Begin the upload of ``segment`` of ``channel`` as epoch ``epoch``: the "uploading" row
    committed, every chunk submitted to ``pool``. The caller then calls ``finish`` or ``abandon``.
    ``guard`` runs after the manifest is written and before the commit; it raises to stop a
    publication (:meth:`.ownership.PrefixGuard.verify`)."""
    with os_errors("open segment", segment.path):
        fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = checked_size(fd, segment)
        chunks = plan_chunks(channel, segment.base_offset, epoch, size, chunk_bytes)
        metadata.begin_upload(epoch, channel, segment.base_offset, segment.end_offset, size, segment.max_timestamp, chunks)
    except BaseException:
        os.close(fd)
        raise
    upload = SegmentUpload(storage, metadata, epoch, channel, segment, fd, list(chunks), guard)
    try:
        upload.submit(pool, limiter or RateLimiter(None))
    except BaseException:  # the pool is shut down: nothing of this attempt will be written
        upload.abandon()
        raise
    return upload


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
    """Upload ``segment`` of ``channel`` as epoch ``epoch``, ``concurrency`` chunks in flight; return
    its record, state "uploaded". Failures as :class:`SegmentUpload`'s."""
    with ThreadPoolExecutor(concurrency, thread_name_prefix="filechannel-upload") as pool:
        upload = start_upload(storage, metadata, epoch, channel, segment, chunk_bytes=chunk_bytes, pool=pool, limiter=limiter)
        return upload.finish()


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


def finish_delete(storage: ChunkStorage, metadata: TierMetadata, epoch: int, channel: str, record: SegmentRecord) -> None:
    """Delete the objects of a "deleting" ``record`` of ``channel`` (missing is fine; a merged
    object another segment still uses stays, and goes with the last of them), then its row."""
    names = list(dict.fromkeys(c.name for c in record.chunks)) + ([record.manifest] if record.manifest else [])
    shared = metadata.shared(channel, record.base_offset, names)
    delete_objects(storage, [n for n in names if n not in shared])
    metadata.finish_delete(epoch, channel, record.base_offset)


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
