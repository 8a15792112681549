"""Deleted tiered topics: their marks (``ROOT/.tier/deleted/TOPIC``, which ``root.mark_topic_deleted``
writes when such a topic is deleted: the storage it was tiered to) and their purge from tier-2.

The daemon purges each marked topic at the start of a pass (:func:`purge_topic`): its
merges abandoned, its garbage forgotten, every row's objects deleted and the row dropped,
then every object under the topic's prefix, then the mark. Until then ``root.py`` refuses
to create a topic of that name.
"""

from __future__ import annotations

import json
import os

from ..config import ChannelConfig
from ..engine.files import read_if_exists, unlink_if_exists
from ..root import DELETED_DIR
from .layout import LOST, STATES, UPLOADED, UPLOADING
from .metadata import TierMetadata
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


def purge_topic(tier_dir: str, storage: ChunkStorage, metadata: TierMetadata, epoch: int, topic: str) -> None:
    """Delete the tier-2 copies and metadata rows of the deleted topic ``topic`` (in ``storage``,
    as epoch ``epoch``), then its mark."""
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
    unlink_if_exists(os.path.join(tier_dir, DELETED_DIR, topic))
