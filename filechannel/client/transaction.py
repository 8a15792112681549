"""A transactional producer's side of its transactions: its epoch, the open transaction, its state.

States (kafka-python's and aiokafka's transaction manager, in small)::

    uninitialized --init_transactions--> ready --begin_transaction--> in transaction
    in transaction --commit_transaction--> ready        (everything applied, futures completed)
    in transaction --abort_transaction--> ready         (everything dropped, futures failed)
    in transaction --timeout, or a commit refused--> abortable --abort_transaction--> ready
    any --another producer's init_transactions--> fenced (for good: close the producer)

Nothing of an open transaction is written anywhere: its records and offsets wait in memory
(``_batches``, ``_groups``) until :meth:`Transactions.commit` hands them to the root's
:class:`~.transaction_log.TransactionLog` as one commit record. So an open, aborted or
abandoned transaction is never seen by any reader and never blocks one; and a record that
could not be appended (too large) is refused at ``send``, before a commit record could
promise it.

Fencing is checked at every ``send``, ``send_offsets_to_transaction`` and ``commit`` with one
``stat`` of the id's epoch file (re-read only when it changed), and again under the id's lock
at commit, before the commit record is written: a zombie's commit never reaches the log.

Not thread-safe across calls that change the state (as Kafka's producer, one thread drives
a transaction); sends from several threads into one open transaction are.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..engine.names import validate_name
from ..engine.record import Headers, encode_record_frames, serialized_sizes
from ..errors import CommitFailedError, ConfigError, IllegalStateError, ProducerFencedError, TransactionAbortedError
from .futures import RecordFuture
from .records import RecordMetadata, TopicPartition, check_offset, to_tp
from .transaction_log import Batch, ChannelFor, CommitRecord, TransactionLog, TxnRecord, to_headers

UNINITIALIZED, READY, IN_TRANSACTION, ABORTABLE, FENCED = "uninitialized", "ready", "in transaction", "abortable", "fenced"


class Transactions:
    """The transactions of one producer with ``transactional_id`` (see the module docstring)."""

    def __init__(self, root: str, transactional_id: str, timeout_ms: int, channel_for: ChannelFor) -> None:
        self.transactional_id = validate_name(transactional_id, "transactional_id")
        self.log = TransactionLog(root, channel_for)
        self._epoch_path = self.log.epoch_path(self.transactional_id)  # stat'ed at every send: made once
        self.timeout = timeout_ms / 1000
        self.state = UNINITIALIZED
        self.epoch = 0
        self._epoch_seen: tuple[int, int] | None = None  # (inode, mtime_ns) of the epoch file when last read
        self._started = 0.0
        self._mutex = threading.Lock()  # sends of several threads into one transaction
        self._done = threading.Condition()  # the futures of this producer's transactional records
        self._batches: dict[tuple[str, int], tuple[list[TxnRecord], list[RecordFuture[RecordMetadata]]]] = {}
        self._groups: dict[str, dict[TopicPartition, int]] = {}
        self._owners: dict[str, tuple[str, list[TopicPartition]]] = {}

    # -- checks --------------------------------------------------------------------------------

    def _check_fenced(self) -> None:
        """ProducerFencedError if a newer producer took the id (then for good); first of every
        check, so a fenced producer says so whatever else is wrong with the call."""
        if self.state == UNINITIALIZED:
            return
        if self.state == FENCED:
            raise self._fenced_error(self.log.epoch(self.transactional_id))
        try:
            st = os.stat(self._epoch_path)
            seen = (st.st_ino, st.st_mtime_ns)
        except FileNotFoundError:
            seen = (0, 0)
        if seen != self._epoch_seen:
            current = self.log.epoch(self.transactional_id)
            if current != self.epoch:
                self._drop(self._fenced_error(current))
                self.state = FENCED
                raise self._fenced_error(current)
            self._epoch_seen = seen

    def _fenced_error(self, current: int) -> ProducerFencedError:
        return ProducerFencedError(
            f"producer of transactional_id {self.transactional_id!r} (epoch {self.epoch}) was fenced: another producer "
            f"with that id called init_transactions (epoch {current}); close this one"
        )

    def _check_open(self, what: str) -> None:
        """IllegalStateError unless a transaction is open; ProducerFencedError if fenced;
        TransactionAbortedError (the transaction aborted) if it is open past its timeout."""
        self._check_fenced()
        if self.state == ABORTABLE:
            raise TransactionAbortedError(
                f"{what}: the transaction was aborted (open longer than transaction_timeout_ms, or its commit was "
                "refused); call abort_transaction(), then begin_transaction()"
            )
        if self.state != IN_TRANSACTION:
            raise IllegalStateError(f"{what} needs an open transaction: call begin_transaction() first (state: {self.state})")
        if time.monotonic() - self._started > self.timeout:
            self._drop(TransactionAbortedError("the transaction was aborted: open longer than transaction_timeout_ms"))
            self.state = ABORTABLE
            raise TransactionAbortedError(
                f"{what}: the transaction was open longer than transaction_timeout_ms ({self.timeout * 1000:g} ms) and "
                "was aborted (nothing of it was written); call abort_transaction(), then begin_transaction()"
            )

    # -- the API -------------------------------------------------------------------------------

    def init(self) -> None:
        """Take a new epoch (fencing every older producer of the id), after the dead one's
        committed work is applied; its open transaction, never written, is gone with it."""
        if self.state != UNINITIALIZED:
            raise IllegalStateError(f"init_transactions() was called already (state: {self.state})")
        self.epoch = self.log.new_epoch(self.transactional_id)
        self._epoch_seen = None
        self.state = READY

    def begin(self) -> None:
        self._check_fenced()
        if self.state == UNINITIALIZED:
            raise IllegalStateError("begin_transaction() needs init_transactions() first")
        if self.state == IN_TRANSACTION:
            raise IllegalStateError("begin_transaction(): a transaction is open already; commit or abort it first")
        if self.state == ABORTABLE:
            raise IllegalStateError("begin_transaction(): the last transaction was aborted; call abort_transaction() first")
        self._started = time.monotonic()
        self.state = IN_TRANSACTION

    def add(
        self,
        topic: str,
        partition: int,
        key: bytes | bytearray | memoryview | None,
        value: bytes | bytearray | memoryview | None,
        headers: Headers | None,
        timestamp_ms: int,
        max_record_bytes: int,
    ) -> RecordFuture[RecordMetadata]:
        """Buffer one record of the open transaction; its future completes at commit (with its
        offset) or fails at abort. A record too large is refused now (MessageTooLargeError)."""
        self._check_open("send")
        k = None if key is None else bytes(key)
        v = None if value is None else bytes(value)
        encode_record_frames([], v, k, headers, timestamp_ms, max_record_bytes)  # raises if too large
        future: RecordFuture[RecordMetadata] = RecordFuture(self._done)
        record = TxnRecord(timestamp_ms, k, v, to_headers(headers))
        with self._mutex:
            records, futures = self._batches.setdefault((topic, partition), ([], []))
            records.append(record)
            futures.append(future)
        return future

    def send_offsets(self, offsets: dict[TopicPartition, Any], group: Any) -> None:
        """Commit ``offsets`` for ``group`` with the transaction. ``group``: a group id, or
        consumer group metadata (``Consumer.group_metadata()``, whose member must then own
        those partitions at commit: a consumer that lost one in a rebalance cannot commit it)."""
        self._check_open("send_offsets_to_transaction")
        member_id = None
        if isinstance(group, str):
            group_id = group
        elif isinstance(getattr(group, "group_id", None), str):
            group_id, member_id = group.group_id, getattr(group, "member_id", None)
        else:
            raise ConfigError(
                f"send_offsets_to_transaction takes a group id or consumer.group_metadata(), not {type(group).__name__}"
            )
        validate_name(group_id, "group_id")
        if not isinstance(offsets, dict):
            raise ConfigError(
                f"send_offsets_to_transaction takes a dict {{TopicPartition: offset}}, not {type(offsets).__name__}"
            )
        plain = {to_tp(tp): check_offset(to_tp(tp), off, "send_offsets_to_transaction") for tp, off in offsets.items()}
        self._groups.setdefault(group_id, {}).update(plain)
        if member_id is not None:
            owned = self._owners.setdefault(group_id, (member_id, []))[1]
            owned.extend(tp for tp in plain if tp not in owned)

    def commit(self) -> None:
        """Commit the open transaction: every record and offset, or (on an error) none."""
        self._check_open("commit_transaction")
        if not self._batches and not self._groups:  # nothing to write: no commit record, no fsync
            self.state = READY
            return
        keys = sorted(self._batches)
        batches = [Batch(t, p, self._batches[(t, p)][0]) for t, p in keys]
        record = CommitRecord(self.transactional_id, self.epoch, batches, self._groups)
        try:
            results = self.log.commit(record, self._owners)
        except ProducerFencedError as exc:
            self._drop(exc)
            self.state = FENCED
            raise
        except CommitFailedError as exc:
            self._drop(exc)
            self.state = ABORTABLE
            raise
        except BaseException as exc:  # e.g. a full disk: if the record was written, recovery applies it
            self._drop(exc)
            self.state = ABORTABLE
            raise
        done = []
        for (topic, partition), offsets in zip(keys, results, strict=True):
            records, futures = self._batches[(topic, partition)]
            tp = TopicPartition(topic, partition)
            for r, future, off in zip(records, futures, offsets, strict=True):
                sizes = serialized_sizes(r.key, r.value, r.headers)
                done.append((future, RecordMetadata(topic, partition, tp, off, r.timestamp, None, *sizes)))
        RecordFuture.complete_many(self._done, done, None)
        self._reset()
        self.state = READY

    def abort(self) -> None:
        """Drop the open (or timed-out) transaction: nothing of it was written."""
        self._check_fenced()
        if self.state not in (IN_TRANSACTION, ABORTABLE):
            raise IllegalStateError(f"abort_transaction(): no transaction is open (state: {self.state})")
        self._drop(TransactionAbortedError("the transaction was aborted"))
        self.state = READY

    def close(self) -> None:
        """The producer closes: an open transaction is aborted."""
        if self.state in (IN_TRANSACTION, ABORTABLE):
            self._drop(TransactionAbortedError("the producer was closed with the transaction open: it was aborted"))
            self.state = READY

    def _drop(self, error: BaseException) -> None:
        """Forget the open transaction; fail its records' futures with ``error``."""
        futures = [(f, None) for _, fs in self._batches.values() for f in fs]
        RecordFuture.complete_many(self._done, futures, error)
        self._reset()

    def _reset(self) -> None:
        self._batches = {}
        self._groups = {}
        self._owners = {}
