"""The settings of one channel, validated when the channel is opened."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import ConfigError

FSYNC_POLICIES = ("never", "interval", "always")
COMPRESSIONS = ("zstd", "none")


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
