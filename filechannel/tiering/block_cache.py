"""A bounded in-memory cache of decompressed tier-2 blocks, least recently used first out.

Invariant: the bytes it holds never exceed its capacity (``tier_cache_bytes``), whatever
is read: a ``put`` evicts the least recently used blocks first, and a block larger than
the whole capacity is not kept. ``peak_bytes`` is the most it ever held, so a test can
assert the bound on the cache's own accounting. Thread-safe (readers and prefetch
threads share one cache per channel).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

from ..engine.compressed import BlockData


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
