"""Readahead for compressed segments: the next blocks decompress on other threads while
the reader decodes the current one.

Reading a compressed segment costs mostly zstd decompression, which runs on one core at
about half the speed a raw segment is read. The C module ``_readahead`` reads and
decompresses blocks on worker threads that never take the GIL (Python threads would
need it between blocks, while the reader holds it decoding; measured, they gained
nothing). Readahead starts once a reader moves from one block to the next (a reader that
seeks and reads one block decompresses nothing more), never crosses a segment, and holds
at most ``READAHEAD_BLOCKS`` blocks per reader, decompressed by ``READAHEAD_THREADS``
threads per process.

Without the C module, without libzstd, or with one CPU, blocks decompress with
python-zstandard on the reader's thread (:meth:`CompressedSegment.read_block`).
"""

from __future__ import annotations

import os

from .compressed import BlockData, CompressedSegment

try:
    from . import _readahead
except ImportError:  # installed without a C compiler
    _readahead = None  # type: ignore[assignment]

READAHEAD_BLOCKS = 4


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# Two, even with two CPUs where the reader keeps one busy: with one worker, 64 KiB records
# read at 0.42x of raw and 1 KiB at 0.61x, with two at 0.52x and 0.56x (means of the
# bench's compressed reads, 5 to 7 runs each). More did not help on two CPUs.
READAHEAD_THREADS = 2
ENABLED = _readahead is not None and _readahead.available and _cpus() > 1
if ENABLED:
    _readahead.set_threads(READAHEAD_THREADS)


class BlockReadahead:
    """Decompressed blocks of one open compressed segment, the next ones read ahead.

    Used by one reader thread. ``close`` waits for blocks still being read, so the
    segment's descriptor can be closed after it.
    """

    def __init__(self, seg: CompressedSegment, enabled: bool | None = None) -> None:
        self.seg = seg
        self.enabled = ENABLED if enabled is None else enabled
        self._ahead: dict[int, _readahead.Job] = {}
        self._last = -1

    def block(self, i: int) -> BlockData:
        """Block ``i`` decompressed; raises as :meth:`CompressedSegment.read_block` does."""
        if not self.enabled:
            return self.seg.read_block(i)
        sequential = i == self._last + 1
        if not sequential:
            self._drop()
        self._last = i
        job = self._ahead.pop(i, None) or self._submit(i)
        if sequential:
            for j in range(i + 1, min(i + 1 + READAHEAD_BLOCKS, len(self.seg.info.blocks))):
                if j not in self._ahead:
                    self._ahead[j] = self._submit(j)
        return self.seg.block_result(i, job.result)

    def _submit(self, i: int) -> _readahead.Job:
        b = self.seg.info.blocks[i]
        return _readahead.submit(self.seg.fd, b.file_position, b.compressed_length, b.raw_length)

    def _drop(self) -> None:
        for job in self._ahead.values():
            if not job.cancel():
                job.wait()
        self._ahead.clear()

    def close(self) -> None:
        self._drop()
