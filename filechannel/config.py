"""The settings of one channel, validated when the channel is opened."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, TypedDict, get_args

from .errors import ConfigError

FsyncPolicy = Literal["never", "interval", "always"]
Compression = Literal["zstd", "none"]
CleanupPolicy = Literal["delete", "compact", "compact,delete"]
FSYNC_POLICIES: tuple[FsyncPolicy, ...] = get_args(FsyncPolicy)
COMPRESSIONS: tuple[Compression, ...] = get_args(Compression)
CLEANUP_POLICIES: tuple[CleanupPolicy, ...] = get_args(CleanupPolicy)
# Index entries hold a byte position as a u32, and a segment may pass segment_bytes by one
# batch (itself at most MAX_BATCH_BYTES, record.py): 2 GiB each keeps every position below 4 GiB.
MAX_SEGMENT_BYTES = 2**31
_MAX_I64 = 2**63 - 1  # the appender keeps sizes as C long longs
# Option names that look like credentials: refused in tier_options (the config is stored in topic.json).
_SECRET = re.compile(r"secret|password|passwd|token|credential|(^|_)key$|^key|access_key|session", re.IGNORECASE)


class TopicSettings(TypedDict, total=False):
    """The settings a topic stores (``Admin.create_topic(name, partitions, **settings)``, ``topic.json``).

    Every key is optional; a type checker reports a misspelt name or a value of the wrong type.
    The meaning, default and bounds of each are :class:`ChannelConfig`'s, which checks the
    values at run time (a test keeps these keys and its fields the same).
    """

    segment_bytes: int  # roll the active segment at this size (4096 to 2 GiB)
    segment_ms: int | None  # ...or at this age in ms (None: never by age)
    retention_bytes: int | None  # delete the oldest sealed segments past this total size (None: keep)
    retention_ms: int | None  # ...or once their newest record is older than this (None: keep)
    fsync: FsyncPolicy  # "never", "interval" (every fsync_interval s) or "always"
    fsync_interval: float  # seconds between fsyncs under fsync="interval" (0 to 86400)
    compression: Compression  # "zstd": compress sealed segments in the background; "none": keep them raw
    compression_level: int  # zstd level, 1 to 22
    compression_block_bytes: int  # uncompressed size of one independently readable block
    max_record_bytes: int  # largest record payload; larger ones raise MessageTooLargeError
    index_interval_bytes: int  # one sparse index entry per this many bytes of frames
    tier: str | None  # tier-2 storage URL (file:///path, s3://bucket/prefix, ...); None: no tiering
    tier_options: dict[str, Any] | None  # non-secret storage options (endpoint_url, region_name, ...)
    local_retention_bytes: int | None  # uploaded data kept on local disk, by size (None: all)
    local_retention_ms: int | None  # ...by age in ms (None: all)
    tier_after_ms: int | None  # upload records once this old, sealing the active segment for it (None: once sealed)
    tier_chunk_bytes: int  # largest chunk object of an uploaded segment
    tier_cache_bytes: int  # bound of the cache of remote blocks
    tier_cache_dir: str | None  # folder for that cache (None: in memory)
    tier_upload_bytes_per_s: int | None  # upload rate limit (None: unlimited)
    tier_concurrency: int  # chunk uploads and remote reads in flight, 1 to 256
    cleanup_policy: CleanupPolicy  # "delete" (retention only), "compact" (latest value per key), or both
    delete_retention_ms: int  # a tombstone is kept by compaction until it is this old (by its timestamp)
    min_cleanable_dirty_ratio: float  # clean once this share of the sealed bytes was never cleaned (0 to 1)
    min_compaction_lag_ms: int  # a segment is cleaned only once its newest record is this old
    max_compaction_lag_ms: int | None  # ...and at the latest once its first record is this old (None: no bound)


class ChannelSettings(TopicSettings, total=False):
    """The settings of a channel: ``FileChannel(path, **settings)``, ``ChannelConfig.from_kwargs``.

    The topic's settings and those that belong to each writer (not stored in ``topic.json``).
    """

    flush_interval: float  # the background flusher writes at most once per this many seconds (0 to 3600)
    buffer_bytes: int  # the buffer is written at once when it reaches this size
    maintenance_interval: float  # seconds between background compress/collect passes; 0: no thread
    cleaner_dedupe_buffer_bytes: int  # memory of the cleaner's key map (Kafka's log.cleaner.dedupe.buffer.size)


@dataclass(frozen=True)
class ChannelConfig:
    """Settings of a channel. Sizes are in bytes, ``*_ms`` in milliseconds, other times in seconds.
    Callers' type checkers see them as :class:`ChannelSettings` (:class:`TopicSettings`: a topic's).

    segment_bytes: roll the active segment once it holds this many bytes (a single batch is
        never split, so a segment may exceed it by one batch).
    segment_ms: also roll once the active segment is this old (None: never by age).
    max_record_bytes: largest record payload accepted; larger ones raise MessageTooLargeError.
    index_interval_bytes: one sparse index entry per this many bytes of frames.
    flush_interval: the background flusher writes at most once per this many seconds; a
        record that finds it idle is written at once, so this bounds how long a record waits
        in the buffer while keeping writes batched under load.
    buffer_bytes: the buffer is written at once when it reaches this size.
    fsync: "never" (the OS decides), "interval" (every ``fsync_interval`` seconds) or
        "always" (send returns only once the record is on disk; concurrent sends share fsyncs).
    compression: "zstd" compresses sealed segments in the background, "none" keeps them raw.
    compression_level: zstd level. compression_block_bytes: uncompressed size of one
        independently decompressible block.
    retention_bytes / retention_ms: delete the oldest sealed segments once the channel is larger
        than this, or once their newest record is older than this (None: keep).
    maintenance_interval: how often the background thread compresses and collects (seconds);
        0 disables the thread (call ``compress_sealed()`` and ``collect_garbage()`` yourself).

    Every value is checked when the config is made, and anything else raises
    :class:`ConfigError` naming the setting and what it must be: sizes and ``*_ms`` are ints
    (not bools) within bounds the file formats can hold (``segment_bytes`` at most 2 GiB, so
    index positions fit their u32), and the three intervals are finite seconds, at most an
    hour for ``flush_interval`` (a writer holds ``writer.lock`` up to twice that) and a day
    for the other two: ``inf`` or ``nan`` once kept other processes out of the channel for
    good, or silently stopped compression and garbage collection.

    Compaction (Kafka's ``cleanup.policy=compact``, see README "Compacted topics"):
    cleanup_policy: "delete" keeps every record until retention deletes its segment; "compact"
        keeps, in sealed segments, only the last record of each key (a send without a key is
        refused); "compact,delete" does both. A compacted channel has no tier: compaction of
        tier-2 history is not done, so ``tier`` with "compact" is refused.
    delete_retention_ms: a tombstone (a record with value None) stays through compaction until
        its own timestamp is this old, so that readers behind see the delete.
    min_cleanable_dirty_ratio: the cleaner runs once the bytes of sealed segments never cleaned
        are at least this share of all sealed bytes. min_compaction_lag_ms: a segment whose
        newest record is younger than this is not cleaned yet. max_compaction_lag_ms: a segment
        never cleaned whose first record is older than this is cleaned whatever the ratio.
    cleaner_dedupe_buffer_bytes: the memory of the cleaner's map of keys (about
        ``cleaner.KEY_ENTRY_BYTES`` a key): a pass cleans as many segments as their keys fit.

    Tier-2 (see DESIGN.md "Tier-2: uploads, retention and the daemon"):
    tier: storage URL of tier-2 (file:///path, s3://bucket/prefix, another fsspec URL);
        None turns tiering off. With a tier, ``retention_bytes`` / ``retention_ms`` are the
        total across both tiers, and only the tiering daemon deletes segments.
    tier_options: non-secret storage options (endpoint_url, region_name, backend...);
        credentials come from the environment or boto3's chain, never from this file.
    local_retention_bytes / local_retention_ms: how much of the uploaded data stays on local
        disk (None: keep everything local). A segment is never deleted locally before it is uploaded.
    tier_after_ms: the freshness of tier-2: the daemon uploads a segment once its first record
        is this old, and seals the active segment for it then (idle or slow writers), so a
        reader of tier-2 is behind the writer by at most this, a daemon pass and an upload
        (None: a segment moves once its writer seals it, at ``segment_bytes``/``segment_ms``).
    tier_chunk_bytes: largest chunk object of an uploaded segment. tier_cache_bytes: the
        bound of the cache of remote blocks, in memory, or in files of ``tier_cache_dir``
        when set (a private subfolder per process, removed on close). tier_upload_bytes_per_s: upload rate
        limit (None: unlimited). tier_concurrency: chunk uploads (and remote reads) in flight.
    """

    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int | None = None
    max_record_bytes: int = 1024 * 1024
    index_interval_bytes: int = 4096
    flush_interval: float = 0.0005
    buffer_bytes: int = 1024 * 1024
    fsync: FsyncPolicy = "interval"
    fsync_interval: float = 1.0
    compression: Compression = "zstd"
    compression_level: int = 3
    compression_block_bytes: int = 256 * 1024
    retention_bytes: int | None = None
    retention_ms: int | None = None
    maintenance_interval: float = 1.0
    tier: str | None = None
    tier_options: dict[str, Any] | None = None
    local_retention_bytes: int | None = None
    local_retention_ms: int | None = None
    tier_after_ms: int | None = None
    tier_chunk_bytes: int = 16 * 1024 * 1024
    tier_cache_bytes: int = 64 * 1024 * 1024
    tier_cache_dir: str | None = None
    tier_upload_bytes_per_s: int | None = None
    tier_concurrency: int = 4
    cleanup_policy: CleanupPolicy = "delete"
    delete_retention_ms: int = 86_400_000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int | None = None
    cleaner_dedupe_buffer_bytes: int = 128 * 1024 * 1024

    def __post_init__(self) -> None:
        _int(self, "segment_bytes", minimum=4096, maximum=MAX_SEGMENT_BYTES)
        _int(self, "max_record_bytes", minimum=16, maximum=0x7FFFFFFF)
        _int(self, "index_interval_bytes", minimum=1, maximum=MAX_SEGMENT_BYTES)
        _int(self, "buffer_bytes", minimum=1, maximum=_MAX_I64)
        _int(self, "compression_block_bytes", minimum=1024, maximum=0x7FFFFFFF)
        _int(self, "segment_ms", minimum=1, maximum=_MAX_I64, optional=True)
        _int(self, "retention_bytes", minimum=0, maximum=_MAX_I64, optional=True)
        _int(self, "retention_ms", minimum=0, maximum=_MAX_I64, optional=True)
        _seconds(self, "flush_interval", maximum=3600)
        _seconds(self, "fsync_interval", maximum=86400)
        _seconds(self, "maintenance_interval", maximum=86400)
        if not isinstance(self.fsync, str) or self.fsync not in FSYNC_POLICIES:
            raise ConfigError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {self.fsync!r}")
        if not isinstance(self.compression, str) or self.compression not in COMPRESSIONS:
            raise ConfigError(f"compression must be one of {', '.join(COMPRESSIONS)}, not {self.compression!r}")
        _int(self, "compression_level", minimum=1, maximum=22)
        self._check_compaction()
        self._check_tier()

    @property
    def compacted(self) -> bool:
        """Whether the cleaner keeps only the last record of each key (``cleanup_policy`` has "compact")."""
        return self.cleanup_policy != "delete"

    def _check_compaction(self) -> None:
        if not isinstance(self.cleanup_policy, str) or self.cleanup_policy not in CLEANUP_POLICIES:
            raise ConfigError(f"cleanup_policy must be one of {', '.join(CLEANUP_POLICIES)}, not {self.cleanup_policy!r}")
        _int(self, "delete_retention_ms", minimum=0, maximum=_MAX_I64)
        _int(self, "min_compaction_lag_ms", minimum=0, maximum=_MAX_I64)
        _int(self, "max_compaction_lag_ms", minimum=0, maximum=_MAX_I64, optional=True)
        _int(self, "cleaner_dedupe_buffer_bytes", minimum=1024, maximum=_MAX_I64)
        ratio = self.min_cleanable_dirty_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
            raise ConfigError(f"min_cleanable_dirty_ratio must be a number from 0 to 1, not {ratio!r}")
        if self.compacted and self.tier is not None:
            raise ConfigError(
                f"cleanup_policy={self.cleanup_policy!r} cannot go with a tier: compaction of tier-2 history is not "
                "done, so a compacted topic keeps its log local (leave tier unset, or use cleanup_policy='delete')"
            )

    def _check_tier(self) -> None:
        _int(self, "local_retention_bytes", minimum=0, maximum=_MAX_I64, optional=True)
        _int(self, "local_retention_ms", minimum=0, maximum=_MAX_I64, optional=True)
        _int(self, "tier_after_ms", minimum=0, maximum=_MAX_I64, optional=True)
        _int(self, "tier_chunk_bytes", minimum=1024, maximum=5 * 2**30)
        _int(self, "tier_cache_bytes", minimum=1024, maximum=_MAX_I64)
        if self.tier_cache_dir is not None and (not isinstance(self.tier_cache_dir, str) or not self.tier_cache_dir.strip()):
            raise ConfigError(f"tier_cache_dir must be a folder path or None, not {self.tier_cache_dir!r}")
        _int(self, "tier_upload_bytes_per_s", minimum=1, maximum=_MAX_I64, optional=True)
        _int(self, "tier_concurrency", minimum=1, maximum=256)
        if self.tier is not None and (not isinstance(self.tier, str) or "://" not in self.tier):
            raise ConfigError(
                f"tier must be a storage URL (file:///path, s3://bucket/prefix, another fsspec URL) or None, not {self.tier!r}"
            )
        if self.tier_options is None:
            return
        if not isinstance(self.tier_options, dict) or not all(isinstance(k, str) for k in self.tier_options):
            raise ConfigError(f"tier_options must be a dict of str keys or None, not {self.tier_options!r}")
        secret = credential_names(self.tier_options)
        if secret:
            raise ConfigError(
                f"tier_options must not hold credentials ({', '.join(secret)}): they would be stored in topic.json; "
                "give them through the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY...) or boto3's credential chain"
            )

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> ChannelConfig:
        """Build a config from keyword arguments, rejecting unknown names with the list of known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown channel setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**kwargs)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(cfg: ChannelConfig, name: str, *, minimum: int, maximum: int, optional: bool = False) -> None:
    value = getattr(cfg, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigError(f"{name} must be an int from {minimum} to {maximum}{' or None' if optional else ''}, not {value!r}")


def _seconds(cfg: ChannelConfig, name: str, *, maximum: int) -> None:
    value = getattr(cfg, name)
    # Written so that nan and inf fail too (every comparison with nan is False).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= maximum:
        raise ConfigError(f"{name} must be a finite number of seconds from 0 to {maximum}, not {value!r}")


def credential_names(options: dict[str, Any]) -> list[str]:
    """The names in storage ``options`` (nested dicts included) that look like credentials, sorted:
    options that are kept or passed on (a topic's settings, Spark's plan) must not hold them."""
    return sorted(k for k in _keys(options) if _SECRET.search(k))


def _keys(options: dict[str, Any]) -> list[str]:
    """Every key of ``options`` and of the dicts nested in it (client_kwargs... may hold credentials too)."""
    keys = []
    for key, value in options.items():
        keys.append(str(key))
        if isinstance(value, dict):
            keys.extend(_keys(value))
    return keys
