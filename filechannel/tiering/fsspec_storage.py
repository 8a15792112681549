"""Chunk storage on any fsspec filesystem (``memory://``, ``hdfs://``, ``gs://``, ``abfs://``...).

The object ``a/b`` is the path ``ROOT/a/b``. fsspec gives the operations (``cat_file(path, start,
end)`` for ranged reads, ``pipe_file`` for whole writes, ``find`` for listings, ``rm_file``); this
class adds what the contract needs on top, once for every filesystem. How ``write`` is atomic
depends on the filesystem:

=========================================  =============================================================
filesystem                                 write
=========================================  =============================================================
local (``file`` with ``backend="fsspec"``)  a temporary file beside the target (a ``~`` in its name, so
                                           listings skip it), then ``os.replace`` over it: readers see all
                                           or nothing. Not fsynced: use ``file:///`` (LocalStorage) for that.
HDFS through ``hdfs-native`` (``hdfs://``)  a temporary file beside the target, then a rename over it
                                           (``rename2`` with OVERWRITE, one NameNode operation). HDFS
                                           shows a file while it is being written (no atomic publish on
                                           close): only the temporary name is ever seen partly written.
object stores (``s3``, ``gs``, ``abfs``)   one ``pipe_file``: a PUT (or a multipart upload) is atomic.
``memory``                                 one ``pipe_file``: one assignment in this process.
anything else (WebHDFS, SFTP...)           one ``pipe_file``, atomic only if the filesystem makes it so
                                           (WebHDFS does not: a reader can see a prefix of the object).
=========================================  =============================================================

A write that fails removes its temporary file; a process killed mid-write can leave one (a name with a
``~``, never listed, so never taken for an object).

``create_new`` (write only if the name is free) is a real conditional create where the filesystem
has one, and ``atomic_create`` says so:

- local: a temporary file, then ``os.link`` to the name (EEXIST if taken; never a rename, which
  replaces). Not fsynced, as ``write``.
- HDFS (``hdfs-native``): a temporary file, then a rename to the name without OVERWRITE (the NameNode
  refuses it if the name is taken: False).
- s3fs: ``pipe_file(mode="create")``, a PUT with ``If-None-Match: *`` (a 412 is False; a 409
  ``ConditionalRequestConflict`` is tried again after a jittered wait).
- ``memory`` and every other filesystem: ``exists`` then ``pipe_file`` under a lock of this process.
  Not atomic across processes (nor against other users of the filesystem): ``atomic_create`` is False.

``list`` and ``info`` give ``modified_ms`` from the first of the fields ``modification_time``,
``modificationTime`` (HDFS: milliseconds), ``mtime``, ``LastModified``, ``last_modified``, ``updated``,
``created`` the filesystem reports (seconds, datetimes or ISO 8601 strings), None if it reports none.

HDFS through ``hdfs-native`` (fsspec's ``hdfs://`` once it is installed: the ``hdfs`` extra) has a Rust
core that panics on a read starting past the end of a file, and a pyo3 ``PanicException`` derives from
``BaseException``, past every ``except Exception``. So reads there go through the open file, clamped to
its length (one request, as a plain ranged read), and any panic of a native client library, in any
operation, is raised as :class:`BindingPanic` (an ``Exception``) and translated into :class:`TierError`
like any other failure; ``KeyboardInterrupt`` and ``SystemExit`` pass untouched. HDFS's errors carry
the server's Java stack trace: only their first line is kept in our messages.

``concat`` exists where a rename publishes the result (local, HDFS): the new object is written from the
sources through a temporary file, then renamed. fsspec has no portable concat, so ``supports_concat``
is False elsewhere; ``append`` and ``truncate`` are not offered.

Tested here against fsspec's local and memory filesystems, against a real HDFS (Hadoop 2.7.3's
NameNode and DataNode, from 2016: protocol compatibility, not a current cluster's behaviour) through
``hdfs-native``, and against s3fs pointed at SeaweedFS: ``open_storage("s3://bucket/prefix",
backend="fsspec", key=..., secret=..., endpoint_url=...)`` - ``backend="fsspec"`` routes an ``s3://``
URL here instead of the boto3 binding, and the other options are the filesystem's own storage options
(s3fs's here). Filesystem instances are private to each storage (never shared through fsspec's
instance cache).
"""

from __future__ import annotations

import errno
import inspect
import os
import socket
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..engine.clock import datetime_ms
from ..errors import AccessDeniedError, ConfigError, ObjectNotFoundError, StorageFullError, StorageUnavailableError, TierError
from .local_storage import link_new, temp_name
from .retry import Backoff
from .storage import ChunkStorage, ObjectInfo, is_valid_name, log

# The check-then-write create_new of filesystems without a conditional create: one lock for the whole process.
_CREATE_LOCK = threading.Lock()
_CONFLICT_RETRIES = Backoff(attempts=5)
_MODIFIED_MS_FIELDS = ("modification_time", "modificationTime")  # HDFS (hdfs-native, WebHDFS): milliseconds
_MODIFIED_FIELDS = ("mtime", "LastModified", "last_modified", "updated", "created")
_UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH}
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_COPY_CHUNK = 1 << 20
# The extra that installs a filesystem's client (hdfs: hdfs-native, which replaces pyarrow's libhdfs client).
_EXTRAS = {"s3": "s3", "hdfs": "hdfs", "webhdfs": "hdfs"}
_T = TypeVar("_T")


class BindingPanic(Exception):
    """A native client library panicked (pyo3's ``PanicException``, a ``BaseException``): raised as an
    ``Exception`` in its place, so that the contract's boundary translates it into :class:`TierError`."""


class FsspecStorage(ChunkStorage):
    """Objects under one root path of an fsspec filesystem (see the module docstring for atomicity).

    ``supports_concat`` and ``atomic_create`` are instance attributes here: ``supports_concat`` is True
    on the local filesystem and HDFS (hdfs-native), ``atomic_create`` on those and s3fs.
    """

    def __init__(self, url: str, **storage_options: Any) -> None:
        super().__init__(url)
        try:
            fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True, **storage_options)
        except ImportError as exc:
            raise ConfigError(
                f"cannot open {self.url}: a package is missing for this filesystem ({exc}){_install_hint(url)}"
            ) from None
        except (ValueError, TypeError) as exc:  # unknown protocol, bad options
            raise ConfigError(f"cannot open {self.url}: {exc}") from None
        except OSError as exc:  # a filesystem that connects when made: ftp://, sftp://, pyarrow's hdfs:// (no libhdfs, no JVM)
            reason = (exc.strerror or str(exc) or type(exc).__name__).splitlines()[0]
            if _is_unreachable(exc) or isinstance(exc, socket.gaierror):  # down, or a host that does not resolve
                raise StorageUnavailableError(
                    f"cannot reach {self.url}: {reason}; check the URL's host and that its server is up"
                ) from None
            raise ConfigError(f"cannot open {self.url}: {reason}{_install_hint(url)}") from None
        self._fs: fsspec.AbstractFileSystem = fs
        self._root = root.rstrip("/")
        self._local = isinstance(fs, LocalFileSystem)
        self._hdfs_native = type(fs).__module__.partition(".")[0] == "hdfs_native"
        self._renames = self._local or self._hdfs_native  # writes go through a temporary file and a rename
        self.supports_concat = self._renames
        self._s3 = _is_s3fs_with_create(fs)
        self.atomic_create = self._renames or self._s3

    def _call(
        self,
        op: str,
        name: str,
        fn: Callable[[], _T],
        nbytes: int | None = None,
        outcome: Callable[[_T], str] | None = None,
    ) -> _T:
        """The contract's :meth:`ChunkStorage._call`, with a native library's panic raised as :class:`BindingPanic`."""
        return super()._call(op, name, partial(_panic_as_error, fn), nbytes, outcome)

    def _path(self, name: str) -> str:
        return f"{self._root}/{name}"

    def _do_exists(self, name: str) -> bool:
        # Not fs.isfile: it answers False for any error, an unreachable storage included.
        try:
            self._do_info(name)
        except FileNotFoundError:  # ObjectNotFoundError (a folder) included
            return False
        return True

    def _do_info(self, name: str) -> ObjectInfo:
        self._fs.invalidate_cache(self._path(name))
        info = self._fs.info(self._path(name))
        if info.get("type") != "file":
            raise ObjectNotFoundError(f"no object {name!r} in {self.url}: it is a folder of objects")
        return ObjectInfo(name, int(info["size"]), modified_ms(info))

    def _do_read(self, name: str, offset: int, length: int) -> bytes:
        path = self._path(name)
        if self._local:  # a local read allocates the whole length asked for: never past the end
            length = min(length, max(0, int(self._fs.size(path)) - offset))
        if self._hdfs_native:  # its reader panics on a seek past the end: clamp to the open file's length
            with self._fs.open(path, "rb") as f:
                size = int(f.size)
                return bytes(f.read_range(offset, min(length, size - offset))) if offset < size else b""
        try:
            return bytes(self._fs.cat_file(path, start=offset, end=offset + length))
        except (FileNotFoundError, PermissionError):
            raise
        except OSError:  # object stores refuse a range past the end (HTTP 416: s3fs raises EINVAL)
            if offset >= self._do_info(name).length:
                return b""
            raise

    def _do_list(self, prefix: str) -> list[ObjectInfo]:
        folder = prefix.rpartition("/")[0]
        base = f"{self._root}/{folder}" if folder else self._root
        self._fs.invalidate_cache(base)
        try:
            found = self._fs.find(base, detail=True)
        except FileNotFoundError:
            return []
        root = self._root + "/"
        result = []
        for path, info in found.items():
            name = path[len(root) :] if path.startswith(root) else ""
            if info.get("type") == "file" and is_valid_name(name) and name.startswith(prefix):
                result.append(ObjectInfo(name, int(info["size"]), modified_ms(info)))
        return result

    def _do_delete(self, name: str) -> None:
        try:
            self._fs.rm_file(self._path(name))
        except FileNotFoundError:
            return

    def _do_write(self, name: str, data: memoryview) -> None:
        if not self._renames:
            self._fs.pipe_file(self._path(name), bytes(data))
            return
        self._replace(name, lambda temp: self._fs.pipe_file(temp, bytes(data)))

    def _do_create_new(self, name: str, data: memoryview) -> bool:
        if self._renames:
            final = self._path(name)
            temp = self._temp_beside(final)
            try:
                self._fs.pipe_file(temp, bytes(data))
            except BaseException:
                self._remove_quietly(temp)
                raise
            if self._local:
                return link_new(temp, final)  # removes temp whatever happens
            return self._rename_new(temp, final)
        if self._s3:
            return self._s3_create_new(name, bytes(data))
        with _CREATE_LOCK:  # not atomic across processes: atomic_create is False
            if self._do_exists(name):
                return False
            self._fs.pipe_file(self._path(name), bytes(data))
            return True

    def _s3_create_new(self, name: str, body: bytes) -> bool:
        """s3fs's conditional PUT: s3fs raises FileExistsError for a 412 that names its condition, else an
        OSError caused by the ClientError (SeaweedFS's 412 names none); a 409 is tried again."""
        failures = 0
        while True:
            try:
                self._fs.pipe_file(self._path(name), body, mode="create")
                return True
            except FileExistsError:
                return False
            except OSError as exc:
                code = _client_error_code(exc)
                if code in ("PreconditionFailed", "412"):
                    return False
                if code != "ConditionalRequestConflict" or failures + 1 >= _CONFLICT_RETRIES.attempts:
                    raise
                failures += 1
                log.debug("tier create_new %s %r: a concurrent conditional write (409), trying again", self.url, name)
                _CONFLICT_RETRIES.sleep(failures)

    def _do_concat(self, target: str, sources: list[str]) -> None:
        def fill(temp: str) -> None:
            with self._fs.open(temp, "wb") as out:
                for source in sources:
                    try:
                        src = self._fs.open(self._path(source), "rb")
                    except FileNotFoundError:
                        raise ObjectNotFoundError(f"cannot concat into {target!r} in {self.url}: no source {source!r}") from None
                    with src:
                        while chunk := src.read(_COPY_CHUNK):
                            out.write(chunk)

        self._replace(target, fill)

    def _temp_beside(self, final: str) -> str:
        """A temporary path beside ``final`` (never a valid object name), its folder made where needed
        (HDFS makes a file's parent folders when it creates the file)."""
        if self._local:
            self._fs.makedirs(final.rpartition("/")[0], exist_ok=True)
        return temp_name(final)

    def _replace(self, name: str, fill: Callable[[str], object]) -> None:
        """Write ``name`` through ``fill(temp_path)`` then a rename over it (local filesystem, HDFS)."""
        final = self._path(name)
        temp = self._temp_beside(final)
        try:
            fill(temp)
            if self._local:
                os.replace(temp, final)  # fsspec's mv would move the file into a folder of that name
            else:
                self._fs.mv(temp, final, overwrite=True)  # hdfs-native: rename2 with OVERWRITE
        except BaseException:
            self._remove_quietly(temp)
            raise

    def _rename_new(self, temp: str, final: str) -> bool:
        """HDFS: rename ``temp`` to ``final`` unless ``final`` exists (one NameNode operation); True if it
        was renamed. ``temp`` is removed whatever happens."""
        try:
            self._fs.mv(temp, final, overwrite=False)
            return True
        except FileExistsError:
            self._remove_quietly(temp)
            return False
        except BaseException:
            self._remove_quietly(temp)
            raise

    def _remove_quietly(self, temp: str) -> None:
        """Remove a temporary file after a failed write (the write's error is the one to raise)."""
        try:
            self._fs.rm_file(temp)
        except OSError:
            pass

    def _translate_error(self, exc: Exception, op: str, name: str) -> TierError | None:
        where = f"{op} {name!r} in {self.url}"
        reason = (str(exc) or type(exc).__name__).splitlines()[0]  # HDFS appends the server's stack trace
        if isinstance(exc, IsADirectoryError | NotADirectoryError) and op in ("write", "concat", "create_new"):
            return TierError(f"cannot {where}: an object and a folder of objects would share a name ({reason})")
        if isinstance(exc, FileNotFoundError | IsADirectoryError | NotADirectoryError):
            return ObjectNotFoundError(f"cannot {where}: no such object ({reason})")
        if isinstance(exc, PermissionError):
            return AccessDeniedError(f"cannot {where}: access denied ({reason}); check the credentials and permissions")
        if _is_unreachable(exc):
            return StorageUnavailableError(f"cannot {where}: the storage is unreachable ({reason}); retry later")
        if _client_error_code(exc) == "ConditionalRequestConflict":  # s3fs, 409 still after our tries
            return StorageUnavailableError(
                f"cannot {where}: concurrent conditional writes to the key kept conflicting ({reason}); retry later"
            )
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return StorageFullError(f"cannot {where}: the storage is full or over quota ({reason})")
        if isinstance(exc, BindingPanic):
            return TierError(
                f"cannot {where}: the filesystem's client library failed ({reason}); "
                "this is a bug in that library: retry, or update it"
            )
        if isinstance(exc, OSError) or _is_botocore(exc):
            return TierError(f"cannot {where}: {reason}")
        return None


def modified_ms(info: dict[str, Any]) -> int | None:
    """The last-modified time in an fsspec ``info`` entry, in milliseconds since the epoch; None if absent.

    Milliseconds as a number (HDFS ``modification_time``, WebHDFS ``modificationTime``), seconds as a number
    (local ``mtime``, memory ``created`` in listings), a datetime (s3fs ``LastModified``, memory ``created``
    in ``info``; a naive one is taken as UTC) or an ISO 8601 string (gcsfs ``updated``).
    """
    for field in _MODIFIED_MS_FIELDS:
        value = info.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    for field in _MODIFIED_FIELDS:
        value = info.get(field)
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value)
            except ValueError:
                continue
        if isinstance(value, datetime):
            return datetime_ms(value, naive_is_utc=True)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value * 1000)
    return None


def _install_hint(url: str) -> str:
    """What to install for ``url``'s filesystem, where an extra of ours has it ("" elsewhere)."""
    extra = _EXTRAS.get(url.partition("://")[0].lower())
    return f"; install its client: pip install 'filechannel[{extra}]'" if extra else ""


def _panic_as_error(fn: Callable[[], _T]) -> _T:
    """``fn()``, with a pyo3 ``PanicException`` (each Rust extension has its own class, all named so in the
    module ``pyo3_runtime``) raised as :class:`BindingPanic`; any other ``BaseException`` passes untouched."""
    try:
        return fn()
    except BaseException as exc:
        kind = type(exc)
        if kind.__name__ == "PanicException" and kind.__module__ == "pyo3_runtime":
            raise BindingPanic(str(exc) or "a panic") from exc
        raise


def _is_s3fs_with_create(fs: fsspec.AbstractFileSystem) -> bool:
    """True for s3fs whose ``pipe_file`` takes ``mode="create"`` (a PUT with If-None-Match: *).

    An older s3fs would take ``mode`` into its kwargs and filter it out: a silent overwrite, so it is checked.
    """
    module = sys.modules.get("s3fs")
    if module is None or not isinstance(fs, module.S3FileSystem):
        return False
    pipe = getattr(type(fs), "_pipe_file", None)
    return pipe is not None and "mode" in inspect.signature(pipe).parameters


def _client_error_code(exc: BaseException) -> str:
    """The S3 error code of the botocore ClientError that ``exc`` (an s3fs OSError) was made from, or ""."""
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))


def _is_botocore(exc: Exception) -> bool:
    module = sys.modules.get("botocore.exceptions")
    return module is not None and isinstance(exc, module.BotoCoreError)


def _is_unreachable(exc: Exception) -> bool:
    """A connection that could not be made or broke (OS errors, and botocore's when s3fs is below)."""
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    if isinstance(exc, OSError) and exc.errno in _UNREACHABLE_ERRNOS:
        return True
    module = sys.modules.get("botocore.exceptions")
    return module is not None and isinstance(exc, module.ConnectionError | module.EndpointConnectionError)
