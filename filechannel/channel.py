"""FileChannel: a durable, segmented log of byte records in one folder.

Opening a channel reads it: it takes no writer lock and changes no segment, so a reader
never waits behind a busy writer nor repairs what it only wanted to read. A writer
recovers the log (checks it, trims a torn tail) when it first takes ``writer.lock``,
before its first append. Opening only creates the first segment of an empty folder, and,
under the maintenance lock if it is free, finishes or rolls back interrupted
compressions. Any number of processes may open the same folder at once, to send,
receive, or both.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Self, Unpack

from .config import ChannelConfig, ChannelSettings
from .engine import cleaner, compression, recovery, retention, roll, time_search, verify
from .engine.appender import Appender
from .engine.files import folder_bytes
from .engine.log import Log
from .engine.log_start import advance_log_start
from .engine.names import validate_name
from .engine.position import PositionStore
from .engine.verify import DamagedRange, Progress
from .engine.wakeup import Wakeup
from .errors import (
    ChannelClosedError,
    ConfigError,
    FileChannelError,
    OffsetOutOfRangeError,
    ReadOnlyError,
    os_errors,
)
from .receiver import AckReceiver, Receiver
from .root import TOPIC_SETTINGS, effective_settings
from .sender import Sender

if TYPE_CHECKING:  # imported lazily at run time, only when the config has a tier
    from .tiering.bindings import StorageClients
    from .tiering.context import TierContext

log = logging.getLogger("filechannel")

# Settings an open channel takes when they change at its source (see FileChannel.apply_settings).
_LIVE_SETTINGS = frozenset(
    {
        "retention_bytes",
        "retention_ms",
        "segment_bytes",
        "segment_ms",
        "delete_retention_ms",
        "min_cleanable_dirty_ratio",
        "min_compaction_lag_ms",
        "max_compaction_lag_ms",
    }
)
# Settings only the tiering daemon uses, which it reads again at each pass.
_DAEMON_SETTINGS = frozenset(
    {"local_retention_bytes", "local_retention_ms", "tier_after_ms", "tier_upload_bytes_per_s", "tier_chunk_bytes"}
)


# How much lower than its process the maintenance thread runs (a nice value: 0 to 19 higher).
MAINTENANCE_NICE = 19


def _lower_thread_priority(by: int) -> None:
    """Lower the calling thread's CPU priority by ``by`` nice levels (Linux, where the nice
    value is per thread), as RocksDB runs its compaction threads.

    The maintenance thread compresses sealed segments: zstd over 64 MiB and a CRC check
    of every frame each, CPU the senders and receivers of the process (and everything else
    on the machine) want at the same moments, on a machine of two CPUs. At nice 19 it
    takes what is idle and waits while they run. Not ``SCHED_IDLE``, though it let an
    appender's writer thread run there at once: the thread holds the GIL between its C
    calls, and preempted for seconds on a busy machine while holding it, it would hold up
    every other thread of the process. A system that
    refuses (another OS, a sandbox) leaves the priority as it was: maintenance still runs,
    at normal priority.
    """
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))
    except OSError:
        pass


class FileChannel:
    """A channel: senders append records, receivers read them from any offset.

    ``path`` is the channel's folder (created if missing, with the user's umask); its last
    component is the channel's name and must match ``[A-Za-z0-9._-]+``. Keyword
    arguments are the settings of :class:`~filechannel.config.ChannelConfig`, typed as
    :class:`~filechannel.config.ChannelSettings` (a type checker reports a misspelt one). Use it as a
    context manager, or call :meth:`close`, which flushes what senders have buffered.

    ``wakeup`` lets several channels share one :class:`~filechannel.engine.wakeup.Wakeup`, so a
    reader of many channels (a consumer of many partitions) can wait on all at once; the
    caller then closes it.

    ``read_only=True`` opens an existing folder without changing any file: no recovery, no
    clean-up of what a dead process left, no maintenance thread, indexes that disagree with
    their frames rebuilt in memory only; receivers and :meth:`check` work, senders, ack
    receivers, compression, garbage collection and repair raise :class:`ReadOnlyError` (a
    :class:`ConfigError`), whose message ends with ``read_only_because`` when given (which
    implies ``read_only``: the partitions of a replica root say so).
    Opening never takes the writer lock either way: only a writer recovers the log.

    With ``tier`` set in the config, the channel has a tier-2 (see DESIGN.md "Tier-2"):
    ``tier_metadata`` is the metadata store's path (default ``CHANNEL/tier/metadata.db``)
    and ``tier_name`` the channel's name in tier-2 (default the folder's name); the client
    passes ``ROOT/.tier/metadata.db`` and ``TOPIC/PARTITION``. Only the tiering daemon
    uploads and deletes; this channel's maintenance only compresses.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        wakeup: Wakeup | None = None,
        read_only: bool = False,
        read_only_because: str | None = None,
        tier_metadata: str | None = None,
        tier_name: str | None = None,
        tier_context: TierContext | None = None,
        tier_storages: StorageClients | None = None,
        settings_source: Callable[[], Mapping[str, Any]] | None = None,
        **config: Unpack[ChannelSettings],
    ) -> None:
        """``settings_source``: where the channel's stored settings can be read again (a topic's
        ``topic.json``); the maintenance thread asks it at each pass and applies what changed
        (:meth:`apply_settings`). None: the settings stay those given here. ``tier_context``:
        the channel's tier-2 made by the caller (a bucket reader's, which follows the bucket
        with no root), instead of the one ``tier`` and ``tier_metadata`` make; the channel closes it.
        ``tier_storages``: storage clients the caller shares across channels and closes (the tier
        context made here takes its client from them: see :class:`~filechannel.tiering.context.TierContext`)."""
        raw = os.fspath(path).rstrip(os.sep)
        validate_name(os.path.basename(raw), "channel name (the folder's last component)")
        self.path = os.path.abspath(raw)
        self.config = ChannelConfig.from_kwargs(**config)
        self.read_only = bool(read_only) or read_only_because is not None
        self._read_only_because = read_only_because
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ConfigError(f"channel path {self.path!r} exists and is not a folder")
        if self.read_only:
            if not os.path.isdir(self.path):
                raise ConfigError(f"channel folder {self.path!r} does not exist (opened read-only, so it is not created)")
        else:
            with os_errors("create channel folder", self.path):
                os.makedirs(self.path, exist_ok=True)
        self._tier: TierContext | None = tier_context
        if tier_context is None and self.config.tier is not None:
            # FileChannel composes the layers: the engine below it never imports tiering.
            from .tiering.context import tier_context_for

            self._tier = tier_context_for(self.path, self.config, tier_metadata, tier_name, tier_storages)
        self._log = Log(self.path, self.config, tier=self._tier, read_only=self.read_only)
        self._own_wakeup = wakeup is None
        self._wakeup = Wakeup(self.path) if wakeup is None else wakeup
        self._wakeup.add_folder(self.path)
        self.positions = PositionStore(self.path)
        self._closed = False
        self._mutex = threading.Lock()
        self._appender: Appender | None = None
        self._receivers: weakref.WeakSet[Receiver] = weakref.WeakSet()
        self._maintenance_wake = threading.Event()
        self._settings_source = settings_source
        self._not_applied: dict[str, Any] = {}  # settings changed at the source that wait for a reopen (said once)
        self._maintenance: threading.Thread | None = None
        if self.read_only:  # change nothing: no first segment, no clean-up, no maintenance
            return
        if not self._log.local_segments():
            with self._log.writer_lock.holding():
                roll.create_first_segment(self._log)
        self.positions.remove_stale_temp_files()
        if self._log.maintenance_lock.acquire(blocking=False):
            try:
                compression.finish_interrupted_compressions(self._log)
            finally:
                self._log.maintenance_lock.release()
        if self.config.maintenance_interval > 0:
            self._maintenance = threading.Thread(target=self._maintenance_loop, name="filechannel-maintenance", daemon=True)
            self._maintenance.start()

    # -- endpoints -------------------------------------------------------------------------

    def sender(self) -> Sender:
        """A sender. All senders of this channel object share one buffer and flusher."""
        self._check_writable()
        with self._mutex:
            if self._appender is None:
                self._appender = Appender(self._log, self.config, self._wakeup.bump, self._maintenance_wake.set)
            return Sender(self, self._appender)

    def receiver(self, start: str | int = "earliest") -> Receiver:
        """A receiver starting at ``"earliest"``, ``"latest"`` (the end now) or an offset."""
        self._check_open()
        rx = Receiver(self, self._log, self._wakeup, self._resolve_start(start))
        self._receivers.add(rx)
        return rx

    def ack_receiver(self, name: str) -> AckReceiver:
        """An ack receiver named ``name``: resumes at its first unacknowledged record."""
        self._check_writable()
        rx = AckReceiver(self, self._log, self._wakeup, name, self._maintenance_wake.set)
        self._receivers.add(rx)
        return rx

    def _resolve_start(self, start: str | int) -> int:
        if start == "earliest":
            return self.first_offset
        if start == "latest":
            return self.end_offset
        if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
            return start
        raise ConfigError(f"start must be 'earliest', 'latest' or an offset >= 0, not {start!r}")

    # -- offsets ---------------------------------------------------------------------------

    @property
    def first_offset(self) -> int:
        """The first offset still retained."""
        return self._log.first_offset

    @property
    def end_offset(self) -> int:
        """One past the last record written to the files (what receivers can read now)."""
        return self._log.end_offset()

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """The first offset whose record has a timestamp >= ``timestamp_ms``; None if none yet.

        Uses the time indexes: a bisect per segment and a short scan, never a full scan.
        A segment compressed or collected while it is looked at is normal on a live
        channel: the folder is listed again and the search goes on with the ``.seg.z`` that
        replaced it, or past what garbage collection deleted. A timestamp that is not an
        int of 64 bits raises :class:`~filechannel.errors.RecordTypeError`.
        """
        return time_search.offset_for_time(self._log, timestamp_ms)

    def record_count(self) -> int:
        """The records held now, in either tier: ``end_offset - first_offset`` less the offsets
        the cleaner removed (a compacted channel's holes). See :meth:`Log.record_count`."""
        return self._log.record_count()

    @property
    def size_bytes(self) -> int:
        """Bytes on disk of the channel's files."""
        return folder_bytes(self.path)

    # -- maintenance -----------------------------------------------------------------------

    def compress_sealed(self) -> list[int]:
        """Compress every sealed raw segment now; return their base offsets."""
        self._check_writable()
        with self._log.maintenance_lock.holding():
            return compression.compress_sealed(self._log)

    def compact(self) -> list[int]:
        """Run one pass of the cleaner of a compacted channel now (``cleanup_policy`` "compact" or
        "compact,delete"), whatever the dirty ratio; return the base offsets of the segments it
        rewrote. Keeps the last record of each key in the sealed segments (README, "Compacted
        topics"); a channel that is not compacted is left as it is ([])."""
        self._check_writable()
        with self._log.maintenance_lock.holding():
            return [c.base_offset for c in cleaner.clean(self._log, force=True)]

    def collect_garbage(self) -> list[int]:
        """Delete the sealed segments that every durable position and retention allow."""
        self._check_writable()
        with self._log.maintenance_lock.holding():
            return retention.collect_garbage(self._log, self.positions.minimum())

    def delete_records(self, before: int) -> int:
        """Delete the records below offset ``before`` (Kafka's ``delete_records``); return the new
        first offset. ``before`` may lie inside a segment: the log start offset is kept on disk
        (:mod:`.engine.log_start`) and reads below it are out of range at once, in this process
        and every other; the whole segments below it are deleted now (without a tier; with one,
        the tiering daemon deletes). ``before`` at most the end offset; the start never moves back.
        """
        self._check_writable()
        end = self.end_offset
        if isinstance(before, bool) or not isinstance(before, int) or not 0 <= before <= end:
            raise OffsetOutOfRangeError(
                f"cannot delete the records before {before!r} of channel {self.path!r}: offsets run to {end}"
            )
        with self._log.maintenance_lock.holding():
            advance_log_start(self.path, before)
            retention.collect_garbage(self._log, self.positions.minimum())
        return self.first_offset

    def repair(self, after_offset: int) -> None:
        """Cut the log after ``after_offset``: keep every record up to it, delete every later one.

        The answer to :class:`~filechannel.errors.LogCorruptedError` (damage in the middle
        of the log, which recovery never cuts by itself): the operator picks the last offset
        to keep, usually the one before the damage. What this channel's senders buffered is
        written first; call it while no thread is sending. Takes ``writer.lock`` (waits for
        writers in other processes); senders go on after it from the new end. Raises
        :class:`OffsetOutOfRangeError` for an offset the valid frames do not reach.
        """
        self._check_writable()
        if isinstance(after_offset, bool) or not isinstance(after_offset, int):
            raise ConfigError(f"after_offset must be an int, not {after_offset!r}")
        if self._appender is not None:
            self._appender.drain(sync=False)  # releases writer.lock once nothing is buffered
        with self._log.writer_lock.holding():
            recovery.repair(self._log, after_offset)
        self._wakeup.bump()

    def apply_settings(self, settings: Mapping[str, Any]) -> list[str]:
        """Apply stored settings (a topic's: its ``topic.json``, those missing at their defaults)
        to this open channel; return the names of those that changed and wait for a reopen.

        Applied at once: ``retention_bytes`` and ``retention_ms`` (at the next garbage
        collection), the cleaner's ``delete_retention_ms``, ``min_cleanable_dirty_ratio``,
        ``min_compaction_lag_ms`` and ``max_compaction_lag_ms`` (its next pass), ``segment_bytes``
        and ``segment_ms`` (the writer's next roll). The tiering daemon reads the settings it
        uses itself at each pass. The others (the codec, fsync, record and index sizes, tier-2
        reads, the cleanup policy) are fixed for an open channel: one log line
        names them, once, and a process that opens the channel again gets them.
        """
        stored = effective_settings({k: v for k, v in settings.items() if k in TOPIC_SETTINGS})
        current = self.config.as_dict()
        changed = {k: v for k, v in stored.items() if current[k] != v}
        live = {k: v for k, v in changed.items() if k in _LIVE_SETTINGS}
        if live:
            self.config = dataclasses.replace(self.config, **live)
            self._log.config = self.config
            if self._appender is not None:
                self._appender.resize(self.config)
            log.info("channel %s: applied %s", self.path, ", ".join(f"{k}={v!r}" for k, v in sorted(live.items())))
        waiting = {k: v for k, v in changed.items() if k not in _LIVE_SETTINGS and k not in _DAEMON_SETTINGS}
        if waiting and waiting != self._not_applied:
            log.warning(
                "channel %s: %s changed; an open channel keeps the old value(s): they apply when it is opened again",
                self.path,
                ", ".join(f"{k}={v!r}" for k, v in sorted(waiting.items())),
            )
        self._not_applied = waiting
        return sorted(waiting)

    def _reload_settings(self) -> None:
        """The maintenance thread's look at the settings source (a missing or damaged topic
        changes nothing: the channel goes on with what it has)."""
        if self._settings_source is None:
            return
        try:
            self.apply_settings(self._settings_source())
        except FileChannelError as exc:
            log.debug("channel %s: settings not re-read: %s", self.path, exc)

    def _maintenance_loop(self) -> None:
        _lower_thread_priority(MAINTENANCE_NICE)
        while not self._closed:
            self._maintenance_wake.wait(self.config.maintenance_interval)
            self._maintenance_wake.clear()
            if self._closed:
                return
            try:
                self._reload_settings()
            except Exception:
                log.exception("channel %s: applying changed settings failed", self.path)
            if not self._log.maintenance_lock.acquire(blocking=False):
                continue
            try:
                cleaner.clean(self._log)
                compression.compress_sealed(self._log)
                retention.collect_garbage(self._log, self.positions.minimum())
            except Exception:
                log.exception("channel %s: background maintenance failed", self.path)
            finally:
                self._log.maintenance_lock.release()

    # -- integrity -------------------------------------------------------------------------

    def check(self, progress: Progress | None = None, on_damage: Callable[[DamagedRange], None] | None = None) -> int:
        """Verify the CRC of every record in every segment; return how many there are.

        With ``on_damage``, damage is reported instead of raised and the check goes on: each
        range of offsets that cannot be read (a bad frame to the end of its raw segment,
        whose later offsets are unknown; a bad compressed block; a missing segment; a bad
        header) is passed as a :class:`DamagedRange` with the first readable offset after it,
        and the count is of the records that can be read.

        Raises :class:`CorruptRecordError` naming the file, byte and offset of the first bad
        record (in the active segment too: a bad or partial last frame followed by a valid
        frame is corruption, not a torn tail), and :class:`MissingSegmentError` naming the
        missing offsets when a segment does not begin where the one before it ended.
        Modifies no file. Segments compressed or collected while it runs are normal on a
        live channel: it checks the ``.seg.z`` that replaced a ``.seg``, and skips what
        garbage collection or tier-2 retention deleted. Segments only in tier-2 are read
        from there: damage names the object, its bytes and the offsets. ``progress(done_bytes, total_bytes)`` is called as
        segments are read.
        """
        self._check_open()
        return verify.check_log(self._log, progress, on_damage)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"the channel {self.path!r} is closed")

    def _check_writable(self) -> None:
        """Open, and not opened with ``read_only=True`` (which never changes a file)."""
        self._check_open()
        if self._read_only_because is not None:
            raise ReadOnlyError(f"the channel {self.path!r} is read-only: {self._read_only_because}")
        if self.read_only:
            raise ReadOnlyError(
                f"the channel {self.path!r} was opened with read_only=True: sending, acking, compressing, "
                "collecting and repairing change files; open it without read_only for those"
            )

    def close(self) -> None:
        """Flush buffered records, stop background work, release files. Idempotent."""
        if self._closed:
            return
        try:
            if self._appender is not None:
                self._appender.close()
        finally:
            self._closed = True
            self._maintenance_wake.set()
            if self._maintenance is not None:
                self._maintenance.join()
            for rx in list(self._receivers):
                rx.close()
            if self._own_wakeup:
                self._wakeup.close()
            self._log.close()
            if self._tier is not None:
                self._tier.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FileChannel({self.path!r}{', closed' if self._closed else ''})"
