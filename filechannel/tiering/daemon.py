"""The tiering daemon: uploads sealed segments of every tiered topic of a root, and applies retention.

One daemon per root, enforced by ``flock`` on ``ROOT/.tier/daemon.lock``; uploading is
its own role, never part of a client's maintenance thread. At start it opens the index
``ROOT/.tier/metadata.db`` (a damaged one is moved aside and made anew, :mod:`.reindex`)
and takes a new epoch above every epoch the index and the reachable storages record
(fencing every older uploader, even after the index was lost). On first use of a storage
it claims the prefix for this root and records its epoch there (:mod:`.ownership`): a
prefix another root owns fails each of its partitions in one line, and nothing is
uploaded, swept or deleted there. Then each pass, for every partition of every topic
whose settings have ``tier``:

0. with ``roll_idle_ms`` (``tier run --roll``), seal the active segment if it holds records,
   no writer holds its ``writer.lock`` and it was not written to for that long
   (:mod:`filechannel.engine.idle_seal`), so a quiet partition's records become eligible;
   with the topic's ``tier_after_ms``, also once its first record is that old (a slow
   writer's segment: tier-2 is then behind the writer by at most ``tier_after_ms``, a pass
   and an upload);
   then clean up: finish "deleting" rows (objects, then row), abandon "uploading" rows (of a
   dead epoch, or this epoch's failed attempt: objects, then row), and, on the
   partition's first pass of this epoch, bring the index up to the bucket if it is behind
   the partition's head, delete objects of older epochs that no row and no manifest
   names, older than ``ORPHAN_GRACE_MS`` (late writes of a fenced uploader), write the
   partition's head; and on every pass where it differs from what this daemon last wrote
   (so on the first pass of an epoch, then after an alter), copy the topic's description to
   ``<topic>/topic.json`` in tier-2, in the shape of the local one (name, partitions,
   settings): the bucket describes itself, and ``tier rebuild`` (and a replica's refresh) reads it;
1. compress sealed raw segments (under the channel's ``maintenance.lock``, as the
   channel's maintenance thread does);
2. upload the eligible ones, oldest first (see :mod:`.uploader`): sealed, in ``.seg.z``
   form (or raw below the recovery point when ``compression="none"``, staged as ``.seg.z``
   at zstd level 1 in ``ROOT/.tier/staging``: the local copy stays raw, tier-2 always has
   the one block form every remote reader reads), once its first record is ``tier_after_ms``
   old if that is set;
3. local retention: delete local copies of a prefix of sealed segments past
   ``local_retention_bytes`` / ``local_retention_ms``, under ``maintenance.lock`` (also
   when an upload failed: what is uploaded may still leave the local disk);
4. total retention (``retention_bytes`` / ``retention_ms`` across both tiers): the local
   copy first, then in tier-2 ``begin_delete`` -> objects deleted (missing is fine; a
   merged object another segment still uses stays) -> ``finish_delete``;
5. with ``defrag`` settings, on a partition with nothing to upload in this pass (idle):
   merge runs of small objects (see :mod:`.defrag`), a few per pass. Merges left by a
   crash are abandoned, and objects they replaced deleted once due, at step 0.

Invariants:

- A local segment is deleted only if the metadata says "uploaded" for it (committed after
  its chunks and manifest), and only as part of a prefix of sealed segments: never the
  active segment, never a hole, never a segment that exists nowhere else. Retention and
  reader positions never override this (the channel's own GC does nothing with a tier).
- Every metadata change carries the daemon's epoch: once another daemon took a newer
  one, the first commit (or object write), or the next pass's first check of the index's
  epoch, raises :class:`FencedError` and the daemon stops.
- A crash anywhere leaves at worst an "uploading" or "deleting" row and objects it names,
  or orphan objects: the next start cleans each of them up.
- After a pass changed a partition's uploaded range (uploads, total retention), its head in
  tier-2 is written again from the index (:mod:`.heads`).

The daemon reads each partition through a :class:`~filechannel.engine.log.Log` without a tier
context: its listing is the local files only, which is what it uploads and deletes.

This module is the daemon's loop and passes. Which channels a root tiers is :mod:`.partitions`,
its lock :mod:`.daemon_lock`, the status it writes and ``tier status`` :mod:`.status`, the
purge of deleted topics :mod:`.marks`, and ``tier defrag`` :func:`.defrag.defrag_root`.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Self

from ..config import ChannelConfig
from ..engine import compression, retention
from ..engine.clock import now_ms
from ..engine.compressed import compress_segment
from ..engine.files import unlink_if_exists
from ..engine.idle_seal import AGED, BUSY, SEALED, seal_idle
from ..engine.lock import FileLock
from ..engine.log import Log, SegmentRef
from ..engine.log_start import read_log_start
from ..engine.recovery_point import FILE_NAME as RECOVERY_POINT_FILE
from ..engine.recovery_point import read_recovery_point
from ..engine.segment import MAX_FRAME_PAYLOAD
from ..errors import ConfigError, FencedError, FileChannelError, TierError, os_errors
from ..root import DELETED_DIR, ROOT_METADATA, TOPIC_FILE, TOPIC_SETTINGS, RootLayout
from .bindings import StorageClients
from .context import STANDALONE_METADATA
from .daemon_lock import LOCK_FILE
from .defrag import DefragReport, DefragSettings, clean_up, defrag_channel
from .heads import ChannelHead, write_head
from .layout import DELETING, LISTED, STATES, UPLOADED, UPLOADING, SegmentRecord, manifest_name, parse_object_name
from .marks import deleted_topics, purge_topic, read_mark
from .metadata import TierMetadata
from .origins import enter_origin, top_url
from .ownership import PrefixGuard, newest_epoch, root_identity
from .partitions import TieredChannel, storage_key, tier_of, tiered_partitions
from .reindex import bring_up, open_index, referenced_by_manifests
from .status import write_status
from .storage import ChunkStorage, redact_url
from .uploader import (
    RateLimiter,
    SegmentToUpload,
    SegmentUpload,
    abandon,
    check_fence,
    delete_objects,
    finish_delete,
    start_upload,
)

log = logging.getLogger("filechannel")

STAGING_DIR = "staging"
STAGING_LEVEL = 1  # zstd level of the staged .seg.z of a compression="none" channel
ORPHAN_GRACE_MS = 10 * 60 * 1000  # an object younger than this is never an orphan (another writer's, under way)
_RETENTION_PAGE = 256  # total retention reads the oldest uploaded segments this many at a time

Progress = Callable[[str], None]


@dataclass
class PassReport:
    """What one pass did: counts, and one line per failure (a partition that could not be served)."""

    uploaded: int = 0
    uploaded_bytes: int = 0
    deleted_local: int = 0
    deleted_remote: int = 0
    merges: int = 0
    failures: list[str] = field(default_factory=list)


class TieringDaemon:
    """Tiers every tiered topic of ``root`` (see the module docstring).

    With ``channel`` (the settings of a standalone :class:`~filechannel.channel.FileChannel`,
    which are stored nowhere), ``root`` is that channel's folder: the daemon tiers it alone,
    with its lock, staging and status in ``CHANNEL/tier/`` beside the standalone metadata
    ``CHANNEL/tier/metadata.db``, under the channel's folder name (what the channel reads).

    ``wait``: if another daemon holds the root's lock, wait for it (else raise TierError at
    :meth:`start`). ``progress`` receives one line per action (defaults to the logger).
    ``defrag``: merge small objects of idle partitions (None: never; ``tier defrag`` does it
    on demand); ``max_merges`` per partition and pass keeps a pass short. ``orphan_grace_ms``:
    how old an object no row and no manifest names must be before the sweep deletes it.
    ``roll_idle_ms``: seal the active segment of a partition that no writer is writing to and
    that was not written to for this long, before its upload (:mod:`filechannel.engine.idle_seal`;
    None: never, only the writers' own rolls seal segments).
    Use as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        channel: ChannelConfig | None = None,
        owner: str | None = None,
        wait: bool = False,
        interval: float = 1.0,
        progress: Progress | None = None,
        defrag: DefragSettings | None = None,
        max_merges: int = 4,
        orphan_grace_ms: int = ORPHAN_GRACE_MS,
        roll_idle_ms: int | None = None,
    ) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.roll_idle_ms = roll_idle_ms
        self.defrag = defrag
        self.max_merges = max_merges
        if channel is not None and channel.tier is None:
            raise ConfigError(f"the channel {self.root} has no tier setting: nothing to tier")
        self._channel = channel
        metadata = ROOT_METADATA if channel is None else STANDALONE_METADATA
        self.metadata_path = os.path.join(self.root, metadata)
        self.tier_dir = os.path.dirname(self.metadata_path)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.wait = wait
        self.interval = interval
        self._progress = progress or (lambda line: log.info("tier: %s", line))
        self._stop = threading.Event()
        self._lock: FileLock | None = None
        self._metadata: TierMetadata | None = None
        self._storages = StorageClients()
        self._last_errors: dict[str, str] = {}
        self._swept: set[str] = set()  # partitions whose orphans this epoch deleted
        self._described: dict[str, bytes] = {}  # topic -> the topic.json this epoch last wrote to tier-2
        self._guards: dict[tuple[str, str], PrefixGuard] = {}  # storages entered: claimed, this epoch marked
        self.root_id = ""
        self.origin: str | None = None if channel is not None else RootLayout(self.root).origin()  # objects under <url>/<origin>
        self.epoch = 0
        self.orphan_grace_ms = orphan_grace_ms
        self._fresh_index = False  # the index was made anew at start: its partitions' manifests are read

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Take the root's lock and a new epoch; each partition's first pass cleans up what earlier epochs left.

        A replica root (``tier rebuild --replica``) is refused with :class:`ReadOnlyError`
        before anything is made: it never claims the prefix nor takes an epoch there."""
        replica = RootLayout(self.root).replica() if self._channel is None else None
        if replica is not None:
            raise replica.refusal("run the tiering daemon")
        with os_errors("create tier folder", self.tier_dir):
            os.makedirs(os.path.join(self.tier_dir, STAGING_DIR), exist_ok=True)
        lock = FileLock(os.path.join(self.tier_dir, LOCK_FILE))
        if not lock.acquire(blocking=self.wait):
            lock.close()
            raise TierError(
                f"another tiering daemon holds {os.path.join(self.tier_dir, LOCK_FILE)}: one daemon per root; "
                "stop it first (or wait for it)"
            )
        self._lock = lock
        try:
            self.root_id = root_identity(self.tier_dir)
            self._metadata = open_index(self.metadata_path)
            self._fresh_index = self._metadata.current_epoch() == 0
            self.epoch = self._metadata.take_epoch(self.owner, above=self._newest_in_buckets())
            self._progress(f"epoch {self.epoch} taken by {self.owner}")
            for name in os.listdir(os.path.join(self.tier_dir, STAGING_DIR)):
                unlink_if_exists(os.path.join(self.tier_dir, STAGING_DIR, name))
        except BaseException:
            self.close()
            raise

    def _newest_in_buckets(self) -> int:
        """The newest epoch recorded in the storages of the root's tiered partitions that can be
        read now (a lost index must not make this daemon reuse an epoch); one that cannot is
        checked when first used (:meth:`_enter`)."""
        newest = 0
        try:
            partitions = self._partitions()
        except FileChannelError as exc:
            self._progress(f"cannot list the tiered partitions yet: {exc}")
            return 0
        for part in partitions:
            try:
                newest = max(newest, newest_epoch(self._storage(part.config)))
            except FileChannelError as exc:
                self._progress(f"{part.name}: cannot read the epochs of its storage now: {exc}")
        return newest

    def _enter(self, config: ChannelConfig) -> PrefixGuard:
        """This daemon's standing on the storage of ``config``: claimed and its epoch marked, once;
        the URL's layout of origins checked around the claim (:func:`.origins.enter_origin`)."""
        storage = self._storage(config)
        key = storage_key(config)
        guard = self._guards.get(key)
        if guard is None:
            url, options = tier_of(config)
            top = self._storages.get(top_url(url, self.origin), options)
            guard = PrefixGuard(storage, self.root_id, self.owner, self.epoch)
            enter_origin(top, self.origin, self.root_id, guard.enter)
            self._guards[key] = guard
            self._progress(f"{redact_url(storage.url)}: owned by this root, epoch {self.epoch} recorded there")
        return guard

    def _partitions(self) -> list[TieredChannel]:
        if self._channel is None:
            return tiered_partitions(self.root)
        config = ChannelConfig.from_kwargs(**{**self._channel.as_dict(), "maintenance_interval": 0})
        return [TieredChannel(self.root, os.path.basename(self.root), config)]

    def _sweep_orphans(self, part: TieredChannel, storage: ChunkStorage) -> None:
        """Delete objects of this channel written by an older epoch that nothing names: no chunk or
        manifest of a row, no merge in progress, no garbage waiting for its delay, no manifest in
        the bucket (:func:`.reindex.referenced_by_manifests`), and older than ``orphan_grace_ms``
        where the storage tells an object's age. The index is never the only reason to delete."""
        rows = self.metadata.segments(part.name, states=STATES)
        known = {c.name for r in rows for c in r.chunks} | {r.manifest for r in rows if r.manifest}
        known |= {manifest_name(part.name, r.base_offset, r.epoch) for r in rows}  # an upload's, before its manifest
        known |= set(self.metadata.garbage(part.name))
        known |= {n for m in self.metadata.merges(part.name) for n in (m.name, *m.sources)}
        listing = storage.list(part.name + "/")
        young = now_ms() - self.orphan_grace_ms
        candidates = []
        for info in listing:
            parsed = parse_object_name(info.name)
            if parsed is None or parsed.channel != part.name or parsed.epoch >= self.epoch or info.name in known:
                continue
            if info.modified_ms is not None and info.modified_ms > young:
                continue  # within the grace period: possibly another writer's, under way
            candidates.append(info.name)
        vouched = referenced_by_manifests(storage, listing, part.name, candidates) if candidates else set()
        orphans = [name for name in candidates if name not in vouched]
        if vouched:
            self._progress(f"{part.name}: {len(vouched)} object(s) the index lacks are named by manifests: kept")
        if orphans:
            delete_objects(storage, orphans)
            self._progress(f"{part.name}: deleted {len(orphans)} orphan object(s) of older epochs")

    def _copy_settings(self, part: TieredChannel, storage: ChunkStorage) -> None:
        """Write the topic's description beside its partitions in tier-2 (``<topic>/topic.json``, the
        local file's shape: name, partitions, settings), so the bucket describes itself: when it
        differs from what this epoch last wrote there (its first pass, then a change of settings
        or partitions: one PUT per change, none per pass; writes are atomic)."""
        topic = part.name.rpartition("/")[0]
        if topic:
            settings = {k: v for k, v in part.config.as_dict().items() if k in TOPIC_SETTINGS}
            meta = {"name": topic, "partitions": part.partitions, "config": settings}
            data = json.dumps(meta, sort_keys=True).encode()
            if self._described.get(topic) != data:
                storage.write(f"{topic}/{TOPIC_FILE}", data)
                self._described[topic] = data

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current partition (thread- and signal-safe)."""
        self._stop.set()

    def close(self) -> None:
        """Release the storages, the metadata and the lock (idempotent)."""
        self._storages.close()
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def metadata(self) -> TierMetadata:
        if self._metadata is None:
            raise TierError(f"the tiering daemon of {self.root} is not started (call start())")
        return self._metadata

    def _storage(self, config: ChannelConfig) -> ChunkStorage:
        return self._storages.get(*tier_of(config))

    # -- passes ------------------------------------------------------------------------------

    def run(self, once: bool = False) -> PassReport:
        """Pass over every tiered partition; with ``once`` return after one pass, else repeat
        every ``interval`` seconds until :meth:`stop`. Return the last pass's report.
        Raises :class:`FencedError` if another daemon took over."""
        while True:
            report = self.run_once()
            if once or self._stop.wait(self.interval):
                return report

    def run_once(self) -> PassReport:
        """One whole pass: compress, upload, local retention, total retention, per partition.

        A partition that fails (storage unreachable, damaged segment...) is reported and
        the pass goes on with the next; a :class:`FencedError` stops the pass at once.
        """
        report = PassReport()
        if self.metadata.replaced():  # moved aside or deleted under us: our commits would go nowhere
            self._progress(f"the tier index {self.metadata_path} was replaced; reopened, and brought up to the bucket")
            self.metadata.close()
            self._metadata = open_index(self.metadata_path)
            self._fresh_index = self._metadata.current_epoch() == 0
            self.epoch = self._metadata.take_epoch(self.owner, above=self._newest_in_buckets())
            self._guards.clear()
            self._swept.clear()
            self._described.clear()
            self._progress(f"epoch {self.epoch} taken by {self.owner}")
        # A daemon that was paused (SIGSTOP, a VM frozen) while another took over stops here,
        # whatever its pass would have done first: not every pass writes the index.
        check_fence(self.metadata, self.epoch)
        if self._channel is None:
            self._purge_deleted_topics(report)
        for part in self._partitions():
            if self._stop.is_set():
                break
            try:
                self._pass(part, report)
                self._last_errors.pop(part.name, None)
            except FencedError:
                raise
            except FileChannelError as exc:
                line = f"{part.name}: {exc}"
                report.failures.append(line)
                self._last_errors[part.name] = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {exc}"
                self._progress(f"FAILED {line}")
        write_status(self.tier_dir, self.epoch, self.owner, self._last_errors)
        return report

    def _purge_deleted_topics(self, report: PassReport) -> None:
        """Delete the tier-2 copies and metadata rows of every deleted tiered topic, then its marks (:mod:`.marks`).

        A storage that cannot be reached now is no failure of the pass: the deletion is done
        locally and its purge waits, one line each pass, for the storage to come back (the name
        stays reserved until then). A damaged mark is a failure: only the operator can mend it.
        """
        for topic in deleted_topics(self.tier_dir):
            try:
                config = read_mark(self.tier_dir, topic)
            except (ValueError, KeyError, TypeError) as exc:  # ConfigError too, a ValueError
                mark = os.path.join(self.tier_dir, DELETED_DIR, topic)
                line = f"{topic} (deleted): its mark {mark} is damaged ({exc}): restore it, or remove it to leave tier-2 as it is"
                report.failures.append(line)
                self._progress(f"FAILED {line}")
                continue
            if config is None:
                continue
            try:
                purge_topic(self.tier_dir, self._enter(config).storage, self.metadata, self.epoch, topic)
                self._progress(f"{topic}: deleted topic purged from tier-2")
            except FencedError:
                raise
            except FileChannelError as exc:
                self._progress(f"{topic} (deleted): its purge from tier-2 waits for the storage, tried again next pass: {exc}")

    def _pass(self, part: TieredChannel, report: PassReport) -> None:
        guard = self._enter(part.config)
        storage = guard.storage
        uploaded_before = report.uploaded
        deleted_before = report.deleted_remote
        log_ = Log(part.path, part.config)  # no tier context: the local listing only
        try:
            if self.roll_idle_ms is not None or part.config.tier_after_ms is not None:
                self._seal_idle(part, log_)
            with log_.maintenance_lock.holding():
                compression.finish_interrupted_compressions(log_)
                compression.compress_sealed(log_)
            self._finish_deletes(part, storage)
            for record in self.metadata.segments(part.name, states=(UPLOADING,)):
                abandon(storage, self.metadata, self.epoch, record)  # a dead epoch's, or this one's failed attempt
                self._progress(f"{part.name}: abandoned the upload of epoch {record.epoch} at offset {record.base_offset}")
            for line in clean_up(storage, self.metadata, self.epoch, part.name, now_ms()):
                self._progress(line)
            fresh = part.name not in self._swept
            if fresh:
                note = bring_up(storage, self.metadata, part.name, self.root_id, fresh=self._fresh_index)
                if note is not None:
                    self._progress(f"{part.name}: {note}")
                self._sweep_orphans(part, storage)
                self._swept.add(part.name)
            self._copy_settings(part, storage)
            try:
                self._upload(part, log_, storage, report, guard)
            except FencedError:
                raise
            except FileChannelError:
                # the storage failed: what is uploaded already may still leave the local disk
                self._local_retention(part, log_, report)
                raise
            self._local_retention(part, log_, report)
            self._total_retention(part, log_, storage, report)
            if fresh or report.uploaded != uploaded_before or report.deleted_remote != deleted_before:
                self._write_head(part, storage)
            if self.defrag is not None and report.uploaded == uploaded_before and not self._stop.is_set():
                merged = DefragReport()
                defrag_channel(
                    storage,
                    self.metadata,
                    self.epoch,
                    part.name,
                    self.defrag,
                    merged,
                    max_merges=self.max_merges,
                    stop=self._stop.is_set,
                    say=self._progress,
                    guard=guard.verify,
                )
                report.merges += merged.merges
        finally:
            log_.close()

    def _seal_idle(self, part: TieredChannel, log_: Log) -> None:
        """Seal the active segment if idle for ``roll_idle_ms`` or its first record is ``tier_after_ms`` old."""
        outcome, base, end = seal_idle(log_, self.roll_idle_ms, part.config.tier_after_ms)
        if outcome == SEALED:
            self._progress(f"{part.name}: sealed the idle active segment, offsets [{base}, {end})")
        elif outcome == AGED:
            self._progress(f"{part.name}: sealed the active segment, its first record tier_after_ms old, offsets [{base}, {end})")
        elif outcome == BUSY:
            self._progress(f"{part.name}: a writer is writing: its active segment is left to it")

    def _write_head(self, part: TieredChannel, storage: ChunkStorage) -> None:
        """Write the partition's head in tier-2 from the index (after its commits: see :mod:`.heads`)."""
        bounds = self.metadata.bounds(part.name)
        first, end = bounds if bounds is not None else (0, 0)
        write_head(storage, ChannelHead(part.name, first, end, self.epoch))

    def _upload(self, part: TieredChannel, log_: Log, storage: ChunkStorage, report: PassReport, guard: PrefixGuard) -> None:
        """Upload the partition's sealed segments not yet in tier-2, oldest first, while each is eligible.

        Segments overlap: the next one is begun and its chunks queued on the pass's pool (of
        ``tier_concurrency`` writers) while the previous ones' last chunks, manifests and
        commits finish, so the writes in flight do not drain at each segment's end. At most
        ``tier_concurrency`` segments are under way, and another is begun only while fewer
        than ``2 x tier_concurrency`` of their chunks are unwritten (each staged copy of a raw
        segment stays on disk until its upload is done). They are finished in offset order;
        when one fails, the later ones are abandoned and the error raised.
        """
        config = part.config
        refs = log_.list_segments()
        # only what the local segments overlap, never the whole history (no local segment: nothing to upload)
        uploaded = {r.base_offset for r in self.metadata.segments(part.name, from_offset=refs[0].base_offset)} if refs else set()
        point = read_recovery_point(os.path.join(part.path, RECOVERY_POINT_FILE))
        limiter = RateLimiter(config.tier_upload_bytes_per_s)
        window = config.tier_concurrency
        under_way: deque[tuple[SegmentUpload, ExitStack]] = deque()

        def finish_oldest() -> None:
            upload, staged = under_way.popleft()
            with staged:
                record = upload.finish()
            report.uploaded += 1
            report.uploaded_bytes += record.size
            self._progress(
                f"{part.name}: uploaded offsets [{record.base_offset}, {record.end_offset}) "
                f"({record.size} bytes, {len(record.chunks)} chunk(s)) to {redact_url(storage.url)}"
            )

        with ThreadPoolExecutor(window, thread_name_prefix="filechannel-upload") as pool:
            try:
                for ref, end in zip(refs[:-1], [r.base_offset for r in refs[1:]], strict=True):
                    if self._stop.is_set():
                        break
                    if ref.base_offset in uploaded or end == ref.base_offset:  # uploaded, or holds no record
                        continue
                    if not ref.compressed and (point is None or point.offset < end):
                        break  # not yet below the recovery point: later segments are not either
                    while under_way and (len(under_way) >= window or sum(u.chunks_left for u, _ in under_way) >= 2 * window):
                        finish_oldest()
                    with ExitStack() as staged:
                        segment = staged.enter_context(self._staged(part, log_, ref))
                        if segment is None:  # collected or compressed under us: next pass
                            break
                        if config.tier_after_ms is not None and not self._due(segment, config.tier_after_ms):
                            break  # its first record is not old enough, and later segments are newer
                        upload = start_upload(
                            storage,
                            self.metadata,
                            self.epoch,
                            part.name,
                            segment,
                            chunk_bytes=config.tier_chunk_bytes,
                            pool=pool,
                            limiter=limiter,
                            guard=guard.verify,
                        )
                        under_way.append((upload, staged.pop_all()))
                while under_way:
                    finish_oldest()
            finally:
                while under_way:  # an upload failed (or was interrupted): the later ones are undone
                    upload, staged = under_way.popleft()
                    with staged:
                        upload.abandon()

    @staticmethod
    def _due(segment: SegmentToUpload, after_ms: int) -> bool:
        """Whether the first record of a sealed segment is ``after_ms`` old (``tier_after_ms``)."""
        first = retention.segment_first_timestamp(SegmentRef(segment.base_offset, True, segment.path))
        return first is None or first <= now_ms() - after_ms

    @contextmanager
    def _staged(self, part: TieredChannel, log_: Log, ref: SegmentRef) -> Iterator[SegmentToUpload | None]:
        """The ``.seg.z`` form of a sealed segment: its own file, or a staged copy of a raw one."""
        if ref.compressed:
            try:
                info = log_.compressed_info(ref)
            except FileChannelError:
                if not os.path.exists(ref.path):
                    yield None
                    return
                raise
            yield SegmentToUpload.of(ref.path, info)
            return
        staged = os.path.join(self.tier_dir, STAGING_DIR, f"{part.name.replace('/', '.')}.{ref.base_offset}.seg.z")
        try:
            info = compress_segment(
                ref.path,
                staged,
                level=STAGING_LEVEL,
                block_bytes=part.config.compression_block_bytes,
                max_payload=MAX_FRAME_PAYLOAD,
            )
            yield SegmentToUpload.of(staged, info)
        finally:
            unlink_if_exists(staged)

    def _local_retention(self, part: TieredChannel, log_: Log, report: PassReport) -> None:
        config = part.config
        if config.local_retention_bytes is None and config.local_retention_ms is None:
            return
        with log_.maintenance_lock.holding():
            refs = log_.list_segments()
            if not refs:
                return
            uploaded = {
                r.base_offset for r in self.metadata.segments(part.name, states=(UPLOADED,), from_offset=refs[0].base_offset)
            }
            ends = [r.base_offset for r in refs[1:]]
            sizes = [retention.segment_bytes_on_disk(r) for r in refs]
            n = 0  # the sealed segments that may go: never past one that exists only here (not uploaded, not empty)
            while n < len(ends) and (refs[n].base_offset in uploaded or ends[n] == refs[n].base_offset):
                n += 1
            k = retention.past_retention(
                sizes[:n],
                sum(sizes),
                lambda i: retention.segment_max_timestamp(log_, refs[i], ends[i]),
                config.local_retention_bytes,
                config.local_retention_ms,
            )
            if k:
                deleted = retention.delete_sealed_prefix(log_, ends[k - 1])
                report.deleted_local += len(deleted)
                self._progress(f"{part.name}: deleted {len(deleted)} uploaded local segment(s) below offset {ends[k - 1]}")

    def _total_retention(self, part: TieredChannel, log_: Log, storage: ChunkStorage, report: PassReport) -> None:
        config = part.config
        start = read_log_start(part.path)  # below it, records were deleted (delete_records): their copies go too
        if config.retention_bytes is None and config.retention_ms is None and start == 0:
            return
        # The log across both tiers, oldest first: uploaded (or lost) segments, their tier-2 size
        # from the totals the index keeps, then the local segments past them, their local size.
        # Only the oldest segments are read, a page at a time, until one retention keeps: a
        # pass costs what it deletes, not the history. The active segment is never deleted.
        local = log_.local_segments()
        active = local[-1].base_offset if local else None
        remote_bytes = sum(summary.bytes[state] for summary in self.metadata.summary(part.name) for state in LISTED)
        remote_end = (self.metadata.bounds(part.name) or (0, 0))[1]
        total = remote_bytes + sum(retention.segment_bytes_on_disk(r) for r in local if r.base_offset >= remote_end)
        doomed: list[SegmentRecord] = []
        page = self.metadata.segments(part.name, limit=_RETENTION_PAGE)
        while page:
            sealed = list(itertools.takewhile(lambda r: r.base_offset != active, page))
            timestamps = [r.max_timestamp for r in sealed]
            k = retention.past_retention(
                [r.size for r in sealed], total, timestamps.__getitem__, config.retention_bytes, config.retention_ms
            )
            k = max(k, sum(1 for _ in itertools.takewhile(lambda r: r.end_offset <= start, sealed)))
            doomed += sealed[:k]
            if k < len(page):
                break
            total -= sum(r.size for r in sealed)
            page = self.metadata.segments(part.name, from_offset=page[-1].base_offset + 1, limit=_RETENTION_PAGE)
        if not doomed:
            return
        upto = doomed[-1].end_offset
        with log_.maintenance_lock.holding():
            deleted = retention.delete_sealed_prefix(log_, upto)
        report.deleted_local += len(deleted)
        for record in doomed:
            self.metadata.begin_delete(self.epoch, part.name, record.base_offset)
            finish_delete(storage, self.metadata, self.epoch, part.name, record)
            report.deleted_remote += 1
        self._progress(f"{part.name}: total retention deleted {len(doomed)} segment(s) below offset {upto} from tier-2")

    def _finish_deletes(self, part: TieredChannel, storage: ChunkStorage) -> None:
        for record in self.metadata.segments(part.name, states=(DELETING,)):
            finish_delete(storage, self.metadata, self.epoch, part.name, record)
