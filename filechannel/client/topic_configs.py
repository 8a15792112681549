"""Kafka's topic config names (``retention.ms``, ``segment.bytes``, ...) and ours (``retention_ms``).

Kafka's names are taken by ``KafkaAdminClient.create_topics``/``alter_configs`` and the CLI
(``topics create --config``, ``configs --alter --add-config``), and given back by
``describe_configs``. A dotted name is Kafka's, its value a string converted here
(``retention.ms=-1`` is no limit, ``flush.ms`` becomes seconds); an underscore name is ours,
its value passed on as it is. A Kafka config with no meaning on one machine is accepted and
dropped (:data:`IGNORED` is None for it); one asking for a Kafka feature filechannel lacks
(broker time stamps) is an :class:`UnsupportedError`; an unknown dotted name is a
:class:`ConfigError` listing the known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..config import ChannelConfig
from ..errors import ConfigError, UnsupportedError
from ..root import TOPIC_SETTINGS, effective_settings

_UNLIMITED = -1  # Kafka's "no limit" for retention.ms / retention.bytes (and "never" for segment.ms here)


def _int(name: str, raw: Any) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"topic config {name} must be an integer, not {raw!r}") from None


def _limit(name: str, raw: Any) -> int | None:
    value = _int(name, raw)
    return None if value == _UNLIMITED else value


def _compression(name: str, raw: Any) -> str:
    codecs = {"zstd": "zstd", "uncompressed": "none", "none": "none"}
    if str(raw).lower() not in codecs:
        raise UnsupportedError(f"{name}={raw}: sealed segments are compressed with zstd or not at all (zstd, uncompressed)")
    return codecs[str(raw).lower()]


def _flush_messages(name: str, raw: Any) -> str:
    if _int(name, raw) != 1:
        raise UnsupportedError(f'{name}={raw}: only 1 (an fsync per record: fsync="always") can be honoured here')
    return "always"


def _cleanup(name: str, raw: Any) -> str:
    """Kafka's list ``compact,delete`` in either order (and with spaces), as our one spelling."""
    parts = sorted({p.strip().lower() for p in str(raw).split(",")})
    policy = {("delete",): "delete", ("compact",): "compact", ("compact", "delete"): "compact,delete"}.get(tuple(parts))
    if policy is None:
        raise ConfigError(f"{name}={raw}: must be delete, compact, or compact,delete")
    return policy


def _ratio(name: str, raw: Any) -> float:
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"topic config {name} must be a number from 0 to 1, not {raw!r}") from None


def _max_lag(name: str, raw: Any) -> int | None:
    """Kafka's default, Long.MAX_VALUE (and -1 here), is no bound."""
    value = _int(name, raw)
    return None if value in (_UNLIMITED, 2**63 - 1) else value


def _timestamp_type(name: str, raw: Any) -> None:
    if raw != "CreateTime":
        raise UnsupportedError(f"{name}={raw}: records keep the producer's timestamp (CreateTime) only")


# Kafka topic config -> (our setting, how its value converts). Setting None: accepted, means nothing here.
KAFKA_TOPIC_CONFIGS: dict[str, tuple[str | None, Callable[[str, Any], Any] | None]] = {
    "retention.ms": ("retention_ms", _limit),
    "retention.bytes": ("retention_bytes", _limit),
    "segment.bytes": ("segment_bytes", _int),
    "segment.ms": ("segment_ms", _limit),
    "max.message.bytes": ("max_record_bytes", _int),
    "index.interval.bytes": ("index_interval_bytes", _int),
    "compression.type": ("compression", _compression),
    "compression.zstd.level": ("compression_level", _int),
    "flush.messages": ("fsync", _flush_messages),
    "flush.ms": ("fsync_interval", lambda name, raw: _int(name, raw) / 1000),
    "local.retention.ms": ("local_retention_ms", _limit),
    "local.retention.bytes": ("local_retention_bytes", _limit),
    "cleanup.policy": ("cleanup_policy", _cleanup),
    "delete.retention.ms": ("delete_retention_ms", _int),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", _ratio),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", _int),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", _max_lag),
    "message.timestamp.type": (None, _timestamp_type),
    # Replication and broker housekeeping: nothing to do on one machine.
    "min.insync.replicas": (None, None),
    "unclean.leader.election.enable": (None, None),
    "preallocate": (None, None),
    "file.delete.delay.ms": (None, None),
    "segment.jitter.ms": (None, None),
}


def topic_setting(key: str, value: Any) -> tuple[str, Any] | None:
    """One topic config as our setting: ``(name, value)``, or None for a Kafka config ignored here."""
    if "." not in key:
        return key, value
    if key not in KAFKA_TOPIC_CONFIGS:
        raise ConfigError(f"unknown topic config {key!r}; Kafka's configs taken here: {', '.join(sorted(KAFKA_TOPIC_CONFIGS))}")
    setting, convert = KAFKA_TOPIC_CONFIGS[key]
    converted = convert(key, value) if convert is not None else None
    return (setting, converted) if setting is not None else None


def topic_settings(configs: Mapping[str, Any]) -> dict[str, Any]:
    """Topic configs by Kafka's names or ours as our settings (those ignored here dropped)."""
    out: dict[str, Any] = {}
    for key, value in configs.items():
        setting = topic_setting(key, value)
        if setting is not None:
            out[setting[0]] = setting[1]
    return out


def removed_setting(key: str) -> str | None:
    """The setting a ``--delete-config KEY`` returns to its default (None: a Kafka config ignored here)."""
    if "." not in key:
        if key not in TOPIC_SETTINGS:
            raise ConfigError(f"unknown topic setting {key!r}; known: {', '.join(TOPIC_SETTINGS)}")
        return key
    if key not in KAFKA_TOPIC_CONFIGS:
        raise ConfigError(f"unknown topic config {key!r}; Kafka's configs taken here: {', '.join(sorted(KAFKA_TOPIC_CONFIGS))}")
    return KAFKA_TOPIC_CONFIGS[key][0]


def _kafka_value(setting: str, value: Any) -> str:
    """Our setting's value as Kafka writes the config's (``None`` limits as -1, ms as ints)."""
    if value is None:
        return str(_UNLIMITED)
    if setting == "compression":
        return "uncompressed" if value == "none" else str(value)
    if setting == "fsync_interval":
        return str(round(value * 1000))
    return str(value)


_KAFKA_NAME = {setting: name for name, (setting, _) in KAFKA_TOPIC_CONFIGS.items() if setting not in (None, "fsync")}


def described_configs(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every setting of a topic stored with ``config``, as ``describe_configs`` gives them:
    ``{name: {"value", "is_default", "read_only", "is_sensitive", "config_source"}}``, by Kafka's
    name where there is one (its value a string as Kafka's), else by ours (its value as stored).
    ``fsync`` has no Kafka name of its own (``flush.messages=1`` sets it to "always")."""
    defaults = ChannelConfig().as_dict()
    out: dict[str, dict[str, Any]] = {}
    for setting, value in effective_settings(config).items():
        name = _KAFKA_NAME.get(setting, setting)
        is_default = setting not in config or config[setting] == defaults[setting]
        out[name] = {
            "value": _kafka_value(setting, value) if name != setting else value,
            "is_default": is_default,
            "read_only": setting == "tier",
            "is_sensitive": False,
            "config_source": "DEFAULT_CONFIG" if is_default else "DYNAMIC_TOPIC_CONFIG",
        }
    return out
