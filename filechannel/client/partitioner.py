"""Choosing a partition: Kafka's default, so a key lands where a Kafka client would put it.

Keyed records go to ``murmur2(key) & 0x7fffffff % partitions`` (Kafka's murmur2, as in the
Java client and kafka-python): stable across processes, runs and machines. Records
without a key are spread round-robin.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable

Partitioner = Callable[[bytes | bytearray | memoryview | None, int], int]  # the key as sent (bytes-like), or None


def murmur2(data: bytes | bytearray | memoryview) -> int:
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

    def __call__(self, key: bytes | bytearray | memoryview | None, partitions: int) -> int:
        if key is None:
            # next() of an itertools.count is atomic in CPython: no lock on the send path
            return next(self._counter) % partitions
        return (murmur2(key) & 0x7FFFFFFF) % partitions


def as_partitioner(fn: Callable[..., int]) -> Partitioner:
    """``fn`` as this module's ``f(key_bytes, partition_count)``.

    kafka-python 2.x calls a partitioner ``f(key_bytes, all_partitions, available_partitions)``
    with lists of partition numbers; one that takes three positional arguments is called
    that way (every partition is always available here), with the lists made once per
    partition count, not per send.
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: ours
        return fn
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is inspect.Parameter.empty]
    if len(required) < 3:
        return fn
    lists: dict[int, list[int]] = {}

    def kafka_python_style(key: bytes | bytearray | memoryview | None, partitions: int) -> int:
        every = lists.get(partitions)
        if every is None:
            every = lists[partitions] = list(range(partitions))
        return fn(key, every, every)

    return kafka_python_style
