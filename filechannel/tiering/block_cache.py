"""Bounded caches of decompressed tier-2 blocks, least recently used first out: in memory
(:class:`BlockCache`, the default) or in files of a folder (:class:`DiskBlockCache`).

Invariant: the bytes it holds never exceed its capacity (``tier_cache_bytes``), whatever
is read: a ``put`` evicts the least recently used blocks first, and a block larger than
the whole capacity is not kept. ``peak_bytes`` is the most it ever held, so a test can
assert the bound on the cache's own accounting. Thread-safe (readers and prefetch
threads share one cache per channel).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Hashable

from ..engine.compressed import BlockData
from ..engine.files import private_folder, unlink_if_exists
from ..errors import os_errors


class BlockCache:
    """Decompressed blocks by key, at most ``capacity`` bytes of them (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[Hashable, BlockData] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self.peak_bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        with self._lock:
            return self._bytes

    def get(self, key: Hashable) -> BlockData | None:
        """The block under ``key`` (now the most recently used), or None."""
        with self._lock:
            data = self._blocks.get(key)
            if data is not None:
                self._blocks.move_to_end(key)
            return data

    def put(self, key: Hashable, data: BlockData) -> None:
        """Keep ``data`` under ``key``, evicting the least recently used blocks to stay in bounds."""
        size = len(data)
        if size > self.capacity:
            return
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            while self._blocks and self._bytes + size > self.capacity:
                _key, evicted = self._blocks.popitem(last=False)
                self._bytes -= len(evicted)
            self._blocks[key] = data
            self._bytes += size
            self.peak_bytes = max(self.peak_bytes, self._bytes)

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self._bytes = 0


class DiskBlockCache:
    """Decompressed blocks in files of a private folder, at most ``capacity`` bytes of them.

    The same contract as :class:`BlockCache` (``get``, ``put``, ``clear``, ``capacity``,
    ``nbytes``, ``peak_bytes``) for a cache larger than memory should hold
    (``tier_cache_dir``): a block's bytes live in a file, and memory holds only the index.
    The folder is ``<folder>/fc-cache-<pid>-<random>``, private to this cache: no two
    processes share files, so eviction needs no cross-process lock. It is removed by
    :meth:`clear` (the channel's close); one left by a process that died is removed by the
    next cache made in the same folder. Each block gets a new file name and enters the index
    only once written whole; nothing is fsynced (a cache: a crash loses only warm blocks). A file that cannot be
    read back is a miss, never an error: the block is fetched again (so is one that cannot
    be written: a full cache disk slows reads, it does not fail them).
    """

    PREFIX = "fc-cache-"

    def __init__(self, capacity: int, folder: str) -> None:
        self.capacity = capacity
        with os_errors("create the tier-2 cache folder", folder):
            self.folder = private_folder(folder, self.PREFIX)
        self._sizes: OrderedDict[Hashable, int] = OrderedDict()
        self._files: dict[Hashable, str] = {}
        self._lock = threading.Lock()
        self._bytes = 0
        self._next = 0
        self.peak_bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes held now (in files)."""
        with self._lock:
            return self._bytes

    def get(self, key: Hashable) -> BlockData | None:
        """The block under ``key`` read back from its file (now the most recently used), or None."""
        with self._lock:
            path = self._files.get(key)
            if path is None:
                return None
            self._sizes.move_to_end(key)
            size = self._sizes[key]
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            data = b""
        if len(data) != size:  # evicted meanwhile, or the file was damaged: fetch again
            return None
        return data

    def put(self, key: Hashable, data: BlockData) -> None:
        """Write ``data`` to a file under ``key``, evicting the least recently used blocks first."""
        size = len(data)
        if size > self.capacity:
            return
        with self._lock:
            evict = []
            if key in self._files:
                evict.append(self._files.pop(key))
                self._bytes -= self._sizes.pop(key)
            while self._sizes and self._bytes + size > self.capacity:
                old, old_size = self._sizes.popitem(last=False)
                evict.append(self._files.pop(old))
                self._bytes -= old_size
            self._next += 1
            path = os.path.join(self.folder, f"{self._next:016d}.block")
            self._bytes += size  # counted before the write: the bound holds while it runs
            self.peak_bytes = max(self.peak_bytes, self._bytes)
        for old_path in evict:
            unlink_if_exists(old_path)
        try:  # a unique name, in the index only once whole: no temp file and rename needed
            with open(path, "xb") as f:
                f.write(data)
        except OSError:  # a full or read-only cache disk: keep reading, uncached
            with self._lock:
                self._bytes -= size
            unlink_if_exists(path)
            return
        with self._lock:
            self._files[key] = path
            self._sizes[key] = size

    def clear(self) -> None:
        """Forget every block and remove the folder."""
        with self._lock:
            self._sizes.clear()
            self._files.clear()
            self._bytes = 0
        shutil.rmtree(self.folder, ignore_errors=True)
