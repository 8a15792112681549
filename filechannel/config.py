"""The settings of one channel, validated when the channel is opened."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import ConfigError

FSYNC_POLICIES = ("never", "interval", "always")
COMPRESSIONS = ("zstd", "none")
# Index entries hold a byte position as a u32, and a segment may pass segment_bytes by one
# batch (itself at most MAX_BATCH_BYTES, record.py): 2 GiB each keeps every position below 4 GiB.
MAX_SEGMENT_BYTES = 2**31
_MAX_I64 = 2**63 - 1  # the appender keeps sizes as C long longs


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

    Every value is checked when the config is made, and anything else raises
    :class:`ConfigError` naming the setting and what it must be: sizes and ``*_ms`` are ints
    (not bools) within bounds the file formats can hold (``segment_bytes`` at most 2 GiB, so
    index positions fit their u32), and the three intervals are finite seconds, at most an
    hour for ``flush_interval`` (a writer holds ``writer.lock`` up to twice that) and a day
    for the other two: ``inf`` or ``nan`` once kept other processes out of the channel for
    good, or silently stopped compression and garbage collection.
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
