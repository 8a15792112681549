"""The admin client of topics under one root folder (kafka-python's ``KafkaAdminClient`` role).

The root's layout is :mod:`filechannel.root`'s; its names are named here too, as the client's
public names. :class:`TopicStore` is the root's layout that also opens partitions as channels.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Unpack

from ..channel import FileChannel
from ..config import TopicSettings
from ..engine.wakeup import Wakeup
from ..errors import FileChannelError
from ..root import (
    GROUPS_DIR,
    ROOT_SETTINGS,
    ROOT_TIER_DIR,
    SETTINGS_FILE,
    TOPIC_FILE,
    TOPIC_SETTINGS,
    RootLayout,
    validate_topic_config,
)
from ..tiering.bindings import StorageClients, check_storage

log = logging.getLogger("filechannel")

__all__ = [
    "GROUPS_DIR",
    "ROOT_SETTINGS",
    "SETTINGS_FILE",
    "TOPIC_FILE",
    "TOPIC_SETTINGS",
    "Admin",
    "PartitionDescription",
    "TopicDescription",
    "TopicStore",
    "validate_topic_config",
]


class TopicStore(RootLayout):
    """Reads and creates topics under a root (see :class:`~filechannel.root.RootLayout`) and opens
    their partitions as channels. Thread-safe."""

    def open_partition(
        self,
        topic: str,
        partition: int,
        *,
        wakeup: Wakeup | None = None,
        tier_storages: StorageClients | None = None,
        **overrides: Any,
    ) -> FileChannel:
        """Open partition ``partition`` of ``topic`` as a channel with the topic's settings (under
        ``overrides``); its maintenance thread applies the topic's changed settings within a
        second or so (:meth:`FileChannel.apply_settings`: ``RootLayout.meta`` re-reads a changed
        ``topic.json``). In a replica root (:meth:`RootLayout.replica`) it opens read-only, and
        a write raises :class:`~filechannel.errors.ReadOnlyError` saying the root is a replica.
        ``tier_storages``: storage clients shared across channels (see :class:`FileChannel`)."""
        settings = self.partition_settings(topic, partition, **overrides)
        replica = self.replica()
        if replica is not None:  # a replica root: every partition read-only, a write says why
            settings["read_only_because"] = str(replica.refusal("write to it"))
        return FileChannel(
            self.partition_path(topic, partition),
            wakeup=wakeup,
            tier_storages=tier_storages,
            settings_source=lambda: self.partition_settings(topic, partition, **overrides),
            **settings,
        )

    def delete(self, topic: str) -> None:
        """:meth:`RootLayout.delete`; a tiered topic's deletion is also marked in its tier-2 storage at
        once when that can be reached (:func:`~filechannel.tiering.marks.mark_deleted_now`), so a
        rebuild of a lost root never brings the topic back; if it cannot, the daemon's purge
        writes the mark once the storage is back. Refused in a replica root (:class:`ReadOnlyError`):
        its topics are the bucket's."""
        self._refuse_in_replica(f"delete topic {topic!r}")
        config = self.tier_config((self._read_file(topic) or {}).get("config", {}))
        super().delete(topic)
        if config.get("tier") is not None:
            try:
                from ..tiering.marks import mark_deleted_now  # tier-2's metadata: only for a tiered topic's delete

                mark_deleted_now(os.path.join(self.root, ROOT_TIER_DIR), topic, config["tier"], config.get("tier_options"))
            except FileChannelError as exc:
                log.warning("topic %s deleted; its tier-2 storage cannot be marked now (%s): the daemon's purge will", topic, exc)

    def _create(self, topic: str, partitions: int, config: Mapping[str, Any], existing_is: str) -> dict[str, Any]:
        """:meth:`RootLayout.create` and ``ensure``, after opening the topic's tier-2 storage (if it
        has a ``tier``) without a request: a URL naming no storage, an unknown option or a missing
        library fails the creation with :class:`ConfigError`, not the topic's first upload.
        A new topic is refused in a replica root (:class:`ReadOnlyError`): its topics are the bucket's."""
        if self._read_file(topic) is None:  # not read(): a topic folder without topic.json is create's to explain
            self._refuse_in_replica(f"create topic {topic!r}")
        checked = validate_topic_config(config)
        if checked.get("tier") is not None:
            check_storage(checked["tier"], checked.get("tier_options"))
        return super()._create(topic, partitions, checked, existing_is)

    def _refuse_in_replica(self, what: str) -> None:
        replica = self.replica()
        if replica is not None:
            raise replica.refusal(what)

    def alter(self, topic: str, changes: Mapping[str, Any], removed: Iterable[str] = ()) -> dict[str, Any]:
        """:meth:`RootLayout.alter`, after opening new ``tier_options``' storage as :meth:`_create` does."""
        if "tier_options" in changes:
            tier = self.meta(topic).get("config", {}).get("tier")
            if tier is not None:
                check_storage(tier, changes["tier_options"])
        return super().alter(topic, changes, removed)


@dataclass(frozen=True)
class PartitionDescription:
    """A partition as ``describe_topic`` found it. ``records`` counts the records held: the
    offsets from first to end less the holes compaction left."""

    partition: int
    first_offset: int
    end_offset: int
    size_bytes: int
    records: int


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: list[PartitionDescription]
    config: dict[str, Any] = field(default_factory=dict)


class Admin:
    """Creates, lists, describes and deletes topics under ``root``.

    >>> admin = Admin("/data/fc")
    >>> admin.create_topic("orders", partitions=3, retention_ms=7 * 24 * 3600 * 1000)
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._store = TopicStore(root)
        self.root = self._store.root

    def create_topic(self, name: str, partitions: int = 1, *, exist_ok: bool = False, **config: Unpack[TopicSettings]) -> None:
        """Create topic ``name``. ``config``: the settings a topic stores, typed as
        :class:`~filechannel.config.TopicSettings` (segment_bytes, retention_ms, fsync, compression, ...).

        Raises :class:`TopicExistsError` if it exists (unless ``exist_ok``), :class:`ConfigError`
        for a bad setting.
        """
        self._store.create(name, partitions, config, exist_ok=exist_ok)

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name`` and all its data. Stop its producers and consumers first."""
        self._store.delete(name)

    def list_topics(self) -> list[str]:
        return self._store.list()

    def root_settings(self) -> dict[str, bool]:
        """The root's settings with their defaults (``ROOT/.settings.json``): auto.create.topics.enable."""
        return self._store.root_settings()

    def set_root_setting(self, name: str, value: bool) -> None:
        """Store a root setting, e.g. ``set_root_setting("auto.create.topics.enable", False)``."""
        self._store.set_root_setting(name, value)

    def origin(self) -> str | None:
        """The root's origin in tier-2 (None: the default origin, objects at each tier URL itself)."""
        return self._store.origin()

    def set_origin(self, origin: str) -> None:
        """Give the root an origin: its tiered topics keep their tier-2 objects under
        ``<tier-url>/<origin>/``, so many roots can tier into one bucket URL (DESIGN.md, "Origins").
        Only before the root's first tiered topic (:class:`ConfigError` after)."""
        self._store.set_origin(origin)

    def describe_topic(self, name: str) -> TopicDescription:
        """Partitions with their first and end offsets, records and bytes on disk, and the settings."""
        meta = self._store.meta(name)
        parts = []
        for p in range(int(meta["partitions"])):
            with self._store.open_partition(name, p, read_only=True) as ch:
                parts.append(PartitionDescription(p, ch.first_offset, ch.end_offset, ch.size_bytes, ch.record_count()))
        return TopicDescription(name, parts, dict(meta.get("config", {})))

    def alter_topic(self, name: str, changes: Mapping[str, Any], removed: Iterable[str] = ()) -> dict[str, Any]:
        """Set the settings ``changes`` of topic ``name`` (our names, as ``create_topic`` takes them)
        and return ``removed`` ones to their defaults; return the topic's settings now.

        Checked whole before ``topic.json`` is rewritten. ``tier`` cannot change (its uploaded
        segments are in that storage). Open producers and consumers apply retention and segment
        settings within about a second; see :meth:`FileChannel.apply_settings`.
        """
        return dict(self._store.alter(name, changes, removed).get("config", {}))

    def add_partitions(self, name: str, total: int) -> None:
        """Grow topic ``name`` to ``total`` partitions (:class:`InvalidPartitionsError` for fewer or
        as many as it has: partitions are never removed). The existing ones keep their records;
        a key's partition is its hash modulo the count, so keyed records go to other partitions
        from now on, as in Kafka. Open producers and consumers see the new partitions within a second."""
        self._store.add_partitions(name, total)

    def delete_records_before(self, topic: str, partition: int, offset: int) -> int:
        """Delete the records of ``topic[partition]`` below ``offset`` (-1: all, up to the end);
        return its new first offset (Kafka's low watermark).

        Durable: the partition's log start offset is kept in its folder, so a restart keeps it.
        Readers below it get :class:`OffsetOutOfRangeError` (a consumer resets by its
        ``auto_offset_reset``); whole segments below it are deleted now (with a tier, the
        tiering daemon deletes them, and tier-2 copies below it are never read again).
        """
        with self._store.open_partition(topic, partition, maintenance_interval=0) as ch:
            return ch.delete_records(ch.end_offset if offset == -1 else offset)

    def open_partition(self, topic: str, partition: int, **overrides: Any) -> FileChannel:
        """Open one partition's channel (the caller closes it)."""
        return self._store.open_partition(topic, partition, **overrides)
