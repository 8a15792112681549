"""Choosing a partition: Kafka's default, so a key lands where a Kafka client would put it.

Keyed records go to ``murmur2(key) & 0x7fffffff % partitions`` (Kafka's murmur2, as in the
Java client and kafka-python): stable across processes, runs and machines. Records
without a key are spread round-robin.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

Partitioner = Callable[[bytes | None, int], int]


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 hash (seed 0x9747b28c), as a signed int like Java's."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    extra = length % 4
    tail = length & ~3
    if extra >= 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


class DefaultPartitioner:
    """murmur2 for keys, round-robin for records without one. Thread-safe."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def __call__(self, key: bytes | None, partitions: int) -> int:
        if key is None:
            # next() of an itertools.count is atomic in CPython: no lock on the send path
            return next(self._counter) % partitions
        return (murmur2(key) & 0x7FFFFFFF) % partitions
