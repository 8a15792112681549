"""One channel's view of tier-2: its chunk storage, the root's metadata store and its name there.

A :class:`TierContext` is built by :class:`~filechannel.channel.FileChannel` when the
channel's config has ``tier`` set, and handed to the log (``Log(path, config, tier=ctx)``)
and to the tiering daemon. It opens nothing until first used: opening a channel whose
storage is unreachable succeeds, and the first tier-2 operation raises a clear
:class:`~filechannel.errors.TierError` instead.

Where things are (the shared decision of issue 19):

- a standalone channel: metadata at ``CHANNEL/tier/metadata.db``, named by its folder's name;
- a topic's partition (opened by the client's TopicStore): one metadata store per root,
  ``ROOT/.tier/metadata.db``, and the name ``TOPIC/PARTITION``.

Thread-safe: the lazy opening happens under a lock, and both objects it opens are thread-safe.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..config import ChannelConfig
from ..errors import TierError
from .block_cache import BlockCache, DiskBlockCache
from .layout import SegmentRecord, validate_channel
from .metadata import TierMetadata
from .remote_segment import RemoteReader
from .storage import ChunkStorage, open_storage, redact_url

STANDALONE_METADATA = os.path.join("tier", "metadata.db")
ROOT_TIER_DIR = ".tier"
ROOT_METADATA = os.path.join(ROOT_TIER_DIR, "metadata.db")


class TierContext:
    """Tier-2 of one channel: ``storage`` (opened on first use), ``metadata`` (idem) and ``name``.

    ``options`` are passed to :func:`~filechannel.tiering.storage.open_storage` (never
    logged: they may come from the environment with credentials).
    """

    def __init__(
        self,
        url: str,
        options: dict[str, Any],
        metadata_path: str,
        name: str,
        *,
        cache_bytes: int = ChannelConfig.tier_cache_bytes,
        cache_dir: str | None = None,
        concurrency: int = ChannelConfig.tier_concurrency,
    ) -> None:
        self.url = url
        self.cache_bytes = cache_bytes
        self.cache_dir = cache_dir
        self.concurrency = concurrency
        self.name = validate_channel(name)
        self.metadata_path = os.fspath(metadata_path)
        self._options = dict(options)
        self._lock = threading.Lock()
        self._storage: ChunkStorage | None = None
        self._metadata: TierMetadata | None = None
        self._reader: RemoteReader | None = None
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise TierError(f"the tier context of {self.name} ({redact_url(self.url)}) is closed")

    @property
    def storage(self) -> ChunkStorage:
        """The chunk storage, opened on first use (a bad URL raises ConfigError here)."""
        with self._lock:
            self._check_open()
            if self._storage is None:
                self._storage = open_storage(self.url, **self._options)
            return self._storage

    @property
    def metadata(self) -> TierMetadata:
        """The metadata store, opened on first use (its folder is created)."""
        with self._lock:
            self._check_open()
            if self._metadata is None:
                os.makedirs(os.path.dirname(self.metadata_path) or ".", exist_ok=True)
                self._metadata = TierMetadata(self.metadata_path)
            return self._metadata

    def object_url(self, name: str) -> str:
        """Where object ``name`` is, for messages; opens nothing (a listing names remote
        segments this way, so a storage that cannot be opened fails their reads, not the listing)."""
        return f"{redact_url(self.url).rstrip('/')}/{name}"

    @property
    def reader(self) -> RemoteReader:
        """The read side (tables, the block cache of ``cache_bytes`` in memory or in ``cache_dir``,
        prefetch threads), made on first use."""
        storage = self.storage
        with self._lock:
            self._check_open()
            if self._reader is None:
                in_memory = self.cache_dir is None
                cache = BlockCache(self.cache_bytes) if in_memory else DiskBlockCache(self.cache_bytes, self.cache_dir)
                self._reader = RemoteReader(
                    storage, self.cache_bytes, self.concurrency, self._still_uploaded, current=self._current, cache=cache
                )
            return self._reader

    def _still_uploaded(self, record: SegmentRecord) -> bool:
        """Whether the metadata still holds ``record`` as uploaded (not deleted by retention)."""
        return self._current(record) is not None

    def _current(self, record: SegmentRecord) -> SegmentRecord | None:
        """The metadata's record of the segment ``record`` describes now (its chunks may have moved
        into a merged object), or None if retention deleted it."""
        now = self.metadata.segment_for(record.channel, record.base_offset)
        same = now is not None and (now.base_offset, now.epoch) == (record.base_offset, record.epoch)
        return now if same else None

    def close(self) -> None:
        """Close what was opened (idempotent); the prefetch threads stop before the storage closes."""
        with self._lock:
            self._closed = True
            storage, self._storage = self._storage, None
            metadata, self._metadata = self._metadata, None
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
        try:
            if storage is not None:
                storage.close()
        finally:
            if metadata is not None:
                metadata.close()

    def __enter__(self) -> TierContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TierContext({redact_url(self.url)!r}, name={self.name!r}, metadata={self.metadata_path!r})"


def tier_context_for(
    channel_path: str, config: ChannelConfig, metadata_path: str | None = None, name: str | None = None
) -> TierContext | None:
    """The tier context of the channel at ``channel_path``, or None when ``config.tier`` is None.

    Defaults (a standalone channel): metadata at ``CHANNEL/tier/metadata.db``, name = the
    folder's name. The client passes ``ROOT/.tier/metadata.db`` and ``TOPIC/PARTITION``.
    """
    if config.tier is None:
        return None
    path = os.path.abspath(os.fspath(channel_path))
    if metadata_path is None:
        metadata_path = os.path.join(path, STANDALONE_METADATA)
    if name is None:
        name = os.path.basename(path)
    return TierContext(
        config.tier,
        config.tier_options or {},
        metadata_path,
        name,
        cache_bytes=config.tier_cache_bytes,
        cache_dir=config.tier_cache_dir,
        concurrency=config.tier_concurrency,
    )
