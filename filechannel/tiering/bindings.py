"""Which binding a storage URL opens: :func:`open_storage`, the one way into chunk storage.

Apart from :mod:`.storage` (the contract), so that the bindings import the contract and this
module imports the bindings, never in a circle. The bindings are imported when a URL asks for
them: boto3 and fsspec are the ``s3`` extra's, and a folder tier needs neither.
"""

from __future__ import annotations

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
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"storage URL {url!r} has no scheme: use file:///path, s3://bucket/prefix or another fsspec URL")
    backend = options.pop("backend", None)
    if backend not in (None, "fsspec"):
        raise ConfigError(f"backend={backend!r} is not known for {redact_url(url)}: leave it unset or use 'fsspec'")
    scheme = url.partition("://")[0].lower()
    if backend is None and scheme == "file":
        from .local_storage import LocalStorage

        if options:
            raise ConfigError(f"file:// storage takes no options, got {sorted(options)}")
        return LocalStorage.from_url(url)
    if backend is None and scheme == "s3":
        from .s3_storage import S3Storage

        return S3Storage.from_url(url, **options)
    from .fsspec_storage import FsspecStorage

    return FsspecStorage(url, **options)
