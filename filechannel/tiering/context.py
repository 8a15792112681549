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

The engine reads tier-2 through the point questions of :class:`~filechannel.engine.log.TierView`
(:meth:`TierContext.uploaded_segments`, :meth:`segment_at`, :meth:`end_offset`, the blocks
of a segment), which this class answers from the local index, kept true to the bucket by
:mod:`.reindex`: checked against the channel's head when first opened, healed when damaged
or replaced under it, retried once after a heal.

Thread-safe: the lazy opening happens under a lock, and both objects it opens are thread-safe.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Self, TypeVar

from ..config import ChannelConfig
from ..engine.compressed import CompressedInfo
from ..engine.log import CompressedBlocks
from ..errors import MetadataDamagedError, TierError, os_errors
from .bindings import StorageClients, open_storage
from .block_cache import BlockCache, DiskBlockCache
from .heads import read_head
from .layout import SegmentRecord, validate_channel
from .metadata import TierMetadata
from .ownership import IDENTITY_FILE, root_identity
from .reindex import bring_up, open_index, quarantine
from .remote_segment import RemoteReader
from .storage import ChunkStorage, redact_url

log = logging.getLogger("filechannel")
_T = TypeVar("_T")
RECHECK_INTERVAL_S = 10.0  # an index the bucket could not confirm is checked again at most this often

STANDALONE_METADATA = os.path.join("tier", "metadata.db")


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
        storages: StorageClients | None = None,
    ) -> None:
        """``storages``: the caller's storage clients, shared (this context takes its storage from
        them and never closes it; the caller does): a process opening the same tier for many
        short-lived channels (a Spark driver answering offsets) makes one client, not one each
        (a boto3 client costs about a quarter of a second of CPU to make)."""
        self.url = url
        self.cache_bytes = cache_bytes
        self.cache_dir = cache_dir
        self.concurrency = concurrency
        self.name = validate_channel(name)
        self.metadata_path = os.fspath(metadata_path)
        self._options = dict(options)
        self._lock = threading.Lock()
        self._storages = storages
        self._storage: ChunkStorage | None = None
        self._metadata: TierMetadata | None = None
        self._reader: RemoteReader | None = None
        self._closed = False
        self._unchecked: TierError | None = None  # why the index could not be checked against the bucket
        self._checked_at = 0.0  # when it was last tried (time.monotonic)

    def _check_open(self) -> None:
        if self._closed:
            raise TierError(f"the tier context of {self.name} ({redact_url(self.url)}) is closed")

    @property
    def storage(self) -> ChunkStorage:
        """The chunk storage, opened on first use (a bad URL raises ConfigError here)."""
        with self._lock:
            self._check_open()
            if self._storage is None:
                shared = self._storages
                self._storage = open_storage(self.url, **self._options) if shared is None else shared.get(self.url, self._options)
            return self._storage

    @property
    def metadata(self) -> TierMetadata:
        """The index of tier-2, opened on first use (its folder is created), checked against the
        channel's head in the bucket, healed if damaged, reopened if the file was replaced."""
        with self._lock:
            self._check_open()
            metadata = self._metadata
        if metadata is not None and not metadata.replaced():
            return metadata
        return self._reopen(metadata)

    def _reopen(self, stale: TierMetadata | None) -> TierMetadata:
        with self._lock:
            self._check_open()
            if self._metadata is not stale:  # another thread reopened it meanwhile
                assert self._metadata is not None
                return self._metadata
            with os_errors("create tier folder", os.path.dirname(self.metadata_path)):
                os.makedirs(os.path.dirname(self.metadata_path) or ".", exist_ok=True)
            metadata = open_index(self.metadata_path)
            if stale is not None:
                stale.close()
            self._metadata = metadata
        self._bring_up(metadata)
        return metadata

    def _bring_up(self, metadata: TierMetadata) -> None:
        """Compare the index with the bucket for this channel; a storage that cannot be read leaves it
        as it is (Tier-1 never waits on tier-2), with a warning, and the check is tried again by the
        next question about tier-2 (see :meth:`_checked`)."""
        self._checked_at = time.monotonic()
        try:
            line = bring_up(self.storage, metadata, self.name, self._root_id())
        except MetadataDamagedError:
            raise
        except TierError as exc:
            if self._unchecked is None:
                log.warning(
                    "tier: cannot check the index of %s against %s (%s); using it as it is", self.name, redact_url(self.url), exc
                )
            self._unchecked = exc
            return
        self._unchecked = None
        if line is not None:
            log.warning("tier: %s", line)

    def _checked(self, metadata: TierMetadata) -> None:
        """Before answering about tier-2 from an index the bucket could not confirm: check again;
        if it still cannot be, and the index is new (made since it was lost or damaged) while a
        daemon of this root once ran (so tier-2 may hold the channel's history), raise instead of
        answering "nothing": a reader must never jump past offloaded records in silence."""
        if self._unchecked is None:
            return
        if time.monotonic() - self._checked_at >= RECHECK_INTERVAL_S:
            self._bring_up(metadata)
        lost = metadata.bounds(self.name) is None and metadata.current_epoch() == 0  # a new index: it knows nothing
        if self._unchecked is not None and lost and self._root_id() is not None:
            raise TierError(
                f"cannot tell what tier-2 holds of {self.name}: the local index {self.metadata_path} has nothing of it "
                f"and {redact_url(self.url)} cannot be read ({self._unchecked}); retry once the storage is reachable"
            ) from self._unchecked

    def _root_id(self) -> str | None:
        """This root's identity, if a daemon of it ever ran (see :mod:`.ownership`); None otherwise."""
        tier_dir = os.path.dirname(self.metadata_path)
        return root_identity(tier_dir) if os.path.exists(os.path.join(tier_dir, IDENTITY_FILE)) else None

    def _indexed(self, fn: Callable[[TierMetadata], _T]) -> _T:
        """``fn`` on the index; once more on a healed index if it turns out damaged."""
        metadata = self.metadata
        try:
            self._checked(metadata)
            return fn(metadata)
        except MetadataDamagedError as exc:
            with self._lock:
                if self._metadata is metadata:
                    self._metadata = None
            quarantine(metadata, exc)
            return fn(self._reopen(None))

    # -- the engine's point questions (engine.log.TierView) -------------------------------------

    def uploaded_segments(self) -> list[SegmentRecord]:
        """The segments readers list (uploaded, and lost ones whose reads raise), by base offset."""
        return self._indexed(lambda m: m.segments(self.name))

    def segment_at(self, offset: int) -> SegmentRecord | None:
        """The listed segment holding ``offset``, or None (one probe of the index)."""
        return self._indexed(lambda m: m.segment_for(self.name, offset))

    def floor_segment(self, offset: int) -> SegmentRecord | None:
        """The listed segment with the greatest base offset <= ``offset`` (it may end before it), or None."""
        return self._indexed(lambda m: m.floor(self.name, offset))

    def segment_after(self, base_offset: int) -> SegmentRecord | None:
        """The listed segment with the least base offset > ``base_offset``, or None."""
        return self._indexed(lambda m: m.after(self.name, base_offset))

    def segment_at_time(self, timestamp: int) -> SegmentRecord | None:
        """The oldest listed segment whose newest record is at or after ``timestamp``, or None."""
        return self._indexed(lambda m: m.first_at_time(self.name, timestamp))

    def bounds(self) -> tuple[int, int] | None:
        """First and end offsets of the listed segments, or None if there are none (two probes)."""
        return self._indexed(lambda m: m.bounds(self.name))

    def end_offset(self) -> int:
        """One past the last uploaded offset (0 if nothing is uploaded): where an empty folder of the
        channel starts. Two probes of the index; when it holds nothing of the channel and a daemon of
        this root ever ran, the head in the bucket decides, and a bucket that cannot be read raises
        (never a start below uploaded offsets)."""
        bounds = self.bounds()
        if bounds is not None:
            return bounds[1]
        if self._root_id() is None:
            return 0  # no daemon of this root ever ran (it takes its identity first): nothing of it was uploaded
        try:
            head = read_head(self.storage, self.name)
        except TierError as exc:
            raise TierError(
                f"cannot start the empty folder of {self.name}: where its offsets continue is in tier-2 "
                f"({redact_url(self.url)}), which cannot be read: {exc}; retry once it is reachable"
            ) from exc
        return 0 if head is None else head.end_offset

    def where(self, record: SegmentRecord) -> str:
        """Where a segment's bytes start, for messages (opens nothing)."""
        return self.object_url(record.chunks[0].name)

    def open_blocks(self, record: SegmentRecord) -> CompressedBlocks:
        """The blocks of an uploaded segment, read in ranges."""
        return self.reader.open(record)

    def info(self, record: SegmentRecord) -> CompressedInfo:
        """The header and block table of an uploaded segment (cached)."""
        return self.reader.info(record)

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
                cache_dir = self.cache_dir
                cache = BlockCache(self.cache_bytes) if cache_dir is None else DiskBlockCache(self.cache_bytes, cache_dir)
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
            if storage is not None and self._storages is None:  # a shared one is the caller's to close
                storage.close()
        finally:
            if metadata is not None:
                metadata.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TierContext({redact_url(self.url)!r}, name={self.name!r}, metadata={self.metadata_path!r})"


def tier_context_for(
    channel_path: str,
    config: ChannelConfig,
    metadata_path: str | None = None,
    name: str | None = None,
    storages: StorageClients | None = None,
) -> TierContext | None:
    """The tier context of the channel at ``channel_path``, or None when ``config.tier`` is None
    (its storage from ``storages`` if given: see :class:`TierContext`).

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
        storages=storages,
    )
