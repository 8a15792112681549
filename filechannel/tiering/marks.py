"""Deleted tiered topics: their marks and their purge from tier-2.

Two marks: the local one, ``ROOT/.tier/deleted/TOPIC`` (which ``root.mark_topic_deleted``
writes when such a topic is deleted: the storage it was tiered to), and the durable one in
tier-2, ``.deleted/TOPIC`` at the prefix's top (:func:`mark_deleted_in_tier`: the deletion
writes it when the storage is reachable, else the daemon's purge writes it first), which
``tier rebuild`` reads: a topic marked there is never rebuilt, even when the root was lost
before its copies were purged.

The daemon purges each marked topic at the start of a pass (:func:`purge_topic`): the
tier-2 mark written, its merges abandoned, its garbage forgotten, every row's objects
deleted and the row dropped, then every object under the topic's prefix, then the tier-2
mark, then the local one (so a purge cut short leaves both marks). Until then ``root.py``
refuses to create a topic of that name. A storage that cannot be reached leaves the
marks for a later pass and deletes nothing else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ..config import ChannelConfig
from ..engine.clock import now_ms
from ..engine.files import read_if_exists, unlink_if_exists
from ..root import DELETED_DIR
from .bindings import open_storage
from .layout import LOST, STATES, UPLOADED, UPLOADING
from .metadata import TierMetadata
from .ownership import IDENTITY_FILE, read_claim, root_identity
from .storage import ChunkStorage
from .uploader import abandon, delete_objects, finish_delete


def deleted_topics(tier_dir: str) -> list[str]:
    """The deleted tiered topics whose tier-2 copies are not purged yet (those with a mark), sorted."""
    try:
        return sorted(os.listdir(os.path.join(tier_dir, DELETED_DIR)))
    except FileNotFoundError:
        return []


def read_mark(tier_dir: str, topic: str) -> ChannelConfig | None:
    """The storage a deleted topic was tiered to, as settings (``tier``, ``tier_options``); None if
    its mark is gone. A damaged mark raises ValueError, KeyError, TypeError or ConfigError."""
    raw = read_if_exists(os.path.join(tier_dir, DELETED_DIR, topic), "deleted topic mark")
    if raw is None:
        return None
    mark = json.loads(raw)
    return ChannelConfig(tier=mark["tier"], tier_options=mark["tier_options"])


TIER_DELETED_PREFIX = ".deleted/"  # in tier-2: .deleted/TOPIC, a topic deleted from its root


def mark_deleted_in_tier(storage: ChunkStorage, topic: str) -> None:
    """Write the durable mark of the deleted ``topic`` in its tier-2 storage (see the module docstring)."""
    storage.write(TIER_DELETED_PREFIX + topic, json.dumps({"topic": topic, "deleted_ms": now_ms()}).encode())


def mark_deleted_now(tier_dir: str, topic: str, tier: str, tier_options: Mapping[str, Any] | None) -> bool:
    """At a tiered topic's deletion: write its tier-2 mark now, if this root owns the prefix (a
    prefix another root owns, or nobody, holds nothing of this root's to hide). Returns whether
    it was written; an unreachable storage raises its TierError (the daemon's purge writes the
    mark once it is back)."""
    identity = os.path.join(tier_dir, IDENTITY_FILE)
    if not os.path.exists(identity):  # this root never tiered: nothing of it in any storage
        return False
    with open_storage(tier, **dict(tier_options or {})) as storage:
        claim = read_claim(storage)
        if claim is None or claim.root_id != root_identity(tier_dir):
            return False
        mark_deleted_in_tier(storage, topic)
    return True


def deleted_in_tier(names: Iterable[str]) -> set[str]:
    """The topics a tier-2 listing (object names) marks deleted."""
    return {n[len(TIER_DELETED_PREFIX) :] for n in names if n.startswith(TIER_DELETED_PREFIX)}


def purge_topic(tier_dir: str, storage: ChunkStorage, metadata: TierMetadata, epoch: int, topic: str) -> None:
    """Delete the tier-2 copies and metadata rows of the deleted topic ``topic`` (in ``storage``,
    as epoch ``epoch``), then its marks: the tier-2 one first written, and deleted last but one."""
    mark_deleted_in_tier(storage, topic)
    for channel in [c for c in metadata.channels() if c.startswith(topic + "/")]:
        for merge in metadata.merges(channel):  # its objects go with the topic's, below
            metadata.abandon_merge(epoch, merge.name)
        metadata.forget_garbage(epoch, metadata.garbage(channel))
        for record in metadata.segments(channel, states=STATES):
            if record.state == UPLOADING:
                abandon(storage, metadata, epoch, record)
                continue
            if record.state in (UPLOADED, LOST):
                metadata.begin_delete(epoch, channel, record.base_offset)
            finish_delete(storage, metadata, epoch, channel, record)
    delete_objects(storage, [o.name for o in storage.list(topic + "/")])
    delete_objects(storage, [TIER_DELETED_PREFIX + topic])
    unlink_if_exists(os.path.join(tier_dir, DELETED_DIR, topic))
