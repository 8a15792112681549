"""The channels a root tiers, as the tools that work on a root's whole tier-2 see them (the
daemon, ``tier status``, ``fsck``, ``defrag``): each partition of a topic whose settings have
``tier`` (:class:`TieredChannel`, :func:`tiered_partitions`), and the storage each names
(:func:`storage_key`: one client per key).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..config import ChannelConfig
from ..errors import ConfigError
from ..root import RootLayout, partition_name
from . import bindings


@dataclass(frozen=True)
class TieredChannel:
    """One channel the daemon tiers (a partition of one of the root's topics, or the one channel of a
    daemon run on a channel folder): its folder, its name in tier-2, its settings (``tier`` already
    under the root's origin, :meth:`RootLayout.tier_config`), and its topic's partition count."""

    path: str
    name: str
    config: ChannelConfig
    partitions: int = 1


def tiered_partitions(root: str) -> list[TieredChannel]:
    """Every partition of every topic under ``root`` whose settings have ``tier`` set (read
    through the root's layout, RootLayout: one reader of ``topic.json``), its ``tier`` under the
    root's origin. A damaged topic.json raises ConfigError, naming it."""
    store = RootLayout(root)
    found = []
    for topic in store.list():
        meta = store.read(topic)
        settings = dict((meta or {}).get("config", {}))
        if meta is None or settings.get("tier") is None:
            continue
        config = ChannelConfig.from_kwargs(**{**store.tier_config(settings), "maintenance_interval": 0})
        for p in range(int(meta["partitions"])):
            path = store.partition_path(topic, p)
            if os.path.isdir(path):
                found.append(TieredChannel(path, partition_name(topic, p), config, int(meta["partitions"])))
    return found


def tier_of(config: ChannelConfig) -> tuple[str, dict[str, Any] | None]:
    """A tiered channel's storage: its URL and options (ConfigError for a channel without a tier)."""
    if config.tier is None:
        raise ConfigError("a channel without a tier setting has no storage")
    return config.tier, config.tier_options


def storage_key(config: ChannelConfig) -> tuple[str, str]:
    """Which storage a tiered channel's settings name (:func:`.bindings.storage_key`: one client per key)."""
    return bindings.storage_key(*tier_of(config))
