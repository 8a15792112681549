"""The recovery point: below it, every sealed segment is known to be on disk.

Rolling does not fsync the segment it seals: that would put a 64 MiB fsync on the append
path of every roll. A background thread (the appender's sealer) fsyncs sealed segments
and then moves the recovery point up, as Kafka does with its recovery-point checkpoint.
Segments at or above the point may still be only in the page cache, which is safe as
long as the machine stays up: a killed process loses nothing the kernel already holds.

So the point records the machine's boot id with it. When a channel is opened after the
machine restarted (another boot id, or no point at all), the sealed segments from the
point on are scanned whole before anyone appends, and the log is cut at the first torn
frame (see :func:`filechannel.engine.recovery.recover`). Within one boot nothing needs scanning.

Layout of the ``recovery-point`` file (little-endian)::

    4s magic b"FCRP", u16 version (1), u16 reserved, u64 offset, 16s boot id, u32 CRC-32C

It is rewritten in place and never fsynced on its own: it is written only after the
segments below it were fsynced, so whatever version of it survives a crash is true.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from functools import cache

from ..errors import os_errors
from .checksum import crc32c
from .files import opened, read_if_exists

FILE_NAME = "recovery-point"
_MAGIC = b"FCRP"
_BODY = struct.Struct("<4sHHQ16s")
_CRC = struct.Struct("<I")
_UNKNOWN_BOOT = bytes(16)


@cache
def boot_id() -> bytes:
    """This boot of the machine, 16 bytes (Linux); zeros where the OS does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = bytes.fromhex(f.read().strip().replace("-", ""))  # a UUID's text: its 16 bytes
    except (OSError, ValueError):
        return _UNKNOWN_BOOT
    return boot if len(boot) == 16 else _UNKNOWN_BOOT


@dataclass(frozen=True)
class RecoveryPoint:
    offset: int
    boot: bytes

    @property
    def this_boot(self) -> bool:
        """Written since the machine last started, so the page cache still holds what is above it."""
        return self.boot != _UNKNOWN_BOOT and self.boot == boot_id()


def read_recovery_point(path: str) -> RecoveryPoint | None:
    """The point in ``path``; None if there is none yet, or it is torn."""
    data = read_if_exists(path, "recovery point")
    if data is None or len(data) < _BODY.size + _CRC.size or crc32c(data[: _BODY.size]) != _CRC.unpack_from(data, _BODY.size)[0]:
        return None
    magic, version, _r, offset, boot = _BODY.unpack_from(data)
    if magic != _MAGIC or version != 1:
        return None
    return RecoveryPoint(offset, boot)


def write_recovery_point(path: str, offset: int) -> None:
    """Record that every sealed segment below ``offset`` is on disk (call only once it is)."""
    body = _BODY.pack(_MAGIC, 1, 0, offset, boot_id())
    with os_errors("write recovery point", path), opened(path, os.O_WRONLY | os.O_CREAT) as fd:
        os.pwrite(fd, body + _CRC.pack(crc32c(body)), 0)
