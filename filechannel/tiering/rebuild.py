"""Rebuild a root from its tier-2 copy alone: topics, partitions and the whole metadata, from the manifests.

For a machine whose local root is gone. Rules (why the result is lossless where a
rebuild from a bare listing, as Pravega's, is not):

- **A segment exists only through its manifest.** Every uploaded segment has one, written
  after its chunks and before ``finish_upload``; it names the segment's offsets, size and
  every chunk with its length. Chunks without a manifest are orphans (an upload that died,
  a fenced uploader's late writes), never data: the next daemon's sweep deletes them.
- **A manifest is used only if every object it names is listed, long enough for its chunks.** One that
  is not (a segment half deleted by retention when the machine was lost, or damaged) is
  left out and reported; if later segments of its channel are used, its offsets are a
  hole (readers raise ``MissingSegmentError`` naming them), and the rebuild says so.
- **Overlapping manifests** (an upload attempt that wrote its manifest, then died before
  its commit, and a newer epoch's upload of the same segment): the newest epoch wins; the
  others are reported and left as orphans.
- **Topics** come from ``<topic>/topic.json`` in tier-2 (name, partitions, settings, as the
  daemon copies them), with ``tier`` set to the URL given (and ``tier_options`` to the
  options given, if any); a topic whose description is missing gets as many partitions as
  its manifests show, and the tier settings only. A description that is damaged (not JSON,
  a setting's value refused) stops the rebuild before anything is made, naming it: a topic
  never comes back with settings other than its own. A topic marked deleted in tier-2
  (``.deleted/TOPIC``, :mod:`.marks`) is not rebuilt either: a deletion stays done.
- **A prefix with nothing of filechannel's** (no description, no manifest: a mistyped URL)
  is refused before anything is made.
- **Producers continue at the tier's end**: the partition folders are left empty, and an
  empty folder of a tiered channel starts its active segment at the tier-2 end offset
  (``Log.tier_end_offset``), so new records never reuse an uploaded offset. Records that
  were only on the lost disk are gone.
- **Epochs**: every epoch a used manifest names is recorded, and the newest epoch named
  by any object or epoch mark of the bucket, so the next daemon's epoch is newer than every name
  already written (it never overwrites an object, and its sweep deletes the orphans).
- **The new root owns the prefix**: its claim replaces the old root's (see :mod:`.ownership`);
  the old root, should it come back, refuses to upload, sweep or delete there.
- **A replica** (``replica=True``, ``tier rebuild --replica``) is the same root made without
  the claim: marked read-only first (``ROOT/.tier/replica.json``, :meth:`RootLayout.replica`),
  it gets no identity, takes no epoch and writes nothing to the bucket; its partitions open
  read-only and the daemon refuses it. :func:`refresh_replica` (``--refresh``) reads the
  bucket again by these rules and makes the index list exactly what it describes.
- **Group offsets** come from the newest export in tier-2 (``.exports/``, see
  :mod:`.export`), if any: the report hands them on (``group_offsets``), and the client
  restores them (``client.group.restore_groups``, which ``tier rebuild`` calls), lowered to
  a partition's end (``ends``) where they are past it. Consumer groups are the client's,
  a layer above tiering.

The target root must not exist or be empty: a rebuild never merges into live data.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..engine.clock import now_ms
from ..errors import ConfigError, FileChannelError, TierError, os_errors
from ..root import (
    REPLICA_FILE,
    ROOT_METADATA,
    TOPIC_FILE,
    TOPIC_SETTINGS,
    RootLayout,
    effective_settings,
    partition_name,
    split_partition_name,
    validate_topic_config,
)
from .bindings import open_storage
from .export import newest_epoch_named, newest_export
from .layout import SegmentRecord
from .marks import TIER_DELETED_PREFIX, deleted_in_tier
from .metadata import EpochRecord, TierMetadata
from .ownership import newest_epoch, root_identity, take_over
from .reindex import usable_segments
from .storage import ChunkStorage, redact_url

Progress = Callable[[str], None]


@dataclass
class RebuildReport:
    """What a rebuild made: topics (name -> partitions), segments and bytes, per-partition end
    offsets; the group offsets of the newest export, for the client to restore
    (``client.group.restore_groups(root, report.group_offsets, report.ends)``); ``problems``
    (holes, unusable manifests: exit non-zero) and ``notes`` (the rest)."""

    topics: dict[str, int] = field(default_factory=dict)
    segments: int = 0
    bytes: int = 0
    ends: dict[str, int] = field(default_factory=dict)
    group_offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _check_empty(root: str) -> None:
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise ConfigError(f"cannot rebuild into {root}: it is a file, not a folder") from None
    if names:
        raise ConfigError(
            f"cannot rebuild into {root}: it is not empty ({len(names)} entries); rebuild into a new or empty folder"
        )


def _topic_description(storage: ChunkStorage, name: str, url: str) -> dict[str, Any]:
    """A tier-2 ``topic.json``: the daemon's copy (name, partitions, config), or an older
    copy holding the settings alone. Raises ValueError (ConfigError for a setting's value)
    if it is damaged: a topic is never rebuilt with settings other than its own."""
    raw = json.loads(storage.read(name, 0, 1 << 20))
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    if "config" in raw and "partitions" in raw:
        partitions = raw["partitions"]
        if type(partitions) is not int or not 1 <= partitions <= 10_000:
            raise ValueError(f"partitions is {partitions!r}")
        config: dict[str, Any] = dict(raw["config"])
    else:
        partitions, config = 0, raw
    settings = {k: v for k, v in config.items() if k in TOPIC_SETTINGS and k not in ("tier", "tier_options")}
    validate_topic_config({**settings, "tier": url})
    return {"partitions": partitions, "config": config}


def rebuild_root(
    root: str | os.PathLike[str],
    url: str,
    *,
    tier_options: dict[str, Any] | None = None,
    replica: bool = False,
    progress: Progress | None = None,
    counted: Callable[[int, int], None] | None = None,
) -> RebuildReport:
    """Rebuild ``root`` (new or empty) from the chunk storage at ``url`` alone (see the module
    docstring for the rules). ``tier_options`` open the storage and become the topics'
    ``tier_options`` (None: open without options, keep each topic's stored ones).
    ``replica``: make a read-only replica instead (:func:`refresh_replica` brings it up to
    date): marked first, it never takes the claim over nor gets an identity.
    ``progress`` receives one line per step; ``counted(done, total)`` the manifests read."""
    say = progress or (lambda line: None)
    root = os.path.abspath(os.fspath(root))
    _check_empty(root)
    with open_storage(url, **(tier_options or {})) as storage:
        report = RebuildReport()
        bucket = _read_bucket(storage, url, report, say, counted)
        layout = RootLayout(root)
        if replica:  # before anything else: no moment where the root looks writable
            layout.make_replica(url, tier_options)
        _make_topics(layout, bucket, url, tier_options, report, say)
        path = os.path.join(root, ROOT_METADATA)
        with os_errors("create tier folder", os.path.dirname(path)):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with TierMetadata(path) as metadata:
            metadata.load(bucket.epochs, bucket.segments)
        _count(bucket, report, say)
        if not replica:
            by = f"tier rebuild:{socket.gethostname()}:{os.getpid()}"
            previous = take_over(storage, root_identity(os.path.dirname(path)), by)
            if previous is not None:
                line = (
                    f"took the prefix over from root {previous.root_id} (claimed by {previous.by}): that root, should it "
                    "come back, refuses to tier there and deletes nothing"
                )
                report.notes.append(line)
                say(line)
        # group offsets from the newest export, if the bucket holds one
        try:
            export = newest_export(storage)
        except FileChannelError as exc:
            report.problems.append(f"the newest export in {storage.url} is unusable, no group offsets restored: {exc}")
            export = None
        if export is not None:
            report.group_offsets = export.groups
        return report


def refresh_replica(
    root: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    counted: Callable[[int, int], None] | None = None,
) -> RebuildReport:
    """Bring the replica root ``root`` up to date with its tier-2 prefix (``tier rebuild --refresh``).

    The bucket is read as a rebuild reads it (the same rules); then topics new in the bucket
    are made and grown ones get their new partitions, and the index is made to list exactly
    what the manifests describe, in one transaction (:meth:`TierMetadata.mirror`): new uploads
    appear, what retention deleted disappears, merged layouts replace old ones. Readers open
    meanwhile see the old listing or the new one. Group offsets are left as they are (the
    replica's own). ConfigError if ``root`` is not a replica: a plain rebuild is disaster
    recovery into a new root."""
    say = progress or (lambda line: None)
    layout = RootLayout(root)
    replica = layout.replica()
    if replica is None:
        raise ConfigError(
            f"{layout.root} is not a replica (no {REPLICA_FILE} there): only a root made by `filechannel tier rebuild "
            "--replica` is refreshed; a root that lost its own data is rebuilt into a new folder by `tier rebuild`"
        )
    with open_storage(replica.tier, **(replica.tier_options or {})) as storage:
        report = RebuildReport()
        bucket = _read_bucket(storage, replica.tier, report, say, counted)
        _make_topics(layout, bucket, replica.tier, replica.tier_options, report, say)
        _follow_settings(layout, bucket, report, say)
        for topic in sorted(set(layout.list()) - set(bucket.topics)):
            report.notes.append(f"topic {topic}: no longer in {redact_url(storage.url)}; nothing of it is listed now")
        with TierMetadata(os.path.join(layout.root, ROOT_METADATA)) as metadata:
            before, after = metadata.mirror(bucket.epochs, bucket.segments)
        _count(bucket, report, say)
        say(f"index: {before} segment(s) before, {after} now")
        return report


@dataclass
class _Bucket:
    """What a prefix describes: topics (name -> {"partitions", "config"}), each channel's usable
    segments, and the epochs to record (those the segments name, and the newest named anywhere)."""

    topics: dict[str, dict[str, Any]]
    channels: dict[str, list[SegmentRecord]]
    epochs: list[EpochRecord]
    newest: int

    @property
    def segments(self) -> list[SegmentRecord]:
        return [r for records in self.channels.values() for r in records]


def _read_bucket(
    storage: ChunkStorage,
    url: str,
    report: RebuildReport,
    say: Progress,
    counted: Callable[[int, int], None] | None,
) -> _Bucket:
    """Read the prefix (see the module docstring's rules); problems and notes go to ``report``.
    Raises before anything is made for a prefix with nothing of filechannel's, or a damaged description."""
    say(f"listing {storage.url}")
    listing = storage.list("")
    say(f"{len(listing)} object(s) listed")
    used = usable_segments(storage, listing, report.problems, report.notes, counted)
    deleted = deleted_in_tier(info.name for info in listing)
    descriptions = [i.name for i in listing if i.name.count("/") == 1 and i.name.endswith("/" + TOPIC_FILE)]
    if not used and not descriptions:
        raise TierError(
            f"nothing to rebuild from at {redact_url(storage.url)}: no topic description and no segment manifest "
            f"among its {len(listing)} object(s); check the URL (the prefix a root's topics are tiered to) and --tier-options"
        )

    # topics: their descriptions in tier-2, and the partitions the manifests show
    topics: dict[str, dict[str, Any]] = {}
    damaged: list[str] = []
    for name in descriptions:
        topic = name.partition("/")[0]
        if topic.startswith(".") or topic in deleted:
            continue
        try:
            topics[topic] = _topic_description(storage, name, url)
        except (ValueError, TypeError) as exc:  # ConfigError too, a ValueError
            damaged.append(f"{name} is damaged ({exc})")
    if damaged:  # before anything is made: no topic comes back with settings other than its own
        raise TierError(
            f"{'; '.join(damaged)}: nothing rebuilt; mend that object in {redact_url(storage.url)}, or delete it "
            "(its topic then gets the tier settings only), and run the rebuild again"
        )
    for topic in sorted(deleted & {name.partition("/")[0] for name in [*used, *descriptions]}):
        report.notes.append(f"topic {topic}: deleted from its root (marked {TIER_DELETED_PREFIX}{topic}), not rebuilt")
    channels: dict[str, list[SegmentRecord]] = {}
    for channel, records in used.items():
        try:
            topic, partition = split_partition_name(channel)
        except ValueError:
            report.notes.append(f"{channel}: not a topic's partition (a standalone channel?), not rebuilt")
            continue
        if topic in deleted:
            continue
        meta = topics.setdefault(topic, {"partitions": 0, "config": {}})
        meta["partitions"] = max(meta["partitions"], partition + 1)
        channels[channel] = records

    # the epochs every used segment names, and the newest epoch in the bucket
    now = now_ms()
    segments = [r for records in channels.values() for r in records]
    epochs = {r.epoch: EpochRecord(r.epoch, "rebuild: uploader of the segments of this epoch", now) for r in segments}
    newest = max(newest_epoch_named(listing), newest_epoch(storage))
    if newest and newest not in epochs:
        epochs[newest] = EpochRecord(newest, "rebuild: the newest epoch named in the bucket", now)
    return _Bucket(topics, channels, sorted(epochs.values(), key=lambda e: e.epoch), newest)


def _make_topics(
    layout: RootLayout,
    bucket: _Bucket,
    url: str,
    options: dict[str, Any] | None,
    report: RebuildReport,
    say: Progress,
) -> None:
    """Make each topic of ``bucket`` missing from ``layout``, and grow one with fewer partitions."""
    for topic, meta in sorted(bucket.topics.items()):
        partitions = max(1, meta["partitions"])
        report.topics[topic] = partitions
        have = layout.read(topic)
        if have is not None:
            if int(have["partitions"]) < partitions:
                layout.add_partitions(topic, partitions)
                say(f"topic {topic}: grown to {partitions} partition(s)")
            continue
        config = {k: v for k, v in meta["config"].items() if k in TOPIC_SETTINGS}
        config["tier"] = url
        if options is not None:
            config["tier_options"] = options
        dropped = sorted(set(meta["config"]) - set(TOPIC_SETTINGS))
        if dropped:
            report.notes.append(f"topic {topic}: settings unknown to this filechannel dropped: {', '.join(dropped)}")
        layout.create(topic, partitions, config)
        say(f"topic {topic}: {partitions} partition(s)")


def _follow_settings(layout: RootLayout, bucket: _Bucket, report: RebuildReport, say: Progress) -> None:
    """A replica's refresh: each topic's settings become those its description in tier-2 has now
    (the owner's daemon writes it again after an alter), but ``tier`` and ``tier_options`` (the
    replica's own). A topic the bucket has no description of keeps its settings."""
    for topic, meta in sorted(bucket.topics.items()):
        described = {k: v for k, v in meta["config"].items() if k in TOPIC_SETTINGS and k not in ("tier", "tier_options")}
        have = layout.read(topic)
        if not described or have is None:
            continue
        current = effective_settings(have.get("config", {}))
        changes = {k: v for k, v in described.items() if current.get(k) != v}
        if changes:
            layout.alter(topic, changes)
            report.notes.append(f"topic {topic}: settings changed by the owner: {', '.join(sorted(changes))}")
            say(f"topic {topic}: settings now as the owner's: {', '.join(f'{k}={v!r}' for k, v in sorted(changes.items()))}")


def _count(bucket: _Bucket, report: RebuildReport, say: Progress) -> None:
    """The report's totals and per-partition ends."""
    segments = bucket.segments
    report.segments = len(segments)
    report.bytes = sum(r.size for r in segments)
    for topic, count in report.topics.items():
        for p in range(count):
            records = bucket.channels.get(partition_name(topic, p), [])
            report.ends[partition_name(topic, p)] = records[-1].end_offset if records else 0
    say(f"metadata: {report.segments} segment(s), {report.bytes} bytes, epochs up to {bucket.newest}")
