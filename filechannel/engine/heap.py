"""Room in glibc's heap for batches of records, so that freeing one does not give it back.

Invariant: once a process has made a reader (:func:`make_room`, from ``Cursor``), glibc's
mmap threshold is at least :data:`HEAP_ROOM` and its trim threshold at least twice that,
unless the process fixed them itself (``mallopt`` or a ``MALLOC_*_`` environment variable
turns glibc's adjustment off, and its settings stand).

Why: values of over 512 bytes are ``malloc``'d one by one, a batch of them comes from the
top of the heap, and when the batch is freed together glibc gives the top back to the
kernel as soon as it exceeds the trim threshold (128 KiB in a fresh process, 512 KiB
once a 256 KiB read chunk was freed). The next batch then faults every page in again,
zeroed: a fresh process's ``recv_many`` of large records faulted pages in for every
batch and ran far slower than with the room, slower even than queuelib's ``pop`` of one
record at a time (DESIGN.md, "Reading"). Whether a process was hit was luck: any process
that once freed a large buffer was not.

How: glibc raises both thresholds itself when a process frees a memory-mapped block
larger than the mmap threshold (up to 32 MiB): the mmap threshold to that block's size,
the trim threshold to twice it. :func:`make_room` allocates and frees one such block of
``HEAP_ROOM`` bytes: the state of a process that once freed an 8 MiB buffer, with glibc's
adjustment still on for larger ones. No ``mallopt``: setting a threshold would turn the
adjustment off for the rest of the process. Under another allocator it is one allocation
freed (``calloc``'d and never touched, so no page of it is faulted in), nothing more.
"""

from __future__ import annotations

import functools

# Bytes a consumer's fill reads at most (client/consumer.py, _FILL_BYTES): batches up to
# twice that are freed without giving the heap back.
HEAP_ROOM = 8 << 20


@functools.cache
def make_room() -> None:
    """Raise glibc's malloc thresholds to ``HEAP_ROOM`` (and twice it); once per process."""
    bytes(HEAP_ROOM)  # calloc'd (memory-mapped, as larger than the threshold) and freed at once
