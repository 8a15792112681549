"""The root folder: its topics of partitions, its settings, and where groups and tier-2 keep theirs.

One owner of the layout (:class:`RootLayout`), below tiering, the channel and the client (they
import it; it imports none of them: opening a partition as a channel is the client's
``TopicStore``, which adds that to this class)::

    ROOT/TOPIC/topic.json        {"name": ..., "partitions": N, "config": {channel settings}}
    ROOT/TOPIC/0/, ROOT/TOPIC/1/ one channel folder per partition
    ROOT/.groups/GROUP/          consumer-group state (see filechannel/client/group.py)
    ROOT/.topics.lock            flock held while a topic is created, altered or deleted
    ROOT/.settings.json          the root's own settings (see ROOT_SETTINGS), written by
                                 `filechannel config` or Admin.set_root_setting; absent: defaults
    ROOT/.tier/                  tier-2's local side: metadata.db (the index), identity.json,
                                 daemon.lock, status.json, staging/, deleted/TOPIC (a deleted
                                 tiered topic whose tier-2 copies are not purged yet), and
                                 origin.json, {"origin": NAME}, when the root has an origin
                                 (see :meth:`RootLayout.set_origin`)
    ROOT/.tier/replica.json      present only in a replica root (`tier rebuild --replica`):
                                 {"tier": URL, "tier_options": {...} or null, "made_at_ms": ms}

A replica root is a read-only copy of a tier-2 prefix another root owns: its partitions
open read-only (a send raises :class:`~filechannel.errors.ReadOnlyError` saying why), and
no daemon or upkeep tool that writes to tier-2 runs on it (:meth:`RootLayout.replica`).

The root folder is made by the first topic created in it, never by a reader: a reader of a
root that does not exist (a typo in ``--root``) learns that instead of an empty new root.

``topic.json`` is written atomically (temp, fsync, rename), so a topic either exists
whole or not at all; it is written after its partition folders exist.

A topic folder with partition folders but no ``topic.json`` (lost or deleted by hand) is
an error, never an absent topic: otherwise the next auto-creating ``send`` would write a
one-partition ``topic.json`` over it and every other partition would vanish from view.
The fix the error names is :meth:`RootLayout.create` with at least as many partitions
(and the topic's settings): it keeps the records in the existing partition folders.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .config import ChannelConfig, TopicSettings
from .engine.clock import now_ms
from .engine.files import fsync_dir, read_if_exists, remove_tree, write_atomically
from .engine.lock import FileLock
from .engine.names import validate_name
from .errors import (
    ConfigError,
    InvalidNameError,
    InvalidPartitionsError,
    ReadOnlyError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
    os_errors,
    storage_error,
)

log = logging.getLogger("filechannel")

TOPIC_FILE = "topic.json"
_DELETED = ".deleted."  # prefix of a topic folder being deleted (hidden: topic names cannot start with ".")
GROUPS_DIR = ".groups"
SETTINGS_FILE = ".settings.json"
# The root's settings (the broker's, in Kafka) and their defaults. auto.create.topics.enable:
# whether a send to a missing topic creates it (one partition, default settings), as Kafka's
# broker setting of that name, whose default is true too.
ROOT_SETTINGS: dict[str, bool] = {"auto.create.topics.enable": True}
# Settings a topic stores (the keys of TopicSettings, in its order); the rest (flush_interval,
# buffer_bytes, maintenance_interval: ChannelSettings) belong to each writer.
TOPIC_SETTINGS: tuple[str, ...] = tuple(TopicSettings.__annotations__)


ROOT_TIER_DIR = ".tier"
ROOT_METADATA = os.path.join(ROOT_TIER_DIR, "metadata.db")
DELETED_DIR = "deleted"  # ROOT/.tier/deleted/TOPIC: a deleted tiered topic whose tier-2 copies are not purged yet
ORIGIN_FILE = os.path.join(ROOT_TIER_DIR, "origin.json")
ORIGIN_SETTING = "tier.origin"  # its name for `filechannel config`
_ORIGIN = re.compile(r"[A-Za-z0-9_-]{1,100}")


def validate_origin(origin: object) -> str:
    """Return ``origin`` if it can name an origin, else :class:`InvalidNameError`.

    An origin is one object-key component under a tier URL (``<url>/<origin>/``), and a bucket
    reader names its topics ``<origin>.<topic>``: so 1 to 100 characters of ``[A-Za-z0-9_-]``,
    no dot (the first dot of a reader's topic name ends the origin), no leading dot (the
    top level's own objects, ``.claim.json`` and ``.origins/``, start with one)."""
    if not isinstance(origin, str) or not _ORIGIN.fullmatch(origin):
        raise InvalidNameError(f"origin name {origin!r} is not allowed: use 1 to 100 characters of [A-Za-z0-9_-] (no dot)")
    return origin


def origin_url(url: str, origin: str | None) -> str:
    """Where a root of origin ``origin`` keeps its tier-2 objects under the tier URL ``url``:
    ``<url>/<origin>``, or ``url`` itself for the default origin (None)."""
    return url if origin is None else f"{url.rstrip('/')}/{validate_origin(origin)}"


REPLICA_FILE = os.path.join(ROOT_TIER_DIR, "replica.json")  # a replica root's mark (see the module docstring)


@dataclass(frozen=True)
class Replica:
    """A replica root (``ROOT/.tier/replica.json``): a read-only copy of the tier-2 prefix ``tier``,
    refreshed from it by ``tier rebuild --refresh`` with ``tier_options``."""

    root: str
    tier: str
    tier_options: dict[str, Any] | None

    def refusal(self, what: str) -> ReadOnlyError:
        """The error of an attempt to ``what`` (send, upload...) in this replica: one line saying why and what to do."""
        return ReadOnlyError(
            f"cannot {what}: {self.root} is a read-only replica of {self.tier} (made by `filechannel tier rebuild "
            f"--replica`), which sends, uploads and deletes nothing; do it on the root that owns {self.tier}, and "
            f"bring this replica up to date with `filechannel tier rebuild --refresh --root {self.root}`"
        )


def topic_path(root: str, topic: str) -> str:
    """The folder of ``topic`` under ``root``: ``ROOT/TOPIC`` (InvalidNameError for a name that is not one)."""
    return os.path.join(root, validate_name(topic, "topic name"))


def partition_path(root: str, topic: str, partition: int) -> str:
    """The folder of partition ``partition`` of ``topic``, its channel: ``ROOT/TOPIC/PARTITION``."""
    return os.path.join(topic_path(root, topic), str(partition))


def partition_name(topic: str, partition: int) -> str:
    """A partition's name in tier-2 and its metadata store (its channel's ``tier_name``): ``TOPIC/PARTITION``."""
    return f"{topic}/{partition}"


def split_partition_name(name: str) -> tuple[str, int]:
    """``TOPIC/PARTITION`` (:func:`partition_name`'s form, also a group's key of a partition) as
    ``(topic, partition)``; ValueError naming ``name`` when it is not that form with a valid topic
    name and a decimal partition."""
    topic, _, partition = name.rpartition("/")
    if "/" in topic or not partition.isascii() or not partition.isdigit():
        raise ValueError(f"{name!r} is not TOPIC/PARTITION")
    try:
        validate_name(topic, "topic name")
    except InvalidNameError as exc:
        raise ValueError(f"{name!r} is not TOPIC/PARTITION: {exc}") from None
    return topic, int(partition)


def mark_topic_deleted(root: str, topic: str, config: Mapping[str, Any]) -> None:
    """Record that tiered ``topic`` is being deleted, with the storage its tier-2 copies are in
    (its ``topic.json`` goes with it). Called by :meth:`RootLayout.delete` before it removes the
    folder; the tiering daemon's next pass purges tier-2 and removes the mark. Until then the topic
    cannot be created again, so a new topic of that name never sees the old one's records."""
    folder = os.path.join(root, ROOT_TIER_DIR, DELETED_DIR)
    with os_errors("create tier folder", folder):
        os.makedirs(folder, exist_ok=True)
    mark = {"tier": config["tier"], "tier_options": config.get("tier_options") or {}}
    write_atomically(os.path.join(folder, topic), json.dumps(mark, sort_keys=True).encode())


def topic_being_deleted(root: str, topic: str) -> bool:
    """Whether tier-2 still holds copies of a deleted topic of this name (see :func:`mark_topic_deleted`)."""
    return os.path.exists(os.path.join(root, ROOT_TIER_DIR, DELETED_DIR, topic))


def validate_topic_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Check topic settings (names and values); return them."""
    unknown = sorted(set(config) - set(TOPIC_SETTINGS))
    if unknown:
        raise ConfigError(f"unknown topic setting(s) {', '.join(unknown)}; known: {', '.join(TOPIC_SETTINGS)}")
    ChannelConfig.from_kwargs(**config)
    return dict(config)


def _altered(topic: str, meta: Mapping[str, Any], changes: Mapping[str, Any], removed: list[str]) -> dict[str, Any]:
    """``meta`` with the settings ``changes`` set and ``removed`` returned to their defaults, checked."""
    validate_topic_config(changes)
    unknown = sorted(set(removed) - set(TOPIC_SETTINGS))
    if unknown:
        raise ConfigError(f"unknown topic setting(s) {', '.join(unknown)}; known: {', '.join(TOPIC_SETTINGS)}")
    old = dict(meta.get("config", {}))
    config = {k: v for k, v in {**old, **changes}.items() if k not in removed}
    if config.get("tier") != old.get("tier"):
        raise ConfigError(
            f"tier of topic {topic!r} cannot change (from {old.get('tier')!r} to {config.get('tier')!r}): its "
            "uploaded segments are in the storage it names; create a new topic and copy the records over"
        )
    return {**meta, "config": validate_topic_config(config)}


def effective_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """A topic's settings with the defaults of those it does not set (all of :data:`TOPIC_SETTINGS`)."""
    full = ChannelConfig.from_kwargs(**config).as_dict()
    return {k: full[k] for k in TOPIC_SETTINGS}


def topic_differences(meta: Mapping[str, Any], partitions: int, config: Mapping[str, Any]) -> list[str]:
    """How a stored ``topic.json`` differs from ``partitions`` and ``config``: one phrase per
    difference (``partitions 1, not 3``, ``retention_ms None, not 1000``); none if they agree."""
    found = [] if meta["partitions"] == partitions else [f"partitions {meta['partitions']}, not {partitions}"]
    have, want = effective_settings(meta.get("config", {})), effective_settings(config)
    found += [f"{k} {have[k]!r}, not {want[k]!r}" for k in TOPIC_SETTINGS if have[k] != want[k]]
    return found


META_RECHECK_S = 1.0  # how stale a cached topic.json may be (see RootLayout.meta)


def _stamp(path: str) -> tuple[int, int, int] | None:
    """What tells a rewritten ``topic.json`` (rewrites are renames: a new inode) from the one read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class _Cached:
    """A topic's description as read, the stamp of the file it was read from, and when to check it again."""

    __slots__ = ("meta", "recheck_at", "stamp")

    def __init__(self, meta: dict[str, Any], stamp: tuple[int, int, int] | None) -> None:
        self.meta = meta
        self.stamp = stamp
        self.recheck_at = time.monotonic() + META_RECHECK_S


class RootLayout:
    """Reads, creates and deletes topics under a root (their descriptions cached), and the root's
    settings. Thread-safe."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self._mutex = threading.Lock()
        self._meta: dict[str, _Cached] = {}

    def topic_path(self, topic: str) -> str:
        return topic_path(self.root, topic)

    def partition_path(self, topic: str, partition: int) -> str:
        return partition_path(self.root, topic, partition)

    def _partition_folders(self, topic: str) -> list[int]:
        """The numbers of the partition folders under the topic's folder (sorted)."""
        try:
            names = os.listdir(self.topic_path(topic))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise storage_error(exc, "list topic folder", self.topic_path(topic)) from exc
        folder = self.topic_path(topic)
        return sorted(int(n) for n in names if n.isascii() and n.isdigit() and os.path.isdir(os.path.join(folder, n)))

    def _read_file(self, topic: str) -> dict[str, Any] | None:
        path = os.path.join(self.topic_path(topic), TOPIC_FILE)
        data = read_if_exists(path, "topic description")
        if data is None:
            return None
        try:
            meta: dict[str, Any] = json.loads(data)  # (anything else fails the checks below)
            n = meta["partitions"]
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 10_000:
                raise ValueError(f"partitions is {n!r}, not an int from 1 to 10000")
            if not isinstance(meta.get("config", {}), dict):
                raise ValueError("config is not an object")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"{path} is not a valid topic description ({exc}); fix it, or delete it and create the topic again "
                "with its partition count and settings (the records in the partition folders are kept)"
            ) from exc
        return meta

    def read(self, topic: str) -> dict[str, Any] | None:
        """The stored ``topic.json`` of ``topic``, or None if there is no such topic.

        Raises :class:`ConfigError` if the topic's folder holds partitions but no ``topic.json``,
        or more partition folders than ``topic.json`` says (partitions would vanish from view).
        """
        meta = self._read_file(topic)
        parts = self._partition_folders(topic)
        if meta is None and parts:
            raise ConfigError(
                f"topic folder {self.topic_path(topic)!r} has partition folders ({len(parts)}, up to {parts[-1]}) but "
                f"no {TOPIC_FILE}: restore it from a backup, or recreate it with `filechannel topics create {topic} "
                f"--partitions {parts[-1] + 1}` (or Admin.create_topic) and its settings, which keeps the partitions' records"
            )
        if meta is not None and parts and parts[-1] >= meta["partitions"] and not self._topics_changing():
            # (while the topics lock is held, the folders past the count are ones add_partitions
            # made before it rewrites topic.json; a retry of one that died runs under it too)
            # e.g. topic.json lost and then re-created with one partition by an older version
            raise ConfigError(
                f"{os.path.join(self.topic_path(topic), TOPIC_FILE)!r} says {meta['partitions']} partition(s) but the "
                f'folder holds partition folders up to {parts[-1]}: set "partitions" to {parts[-1] + 1} in it'
            )
        return meta

    def _topics_changing(self) -> bool:
        """Whether a process holds ``.topics.lock`` now (a topic is being created, altered or deleted)."""
        probe = FileLock(os.path.join(self.root, ".topics.lock"))
        try:
            if probe.acquire(blocking=False):
                probe.release()
                return False
            return True
        finally:
            probe.close()

    def meta(self, topic: str) -> dict[str, Any]:
        """The topic's description, cached; :class:`UnknownTopicError` if it does not exist.

        The cache is checked against ``topic.json`` at most once per :data:`META_RECHECK_S` (one
        stat: its inode, size and time) and read again if it changed, so partitions added and
        settings altered by another process are seen by open producers and consumers.
        """
        cached = self._meta.get(topic)  # no lock on this hot path: a dict lookup is atomic
        if cached is not None and time.monotonic() < cached.recheck_at:
            return cached.meta
        path = os.path.join(self.topic_path(topic), TOPIC_FILE)
        stamp = _stamp(path)
        if cached is not None and stamp == cached.stamp:
            cached.recheck_at = time.monotonic() + META_RECHECK_S
            return cached.meta
        meta = self.read(topic)
        if meta is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist under {self.root!r}; create it first")
        with self._mutex:
            self._meta[topic] = _Cached(meta, stamp)
        return meta

    def partitions(self, topic: str) -> int:
        return int(self.meta(topic)["partitions"])

    def create(self, topic: str, partitions: int, config: Mapping[str, Any], exist_ok: bool = False) -> dict[str, Any]:
        """Create a topic with ``partitions`` partitions and ``config`` (validated).

        :class:`TopicExistsError` if it exists, unless ``exist_ok`` and it has these partitions
        and settings (defaults filled in on both sides); the error names every difference, so a
        changed ``create_topic`` call never runs against the old topic unnoticed.
        """
        return self._create(topic, partitions, config, "same" if exist_ok else "raise")

    def ensure(self, topic: str, partitions: int, config: Mapping[str, Any]) -> dict[str, Any]:
        """Create the topic unless it exists, whatever the existing one's partitions and settings:
        the auto-creation of a send (a topic made meanwhile by anyone is the one to use)."""
        return self._create(topic, partitions, config, "keep")

    def check_new(self, topic: str, partitions: int, config: Mapping[str, Any]) -> dict[str, Any]:
        """Check a topic to create (its name, partition count and settings; return the settings)
        and that none of that name exists (:class:`TopicExistsError`), creating nothing."""
        config = self._checked(topic, partitions, config)
        if os.path.isdir(self.root) and self._read_file(topic) is not None:
            raise TopicExistsError(f"topic {topic!r} already exists under {self.root!r}")
        return config

    def _checked(self, topic: str, partitions: int, config: Mapping[str, Any]) -> dict[str, Any]:
        validate_name(topic, "topic name")
        if topic.startswith("."):
            raise ConfigError(f"topic name {topic!r} may not start with '.' (reserved for internal folders)")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= 10_000:
            raise InvalidPartitionsError(f"partitions must be an int from 1 to 10000, not {partitions!r}")
        return validate_topic_config(config)

    def _create(self, topic: str, partitions: int, config: Mapping[str, Any], existing_is: str) -> dict[str, Any]:
        config = self._checked(topic, partitions, config)
        with os_errors("create root folder", self.root):
            os.makedirs(self.root, exist_ok=True)
        lock = FileLock(os.path.join(self.root, ".topics.lock"))
        try:
            with lock.holding():
                self._purge_deleted()
                existing = self._read_file(topic)
                if existing is not None:
                    differences = [] if existing_is == "keep" else topic_differences(existing, partitions, config)
                    if existing_is == "raise":
                        raise TopicExistsError(f"topic {topic!r} already exists under {self.root!r}")
                    if differences:
                        raise TopicExistsError(
                            f"topic {topic!r} already exists under {self.root!r} with other settings: "
                            f"{'; '.join(differences)}; change them with alter (`filechannel configs --alter`, "
                            "`filechannel topics alter --partitions`) or create it under another name"
                        )
                    return existing
                self._refuse_while_purging(topic)
                path = self.topic_path(topic)
                orphans = self._partition_folders(topic)
                if orphans and orphans[-1] >= partitions:
                    raise ConfigError(
                        f"topic folder {path!r} already holds partition folders up to {orphans[-1]} (its {TOPIC_FILE} is "
                        f"missing): create it with at least {orphans[-1] + 1} partitions to keep their records"
                    )
                if orphans:
                    log.warning("restoring the missing %s of topic %r (%d partitions)", TOPIC_FILE, topic, partitions)
                with os_errors("create topic folder", path):
                    for p in range(partitions):
                        os.makedirs(self.partition_path(topic, p), exist_ok=True)
                meta = {"name": topic, "partitions": partitions, "config": config}
                write_atomically(os.path.join(path, TOPIC_FILE), json.dumps(meta, indent=2).encode())
        finally:
            lock.close()
        return meta

    def alter(self, topic: str, changes: Mapping[str, Any], removed: Iterable[str] = ()) -> dict[str, Any]:
        """Set the settings ``changes`` of an existing topic and return ``removed`` ones to their
        defaults; return the new description. Everything is checked before ``topic.json`` is
        rewritten (atomically, under the topics lock: two alters keep both).

        ``tier`` cannot change: the topic's uploaded segments are in the storage it names, and a
        reader of another would not find them. Every process reads the new description within
        a second (see :meth:`meta`); what an open channel applies is
        ``FileChannel.apply_settings``'s.
        """
        removed = list(removed)
        return self._rewrite(topic, lambda meta: _altered(topic, meta, changes, removed))

    def altered(self, topic: str, changes: Mapping[str, Any], removed: Iterable[str] = ()) -> dict[str, Any]:
        """What :meth:`alter` would make of the topic's description (checked), writing nothing."""
        return _altered(topic, self.meta(topic), changes, list(removed))

    def add_partitions(self, topic: str, total: int) -> dict[str, Any]:
        """Grow ``topic`` to ``total`` partitions (Kafka's create_partitions); return the new description.

        :class:`InvalidPartitionsError` unless ``total`` is more than it has (partitions are never
        removed: their records would go) and at most 10000. The new partition folders are made
        before ``topic.json`` counts them, so a crash between leaves empty folders that a retry
        reuses. The existing partitions keep their records; a key's partition is its hash modulo
        the count, so keyed records go to other partitions from now on, as in Kafka.
        """
        if isinstance(total, bool) or not isinstance(total, int) or not 1 <= total <= 10_000:
            raise InvalidPartitionsError(f"the partition count must be an int from 1 to 10000, not {total!r}")

        def grow(meta: dict[str, Any]) -> dict[str, Any]:
            have = int(meta["partitions"])
            if total <= have:
                raise InvalidPartitionsError(
                    f"topic {topic!r} has {have} partition(s), so it cannot have {total}: partitions can only be added"
                    if total < have
                    else f"topic {topic!r} already has {total} partition(s)"
                )
            left = self._partition_folders(topic)
            if left and left[-1] >= total:  # an add to more partitions died after it made their folders
                raise InvalidPartitionsError(
                    f"topic {topic!r} has partition folders up to {left[-1]} (an add of partitions that stopped "
                    f"half-way): grow it to at least {left[-1] + 1}"
                )
            with os_errors("create partition folder", self.topic_path(topic)):
                for p in range(have, total):
                    os.makedirs(self.partition_path(topic, p), exist_ok=True)
            return {**meta, "partitions": total}

        return self._rewrite(topic, grow)

    def _rewrite(self, topic: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """Replace the ``topic.json`` of an existing topic by ``change(meta)``, under the topics lock."""
        if not os.path.isdir(self.root):
            raise UnknownTopicError(f"topic {topic!r} does not exist: the root folder {self.root!r} does not exist")
        lock = FileLock(os.path.join(self.root, ".topics.lock"))
        try:
            with lock.holding():
                existing = self.read(topic)
                if existing is None:
                    raise UnknownTopicError(f"topic {topic!r} does not exist under {self.root!r}")
                meta = change(existing)
                write_atomically(os.path.join(self.topic_path(topic), TOPIC_FILE), json.dumps(meta, indent=2).encode())
        finally:
            lock.close()
        with self._mutex:
            self._meta[topic] = _Cached(meta, _stamp(os.path.join(self.topic_path(topic), TOPIC_FILE)))
        return meta

    def delete(self, topic: str) -> None:
        """Delete the topic, atomically: its folder is renamed away (hidden), then removed.

        A crash or an error half-way through leaves a hidden ``.deleted.*`` folder, purged
        at the next create or delete, never a topic folder without ``topic.json``. A topic
        whose ``topic.json`` was lost can be deleted too.
        """
        if not os.path.isdir(self.root):
            raise UnknownTopicError(f"topic {topic!r} does not exist: the root folder {self.root!r} does not exist")
        lock = FileLock(os.path.join(self.root, ".topics.lock"))
        try:
            with lock.holding():
                self._purge_deleted()
                existing = self._read_file(topic)
                if existing is None and not self._partition_folders(topic):
                    raise UnknownTopicError(f"topic {topic!r} does not exist under {self.root!r}")
                config = self.tier_config((existing or {}).get("config", {}))
                if config.get("tier") is not None:  # its tier-2 copies go too, by the tiering daemon
                    mark_topic_deleted(self.root, topic, config)
                path = self.topic_path(topic)
                doomed = os.path.join(self.root, f"{_DELETED}{topic}.{os.urandom(16).hex()}")
                with os_errors("delete topic folder", path):
                    os.rename(path, doomed)
                fsync_dir(self.root)
                with os_errors("delete topic folder", doomed):
                    remove_tree(doomed)
        finally:
            lock.close()
        with self._mutex:
            self._meta.pop(topic, None)

    def _refuse_while_purging(self, topic: str) -> None:
        """A deleted tiered topic's tier-2 copies must be purged before a topic of that name exists
        again, or the new topic would read the old one's records from tier-2."""
        if topic_being_deleted(self.root, topic):
            raise ConfigError(
                f"topic {topic!r} was deleted and the tiering daemon has not purged its tier-2 copies yet: run "
                f"'filechannel tier run --root {self.root} --once' (or wait for the running daemon's next pass), then retry"
            )

    def _purge_deleted(self) -> None:
        """Remove what deletes that died half-way left (under ``.topics.lock``: no delete is running)."""
        with os_errors("list root folder", self.root):
            names = os.listdir(self.root)
        for name in names:
            if name.startswith(_DELETED):
                with os_errors("delete topic folder", os.path.join(self.root, name)):
                    remove_tree(os.path.join(self.root, name))

    def list(self) -> list[str]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if not n.startswith(".") and os.path.exists(os.path.join(self.root, n, TOPIC_FILE)))

    def root_settings(self) -> dict[str, bool]:
        """The root's settings (:data:`ROOT_SETTINGS`), the stored ones over the defaults."""
        path = os.path.join(self.root, SETTINGS_FILE)
        data = read_if_exists(path, "root settings")
        stored: Any = {}
        if data is not None:
            try:
                stored = json.loads(data)
            except ValueError as exc:
                raise ConfigError(f"{path} is not valid JSON ({exc}); fix it or delete it (defaults: {ROOT_SETTINGS})") from exc
            if not isinstance(stored, dict) or any(k not in ROOT_SETTINGS or not isinstance(v, bool) for k, v in stored.items()):
                raise ConfigError(
                    f"{path} must be a JSON object of {', '.join(ROOT_SETTINGS)} (true or false), "
                    f"not {stored!r}; fix it or delete it"
                )
        return {**ROOT_SETTINGS, **stored}

    def set_root_setting(self, name: str, value: bool) -> None:
        """Store one root setting (atomically, under the topics lock: two setters keep both)."""
        if name not in ROOT_SETTINGS:
            raise ConfigError(f"unknown root setting {name!r}; known: {', '.join(ROOT_SETTINGS)}")
        if not isinstance(value, bool):
            raise ConfigError(f"root setting {name} must be true or false, not {value!r}")
        with os_errors("create root folder", self.root):
            os.makedirs(self.root, exist_ok=True)
        lock = FileLock(os.path.join(self.root, ".topics.lock"))
        try:
            with lock.holding():
                settings = {**self.root_settings(), name: value}
                write_atomically(os.path.join(self.root, SETTINGS_FILE), json.dumps(settings, indent=2).encode())
        finally:
            lock.close()

    def replica(self) -> Replica | None:
        """What ``ROOT/.tier/replica.json`` says if this root is a replica (None: it is not); a
        damaged mark raises ConfigError naming it (never read as "not a replica": that would let
        a daemon claim the prefix another root owns)."""
        path = os.path.join(self.root, REPLICA_FILE)
        data = read_if_exists(path, "replica mark")
        if data is None:
            return None
        try:
            mark = json.loads(data)
            tier, options = mark["tier"], mark.get("tier_options")
            if not isinstance(tier, str) or not (options is None or isinstance(options, dict)):
                raise ValueError(f"tier is {tier!r}, tier_options {options!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{path} is damaged ({exc}): this root is a replica of a tier-2 prefix; restore the file "
                '({"tier": URL, "tier_options": {...}}), or make the replica again with `filechannel tier rebuild --replica`'
            ) from exc
        return Replica(self.root, tier, options)

    def make_replica(self, tier: str, tier_options: Mapping[str, Any] | None) -> Replica:
        """Mark this root a replica of the tier-2 prefix ``tier`` (before anything else is made in it)."""
        path = os.path.join(self.root, REPLICA_FILE)
        with os_errors("create tier folder", os.path.dirname(path)):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        options = None if tier_options is None else dict(tier_options)
        mark = {"made_at_ms": now_ms(), "tier": tier, "tier_options": options}
        write_atomically(path, json.dumps(mark, sort_keys=True).encode())
        return Replica(self.root, tier, options)

    def auto_create_allowed(self) -> bool:
        """Whether a send may create a missing topic: the root's ``auto.create.topics.enable``."""
        return self.root_settings()["auto.create.topics.enable"]

    def partition_settings(self, topic: str, partition: int, **overrides: Any) -> dict[str, Any]:
        """The keyword arguments that open partition ``partition`` of ``topic`` as a channel (in
        its :meth:`partition_path`): the topic's settings under ``overrides``, and with a tier,
        the root's tier-2 metadata store and the partition's name in it."""
        n = self.partitions(topic)
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < n:
            raise UnknownPartitionError(f"partition {partition!r} does not exist: topic {topic!r} has partitions 0 to {n - 1}")
        config = self.tier_config({**self.meta(topic).get("config", {}), **overrides})
        if config.get("tier") is not None:  # one metadata store per root; the partition is TOPIC/PARTITION in it
            return {
                "tier_metadata": os.path.join(self.root, ROOT_METADATA),
                "tier_name": partition_name(topic, partition),
                **config,
            }
        return config

    # -- the root's origin in tier-2 ------------------------------------------------------------

    def origin(self) -> str | None:
        """The root's origin (``ROOT/.tier/origin.json``), or None: the default origin, whose
        tier-2 objects are at each topic's tier URL itself."""
        path = os.path.join(self.root, ORIGIN_FILE)
        data = read_if_exists(path, "root origin")
        if data is None:
            return None
        try:
            return validate_origin(json.loads(data)["origin"])
        except (ValueError, KeyError, TypeError, InvalidNameError) as exc:
            raise ConfigError(
                f'{path} is damaged ({exc}): it must be {{"origin": NAME}}; restore it (the root\'s tier-2 objects are '
                "under <tier-url>/NAME), or delete it if no tiered topic was ever used under this root"
            ) from None

    def set_origin(self, origin: str) -> None:
        """Give the root the origin ``origin``: from now on its tiered topics keep their tier-2
        objects under ``<tier-url>/<origin>/`` (claim, epochs, channels, settings, exports), so
        several roots, each with its own origin, can tier into one bucket URL.

        Only before the root's tier-2 is first used (no tiered topic, no ``ROOT/.tier/metadata.db``):
        the uploaded segments of a root are where its origin says, and a root that moved
        would no longer find them. Setting the origin it has already is allowed."""
        origin = validate_origin(origin)
        if self.origin() == origin:
            return
        tiered = [t for t in self.list() if (self.read(t) or {}).get("config", {}).get("tier") is not None]
        if tiered or os.path.exists(os.path.join(self.root, ROOT_METADATA)):
            raise ConfigError(
                f"the origin of {self.root!r} cannot be set now: its tier-2 is in use "
                f"({'tiered topic(s) ' + ', '.join(tiered) if tiered else 'it has a tier-2 index'}), and its uploaded "
                "segments are where the current origin says; set the origin of a new root before its first tiered "
                "topic (or rebuild this one into a new root with `filechannel tier rebuild`)"
            )
        folder = os.path.join(self.root, ROOT_TIER_DIR)
        with os_errors("create tier folder", folder):
            os.makedirs(folder, exist_ok=True)
        write_atomically(os.path.join(self.root, ORIGIN_FILE), json.dumps({"origin": origin}).encode())

    def tier_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """A topic's settings as its channels use them: ``tier`` moved under the root's origin
        (:func:`origin_url`); unchanged without a tier or an origin."""
        if config.get("tier") is None:
            return dict(config)
        return {**config, "tier": origin_url(config["tier"], self.origin())}
