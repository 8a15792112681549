"""The appender: the one buffered writer per open channel that every sender feeds.

How an append works:

1. The first record of a buffer takes ``writer.lock`` (flock) and reads the writer
   state, so this process knows the next offset. While the lock is held no other
   process can append, so offsets assigned to buffered records stay valid.
2. Records are encoded straight into the buffer (a list of byte strings); index
   index entries are encoded every ``index_interval_bytes``.
3. A *drain* writes the buffer with one ``write`` (plus the index entries and the new
   writer state) and, by policy, ``fsync``. When nothing is left buffered it releases
   the lock, unless a sender drained its own records: that thread is sending, so the
   lock is kept, and the flusher releases it once nothing has been buffered for
   ``flush_interval``. The background flusher drains at most once per ``flush_interval``: a record
   that finds it idle is written at once, and under load each write carries everything
   sent since the previous one. A sender that finds a record waiting longer than
   ``flush_interval`` drains itself (a busy sender thread may keep the flusher from
   the GIL). A full buffer, ``flush()``, and ``fsync="always"`` senders drain at once.
   A sender's own drain is *written behind* (with the C extension): the writer thread
   writes it without the GIL while the sender goes on buffering (``_write_behind``). Under ``fsync="interval"``
   the flusher fsyncs after its drain, not inside it (``_sync_interval``), so no sender
   waits for that fsync.
4. Group commit: a drain is done by one leader at a time. Senders that need their
   records durable wait for a drain that covers them; records buffered while the
   leader writes go into the next drain, so concurrent senders share fsyncs.
5. A process holds the lock for at most ``hold_limit`` seconds at a stretch, then
   drains and lets other processes in.

If a write fails (a full disk), the segment is cut back to its last whole record, the
appender is marked failed and every later call raises :class:`SenderFailedError`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple, NoReturn

from ..config import ChannelConfig
from ..errors import ChannelClosedError, FileChannelError, InvalidRecordError, SenderFailedError, os_errors, storage_error
from .checksum import crc32c
from .clock import now_ms, wall_ns
from .files import write_limits, write_pieces
from .log import Log
from .names import OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX
from .record import (
    FRAME_AND_PREFIX,
    FRAME_HEADER_SIZE,
    OFFSET_ENTRY,
    RECORD_PREFIX,
    RECORD_PREFIX_SIZE,
    TIME_ENTRY,
    Headers,
    checked_timestamp,
    encode_record_frames,
    encode_value_frames,
    too_large,
)
from .recovery import current_state
from .roll import roll
from .sealer import Sealer
from .writer_state import WriterState, write_state

if TYPE_CHECKING:  # typed as built; the fallback base, object, adds nothing the class does not set itself
    from ._codec import AppendCore as _Core
    from ._codec import Mutex as _Mutex
    from ._codec import WriteBehind as _WriteBehindType

    _WriteBehind: type[_WriteBehindType] | None
else:
    try:  # Appender.append's common case in C (filechannel/engine/_codec.c), when it was built and loads
        from ._codec import AppendCore as _Core
        from ._codec import Mutex as _Mutex  # a threading.Lock the C path takes without a Python call
        from ._codec import WriteBehind as _WriteBehind  # a sender's drains written by another thread
    except ImportError:
        _Core = object
        _Mutex = threading.Lock
        _WriteBehind = None

log = logging.getLogger("filechannel")
# Durations (the hold limit, flush deadlines, segment age checks) are measured on the
# monotonic clock, which the C path reads too (CLOCK_MONOTONIC): with the wall clock, a step
# back kept writer.lock held far past the hold limit. Wall-clock time is only a record's
# timestamp and a segment's ``created``. A send reads one clock: the monotonic one, and its
# timestamp is that plus ``_wall_offset_ns``, the wall clock's lead taken whenever the writer
# lock is taken (see Appender._append). A second clock read per send was measurable on the
# hot path (DESIGN.md, "Appending and locking").
# The clocks are bound here, a global read per use on the append path; the wall clock is
# the one of .clock, whose now_ms stamps what the Python path stamps.
_monotonic = time.monotonic
_monotonic_ns = time.monotonic_ns
_wall_ns = wall_ns
_FRAME_AND_PREFIX = FRAME_AND_PREFIX.pack


class _Drain(NamedTuple):
    """One drain in flight (``Appender._flushing``): the buffer it took and where it goes."""

    batch: list[bytes]  # the records' frames (empty: a drain that only fsyncs)
    entries: list[tuple[bytes, bytes]]  # their index entries
    nbytes: int
    snapshot: WriterState | None  # the writer state once they are written (None: nothing taken)
    start_size: int  # the active segment's size before them, where a failed write is cut back to
    end: int  # the offset after the last record written once this drain ends
    seg_fd: int  # the active segment (no roll while a drain is in flight)
    seg_base: int


class Appender(_Core):
    """Buffered, lock-holding writer of one channel (see the module docstring). Thread-safe.

    With the C extension, ``append`` is ``AppendCore.append``: the common case (a plain
    value into a non-empty buffer, nothing due) in C, everything else through ``_append_stamped``.
    """

    def __init__(self, log_: Log, config: ChannelConfig, on_write: Callable[[], None], on_roll: Callable[[], None]) -> None:
        self._log = log_
        self._config = config
        self._on_write = on_write
        self._on_roll = on_roll
        self._lock = log_.writer_lock
        self._mutex = _Mutex()
        self._cond = threading.Condition(self._mutex)
        # The flusher sleeps on its own condition, woken only when records wait for it (and
        # on close). Woken by every drain's notify_all, it found nothing to do and cost a
        # GIL handoff each time (a futex call per record of a 64 KiB send_many, DESIGN.md,
        # "Appending and locking").
        self._flush_wanted = threading.Condition(self._mutex)
        self._behind: _WriteBehindType | None = None  # the writer thread's, made at a sender's first drain
        self._behind_thread: threading.Thread | None = None
        self._behind_drain: _Drain | None = None  # the drain submitted to it, until it ends
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._index: list[tuple[bytes, bytes]] = []  # index entries to append: (.idx, .tix) bytes
        self._state: WriterState | None = None  # valid while the lock is held
        self._hold_limit = max(0.01, 2 * config.flush_interval)
        self._hold_until = 0.0
        self._check_at = 0.0
        self._roll_bytes = config.segment_bytes
        self._max_payload = config.max_record_bytes
        self._index_interval = config.index_interval_bytes
        self._buffer_bytes = config.buffer_bytes
        self._always = config.fsync == "always"
        self._flush_interval = config.flush_interval
        self._flush_due = float("inf")  # a sender drains itself once a record waited this long
        self._prefix_ts = 0  # a timestamp and the CRC-32C of its plain record prefix
        self._prefix_crc = crc32c(RECORD_PREFIX.pack(0, 0))
        self._wall_offset_ns = 0  # the wall clock minus the monotonic one, in ns (see _append)
        self._written_offset = 0
        self._durable_offset = 0
        self._interval_synced = 0  # the end of what the flusher's last interval fsync covered
        self._flushing = False
        self._kept_at: float | None = None  # when a sender's drain kept writer.lock, nothing buffered
        self._sync_waiters = 0  # threads waiting in a sync drain for the fsync in flight
        self._failed: BaseException | None = None
        self._closed = False
        self._seg_fd = -1
        self._idx_fd = -1
        self._tix_fd = -1
        self._seg_base = -1
        self._last_fsync = time.monotonic()
        self._last_drain = float("-inf")  # not 0.0: the monotonic clock may be younger than an interval
        self._sealer = Sealer(log_)
        if config.compacted:  # every record needs a key: the key-less short paths refuse
            self.append = self._append_keyed  # type: ignore[method-assign]
            self.append_stamped = self._refuse_keyless  # type: ignore[method-assign,assignment]
            self.append_values = self._refuse_keyless  # type: ignore[method-assign,assignment]
        self._flusher: threading.Thread | None = None
        if config.fsync != "always":
            self._flusher = threading.Thread(target=self._flush_loop, name="filechannel-flusher", daemon=True)
            self._flusher.start()

    # -- appending ---------------------------------------------------------------------------

    def resize(self, config: ChannelConfig) -> None:
        """Roll by ``config``'s ``segment_bytes`` and ``segment_ms`` from now on (the other
        settings stay those this appender was made with: its buffer, codec and fsync)."""
        with self._mutex:
            self._config = dataclasses.replace(self._config, segment_bytes=config.segment_bytes, segment_ms=config.segment_ms)
            self._roll_bytes = config.segment_bytes

    def _append(
        self, value: bytes | None, *, key: bytes | None = None, headers: Headers | None = None, timestamp: int | None = None
    ) -> int:
        """Buffer one record; return its offset. The per-message hot path: keep it lean.

        ``Sender.send`` is ``append`` (bound per sender), so mind its signature. The C
        ``AppendCore.append`` does the same for its common case, and calls
        ``_append_stamped`` otherwise (this is the Python build's ``append``).
        """
        return self._append_stamped(value, key=key, headers=headers, timestamp=timestamp)[0]

    def _append_stamped(
        self, value: bytes | None, *, key: bytes | None = None, headers: Headers | None = None, timestamp: int | None = None
    ) -> tuple[int, int]:
        """Buffer one record; return its offset and timestamp (``append_stamped``'s Python path).

        The record is checked (and, unless plain, encoded) before the mutex and the writer
        lock are taken, so a rejected record holds neither.
        """
        mono = _monotonic_ns()
        now = mono / 1e9
        if timestamp is None:
            if self._state is None:  # about to take the lock: the wall clock's lead afresh
                self._wall_offset_ns = _wall_ns() - mono
            ts = (mono + self._wall_offset_ns) // 1_000_000
        else:
            ts = checked_timestamp(timestamp)
        frames: list[bytes] | None = None
        if key is None and headers is None and type(value) is bytes:
            plain = value  # (a bytes value: the type checker's name for it in the frames-is-None branch below)
            n = len(value) + RECORD_PREFIX_SIZE
            if n > self._max_payload:
                raise too_large(n, self._max_payload)
            size = n + FRAME_HEADER_SIZE
        else:
            frames = []
            size = encode_record_frames(frames, value, key, headers, ts, self._max_payload)
        with self._mutex:
            state = self._state
            if state is None or now >= self._check_at or state.segment_size + self._pending_bytes >= self._roll_bytes:
                state = self._ready_state()
            pending = self._pending
            pos = state.segment_size + self._pending_bytes
            if frames is None:
                if ts != self._prefix_ts:
                    self._prefix_ts, self._prefix_crc = ts, crc32c(RECORD_PREFIX.pack(0, ts))
                pending.append(_FRAME_AND_PREFIX(n, crc32c(plain, self._prefix_crc), 0, ts))
                pending.append(plain)
            else:
                pending += frames
            offset = state.end_offset
            if state.since_index >= self._index_interval:
                rel = offset - state.segment_base
                self._index.append((OFFSET_ENTRY.pack(rel, pos), TIME_ENTRY.pack(state.max_timestamp, rel)))
                state.since_index = size
            else:
                state.since_index += size
            if ts > state.max_timestamp:
                state.max_timestamp = ts
            state.end_offset = offset + 1
            self._pending_bytes += size
            if len(pending) == 2:
                self._flush_due = now + self._flush_interval
                if self._pending_bytes < self._buffer_bytes:  # else this call writes it
                    self._flush_wanted.notify()
            if self._pending_bytes < self._buffer_bytes and not self._always and (now < self._flush_due or self._flushing):
                # Due but a drain is in flight: the next drain (a later send's, or the flusher's)
                # writes this record. Waiting for the one in flight to lead another made every
                # sender thread queue behind the others (8 threads sent far less than one).
                return offset, ts
        self._after_append(offset, True)
        return offset, ts

    if _Core is object:
        append = _append

        def append_stamped(self, value: bytes) -> tuple[int, int]:
            """Buffer one key-less, header-less record stamped now; return its offset and timestamp."""
            return self._append_stamped(value)

    def _append_keyed(
        self, value: bytes | None, *, key: bytes | None = None, headers: Headers | None = None, timestamp: int | None = None
    ) -> int:
        """``append`` of a compacted channel: a record without a key is refused (the cleaner
        keeps the last record of each key, so a key-less record has no meaning there)."""
        if key is None:
            self._refuse_keyless()
        return self._append_stamped(value, key=key, headers=headers, timestamp=timestamp)[0]

    def _refuse_keyless(self, *_args: object) -> NoReturn:
        raise InvalidRecordError(
            f"channel {self._log.path!r} is compacted (cleanup_policy={self._config.cleanup_policy!r}): "
            "every record needs a key; send it with key=..."
        )

    def append_values(self, values: Iterable[bytes], timestamp: int | None) -> range:
        """Buffer key-less records sharing one timestamp; return their offsets.

        The batch is checked whole before anything is buffered; if it is rejected (or the
        caller's iterable raises), the writer lock is let go again unless other records
        are buffered, which the flusher then writes.
        """
        ts = now_ms() if timestamp is None else checked_timestamp(timestamp)
        with self._mutex:
            state = self._ready_state()
            start = state.end_offset
            pos0 = state.segment_size + self._pending_bytes
            before = len(self._pending)
            try:
                count, nbytes, idx, tix, state.since_index = encode_value_frames(
                    self._pending,
                    values,
                    ts,
                    self._max_payload,
                    self._index_interval,
                    state.since_index,
                    start - state.segment_base,
                    pos0,
                    state.max_timestamp,
                )
            except BaseException:
                self._release_if_idle()
                raise
            if count == 0:
                self._release_if_idle()
                return range(start, start)
            if idx:
                self._index.append((idx, tix))
            if ts > state.max_timestamp:
                state.max_timestamp = ts
            state.end_offset = start + count
            self._pending_bytes += nbytes
            now = _monotonic()
            full = self._pending_bytes >= self._buffer_bytes
            if before == 0:
                self._flush_due = now + self._flush_interval
                if not full:  # else this call writes them
                    self._flush_wanted.notify()
            full = full or (now >= self._flush_due and not self._flushing)  # as in _append_stamped
        self._after_append(start + count - 1, full)
        return range(start, start + count)

    def _after_append(self, last_offset: int, full: bool) -> None:
        if self._config.fsync == "always":
            self.drain(sync=True, upto=last_offset + 1)
        elif full:
            self._drain_sending()

    def _drain_sending(self) -> None:
        """A sender's own drain (its buffer full, or a record waited past ``flush_interval``),
        written behind by the writer thread when there is one (``_write_behind``).

        It keeps ``writer.lock`` though nothing is left buffered: this thread is sending,
        and letting the lock go made its next record take it again (flock twice, the writer
        state read, two stats, at every such drain; one thread sending small records drained
        often, and kept more of its rate without: DESIGN.md, "Appending and locking"). The
        flusher lets the lock go once nothing has been buffered for ``flush_interval`` (by
        the hold limit at the latest), as any drain of its own does.
        """
        with self._cond:
            if self._write_behind():
                return
            keep = _monotonic() < self._hold_until
            self._drain_locked(sync=False, upto=self._buffered_end(), keep_lock=keep)
            if keep and self._state is not None and not self._pending and not self._flushing:
                self._kept_at = _monotonic()
                self._flush_wanted.notify()

    def _ready_state(self) -> WriterState:
        """Under the mutex: make sure we hold the lock and the active segment has room.

        If it raises (a failed roll, a closed or failed appender), the writer lock is not
        left held with nothing buffered: nobody would ever drain and release it.
        """
        try:
            return self._ready_state_locked()
        except BaseException:
            self._release_if_idle()
            raise

    def _ready_state_locked(self) -> WriterState:
        while True:
            self._check_usable()
            if self._state is not None and _monotonic() >= self._hold_until:
                if self._flushing:
                    # Perhaps another thread's drain before it lets the lock go: once it is
                    # written, look again (the lock may have been let go and taken anew).
                    # Draining on behind it, each waiting thread led a drain of the one
                    # record sent since (8 threads sent less than one thread alone).
                    self._wait_in_flight()
                    continue
                self._drain_locked(sync=False, upto=None)
                continue
            if self._state is None:
                if self._flushing:
                    self._wait_in_flight()
                    continue
                self._acquire()
            state = self._state
            assert state is not None
            if self._needs_roll(state):
                if self._pending or self._flushing:
                    self._drain_locked(sync=False, upto=None, keep_lock=True)
                    continue
                self._roll(state)
                continue
            return state

    def _update_check_at(self) -> None:
        """When the hot path must next look at the slow conditions (hold limit, segment age).

        Monotonic time; the segment's age is wall-clock (its ``created``), converted here.
        """
        check_at = self._hold_until
        if self._config.segment_ms is not None and self._state is not None:
            roll_in = (self._state.created_ms + self._config.segment_ms - now_ms()) / 1000
            check_at = min(check_at, _monotonic() + roll_in)
        self._check_at = check_at

    def _needs_roll(self, state: WriterState) -> bool:
        if state.end_offset == state.segment_base:
            return False
        if state.segment_size + self._pending_bytes >= self._config.segment_bytes:
            return True
        seg_ms = self._config.segment_ms
        return seg_ms is not None and now_ms() - state.created_ms >= seg_ms

    def _acquire(self) -> None:
        self._lock.acquire()
        try:
            state = current_state(self._log)
            self._open_active(state)
        except BaseException:
            self._lock.release()
            raise
        self._state = state
        mono = _monotonic_ns()
        self._wall_offset_ns = _wall_ns() - mono  # read after the monotonic clock: never behind
        self._hold_until = mono / 1e9 + self._hold_limit
        self._update_check_at()
        self._written_offset = state.end_offset

    def _open_active(self, state: WriterState) -> None:
        if state.segment_base == self._seg_base and self._seg_fd >= 0:
            return
        self._close_files()
        base = state.segment_base
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
        seg = self._log.segment_path(base)
        with os_errors("open segment", seg):
            self._seg_fd = os.open(seg, flags)
        idx, tix = self._log.file(base, OFFSET_INDEX_SUFFIX), self._log.file(base, TIME_INDEX_SUFFIX)
        with os_errors("open index", idx):
            self._idx_fd = os.open(idx, flags | os.O_CREAT, 0o666)
            self._tix_fd = os.open(tix, flags | os.O_CREAT, 0o666)
        self._seg_base = base

    def _roll(self, state: WriterState) -> None:
        """Seal the active segment and start the next one; the sealer fsyncs the sealed one."""
        new = roll(self._log, state)
        self._open_active(new)
        self._state = new
        self._update_check_at()
        self._sealer.seal(new.segment_base)
        self._on_roll()

    # -- draining ----------------------------------------------------------------------------

    def drain(self, sync: bool, upto: int | None = None) -> None:
        """Write buffered records (``upto`` an offset: at least those before it), fsync if ``sync``.

        Without ``upto``: the records buffered when the call began. Records other threads
        send meanwhile go into a later drain; chasing them would keep this caller (say, a
        flush or the syncer of durable futures) writing for as long as they keep sending.
        """
        with self._cond:
            self._drain_locked(sync, self._buffered_end() if upto is None else upto)

    def _buffered_end(self) -> int:
        """Under the mutex: the offset after the last record buffered (or written)."""
        return self._state.end_offset if self._state is not None else self._written_offset

    def _drain_locked(self, sync: bool, upto: int | None, keep_lock: bool = False) -> None:
        yielded = False
        while True:
            if self._failed is not None:
                raise SenderFailedError(
                    f"a previous write to channel {self._log.path!r} failed: {self._failed}"
                ) from self._failed
            target = self._buffered_end() if upto is None else upto
            reached = self._durable_offset if sync else self._written_offset
            # With ``upto``, our records being there is enough: waiting for an empty buffer
            # would make every caller of a busy channel lead fsyncs for the others' records.
            if reached >= target and (upto is not None or not self._pending):
                if not self._flushing and not keep_lock:
                    self._release_if_idle()
                return
            if self._flushing:
                self._sync_waiters += sync
                try:
                    self._wait_in_flight()
                finally:
                    self._sync_waiters -= sync
                continue
            if sync and self._sync_waiters and not yielded:
                # Threads just woken by the last fsync are about to send their next records:
                # let them (release the mutex and the GIL once) so this fsync covers them too.
                yielded = True
                self._cond.release()
                try:
                    time.sleep(0)
                finally:
                    self._cond.acquire()
                continue
            self._lead_drain(sync)

    def _lead_drain(self, sync: bool) -> None:
        """Write the buffer as the one leader; the mutex is released during the I/O."""
        drain = self._take()
        self._cond.release()
        error: BaseException | None = None
        sealed_error: BaseException | None = None
        try:
            if drain.batch:
                self._write_batch(drain)
                self._write_after(drain)
            if sync:
                self._fsync_active()
                # Records another thread's drain wrote before a roll sealed their segment are
                # the sealer's to fsync: durable only once it has.
                try:
                    self._sealer.wait(drain.seg_base)
                except Exception as exc:
                    sealed_error = exc
        except BaseException as exc:
            error = exc
        finally:
            self._cond.acquire()
        self._finish(drain, sync, error, sealed_error)

    def _take(self) -> _Drain:
        """Under the mutex: take the buffer for one drain, which is in flight (``_flushing``) until ``_finish``."""
        batch, index, nbytes = self._pending, self._index, self._pending_bytes
        snapshot = None
        start_size = 0
        end = self._written_offset
        if batch:
            state = self._state
            assert state is not None, "records are buffered only while the writer lock is held"
            self._pending, self._index, self._pending_bytes = [], [], 0
            self._flush_due = float("inf")
            end = state.end_offset
            start_size = state.segment_size
            state.segment_size += nbytes
            snapshot = WriterState(
                state.segment_base,
                state.segment_id,
                state.segment_size,
                end,
                state.since_index,
                state.max_timestamp,
                state.created_ms,
            )
        self._flushing = True
        # (no roll while this drain is in flight: the active segment's fd and base stay)
        return _Drain(batch, index, nbytes, snapshot, start_size, end, self._seg_fd, self._seg_base)

    def _finish(self, drain: _Drain, sync: bool, error: BaseException | None, sealed_error: BaseException | None) -> None:
        """Under the mutex: end the drain in flight, raising its error (after which the appender is failed)."""
        self._flushing = False
        if error is not None:
            self._fail(error, drain.start_size if drain.snapshot is not None else None)
            self._cond.notify_all()
            if isinstance(error, FileChannelError):
                raise error  # e.g. DiskFullError, naming the file; later calls get SenderFailedError
            raise SenderFailedError(f"writing to channel {self._log.path!r} failed: {error}") from error
        if sealed_error is not None:  # the write itself is whole: nothing to cut back
            self._stop_failed(sealed_error)
            self._cond.notify_all()
            raise self._sealer_failed(sealed_error)
        self._written_offset = drain.end
        if sync:
            self._durable_offset = drain.end
            self._last_fsync = time.monotonic()
        self._cond.notify_all()
        if drain.batch:
            self._on_write()

    def _write_batch(self, drain: _Drain) -> None:
        """The drain's records, at the end of the active segment."""
        try:
            write_pieces(drain.seg_fd, drain.batch, drain.nbytes)
        except OSError as exc:
            raise storage_error(exc, "append to", self._log.segment_path(drain.seg_base)) from exc

    def _write_after(self, drain: _Drain) -> None:
        """After the drain's records: their index entries, then the writer state that counts them."""
        assert drain.snapshot is not None
        with os_errors("append to index of", self._log.segment_path(drain.seg_base)):
            for fd, data in self._index_writes(drain):
                os.write(fd, data)
        write_state(self._lock.fd, self._lock.path, drain.snapshot)

    def _index_writes(self, drain: _Drain) -> list[tuple[int, bytes]]:
        """The drain's index entries as the appends they are: to ``.idx``, then ``.tix`` (none without entries)."""
        if not drain.entries:
            return []
        idx, tix = zip(*drain.entries, strict=True)
        return [(self._idx_fd, b"".join(idx)), (self._tix_fd, b"".join(tix))]

    def _fsync_active(self) -> None:
        seg = self._log.segment_path(self._seg_base)
        with os_errors("fsync", seg):
            os.fsync(self._seg_fd)

    # -- write-behind: a sender's drains written by another thread ----------------------------

    def _write_behind(self) -> bool:
        """Under the mutex, in a sender: have the writer thread write the buffer, without
        waiting for it; False if there is no writer thread (no C extension) or nothing to write.

        The sender waits only for a drain still in flight, takes the buffer and submits it to
        ``_codec.WriteBehind`` (the records, then their index entries and the writer state,
        in that order, as ``_lead_drain`` writes them). The writer thread, waiting in C
        without the GIL, writes it at once on another CPU while this thread goes on
        buffering, and the sender ends that drain at its next one (``_collect``). A Python
        thread could not write it behind: a busy sender holds the GIL for a switch interval
        (5 ms) at a time, which it would wait for before and after each write.
        """
        if _WriteBehind is None:
            return False
        while self._flushing and self._failed is None:
            self._wait_in_flight()
        if not self._pending or self._failed is not None or self._closed:
            return False
        behind = self._behind
        if behind is None:
            behind = self._behind = _WriteBehind()
            self._behind_thread = threading.Thread(target=self._behind_loop, name="filechannel-writer", daemon=True)
            self._behind_thread.start()
        drain = self._take()
        assert drain.snapshot is not None
        after = [(fd, data, -1) for fd, data in self._index_writes(drain)]  # then the state, at 0 (as _write_after)
        after.append((self._lock.fd, drain.snapshot.encode(), 0))
        try:
            behind.submit(drain.seg_fd, drain.batch, drain.nbytes, *write_limits(), after)
        except BaseException as exc:  # nothing written (a piece that is not bytes, say)
            self._finish(drain, False, exc, None)
        self._behind_drain = drain
        self._flush_wanted.notify()  # the flusher ends it, should this sender send no more
        return True

    def _wait_in_flight(self) -> None:
        """Under the mutex: wait until the drain in flight may have ended (the caller looks
        again). A write-behind's is waited for in C, without the GIL, and ended here."""
        behind, drain = self._behind, self._behind_drain
        if behind is None or drain is None:
            self._cond.wait()
            return
        self._cond.release()
        try:
            behind.wait()
        finally:
            self._cond.acquire()
        self._collect()

    def _collect(self) -> None:
        """Under the mutex: end the write-behind's drain if its write is done (raising its
        error, after which the appender is failed), whichever thread comes first."""
        behind, drain = self._behind, self._behind_drain
        if behind is None or drain is None or behind.poll() is None:
            return
        err, failed_at = behind.collect()
        self._behind_drain = None
        error: BaseException | None = None
        if err:
            seg = self._log.segment_path(drain.seg_base)
            steps = ["append to", *(["append to index of"] * 2 if drain.entries else []), "write writer state of"]
            where = self._lock.path if failed_at == len(steps) - 2 else seg
            error = storage_error(OSError(err, os.strerror(err)), steps[failed_at + 1], where)
        self._finish(drain, False, error, None)
        if not self._pending and not self._flushing:  # the sender keeps writer.lock (see _drain_sending)
            if _monotonic() < self._hold_until:
                self._kept_at = _monotonic()
                self._flush_wanted.notify()
            else:
                self._release_if_idle()

    def _behind_loop(self) -> None:
        """The writer thread: in C, each write as it is submitted; back in Python only to end
        a drain nobody has ended within the hold limit of its write. (The sender ends it at its
        next drain, a flush or the flusher on their way; a writer thread that came back sooner
        would wait for the GIL a busy sender holds, and write nothing meanwhile.)"""
        behind = self._behind
        assert behind is not None
        while behind.run(self._hold_limit) > 0:
            with self._cond:
                try:
                    self._collect()
                except Exception as exc:
                    # No sender waits for this write: its error goes to the log, and every later
                    # send raises SenderFailedError carrying it.
                    log.error("channel %s: writing behind failed: %s", self._log.path, exc)

    def _fail(self, error: BaseException, good_size: int | None) -> None:
        """After a failed write: cut the segment back to its last whole record, stop for good."""
        self._failed = error
        seg = self._log.segment_path(self._seg_base)
        log.error("channel %s: write failed (%s); cutting %s back to %s bytes", self._log.path, error, seg, good_size)
        if good_size is not None:
            try:
                os.ftruncate(self._seg_fd, good_size)
            except OSError as exc:
                log.error("channel %s: could not cut %s back (%s); the next open trims it", self._log.path, seg, exc)
        self._stop_failed(error)

    def _stop_failed(self, error: BaseException) -> None:
        """Under the mutex, no drain in flight: stop for good after ``error``. What is buffered
        is dropped and ``writer.lock`` let go; every later call raises :class:`SenderFailedError`."""
        self._failed = error
        self._pending, self._index, self._pending_bytes = [], [], 0
        if self._state is not None:
            self._state = None
            self._lock.release()

    def _release_if_idle(self) -> None:
        if self._state is not None and not self._pending and not self._flushing:
            self._state = None
            self._kept_at = None
            self._lock.release()

    # -- background flusher ------------------------------------------------------------------

    def _flush_loop(self) -> None:
        interval = self._config.flush_interval
        fsync_every = self._config.fsync_interval if self._config.fsync == "interval" else None
        while True:
            with self._cond:
                while not self._closed and not self._pending and not self._fsync_due(fsync_every):
                    if self._behind_drain is not None:
                        break
                    if self._kept_at is not None:  # a sender's drain kept writer.lock (see _drain_sending)
                        wait = min(self._kept_at + interval, self._hold_until) - _monotonic()
                        if wait > 0:
                            self._flush_wanted.wait(timeout=wait)
                        else:
                            self._kept_at = None
                            self._release_if_idle()
                        continue
                    self._flush_wanted.wait(timeout=fsync_every)
                if self._closed:
                    return
                if self._behind_drain is not None:
                    # End a sender's write-behind once it is written (local receivers are woken
                    # then), waiting in C: a sender that stopped sending will not end it.
                    try:
                        self._wait_in_flight()
                    except Exception as exc:
                        log.error("channel %s: writing behind failed: %s", self._log.path, exc)
                        if self._failed is not None:
                            return
                    if not self._pending and not self._fsync_due(fsync_every):
                        continue
            # Rate-limit, don't delay: a record that finds the flusher idle is written at once;
            # under load, writes happen once per interval and carry everything sent meanwhile.
            wait = self._last_drain + interval - time.monotonic()
            if wait > 0:
                with self._cond:  # not time.sleep: close() must not wait out a long interval
                    if self._flush_wanted.wait_for(lambda: self._closed, timeout=wait):
                        continue  # close() drains what is left
            self._last_drain = time.monotonic()
            try:
                self.drain(sync=False)
                if self._fsync_due(fsync_every):
                    self._sync_interval()
            except Exception as exc:
                # No sender is waiting to see this error: it must reach the log.
                log.error("channel %s: background flush failed: %s", self._log.path, exc, exc_info=True)
                if self._failed is not None:
                    return  # every later send raises SenderFailedError; nothing left to write

    def _fsync_due(self, every: float | None) -> bool:
        return (
            every is not None
            and max(self._durable_offset, self._interval_synced) < self._written_offset
            and time.monotonic() - self._last_fsync >= every
        )

    def _sync_interval(self) -> None:
        """The flusher's fsync under ``fsync="interval"``: of the active segment, after its drain.

        Senders go on buffering, and drains (a sender's full buffer, the flusher's next) go
        on writing meanwhile. Inside a drain the fsync held ``_flushing`` for its whole
        length (a second's records: hundreds of MB at full rate), and a sender whose buffer
        filled waited for all of it. The fsync covers what was written before it began
        (``_interval_synced``). It does not move ``_durable_offset``, which only sync drains
        (``flush()``, ``fsync="always"``) move: a roll since may have left records in a
        sealed segment it does not cover (the sealer's fsync does). It fsyncs a duplicate of
        the segment's descriptor, which a roll may close meanwhile.
        """
        with self._cond:
            if self._seg_fd < 0 or self._failed is not None:
                return
            end = self._written_offset
            seg = self._log.segment_path(self._seg_base)
            with os_errors("fsync", seg):
                fd = os.dup(self._seg_fd)
            self._last_fsync = time.monotonic()
        try:
            with os_errors("fsync", seg):
                os.fsync(fd)
        except BaseException as exc:
            # The kernel may have dropped the pages it could not write: fail as after a
            # failed write (the drain this fsync was part of did), so no sender goes on
            # believing its records will be on disk within the interval.
            with self._cond:
                while self._flushing and self._failed is None:
                    try:
                        self._wait_in_flight()
                    except FileChannelError:
                        pass  # a write-behind failed too: the appender is failed with its error
                if self._failed is None:
                    log.error("channel %s: fsync of %s failed (%s)", self._log.path, seg, exc)
                    self._stop_failed(exc)
                self._cond.notify_all()
            raise
        finally:
            os.close(fd)
        with self._cond:
            self._interval_synced = max(self._interval_synced, end)

    # -- lifecycle ---------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"the channel {self._log.path!r} is closed")
        if self._failed is not None:
            raise SenderFailedError(
                f"a previous write to channel {self._log.path!r} failed ({self._failed}); "
                "records sent since were not written; reopen the channel once the cause is fixed"
            ) from self._failed
        if self._sealer.error is not None:
            raise self._sealer_failed(self._sealer.error)

    def _sealer_failed(self, error: BaseException) -> SenderFailedError:
        failed = SenderFailedError(
            f"fsync of a sealed segment of channel {self._log.path!r} failed ({error}); "
            "its records may not be on disk: check the disk, then reopen the channel"
        )
        failed.__cause__ = error
        return failed

    def close(self) -> None:
        """Write what is buffered (fsync unless the policy is "never"), stop the flusher.

        If that last write fails, its error is raised once the threads are stopped, the
        writer lock released and the files closed.
        """
        error: BaseException | None = None
        with self._cond:
            if self._closed:
                return
            if self._failed is None:
                try:
                    self._drain_locked(sync=self._config.fsync != "never", upto=None)
                except BaseException as exc:
                    error = exc
            self._closed = True
            self._cond.notify_all()
            self._flush_wanted.notify()
        if self._flusher is not None:
            self._flusher.join()
        if self._behind is not None and self._behind_thread is not None:
            self._behind.close()  # (the drain above waited for the write in flight)
            self._behind_thread.join()
        self._sealer.close()
        with self._cond:
            self._release_if_idle()
            self._close_files()
        if error is not None:
            raise error

    def _close_files(self) -> None:
        for fd in (self._seg_fd, self._idx_fd, self._tix_fd):
            if fd >= 0:
                os.close(fd)
        self._seg_fd = self._idx_fd = self._tix_fd = -1
        self._seg_base = -1
