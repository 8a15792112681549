"""Which binding a storage URL opens: :func:`open_storage`, the one way into chunk storage;
and :class:`StorageClients`, the clients a process keeps, one per URL and options.

Apart from :mod:`.storage` (the contract), so that the bindings import the contract and this
module imports the bindings, never in a circle. The bindings are imported when a URL asks for
them: boto3 and fsspec are the ``s3`` extra's, and a folder tier needs neither.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .storage import ChunkStorage, redact_url


def open_storage(url: str, **options: Any) -> ChunkStorage:
    """The chunk storage at ``url``.

    - ``file:///path``: :class:`~filechannel.tiering.local_storage.LocalStorage`, a folder
      (created if missing); no options.
    - ``s3://bucket/prefix``: :class:`~filechannel.tiering.s3_storage.S3Storage` (boto3);
      options ``endpoint_url``, ``region_name``, credentials, retries and multipart sizes.
      With ``backend="fsspec"`` the same URL goes through s3fs instead, and the other
      options are s3fs's (``key``, ``secret``, ``endpoint_url``, ``client_kwargs``...).
    - any other fsspec URL (``memory://``, ``hdfs://``, ``gs://``...):
      :class:`~filechannel.tiering.fsspec_storage.FsspecStorage`; the options are the
      filesystem's storage options.

    Credentials belong in options or the environment, never in the URL (refused for
    ``s3://``); they are passed to the client library and never kept, printed or logged
    by filechannel. A URL without a scheme or of an unknown protocol is a :class:`ConfigError`.
    """
    scheme = url.partition("://")[0].lower() if isinstance(url, str) and "://" in url else ""
    if not _SCHEME.fullmatch(scheme):
        raise ConfigError(f"storage URL {url!r} has no scheme: use file:///path, s3://bucket/prefix or another fsspec URL")
    backend = options.pop("backend", None)
    if backend not in (None, "fsspec"):
        raise ConfigError(f"backend={backend!r} is not known for {redact_url(url)}: leave it unset or use 'fsspec'")
    if backend is None and scheme == "file":
        from .local_storage import LocalStorage

        if options:
            raise ConfigError(f"file:// storage takes no options, got {sorted(options)}")
        return LocalStorage.from_url(url)
    try:
        if backend is None and scheme == "s3":
            from .s3_storage import S3Storage

            return S3Storage.from_url(url, **options)
        from .fsspec_storage import FsspecStorage
    except ImportError as exc:  # boto3 (botocore), fsspec, s3fs: the s3 extra's
        package = exc.name.partition(".")[0] if exc.name else "a library"  # (botocore, not botocore.exceptions)
        raise ConfigError(f"{redact_url(url)} needs {package}, which is not installed: pip install 'filechannel[s3]'") from None
    return FsspecStorage(url, **options)


_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")  # RFC 3986's, lower-cased


def check_storage(url: str, options: Mapping[str, Any] | None = None) -> None:
    """Open and close the storage at ``url``, without a request: a URL that names no storage, an
    unknown option or a missing library raises :class:`ConfigError` here, when a topic is
    created, rather than at its first upload."""
    open_storage(url, **dict(options or {})).close()


def probe_storage(url: str, options: Mapping[str, Any] | None = None) -> None:
    """Reach the storage at ``url`` once: read (whether the bucket exists), then write and delete an
    empty ``.probe.<pid>`` object. Raises the storage's error (:class:`TierError`), which names
    the bucket or folder and what to do, if it cannot be read or written."""
    with open_storage(url, **dict(options or {})) as storage:
        storage.exists(".claim.json")
        name = f".probe.{os.getpid()}"
        storage.write(name, b"")
        storage.delete(name)


def storage_key(url: str, options: Mapping[str, Any] | None) -> tuple[str, str]:
    """Which storage client ``url`` with ``options`` names: the URL and the options as canonical JSON
    (values JSON cannot hold by their ``str``). Equal keys share one client."""
    return url, json.dumps(dict(options or {}), sort_keys=True, default=str)


class StorageClients:
    """Storage clients by URL and options (:func:`storage_key`), each opened (:func:`open_storage`)
    on first use and kept until :meth:`close`. Thread-safe.

    A client can be costly to make (a boto3 client loads the service's model) and
    is thread-safe: whoever opens the storages of many partitions (the tiering daemon, ``tier
    defrag``, fsck, a Spark worker's tasks) opens each storage once.
    """

    def __init__(self) -> None:
        self._clients: dict[tuple[str, str], ChunkStorage] = {}
        self._lock = threading.Lock()

    def get(self, url: str, options: Mapping[str, Any] | None = None) -> ChunkStorage:
        """The client of the storage at ``url`` with ``options``, opened now if it is the first use."""
        key = storage_key(url, options)
        with self._lock:
            storage = self._clients.get(key)
            if storage is None:
                storage = self._clients[key] = open_storage(url, **dict(options or {}))
            return storage

    def opened(self) -> list[ChunkStorage]:
        """The clients opened so far, in the order they were."""
        with self._lock:
            return list(self._clients.values())

    def close(self) -> None:
        """Close every client opened so far and forget them (a later :meth:`get` opens anew)."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for storage in clients:
            storage.close()
