"""Chunk storage in a local folder (``file:///path``): the embedded default, no server.

Layout: the object ``a/b/c`` is the file ``ROOT/a/b/c``. A write goes to a temporary
file beside the target (its name holds a ``~``, which no object name has, so listings
skip it), is fsynced, renamed over the target and the folder is fsynced: after
``write`` returns the object survives a machine crash, and a reader never sees a
prefix of it. ``concat`` builds the new object the same way from its sources.
``create_new`` fills and fsyncs a temporary file the same way, then publishes it with
``os.link`` (never a rename, which replaces): the link fails with EEXIST if the name is
taken, atomically, across processes (``atomic_create``); the temporary file is then
unlinked and the folder fsynced. The folder's filesystem must offer hard links.
``append`` and ``truncate`` change the file in place and fsync it (not atomic: a crash
during ``append`` may leave part of the data).

A name that is a folder of other objects (``a`` when ``a/b`` exists) is not an object;
an object and a folder cannot share a name here (S3 allows it; tiering never does it).
Deleting an object leaves its (possibly empty) folders: removing them would race with
a writer creating an object in them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Callable
from functools import partial
from urllib.parse import unquote, urlsplit

from ..engine.files import opened
from ..errors import AccessDeniedError, ConfigError, ObjectNotFoundError, StorageFullError, TierError
from .storage import ChunkStorage, ObjectInfo, is_valid_name, log

_NOT_FOUND = {errno.ENOENT, errno.EISDIR, errno.ENOTDIR}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_COPY_CHUNK = 1 << 20
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP}  # what link(2) answers on a filesystem without hard links


class NoHardLinksError(OSError):
    """link(2) is refused by the filesystem (FAT, some FUSE or network mounts): create_new cannot work there."""


def link_new(temp: str, final: str) -> bool:
    """Publish the file ``temp`` as ``final`` only if ``final`` does not exist (a hard link); ``temp`` is removed.

    True if ``final`` was created; False if a file of that name exists (it is left alone). A folder
    of that name raises IsADirectoryError; a filesystem without hard links raises NoHardLinksError.
    """
    try:
        try:
            os.link(temp, final)
        except FileExistsError:
            try:
                is_folder = stat.S_ISDIR(os.lstat(final).st_mode)
            except FileNotFoundError:  # deleted since: it existed when we tried, so the answer stands
                return False
            if not is_folder:
                return False
            raise IsADirectoryError(errno.EISDIR, "a folder of objects has this name", final) from None
        except OSError as exc:
            if exc.errno in _NO_LINKS:
                reason = f"the filesystem offers no hard links, which create_new needs ({exc.strerror or exc})"
                raise NoHardLinksError(exc.errno, reason, final) from exc
            raise
        return True
    finally:
        try:
            os.unlink(temp)
        except OSError as exc:  # the object is there or not: a leftover temporary file is never listed
            log.debug("cannot remove the temporary file %r: %s", temp, exc)


def fsync_dir(path: str) -> None:
    """fsync a folder, so that the entries created or renamed in it are durable."""
    with opened(path, os.O_RDONLY | os.O_DIRECTORY) as fd:
        os.fsync(fd)


def make_dirs(root: str, rel_dir: str) -> str:
    """Create ``root/rel_dir`` (each new folder's entry fsynced in its parent) and return its path."""
    path = root
    for part in rel_dir.split("/") if rel_dir else ():
        parent, path = path, os.path.join(path, part)
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        fsync_dir(parent)
    return path


def temp_name(final_path: str) -> str:
    """A unique temporary path beside ``final_path``; never a valid object name (it holds a '~')."""
    return f"{final_path}~{uuid.uuid4().hex}.tmp"


class LocalStorage(ChunkStorage):
    """Objects as files under one folder (see the module docstring for the layout and durability)."""

    supports_concat = True
    supports_append = True
    supports_truncate = True
    atomic_create = True

    def __init__(self, root: str) -> None:
        root = os.path.abspath(root)
        super().__init__("file://" + root)
        self.root = root
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as exc:
            err = self._translate_error(exc, "create the folder", "")
            if err is None:  # (not for an OSError: as ChunkStorage._call does)
                raise
            raise err from exc

    @classmethod
    def from_url(cls, url: str) -> LocalStorage:
        """``file:///abs/path`` (or ``file://localhost/abs/path``)."""
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or parts.query or parts.fragment:
            raise ConfigError(f"storage URL {url!r} is not a local folder: use file:///absolute/path")
        return cls(unquote(parts.path))

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def _do_exists(self, name: str) -> bool:
        # Not os.path.isfile: it answers False for any error, a folder we may not read included.
        try:
            return stat.S_ISREG(os.stat(self._path(name)).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def _do_info(self, name: str) -> ObjectInfo:
        st = os.stat(self._path(name))
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFoundError(f"no object {name!r} in {self.url}: it is a folder of objects")
        return ObjectInfo(name, st.st_size, st.st_mtime_ns // 1_000_000)

    def _do_read(self, name: str, offset: int, length: int) -> bytes:
        with opened(self._path(name), os.O_RDONLY) as fd:
            size = os.fstat(fd).st_size
            length = min(length, max(0, size - offset))  # never allocate past the end
            chunks = []
            while length > 0:
                chunk = os.pread(fd, length, offset)
                if not chunk:  # the file shrank (truncate) while we read
                    break
                chunks.append(chunk)
                offset += len(chunk)
                length -= len(chunk)
            return b"".join(chunks)

    def _do_list(self, prefix: str) -> list[ObjectInfo]:
        folder, _, _ = prefix.rpartition("/")
        found: list[ObjectInfo] = []
        self._walk(folder, prefix, found)
        return found

    def _walk(self, rel: str, prefix: str, found: list[ObjectInfo]) -> None:
        try:
            entries = list(os.scandir(self._path(rel) if rel else self.root))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            if not is_valid_name(name):
                continue
            if entry.is_dir(follow_symlinks=False):
                if name.startswith(prefix) or prefix.startswith(name + "/"):
                    self._walk(name, prefix, found)
            elif entry.is_file(follow_symlinks=False) and name.startswith(prefix):
                try:
                    st = entry.stat()
                except FileNotFoundError:  # deleted since scandir
                    continue
                found.append(ObjectInfo(name, st.st_size, st.st_mtime_ns // 1_000_000))

    def _do_delete(self, name: str) -> None:
        try:
            os.unlink(self._path(name))
        except FileNotFoundError:
            return

    def _do_write(self, name: str, data: memoryview) -> None:
        self._replace_atomically(name, partial(_write_all, data=data))

    def _do_create_new(self, name: str, data: memoryview) -> bool:
        return self._through_temp(name, partial(_write_all, data=data), link_new)

    def _do_concat(self, target: str, sources: list[str]) -> None:
        def fill(fd: int) -> None:
            with open(fd, "wb", closefd=False) as out:
                for source in sources:
                    try:
                        src = open(self._path(source), "rb")  # noqa: SIM115 - closed by the with below
                    except FileNotFoundError:
                        raise ObjectNotFoundError(f"cannot concat into {target!r} in {self.url}: no source {source!r}") from None
                    with src:
                        shutil.copyfileobj(src, out, _COPY_CHUNK)

        self._replace_atomically(target, fill)

    def _replace_atomically(self, name: str, fill: Callable[[int], None]) -> None:
        """Write ``name`` through a temporary file: fill, fsync, rename over, fsync the folder."""
        self._through_temp(name, fill, _rename_over)

    def _through_temp(self, name: str, fill: Callable[[int], None], publish: Callable[[str, str], bool]) -> bool:
        """Fill and fsync a temporary file beside ``name``, then ``publish(temp, final)``; fsync the folder if
        that published it. Returns what ``publish`` did; the temporary file never stays (but after a crash)."""
        folder, _, _ = name.rpartition("/")
        folder_path = make_dirs(self.root, folder)
        final = self._path(name)
        temp = temp_name(final)
        try:
            with opened(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644) as fd:  # temp is unique: ours to delete
                fill(fd)
                os.fsync(fd)
            published = publish(temp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        if published:
            fsync_dir(folder_path)
        return published

    def _do_append(self, name: str, data: memoryview) -> None:
        with opened(self._path(name), os.O_WRONLY | os.O_APPEND) as fd:  # no O_CREAT: a missing object is ENOENT
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)

    def _do_truncate(self, name: str, length: int) -> None:
        with opened(self._path(name), os.O_WRONLY) as fd:
            size = os.fstat(fd).st_size
            if length > size:
                raise ConfigError(f"cannot truncate {name!r} in {self.url} to {length} bytes: it holds only {size}")
            os.ftruncate(fd, length)
            os.fsync(fd)

    def _translate_error(self, exc: Exception, op: str, name: str) -> TierError | None:
        if not isinstance(exc, OSError):
            return None
        reason = exc.strerror or str(exc)
        where = f"{name!r} in {self.url}" if name else self.url
        if exc.errno in (errno.EISDIR, errno.ENOTDIR, errno.EEXIST) and op in ("write", "concat", "create_new"):
            return TierError(f"cannot {op} {where}: an object and a folder of objects would share a name ({reason})")
        if isinstance(exc, NoHardLinksError):
            return TierError(f"cannot {op} {where}: {reason}; use a folder on a local filesystem")
        if exc.errno in _NOT_FOUND:
            return ObjectNotFoundError(f"cannot {op} {where}: no such object ({reason})")
        if exc.errno in _DENIED:
            return AccessDeniedError(f"cannot {op} {where}: {reason}; check the folder's owner and permissions")
        if exc.errno in _FULL:
            return StorageFullError(f"cannot {op} {where}: {reason}; free some space or raise the quota, then retry")
        return TierError(f"cannot {op} {where}: {reason}")


def _write_all(fd: int, data: memoryview) -> None:
    written = 0
    while written < len(data):
        written += os.write(fd, data[written:])


def _rename_over(temp: str, final: str) -> bool:
    os.rename(temp, final)
    return True
