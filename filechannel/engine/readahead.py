"""Readahead for compressed segments: the next blocks decompress on other threads while
the reader decodes the current one.

Reading a compressed segment costs mostly zstd decompression, which on one core is
slower than reading a raw segment. The C module ``_readahead`` reads and decompresses
blocks on worker threads that never take the GIL (Python threads would need it between
blocks, while the reader holds it decoding, and gained nothing: DESIGN.md, "Reading").
Readahead starts once a reader moves from one block to the next (a reader that
seeks and reads one block decompresses nothing more), and holds at most
``READAHEAD_BLOCKS`` blocks per segment, decompressed by ``READAHEAD_THREADS`` threads per
process and by the reader itself while it waits for a block. A cursor on the last blocks
of a segment starts reading the next compressed segment ahead (:meth:`BlockReadahead.start`),
so the threads do not run dry at every segment's end.

Without the C module, without libzstd, or with one CPU, blocks decompress with
python-zstandard on the reader's thread (:meth:`CompressedSegment.read_block`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..errors import ChannelClosedError
from .compressed import Block, BlockData, CompressedSegment, decompress_block

if TYPE_CHECKING:
    from ._readahead import Job


class _Readahead(Protocol):
    """What this module uses of the C module (see _readahead.pyi): ``_readahead`` is it, or None."""

    available: bool

    def set_threads(self, n: int, /) -> None: ...

    def submit(self, fd: int, position: int, length: int, raw_length: int, /) -> Job: ...

    def submit_bytes(self, data: bytes, raw_length: int, /) -> Job: ...


_readahead: _Readahead | None
try:
    from . import _readahead
except ImportError:  # installed without a C compiler
    _readahead = None
NATIVE = _readahead is not None  # whether the C module loaded (filechannel.native_extensions())

READAHEAD_BLOCKS = 4


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# One CPU is the reader's, and a reader waiting for a block decompresses the next ones
# itself: more workers than the other CPUs only make the reader wait for a CPU. Two at most:
# two keep ahead of one reader (decompressing runs slower than decoding).
READAHEAD_THREADS = max(1, min(2, usable_cpus() - 1))
ENABLED = _readahead is not None and _readahead.available and usable_cpus() > 1
if ENABLED and _readahead is not None:  # (ENABLED implies the second test, which the type checker needs)
    _readahead.set_threads(READAHEAD_THREADS)


class BlockReadahead:
    """Decompressed blocks of one open compressed segment, the next ones read ahead.

    Used by one reader thread; ``close`` may come from any thread at any moment: it waits
    for the block being read and for the blocks in flight (so the segment's descriptor can
    be closed after it, and no job ever reads a closed or reused descriptor), and a
    ``block`` after it raises :class:`ChannelClosedError`.
    """

    def __init__(self, seg: CompressedSegment, enabled: bool | None = None) -> None:
        self.seg = seg
        self.enabled = ENABLED if enabled is None else enabled
        self._ahead: dict[int, Job] = {}
        self._last = -1
        self._lock = threading.Lock()  # block, start and close: jobs are submitted and cancelled under it
        self._closed = False

    def block(self, i: int) -> BlockData:
        """Block ``i`` decompressed; raises as :meth:`CompressedSegment.read_block` does."""
        if not self.enabled:
            return self.seg.read_block(i)
        with self._lock:
            if self._closed:
                raise ChannelClosedError(f"the reader of compressed segment {self.seg.path!r} was closed")
            sequential = i == self._last + 1
            if not sequential:
                self._drop()
            self._last = i
            if not self.seg.fits(i):
                return self.seg.block_result(i, self.seg.cut_short)
            job = self._ahead.pop(i, None) or self._submit(i)
            if sequential:
                for j in range(i + 1, min(i + 1 + READAHEAD_BLOCKS, len(self.seg.info.blocks))):
                    if j not in self._ahead and self.seg.fits(j):
                        self._ahead[j] = self._submit(j)
            return self.seg.block_result(i, job.result)

    def start(self) -> None:
        """Read the first blocks ahead now, before the reader asks for block 0 (a reader
        nearing the end of the segment before this one calls it)."""
        with self._lock:
            if self.enabled and not self._closed and self._last == -1 and not self._ahead:
                for j in range(min(READAHEAD_BLOCKS, len(self.seg.info.blocks))):
                    if self.seg.fits(j):
                        self._ahead[j] = self._submit(j)

    def _submit(self, i: int) -> Job:
        b = self.seg.info.blocks[i]
        assert _readahead is not None  # readahead is enabled only where the module loaded
        return _readahead.submit(self.seg.fd, b.file_position, b.compressed_length, b.raw_length)

    def _drop(self) -> None:
        for job in self._ahead.values():
            if not job.cancel():
                job.wait()
        self._ahead.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()


def decompress_fetched(body: bytes, block: Block) -> Callable[[], BlockData]:
    """The decompression of a block whose bytes were fetched already (a tier-2 read): queued
    to the C workers now, where they run, so it proceeds without the GIL while the fetching
    thread goes on with the next request; the returned call waits for it (running it on
    the caller's thread if no worker has started it). Without the C module, the call
    decompresses with python-zstandard. Errors raise from the call, as
    :func:`~filechannel.engine.compressed.block_result` expects."""
    if ENABLED:
        assert _readahead is not None  # ENABLED: the module loaded
        return _readahead.submit_bytes(body if type(body) is bytes else bytes(body), block.raw_length).result
    return lambda: decompress_block(body, block)


class LocalBlocks:
    """The blocks of a local ``.seg.z``: its open file and its readahead, as one object.

    One seam for reading blocks: a cursor or a check reads a compressed segment through
    ``info``, ``path``, ``block(i)``, ``start()``, ``where(i)`` and ``close()``, and the
    same calls read an uploaded segment from tier-2
    (:class:`filechannel.tiering.remote_segment.RemoteSegment`).
    """

    def __init__(self, path: str) -> None:
        self.seg = CompressedSegment.open(path)
        self.info = self.seg.info
        self.path = path
        self._ahead = BlockReadahead(self.seg)

    def block(self, i: int) -> BlockData:
        return self._ahead.block(i)

    def start(self) -> None:
        self._ahead.start()

    def where(self, i: int) -> str:
        """Where block ``i``'s bytes are, for messages: the file."""
        return self.path

    def close(self) -> None:
        """Close the readahead first (it waits for jobs that read the descriptor), then the file."""
        try:
            self._ahead.close()
        finally:
            self.seg.close()
