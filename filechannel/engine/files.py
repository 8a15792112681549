"""Small file operations every part of the channel needs, with OS errors translated."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..errors import os_errors, storage_error


@contextmanager
def opened(path: str, flags: int, mode: int = 0o666, *, action: str | None = None) -> Iterator[int]:
    """``with opened(path, flags) as fd``: ``path`` opened with ``flags`` (and ``O_CLOEXEC``),
    closed when the block ends, however it ends. For an fd kept past a block, ``os.open``.

    With ``action``, an OSError of the open is raised as a :class:`~filechannel.errors.StorageError`
    ("cannot ACTION 'PATH'", as ``os_errors(action, path)`` raises it); without, as it is (for a
    caller inside an ``os_errors`` of its own, or one that tells errors apart). What the block
    raises is the block's own.
    """
    fd = _open(path, flags, mode, action, missing_ok=False)
    assert fd is not None
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def opened_if_exists(path: str, flags: int, *, action: str | None = None) -> Iterator[int | None]:
    """As :func:`opened`, but the block gets None (and nothing is open) if ``path`` does not exist."""
    fd = _open(path, flags, 0o666, action, missing_ok=True)
    if fd is None:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _open(path: str, flags: int, mode: int, action: str | None, missing_ok: bool) -> int | None:
    try:
        return os.open(path, flags | os.O_CLOEXEC, mode)
    except OSError as exc:
        if missing_ok and isinstance(exc, FileNotFoundError):
            return None
        if action is None:
            raise
        raise storage_error(exc, action, path) from exc


def fsync_dir(path: str) -> None:
    """fsync a folder so that a rename, create or delete inside it is durable."""
    with os_errors("fsync folder", path), opened(path, os.O_RDONLY | os.O_DIRECTORY) as fd:
        os.fsync(fd)


def fsync_if_exists(path: str) -> bool:
    """fsync the file at ``path`` (written by another fd, maybe another process); False if it is gone."""
    with opened_if_exists(path, os.O_RDONLY, action="open") as fd:
        if fd is None:
            return False
        with os_errors("fsync", path):
            os.fsync(fd)
    return True


_native_write: Callable[[int, list[bytes], int, int, int, int, int], None] | None
try:  # write_pieces without the GIL (filechannel/engine/_codec.c), when it was built and loads
    from ._codec import write_pieces as _native_write
except ImportError:
    _native_write = None

_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024
_JOIN_BELOW = 1024  # average piece size under which one joined buffer beats writev's per-piece cost
# Bytes per write call: small pieces joined into buffers of up to _WRITE_BYTES, large ones
# handed to writev up to _WRITEV_BYTES at a time (a kernel effect we work around, not
# explain): a first large writev in a process ran far slower than the same bytes in calls
# of a few MiB (DESIGN.md, "Appending and locking"), and send_many of 64 KiB values swung
# widely in rate with 4 MiB writevs, steady with 1 MiB ones. Joined buffers stay larger: a
# drain just over the limit goes through the per-piece loop below, which costs small
# records more.
_WRITE_BYTES = 4 << 20
_WRITEV_BYTES = 1 << 20


def write_pieces(fd: int, pieces: list[bytes], nbytes: int) -> None:
    """Write ``pieces`` (``nbytes`` in all) at the file position of ``fd``, all of them.

    Written in calls of at most about ``_WRITE_BYTES`` (small pieces: frame headers and short
    records, joined into one buffer) or ``_WRITEV_BYTES`` (large ones, handed to ``writev``
    as they are, because copying megabytes of records into a fresh buffer costs more than
    the write itself). With the C extension, the same with the GIL released for the whole
    batch, joins included (``_codec.write_pieces``): the flusher writes a sender's buffer
    while the sender runs (Appender, "handing the buffer over"); ``write_pieces_py`` is its
    reference.
    """
    if _native_write is not None:
        _native_write(fd, pieces, nbytes, *write_limits())
    else:
        write_pieces_py(fd, pieces, nbytes)


def write_limits() -> tuple[int, int, int, int]:
    """What the C writers take after their pieces: ``_WRITE_BYTES``, ``_WRITEV_BYTES``,
    ``_IOV_MAX``, ``_JOIN_BELOW`` (read at each call: the tests make them small)."""
    return _WRITE_BYTES, _WRITEV_BYTES, _IOV_MAX, _JOIN_BELOW


def write_pieces_py(fd: int, pieces: list[bytes], nbytes: int) -> None:
    """``write_pieces`` in Python (each join and call holding the GIL)."""
    joined = nbytes < _JOIN_BELOW * len(pieces)
    limit = _WRITE_BYTES if joined else _WRITEV_BYTES
    if nbytes <= limit and (joined or len(pieces) <= _IOV_MAX):
        _write_group(fd, pieces, nbytes)
        return
    group: list[bytes] = []
    size = 0
    for piece in pieces:
        group.append(piece)
        size += len(piece)
        if size >= limit or len(group) == _IOV_MAX:
            _write_group(fd, group, size)
            group, size = [], 0
    if group:
        _write_group(fd, group, size)


def _write_group(fd: int, group: list[bytes], size: int) -> None:
    if size < _JOIN_BELOW * len(group):
        _write_all(fd, b"".join(group))
        return
    done = os.writev(fd, group)
    if done < size:  # a short write (rare on files): finish with plain writes
        _write_all(fd, memoryview(b"".join(group))[done:])


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomically(path: str, data: bytes, *, sync_folder: bool = True) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync the folder (unless
    ``sync_folder`` is false: then after a machine crash the temp file may be found whole in
    place of the rename, and the caller must know what that means).

    The temp file is ``PATH.PID.TID.tmp``: no two writers (processes or threads) share
    one, and one whose process died can be told from one being written. It is removed
    if the write fails (a full disk)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with os_errors("write", tmp):
        try:
            with opened(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as fd:
                os.write(fd, data)
                os.fsync(fd)
            os.replace(tmp, path)
        except BaseException:
            unlink_if_exists(tmp)
            raise
    if sync_folder:
        fsync_dir(os.path.dirname(path) or ".")


def read_if_exists(path: str, what: str) -> bytes | None:
    """The whole content of ``path``, or None if there is no such file."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise storage_error(exc, f"read {what}", path) from exc


def unlink_if_exists(path: str) -> bool:
    """Delete ``path``; False if it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise storage_error(exc, "delete", path) from exc
    return True


def folder_bytes(path: str) -> int:
    """Bytes of the files under ``path``. A file that goes while we walk (background
    compression renames sealed segments, GC deletes them) is skipped, not an error."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except FileNotFoundError:
                pass
    return total


def remove_tree(path: str, ignore_errors: bool = False) -> None:
    """``shutil.rmtree``, with shutil imported on first use: it imports zlib, bz2 and lzma, which
    a process that deletes no folder (most of them) never needs."""
    import shutil

    shutil.rmtree(path, ignore_errors=ignore_errors)


def private_folder(parent: str, prefix: str) -> str:
    """A new folder ``<parent>/<prefix><pid>-<random>`` of this process (``parent`` made if
    missing), after removing those of processes that no longer run: a process killed before
    its cleanup leaves its folder, and the next one made in ``parent`` removes it."""
    import tempfile  # here, as shutil in remove_tree: most processes never make one

    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            remove_tree(os.path.join(parent, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
