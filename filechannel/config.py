"""The settings of one channel, validated when the channel is opened."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import ConfigError

FSYNC_POLICIES = ("never", "interval", "always")
COMPRESSIONS = ("zstd", "none")
# Option names that look like credentials: refused in tier_options (the config is stored in topic.json).
_SECRET = re.compile(r"secret|password|passwd|token|credential|(^|_)key$|^key|access_key|session", re.IGNORECASE)


@dataclass(frozen=True)
class ChannelConfig:
    """Settings of a channel. Sizes are in bytes, ``*_ms`` in milliseconds, other times in seconds.

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

    Tier-2 (see DESIGN.md "Tier-2: uploads, retention and the daemon"):
    tier: storage URL of tier-2 (file:///path, s3://bucket/prefix, another fsspec URL);
        None turns tiering off. With a tier, ``retention_bytes`` / ``retention_ms`` are the
        total across both tiers, and only the tiering daemon deletes segments.
    tier_options: non-secret storage options (endpoint_url, region_name, backend...);
        credentials come from the environment or boto3's chain, never from this file.
    local_retention_bytes / local_retention_ms: how much of the uploaded data stays on local
        disk (None: keep everything local). A segment is never deleted locally before it is uploaded.
    tier_after_ms: upload a sealed segment only once its newest record is this old (None:
        as soon as it is sealed and compressed).
    tier_chunk_bytes: largest chunk object of an uploaded segment. tier_cache_bytes: the
        bound of the in-memory cache of remote blocks. tier_upload_bytes_per_s: upload rate
        limit (None: unlimited). tier_concurrency: chunk uploads (and remote reads) in flight.
    """

    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int | None = None
    max_record_bytes: int = 1024 * 1024
    index_interval_bytes: int = 4096
    flush_interval: float = 0.0005
    buffer_bytes: int = 1024 * 1024
    fsync: str = "interval"
    fsync_interval: float = 1.0
    compression: str = "zstd"
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
    tier_upload_bytes_per_s: int | None = None
    tier_concurrency: int = 4

    def __post_init__(self) -> None:
        _positive_int(self, "segment_bytes", minimum=4096)
        _positive_int(self, "max_record_bytes", minimum=16)
        _positive_int(self, "index_interval_bytes", minimum=1)
        _positive_int(self, "buffer_bytes", minimum=1)
        _positive_int(self, "compression_block_bytes", minimum=1024)
        _positive_int(self, "segment_ms", minimum=1, optional=True)
        _positive_int(self, "retention_bytes", minimum=0, optional=True)
        _positive_int(self, "retention_ms", minimum=0, optional=True)
        _number(self, "flush_interval", minimum=0.0)
        _number(self, "fsync_interval", minimum=0.0)
        _number(self, "maintenance_interval", minimum=0.0)
        if self.fsync not in FSYNC_POLICIES:
            raise ConfigError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {self.fsync!r}")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(f"compression must be one of {', '.join(COMPRESSIONS)}, not {self.compression!r}")
        if not isinstance(self.compression_level, int) or not 1 <= self.compression_level <= 22:
            raise ConfigError(f"compression_level must be an int from 1 to 22, not {self.compression_level!r}")
        if self.max_record_bytes > 0x7FFFFFFF:
            raise ConfigError("max_record_bytes must be below 2 GiB (a frame length is a u32)")
        self._check_tier()

    def _check_tier(self) -> None:
        _positive_int(self, "local_retention_bytes", minimum=0, optional=True)
        _positive_int(self, "local_retention_ms", minimum=0, optional=True)
        _positive_int(self, "tier_after_ms", minimum=0, optional=True)
        _positive_int(self, "tier_chunk_bytes", minimum=1024)
        _positive_int(self, "tier_cache_bytes", minimum=1024)
        _positive_int(self, "tier_upload_bytes_per_s", minimum=1, optional=True)
        _positive_int(self, "tier_concurrency", minimum=1)
        if self.tier is not None and (not isinstance(self.tier, str) or "://" not in self.tier):
            raise ConfigError(
                f"tier must be a storage URL (file:///path, s3://bucket/prefix, another fsspec URL) or None, not {self.tier!r}"
            )
        if self.tier_options is None:
            return
        if not isinstance(self.tier_options, dict) or not all(isinstance(k, str) for k in self.tier_options):
            raise ConfigError(f"tier_options must be a dict of str keys or None, not {self.tier_options!r}")
        secret = sorted(k for k in _keys(self.tier_options) if _SECRET.search(k))
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


def _positive_int(cfg: ChannelConfig, name: str, *, minimum: int, optional: bool = False) -> None:
    value = getattr(cfg, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}{' or None' if optional else ''}, not {value!r}")


def _number(cfg: ChannelConfig, name: str, *, minimum: float) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ConfigError(f"{name} must be a number >= {minimum}, not {value!r}")


def _keys(options: dict[str, Any]) -> list[str]:
    """Every key of ``options`` and of the dicts nested in it (client_kwargs... may hold credentials too)."""
    keys = []
    for key, value in options.items():
        keys.append(str(key))
        if isinstance(value, dict):
            keys.extend(_keys(value))
    return keys
