"""Durable named positions of a channel: where ack receivers and consumer groups stand.

Each position is a file ``positions/<name>.pos`` holding ``[4s magic b"FCHP"][u64 offset]
[u32 CRC-32C of the first 12 bytes]``. It is replaced atomically: written to a temp file,
fsynced, renamed over the old one, and the folder fsynced, so after a crash a position is
either the old or the new value, never a torn one.

The temp file is ``<name>.pos.<pid>.<thread id>.tmp`` (:func:`files.write_atomically`):
no two writers share one, so a writer never renames another's half-written file, and one
left by a process that died can be told from one being written: opening a channel
deletes those whose process is gone (a failed write removes its own).

Garbage collection keeps every segment holding an offset at or past the smallest
position, so a reader that stores its position here never loses what it has not passed.
Ack receivers use the name ``ack.<name>``; consumer groups ``group.<group_id>``.
"""

from __future__ import annotations

import os
import struct

from ..errors import ConfigError, CorruptRecordError, os_errors, storage_error
from .checksum import crc32c
from .files import fsync_dir, read_if_exists, unlink_if_exists, write_atomically
from .names import validate_name

_MAGIC = b"FCHP"
_BODY = struct.Struct("<4sQ")
_CRC = struct.Struct("<I")
_SUFFIX = ".pos"
_TEMP = ".tmp"


class PositionStore:
    """The durable positions of one channel (see the module docstring)."""

    def __init__(self, channel_path: str) -> None:
        self.folder = os.path.join(channel_path, "positions")

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, validate_name(name, "position name") + _SUFFIX)

    def get(self, name: str) -> int | None:
        """The stored offset of ``name``, or None if it has none."""
        path = self._path(name)
        data = read_if_exists(path, "position")
        if data is None:
            return None
        if (
            len(data) != _BODY.size + _CRC.size
            or data[:4] != _MAGIC
            or crc32c(data[: _BODY.size]) != _CRC.unpack_from(data, _BODY.size)[0]
        ):
            raise CorruptRecordError(f"position file {path!r} is corrupt; delete it to make {name!r} start over")
        offset: int = _BODY.unpack_from(data)[1]
        return offset

    def set(self, name: str, offset: int) -> None:
        """Durably store ``offset`` for ``name``."""
        path = self._path(name)
        if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < 2**63:
            raise ConfigError(f"a position must be an int from 0 to 2**63-1, not {offset!r}")
        with os_errors("create folder", self.folder):
            os.makedirs(self.folder, exist_ok=True)
        body = _BODY.pack(_MAGIC, offset)
        write_atomically(path, body + _CRC.pack(crc32c(body)))

    def remove_stale_temp_files(self) -> list[str]:
        """Delete the temp files of positions whose writing process is gone (killed, or
        failed on a full disk before it could clean up); return their names. A temp file of
        a live process (another writer now) is left alone; so is one whose process cannot be
        told (a name of another form): deleting a file someone renames next would fail it."""
        try:
            files = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise storage_error(exc, "list", self.folder) from exc
        removed = []
        for f in files:
            pid = _temp_pid(f)
            if pid is not None and not _alive(pid):
                unlink_if_exists(os.path.join(self.folder, f))
                removed.append(f)
        return removed

    def delete(self, name: str) -> None:
        if unlink_if_exists(self._path(name)):
            fsync_dir(self.folder)

    def names(self) -> list[str]:
        try:
            files = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return sorted(f[: -len(_SUFFIX)] for f in files if f.endswith(_SUFFIX))

    def minimum(self) -> int | None:
        """The smallest stored position, or None if there are none."""
        values = [v for v in (self.get(n) for n in self.names()) if v is not None]
        return min(values) if values else None


def _temp_pid(filename: str) -> int | None:
    """The pid in a position temp file's name (``N.pos.PID.TID.tmp``, or ``N.pos.PID.tmp``
    as written before); None for any other file."""
    if not filename.endswith(_TEMP) or _SUFFIX + "." not in filename:
        return None
    fields = filename[: -len(_TEMP)].rsplit(_SUFFIX + ".", 1)[1].split(".")
    if not 1 <= len(fields) <= 2 or not all(x.isdigit() for x in fields):
        return None
    return int(fields[0])


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (ours counts: a thread may write)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or no pid this machine can have: leave it
    return True
