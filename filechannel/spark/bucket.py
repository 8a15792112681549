"""A query of a tier URL read alone (option ``tier``): the driver's view of the bucket, and its planner.

With ``option("tier", URL)`` instead of ``root``, nothing but the bucket is needed, on the
driver or on the executors: the driver finds the origins and their topics, and each
partition's uploaded offsets, with the bucket reader's machinery (:class:`~filechannel.client.
bucket.BucketTopics`: origins and topics listed, each partition's ``head.json`` followed and its
manifests indexed); the executors read the segments' chunks (:func:`~.tier.read_tier_range`).

Invariants:

- **Named as the bucket Consumer names them.** Offsets (and the checkpoint) are keyed by the
  reader's topic name, ``<origin>.<topic>`` (plain ``<topic>`` for the default origin), so they
  are per origin-partition. The rows carry the plain topic in ``topic`` and the origin in
  ``origin`` (``""`` for the default origin). ``subscribe``, ``subscribePattern`` and ``assign``
  name plain topics, read in every origin the ``origins`` option matches (all without it).
- **Everything is uploaded.** A partition's channel here is tier-2 only: its end is the
  uploaded end, so every task is a :class:`~.tier.TierRange` (a piece the index no longer
  covers at planning, after retention, is data loss, never a task on a root).
- **Read-only, nothing kept.** Nothing is written to the bucket. The indexes live in a private
  temporary folder of the driver's process, derived data removed when the catalog is closed
  (a batch: after planning; a stream: at ``stop()``), collected, or the process exits; one
  left by a process killed first (Spark ends a stream's reader process without ``stop()``) is
  removed by the next catalog made on the machine.
- **Waits for what is not there yet.** A URL with nothing claimed yet, or no origin matching,
  lists no topic (a stream's micro-batches are empty until one appears; a batch refuses, in
  :meth:`BucketCatalog.require_topics`); the listing is repeated at most once per
  ``max_age_s``, so a stream picks up new origins and topics as ``subscribePattern`` does.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from typing import Any, Self

from ..channel import FileChannel
from ..client.bucket import BucketTopic, BucketTopics
from ..engine.files import private_folder
from ..errors import UnknownTopicError, os_errors
from ..root import origin_url
from ..tiering.layout import SegmentRecord
from ..tiering.storage import redact_url
from .errors import data_loss
from .ranges import OffsetRange
from .tier import SegmentPlanner, TierRange

log = logging.getLogger(__name__)

STATE_PREFIX = "filechannel-spark-bucket-"  # a catalog's folder in the system's temp folder: <prefix><pid>-<random>
FOLLOW_S = 1.0  # a partition's head is read again at most this often while one channel of it is open


class BucketCatalog:
    """The origins matching ``origins`` (names or globs, None: every origin) under the tier URL
    ``url``, opened with the non-secret storage ``options``; their topics listed at most once per
    ``max_age_s``. See the module docstring. Not thread-safe (a reader's, on the driver)."""

    def __init__(self, url: str, options: dict[str, Any], origins: Sequence[str] | None, *, max_age_s: float) -> None:
        self.url = url
        self.options = dict(options)
        self.origins = None if origins is None else tuple(origins)
        self._max_age_s = max_age_s
        # (Spark may kill the process holding a stream's reader without stop(): the next catalog made
        # on this machine removes the folders of dead processes)
        with os_errors("create the Spark bucket reader's folder", tempfile.gettempdir()):
            self._state = private_folder(tempfile.gettempdir(), STATE_PREFIX)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._state, ignore_errors=True)
        self._bucket: BucketTopics | None = None

    def _topics(self) -> BucketTopics | None:
        """The bucket reader, made on first use; None while the URL holds no tiered root (tried
        again next time). A bucket that cannot be reached raises the binding's error."""
        if self._bucket is None:
            try:
                self._bucket = BucketTopics(
                    self.url, self.options, None, self._state, max_age_s=self._max_age_s, follow_s=FOLLOW_S
                )
            except UnknownTopicError:
                return None  # nothing claimed at the URL yet: no origin, no topic
        return self._bucket

    def matches(self, origin: str | None) -> bool:
        """Whether the ``origins`` option takes ``origin`` (the default origin only without the option)."""
        if self.origins is None:
            return True
        return origin is not None and any(fnmatch.fnmatchcase(origin, pattern) for pattern in self.origins)

    def topics(self) -> dict[str, BucketTopic]:
        """The topics of the matching origins, by the reader's name (``<origin>.<topic>``)."""
        bucket = self._topics()
        if bucket is None:
            return {}
        return {name: entry for name, entry in bucket.entries().items() if self.matches(entry.origin)}

    def require_topics(self, option: str, value: str, partitions: dict[str, list[int]]) -> None:
        """A batch's check: :class:`UnknownTopicError` saying what the URL holds if ``partitions``
        (those option ``option`` = ``value`` selects) is empty."""
        if partitions:
            return
        bucket = self._topics()
        found = {} if bucket is None else bucket.entries()
        origins = sorted({e.origin or "(the default origin)" for e in found.values()})
        wanted = "every origin" if self.origins is None else f"origins {', '.join(self.origins)}"
        raise UnknownTopicError(
            f"{redact_url(self.url)}: no topic of {wanted} matches {option} {value} (origins there: "
            f"{', '.join(origins) or 'none'}; topics: {', '.join(sorted(found)[:10]) or 'none'}); check the options tier, "
            f"origins and {option}, or wait for the roots' first `filechannel tier run` pass"
        )

    def _listed(self, name: str) -> BucketTopics:
        """The bucket reader, which listed ``name`` (:class:`UnknownTopicError` if the URL holds nothing now)."""
        bucket = self._topics()
        if bucket is None:
            raise UnknownTopicError(f"{redact_url(self.url)} holds no tiered root (any more): {name!r} cannot be read")
        return bucket

    def topic(self, name: str) -> BucketTopic:
        return self._listed(name).topic(name)

    def open_partition(self, name: str, partition: int, *, read_only: bool = True) -> FileChannel:
        """A read-only channel over the partition's uploaded segments (``read_only`` is always so)."""
        return self._listed(name).open_partition(name, partition)

    def uploaded(self, name: str, partition: int) -> list[SegmentRecord]:
        return list(self._listed(name).uploaded_segments(name, partition))

    def close(self) -> None:
        bucket, self._bucket = self._bucket, None
        try:
            if bucket is not None:
                bucket.close()
        finally:
            self._cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class BucketPlanner(SegmentPlanner):
    """Tier ranges over a bucket's partitions: their segments from the catalog's indexes, their
    storage at ``<url>/<origin>``, their rows labelled with the plain topic and the origin."""

    def __init__(self, catalog: BucketCatalog) -> None:
        super().__init__()
        self.catalog = catalog

    def tier_config(self, topic: str) -> dict[str, Any] | None:
        url = origin_url(self.catalog.url, self.catalog.topic(topic).origin)
        return {"tier": url, "tier_options": self.catalog.options}

    def uploaded(self, topic: str, partition: int) -> list[SegmentRecord]:
        return self.catalog.uploaded(topic, partition)

    def labels(self, topic: str) -> tuple[str, str | None]:
        entry = self.catalog.topic(topic)
        return entry.topic, entry.origin or ""

    def split_tiers(self, r: OffsetRange) -> list[TierRange | OffsetRange]:
        """As a root's, but all of ``r`` must be uploaded: a piece left over is what retention
        deleted since the partition's bounds were read (never a task on a root). That is data
        loss; with ``failOnDataLoss=false`` the range starts again at the first offset still
        uploaded, as Kafka's source goes on from the earliest offset."""
        pieces = super().split_tiers(r)
        gone = next((p for p in pieces if isinstance(p, OffsetRange) and p.size > 0), None)
        if gone is None:
            return pieces
        uploaded = self.uploaded(r.topic, r.partition)
        first = uploaded[0].base_offset if uploaded else r.end
        if r.fail_on_data_loss or gone.start >= first:  # not the start retention took: never skipped
            raise data_loss(r.topic, r.partition, gone.start, first)
        log.warning("%s[%d]: offsets %d to %d were deleted from tier-2; going on", r.topic, r.partition, r.start, first - 1)
        return self.split_tiers(dataclasses.replace(r, start=first)) if first < r.end else []
