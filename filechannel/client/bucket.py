"""The topics of a tier URL, read from the bucket alone: what ``Consumer(tier=...)`` reads, with no root.

Every root that tiers into the URL is an *origin* (:mod:`filechannel.tiering.origins`): the
default origin, when a root without one tiers at the URL itself, or each named origin under
``<url>/<origin>/``. :class:`BucketTopics` finds them and their topics in the bucket and
names each origin's topic as Kafka's MirrorMaker 2 names a remote topic: ``<origin>.<topic>``
(an origin name has no dot), or plain ``<topic>`` for the default origin. So topic
partitions, positions and a group's committed offsets are per origin and partition; no
order across origins is promised. Each record carries its origin in the header
:data:`ORIGIN_HEADER` (the origin's name; empty for the default origin).

Invariants:

- **Read-only.** Nothing is written to the bucket or deleted from it: a partition is a
  read-only channel over tier-2 only (no local segment), its index derived from the
  bucket's manifests and following the partition's head (:mod:`filechannel.tiering.follower`).
  Only uploaded segments are read: the records a root has not uploaded yet are not seen.
- **The state folder is the reader's.** Under ``state_dir``::

    STATE/.bucket.json                    {"url": URL (redacted)}: the tier URL this state belongs to
    STATE/.bucket/ORIGIN/metadata.db      the derived index of one origin's uploaded segments (.default: the default origin)
    STATE/.bucket/ORIGIN/TOPIC/PARTITION/ an empty folder per partition read (the channel's place)
    STATE/.groups/GROUP/                  consumer groups, as under a root (client/group.py)

  A state folder of another URL is refused (its indexes would describe another bucket).
  Everything but ``.groups`` is derived, and made again from the bucket if deleted.
- **Costs.** Finding origins and topics lists ``.origins/`` and each origin's prefix (one
  listing each, one GET per topic) at most once per ``metadata_max_age_ms``; following a
  partition is one GET of its head per ``tier_poll_ms`` while it is read.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..channel import FileChannel
from ..engine.files import read_if_exists, write_atomically
from ..engine.wakeup import Wakeup
from ..errors import ConfigError, UnknownPartitionError, UnknownTopicError, os_errors
from ..root import origin_url, partition_name, validate_origin
from ..tiering.bindings import StorageClients
from ..tiering.follower import FollowingTierContext
from ..tiering.layout import SegmentRecord
from ..tiering.origins import bucket_origins, prefix_topics
from ..tiering.storage import redact_url

ORIGIN_HEADER = "filechannel.origin"
BUCKET_DIR = ".bucket"
STATE_FILE = ".bucket.json"
DEFAULT_ORIGIN_DIR = ".default"  # (an origin's name never starts with a dot)


@dataclass(frozen=True)
class BucketTopic:
    """One topic of one origin: the origin (None: the default), its name there, its partition count."""

    origin: str | None
    topic: str
    partitions: int

    @property
    def name(self) -> str:
        """The reader's name of it: ``<origin>.<topic>``, or ``<topic>`` for the default origin."""
        return self.topic if self.origin is None else f"{self.origin}.{self.topic}"


class BucketTopics:
    """The topics of every origin under ``url`` (or of ``origins``), as a consumer reads them.

    ``options``: the storage's (``endpoint_url``...; credentials come from the environment or
    here, never stored). ``max_age_s``: how long a listing of origins and topics is used
    before the next; ``follow_s``: how often a partition being read asks for its head.
    Reaches the bucket once at construction, so a wrong URL or an unreachable bucket fails
    here. Thread-safe.
    """

    def __init__(
        self,
        url: str,
        options: dict[str, Any] | None,
        origins: Sequence[str] | None,
        state_dir: str | os.PathLike[str],
        *,
        max_age_s: float,
        follow_s: float,
    ) -> None:
        if isinstance(origins, str):
            raise ConfigError(f"origins must be a list of origin names, not the string {origins!r}")
        self.url = url
        self.root = os.path.abspath(os.fspath(state_dir))  # where groups keep their state (GroupMember's root)
        self.follow_s = follow_s
        self._options = dict(options or {})
        self._wanted = None if origins is None else {validate_origin(o) for o in origins}
        self._max_age_s = max_age_s
        self._storages = StorageClients()
        self._lock = threading.Lock()
        self._catalog: dict[str, BucketTopic] = {}
        self._listed_at = -math.inf
        self._own_state()
        try:
            if not self._refresh():
                raise UnknownTopicError(
                    f"{redact_url(self.url)} holds no tiered root: nothing claimed at its top level nor under an origin; "
                    "check the URL (and tier_options), or wait for a root's first `filechannel tier run` pass"
                )
        except BaseException:
            self.close()
            raise

    def _own_state(self) -> None:
        """Make the state folder, or check that it is this URL's."""
        with os_errors("create state folder", self.root):
            os.makedirs(os.path.join(self.root, BUCKET_DIR), exist_ok=True)
        path = os.path.join(self.root, STATE_FILE)
        mine = redact_url(self.url).rstrip("/")
        data = read_if_exists(path, "bucket reader state")
        if data is None:
            write_atomically(path, json.dumps({"url": mine}).encode())
            return
        try:
            theirs = json.loads(data)["url"]
        except (ValueError, KeyError, TypeError):
            theirs = None
        if theirs != mine:
            raise ConfigError(
                f"the state folder {self.root!r} belongs to a reader of {theirs!r} ({path}), not of {mine!r}: "
                "use another state folder for this URL (its indexes describe another bucket)"
            )

    def _refresh(self) -> list[str | None]:
        """List the origins and their topics again (see the module docstring); return the origins found."""
        found = bucket_origins(self._storages.get(self.url, self._options))
        catalog = {}
        for origin in found:
            if self._wanted is not None and origin not in self._wanted:
                continue
            storage = self._storages.get(origin_url(self.url, origin), self._options)
            for topic, partitions in prefix_topics(storage).items():
                entry = BucketTopic(origin, topic, partitions)
                catalog[entry.name] = entry
        with self._lock:
            self._catalog = catalog
            self._listed_at = time.monotonic()
        return found

    def _catalog_now(self, force: bool = False) -> dict[str, BucketTopic]:
        with self._lock:
            due = force or time.monotonic() - self._listed_at >= self._max_age_s
            catalog = self._catalog
        if due:
            self._refresh()
            with self._lock:
                catalog = self._catalog
        return catalog

    def topic(self, name: str) -> BucketTopic:
        """The origin and topic ``name`` names; :class:`UnknownTopicError` saying what is there if none."""
        catalog = self._catalog_now()
        entry = catalog.get(name)
        if entry is None:
            known = ", ".join(sorted(catalog)[:10]) or "none"
            raise UnknownTopicError(
                f"topic {name!r} is not in {redact_url(self.url)} (topics: {known}): a named origin's topic is "
                "<origin>.<topic>, a topic of a root without an origin is <topic>; a topic appears once its root's "
                "daemon made a pass over it"
            )
        return entry

    # -- what a consumer asks of its topics (subscription.TopicSource) ---------------------------

    def list(self) -> list[str]:
        """The reader's names of every topic found (``<origin>.<topic>``, or ``<topic>``), sorted."""
        return sorted(self._catalog_now())

    def entries(self) -> dict[str, BucketTopic]:
        """Every topic found, by the reader's name (listed again at most once per ``max_age_s``)."""
        return dict(self._catalog_now())

    def partitions(self, topic: str) -> int:
        return self.topic(topic).partitions

    def open_partition(self, topic: str, partition: int, *, wakeup: Wakeup | None = None, **_overrides: Any) -> FileChannel:
        """Partition ``partition`` of ``topic`` as a read-only channel over tier-2 only (the
        overrides, a writer's settings, mean nothing here)."""
        path, context = self._partition(topic, partition)
        return FileChannel(path, read_only=True, wakeup=wakeup, tier=context.url, tier_context=context)

    def uploaded_segments(self, topic: str, partition: int) -> Sequence[SegmentRecord]:
        """The uploaded segments of partition ``partition`` of ``topic``, by offset, as its channel
        lists them (the index first brought up to the partition's head): what Spark's planner cuts
        into tasks (spark/bucket.py)."""
        _, context = self._partition(topic, partition)
        with context:
            return context.uploaded_segments()

    def _partition(self, topic: str, partition: int) -> tuple[str, FollowingTierContext]:
        """The state folder of a partition (made if missing) and a new context following its head."""
        entry = self.topic(topic)
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < entry.partitions:
            raise UnknownPartitionError(
                f"partition {partition!r} does not exist: topic {topic!r} has partitions 0 to {entry.partitions - 1}"
            )
        folder = os.path.join(self.root, BUCKET_DIR, entry.origin or DEFAULT_ORIGIN_DIR)
        path = os.path.join(folder, entry.topic, str(partition))
        with os_errors("create state folder", path):
            os.makedirs(path, exist_ok=True)
        url = origin_url(self.url, entry.origin)
        storage = self._storages.get(url, self._options)
        name = partition_name(entry.topic, partition)
        return path, FollowingTierContext(storage, url, os.path.join(folder, "metadata.db"), name, follow_s=self.follow_s)

    def origin_header(self, topic: str) -> tuple[str, bytes]:
        """The header every record of ``topic`` carries: (:data:`ORIGIN_HEADER`, the origin's name)."""
        origin = self.topic(topic).origin
        return ORIGIN_HEADER, (origin or "").encode()

    def close(self) -> None:
        self._storages.close()
