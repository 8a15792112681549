"""CRC-32C, the checksum of every frame, segment header, table, manifest and head.

``crc32c(data, previous=0)`` continues ``previous`` over ``data``, as the crc32c package's
function does: the C codec's (filechannel/engine/_codec.c: the CPU's CRC instruction, the same
values, checked against the package in tests/channel/test_codec.py) where the extension is
built, else the package's. Why not the package always: importing it imports
``importlib.metadata`` for its version, which cost more than the rest of the engine's imports
together at every process start (every ``filechannel`` command, every worker).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


class _Crc32c(Protocol):
    def __call__(self, data: ReadableBuffer, previous: int = 0, /) -> int: ...


crc32c: _Crc32c
try:
    from ._codec import crc32c
except ImportError:  # no C build: the package's (it has a software fallback of its own)
    from crc32c import crc32c

__all__ = ["crc32c"]
