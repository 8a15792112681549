"""The fastest a compressed read could possibly run on this machine's CPUs.

Reading a ``.seg.z`` takes two kinds of work: decompressing blocks (any thread) and
decoding records out of them (the reader's thread). Measured alone, one thread each, in
the run itself: libzstd decompressing every block into one reused buffer, and the record
decoder going through the decompressed blocks. With every CPU busy all the time and no
cost to hand a block from one thread to another, a read of those segments takes at least
``max(decode, (decompress + decode) / cpus)``; the real read (readahead threads, the
reader's own calls, the GIL) can only be slower. The compressed-read row reports that
bound next to the ratio it measured, so a miss can be told from a limit of the machine.
"""

from __future__ import annotations

import ctypes
import glob
import os
import time
from typing import Any


def _libzstd() -> Any:
    for name in ("libzstd.so.1", "libzstd.1.dylib", "libzstd.so", "libzstd.dylib"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.ZSTD_createDCtx.restype = ctypes.c_void_p
        lib.ZSTD_decompressDCtx.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
        lib.ZSTD_decompressDCtx.restype = ctypes.c_size_t
        lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
        return lib
    return None


def compressed_read_floor_s(folder: str, batch: int, repeats: int) -> dict[str, float] | None:
    """Seconds a read of the compressed segments in ``folder`` takes at the very least on
    this machine's CPUs (best of ``repeats`` per kind of work), and the raw bytes they hold;
    None without libzstd or without compressed segments."""
    from filechannel.engine.compressed import CompressedSegment
    from filechannel.engine.readahead import usable_cpus
    from filechannel.engine.record import decode_records

    lib = _libzstd()
    paths = sorted(glob.glob(os.path.join(folder, "*.seg.z")))
    if lib is None or not paths:
        return None
    bodies, blocks = [], []
    for path in paths:
        seg = CompressedSegment.open(path)
        try:
            for i, b in enumerate(seg.info.blocks):
                bodies.append((os.pread(seg.fd, b.compressed_length, b.file_position), b.raw_length))
                blocks.append(seg.read_block(i))
        finally:
            seg.close()
    dctx = lib.ZSTD_createDCtx()
    out = ctypes.create_string_buffer(max(raw for _, raw in bodies))
    decompress_s = decode_s = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for body, raw in bodies:
            if lib.ZSTD_isError(lib.ZSTD_decompressDCtx(dctx, out, raw, body, len(body))):
                raise RuntimeError(f"libzstd could not decompress a block of {folder}")
        decompress_s = min(decompress_s, time.perf_counter() - t0)
        t0 = time.perf_counter()
        recs: list[Any] = []
        for block in blocks:
            pos = 0
            while True:
                pos, n = decode_records(block, pos, 0, batch, recs)
                if not n:
                    break
                recs.clear()
        decode_s = min(decode_s, time.perf_counter() - t0)
    lib.ZSTD_freeDCtx(ctypes.c_void_p(dctx))
    cpus = usable_cpus()
    return {
        "floor_s": max(decode_s, (decompress_s + decode_s) / cpus),
        "decompress_s": decompress_s,
        "decode_s": decode_s,
        "cpus": cpus,
        "raw_bytes": sum(len(b) for b in blocks),
    }
