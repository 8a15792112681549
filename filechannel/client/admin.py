"""kafka-python's ``KafkaAdminClient`` over a root folder: its method names, arguments and results.

``KafkaAdminClient(root=..., **kafka_python_configs)`` takes every configuration name
kafka-python's admin client knows (all of them about a network: accepted and ignored, a typo
refused, see :mod:`.kafka_names`). Topics are :class:`~.topics.Admin`'s (this class is one);
configs are Kafka's names mapped to our settings (:mod:`.topic_configs`); groups are
:mod:`.group`'s files. Results have kafka-python's shapes (each method says which); errors are
raised as kafka-python's names for them (:mod:`.errors`) rather than returned, except where
kafka-python returns them per item (``delete_consumer_groups``).

Invariants: every argument is checked before anything changes (a list of topics to create
is checked whole first); a group's offsets change only while no member of it is alive (Kafka
refuses them for a group that is not empty), so no member commits over them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from enum import IntEnum
from typing import Any, NamedTuple

from ..errors import (
    ConfigError,
    FileChannelError,
    GroupNotEmptyError,
    GroupNotFoundError,
    RootUnavailableError,
    UnsupportedError,
)
from ..root import ROOT_SETTINGS, TOPIC_SETTINGS
from .consumer import Consumer
from .group import OFFSETS_FILE, delete_group, group_folder, list_groups, live_members, read_group, read_metadata, tp_key
from .kafka_names import ADMIN_IGNORED, check_names
from .records import OffsetAndMetadata, TopicPartition, to_tp
from .topic_configs import described_configs, topic_settings
from .topics import Admin

__all__ = [
    "ConfigResource",
    "ConfigResourceType",
    "GroupInformation",
    "KafkaAdminClient",
    "MemberInformation",
    "NewPartitions",
    "NewTopic",
]

_KEPT_ON_ALTER = ("tier", "tier_options")  # alter_configs replaces the rest (Kafka's AlterConfigs), not these


class NewTopic:
    """A topic for :meth:`KafkaAdminClient.create_topics` (kafka-python's). ``replication_factor``
    and ``replica_assignments`` are accepted and mean nothing on one machine; ``topic_configs``
    take Kafka's names (``{"retention.ms": "1000"}``) or ours (``{"retention_ms": 1000}``)."""

    def __init__(
        self,
        name: str,
        num_partitions: int = 1,
        replication_factor: int = 1,
        replica_assignments: Mapping[int, list[int]] | None = None,
        topic_configs: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor
        self.replica_assignments = dict(replica_assignments or {})
        self.topic_configs = dict(topic_configs or {})

    def __repr__(self) -> str:
        return f"NewTopic({self.name!r}, {self.num_partitions}, {self.replication_factor}, topic_configs={self.topic_configs})"


class NewPartitions:
    """The partition count a topic grows to, for :meth:`KafkaAdminClient.create_partitions`
    (``new_assignments``, the brokers of each new partition, means nothing here)."""

    def __init__(self, total_count: int, new_assignments: list[list[int]] | None = None) -> None:
        self.total_count = total_count
        self.new_assignments = new_assignments

    def __repr__(self) -> str:
        return f"NewPartitions({self.total_count})"


class ConfigResourceType(IntEnum):
    """What a :class:`ConfigResource` names (kafka-python's values). TOPIC: a topic's settings;
    BROKER: the root's settings (``auto.create.topics.enable``), the broker's in Kafka."""

    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4


class ConfigResource:
    """A topic (or the root, as BROKER) and its configs: names to describe (a list, or None for
    all) or names and values to set (a dict). ``resource_type`` may be given as "topic"."""

    def __init__(
        self, resource_type: ConfigResourceType | str, name: str, configs: Mapping[str, Any] | list[str] | None = None
    ) -> None:
        if not isinstance(resource_type, ConfigResourceType):
            try:
                resource_type = ConfigResourceType[str(resource_type).upper()]
            except KeyError:
                raise ConfigError(f"resource type {resource_type!r} is not one of TOPIC, BROKER") from None
        self.resource_type = resource_type
        self.name = name
        self.configs = configs

    def __repr__(self) -> str:
        return f"ConfigResource({self.resource_type!r}, {self.name!r}, {self.configs!r})"


class MemberInformation(NamedTuple):
    """A live member of a group, as kafka-python's ``describe_consumer_groups`` gives it
    (``member_metadata``: the topics it subscribes to; ``member_assignment``: its partitions)."""

    member_id: str
    client_id: str
    client_host: str
    member_metadata: list[str]
    member_assignment: list[TopicPartition]


class GroupInformation(NamedTuple):
    """A group, as kafka-python's ``describe_consumer_groups`` gives it. ``state``: "Stable" with
    a live member, "Empty" without; ``protocol``: the one assignment strategy, "roundrobin"."""

    error_code: int
    group: str
    state: str
    protocol_type: str
    protocol: str
    members: list[MemberInformation]
    authorized_operations: None


def _partition_count(topic: NewTopic) -> int:
    """A new topic's partition count: ``num_partitions``, or with -1 one per replica assignment."""
    if topic.num_partitions == -1 and topic.replica_assignments:
        return len(topic.replica_assignments)
    return topic.num_partitions


class KafkaAdminClient(Admin):
    """kafka-python's ``KafkaAdminClient`` for the topics and groups under ``root``.

    >>> admin = KafkaAdminClient(root="/data/fc", bootstrap_servers="ignored:9092")
    >>> admin.create_topics([NewTopic("orders", 3, 1, topic_configs={"retention.ms": "3600000"})])
    """

    def __init__(self, root: str | os.PathLike[str], **configs: Any) -> None:
        check_names("KafkaAdminClient", configs, ADMIN_IGNORED, ())
        if os.path.exists(root) and not os.path.isdir(root):
            raise RootUnavailableError(0, f"the root {os.fspath(root)!r} is not a folder, so it cannot hold topics: check root=")
        super().__init__(root)

    def close(self) -> None:
        """Nothing to release (kafka-python's admin client closes its connections)."""

    # -- topics ------------------------------------------------------------------------------

    def create_topics(self, new_topics: Iterable[NewTopic], timeout_ms: int | None = None, validate_only: bool = False) -> None:
        """Create each topic of ``new_topics`` (its configs by Kafka's names or ours). All are
        checked before any is made: :class:`TopicAlreadyExistsError` for one that exists, and
        none is made (one created meanwhile by another process fails its own creation only).
        ``num_partitions=-1`` with ``replica_assignments``: one partition per assignment, as
        Kafka. ``validate_only``: check, create nothing."""
        planned = [(t.name, _partition_count(t), topic_settings(t.topic_configs)) for t in new_topics]
        for name, partitions, settings in planned:
            self._store.check_new(name, partitions, settings)
        if validate_only:
            return
        for name, partitions, settings in planned:
            self._store.create(name, partitions, settings)

    def delete_topics(self, topics: Iterable[str], timeout_ms: int | None = None) -> None:
        """Delete each topic and its records (:class:`UnknownTopicOrPartitionError` for one that
        does not exist; those before it are deleted). Stop its producers and consumers first."""
        for name in topics:
            self.delete_topic(name)

    def create_partitions(
        self, topic_partitions: Mapping[str, NewPartitions], timeout_ms: int | None = None, validate_only: bool = False
    ) -> None:
        """Grow each topic to its ``NewPartitions.total_count`` partitions. The existing partitions
        keep their records; keyed records go to other partitions from now on (a key's partition is
        its hash modulo the count), as in Kafka; open producers and consumers see the new
        partitions within a second. :class:`InvalidPartitionsError` for a count not above the
        topic's (partitions are never removed)."""
        for name, new in topic_partitions.items():
            if validate_only:
                self._store.meta(name)
            else:
                self.add_partitions(name, new.total_count)

    def describe_configs(
        self, config_resources: Iterable[ConfigResource], include_synonyms: bool = False
    ) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
        """The configs of each resource: ``{"topic": {name: {config: {"value", "is_default",
        "read_only", "is_sensitive", "config_source"}}}}`` (``"broker"`` for the root's), as
        kafka-python's newer releases give them. A topic's are all its settings, by Kafka's
        names where there is one (values as Kafka writes them: ``"-1"`` for no limit), by ours
        for the rest (``tier``...); a resource's ``configs`` list keeps only those names."""
        out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        for resource in config_resources:
            if resource.resource_type == ConfigResourceType.TOPIC:
                described = described_configs(self._store.meta(resource.name).get("config", {}))
            elif resource.resource_type == ConfigResourceType.BROKER:
                stored = self.root_settings()
                described = {
                    k: {
                        "value": str(v).lower(),
                        "is_default": v == ROOT_SETTINGS[k],
                        "read_only": False,
                        "is_sensitive": False,
                        "config_source": "DEFAULT_CONFIG" if v == ROOT_SETTINGS[k] else "DYNAMIC_BROKER_CONFIG",
                    }
                    for k, v in stored.items()
                }
            else:
                raise UnsupportedError(f"{resource!r}: only TOPIC and BROKER resources have configs here")
            if resource.configs is not None:
                described = {k: v for k, v in described.items() if k in resource.configs}
            out.setdefault(resource.resource_type.name.lower(), {})[resource.name] = described
        return out

    def alter_configs(
        self, config_resources: Iterable[ConfigResource], validate_only: bool = False
    ) -> dict[str, dict[str, None]]:
        """Set each resource's configs to ``configs``, as Kafka's AlterConfigs does: a topic's
        settings not given return to their defaults (``tier`` and ``tier_options`` excepted: they
        are kept unless given, and ``tier`` cannot change). Every resource is checked before any
        changes. Returns ``{"topic": {name: None}}`` (kafka-python: an error per resource; here a
        failure raises). Open producers and consumers apply retention and segment settings within
        about a second (see ``FileChannel.apply_settings``)."""
        resources = list(config_resources)
        plans = []
        for resource in resources:
            if not isinstance(resource.configs, Mapping):
                raise ConfigError(f"{resource!r}: alter_configs needs a dict of configs and their values")
            if resource.resource_type == ConfigResourceType.TOPIC:
                settings = topic_settings(resource.configs)
                config = self._store.meta(resource.name).get("config", {})
                settings.update({k: config[k] for k in _KEPT_ON_ALTER if k in config and k not in settings})
                self._store.altered(resource.name, settings, [k for k in TOPIC_SETTINGS if k not in settings])
                plans.append((resource, settings))
            elif resource.resource_type == ConfigResourceType.BROKER:
                for k, v in resource.configs.items():
                    if k not in ROOT_SETTINGS or str(v).lower() not in ("true", "false"):
                        raise ConfigError(
                            f"broker config {k}={v!r}: the root's settings are {', '.join(ROOT_SETTINGS)} (true or false)"
                        )
                plans.append((resource, {k: str(v).lower() == "true" for k, v in resource.configs.items()}))
            else:
                raise UnsupportedError(f"{resource!r}: only TOPIC and BROKER resources have configs here")
        out: dict[str, dict[str, None]] = {}
        for resource, settings in plans:
            if not validate_only:
                if resource.resource_type == ConfigResourceType.TOPIC:
                    self._store.alter(resource.name, settings, [k for k in TOPIC_SETTINGS if k not in settings])
                else:
                    for k, v in settings.items():
                        self.set_root_setting(k, v)
            out.setdefault(resource.resource_type.name.lower(), {})[resource.name] = None
        return out

    def delete_records(
        self,
        records_to_delete: Mapping[TopicPartition, int],
        timeout_ms: int | None = None,
        partition_leader_id: int | None = None,
    ) -> dict[TopicPartition, dict[str, int]]:
        """Delete each partition's records below its offset (-1: all of them, up to the end).
        Returns ``{tp: {"partition_index", "low_watermark", "error_code": 0}}``, low_watermark
        the partition's new first offset (kafka-python's DeleteRecords result). See
        :meth:`Admin.delete_records`."""
        out = {}
        for tp, offset in records_to_delete.items():
            tp = to_tp(tp)
            low = self.delete_records_before(tp.topic, tp.partition, offset)
            out[tp] = {"partition_index": tp.partition, "low_watermark": low, "error_code": 0}
        return out

    # -- consumer groups ---------------------------------------------------------------------

    def list_consumer_groups(self, broker_ids: list[int] | None = None) -> list[tuple[str, str]]:
        """Every group under the root, as kafka-python's ``(group_id, protocol_type)`` tuples."""
        return [(group, "consumer") for group in list_groups(self.root)]

    def describe_consumer_groups(
        self, group_ids: Iterable[str], group_coordinator_id: int | None = None, include_authorized_operations: bool = False
    ) -> list[GroupInformation]:
        """Each group's state and live members (:class:`GroupInformation`, kafka-python's fields);
        :class:`GroupIdNotFoundError` for a group that does not exist."""
        out = []
        for group in group_ids:
            state, _ = read_group(self.root, self._existing_group(group))
            members = [
                MemberInformation(
                    member,
                    str(state.members[member].get("client_id") or member),
                    "localhost",
                    list(state.members[member].get("topics", [])),
                    sorted(TopicPartition(t, p) for t, p in state.assignment.get(member, [])),
                )
                for member in sorted(live_members(self.root, group))
            ]
            out.append(GroupInformation(0, group, "Stable" if members else "Empty", "consumer", "roundrobin", members, None))
        return out

    def list_consumer_group_offsets(
        self, group_id: str, group_coordinator_id: int | None = None, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets (of ``partitions`` only if given) with their metadata,
        ``{TopicPartition: OffsetAndMetadata}`` as kafka-python's; {} for a group that does not exist."""
        if group_id not in list_groups(self.root):
            return {}
        _, offsets = read_group(self.root, group_id)
        texts = read_metadata(os.path.join(group_folder(self.root, group_id), OFFSETS_FILE))
        wanted = None if partitions is None else {to_tp(tp) for tp in partitions}
        return {
            tp: OffsetAndMetadata(off, texts.get(tp_key(tp), ""), -1)
            for tp, off in sorted(offsets.items())
            if wanted is None or tp in wanted
        }

    def alter_consumer_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, OffsetAndMetadata | int]
    ) -> dict[TopicPartition, None]:
        """Set the group's committed offsets (with their metadata) as a commit of the group does:
        each offset checked (0 to the partition's end) before any is written. Only while the
        group has no live member (:class:`GroupNotEmptyError`), as Kafka. Returns ``{tp: None}``
        (no error for each; kafka-python gives the per-partition errors there)."""
        self._require_empty(group_id, "its offsets can be altered")
        consumer = Consumer(root=self.root, group_id=group_id, enable_auto_commit=False)
        try:
            tps = [to_tp(tp) for tp in offsets]
            consumer.assign(tps)
            consumer.commit({to_tp(tp): off for tp, off in offsets.items()})
        finally:
            consumer.close(autocommit=False)
        return dict.fromkeys(tps)

    def delete_consumer_groups(
        self, group_ids: Iterable[str], group_coordinator_id: int | None = None
    ) -> list[tuple[str, FileChannelError | None]]:
        """Delete each group and its committed offsets. Returns kafka-python's ``[(group_id,
        error)]``: None where it was deleted, else :class:`GroupIdNotFoundError` or
        :class:`GroupNotEmptyError` (a live member), and the other groups are still deleted."""
        out: list[tuple[str, FileChannelError | None]] = []
        for group in group_ids:
            try:
                self._require_empty(self._existing_group(group), "it can be deleted")
                delete_group(self.root, group)
            except (GroupNotFoundError, GroupNotEmptyError) as exc:
                out.append((group, exc))
            else:
                out.append((group, None))
        return out

    def _existing_group(self, group: str) -> str:
        if group not in list_groups(self.root):
            raise GroupNotFoundError(f"there is no consumer group {group!r} under {self.root!r}")
        return group

    def _require_empty(self, group: str, what: str) -> None:
        live = live_members(self.root, group)
        if live:
            raise GroupNotEmptyError(
                f"group {group!r} has {len(live)} live member(s) ({', '.join(live)}), so {what} only once its "
                "consumers are stopped (as Kafka, for a group that is not empty)"
            )
