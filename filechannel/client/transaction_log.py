"""The transaction log of a root: commit records, their redo, and the producers' epochs.

A transaction's records and group offsets live only in the producer's memory until it
commits. ``commit`` writes them all as one *commit record* (one file, fsynced, then renamed
into place; the folder is not fsynced), then appends each partition's share to its log, stores the group offsets, and
deletes the record. A commit record that exists is a transaction that is committed but
perhaps not wholly applied: whoever takes ``apply.lock`` next (a commit, ``init_transactions``,
a consumer reading its group's committed offsets) applies it again, idempotently, before
anything else. So a transaction is all or nothing at every crash point:

- before the record is renamed into place: nothing of it exists anywhere (the temp file of
  a dead writer is deleted under ``apply.lock``), except after a machine crash that lost
  the rename: a whole temp file one of whose records is in its partition was renamed
  (appends begin only after the rename) and is applied as a commit record;
- after: it is applied whole, by the writer or by the recovery that follows its death.

Layout (``ROOT/.transactions/``)::

    apply.lock      flock: held while a commit record is written and applied, and by
                    recovery; so commits of a root are applied one at a time
    ID.lock         flock per transactional id: held while its epoch is taken or checked and
                    its commit record written (fencing)
    ID.epoch        the id's current epoch (decimal), replaced atomically by init_transactions
    ID.commit       the id's commit record while it is not wholly applied (at most one per id)

Lock order: ``ID.lock``, then ``apply.lock``, then the groups' ``group.lock`` (sorted by
name). A consumer's own commit takes only its ``group.lock``.

*Idempotent apply.* The commit record holds, per partition, the partition's end offset
before the append (``start``; taken under ``apply.lock``, so no other transaction appends in
between). Re-applying reads the partition from ``start``, finds the longest run of the
batch's records already there (same timestamp, key, value and headers, in order) and
appends only what follows it: a crash before, within or after a partition's append neither
loses nor duplicates its share. Group offsets are plain values: storing them twice is
storing them once.

Commit record format: ``FCTX``, crc32c (u32) of the rest, the rest = u32 header length, JSON
header ``{"id", "epoch", "batches": [[topic, partition, start, count], ...], "groups":
{group: {"topic/p": offset}}}``, then each batch's records in order: ``<qiiH`` timestamp,
key length, value length (-1: None), header count, the key and value bytes, and per header
``<HI`` name length, value length, name (UTF-8), value.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..channel import FileChannel
from ..engine import failpoints
from ..engine.checksum import crc32c
from ..engine.files import fsync_dir, read_if_exists, unlink_if_exists, write_atomically
from ..engine.lock import FileLock
from ..engine.names import validate_name
from ..engine.record import Headers, Record
from ..errors import CorruptRecordError, OffsetOutOfRangeError, ProducerFencedError, UnknownTopicError, os_errors
from ..sender import Sender
from .group import GroupOffsets, tp_from_key, tp_key
from .records import TopicPartition
from .subscription import TopicSource
from .topics import TopicStore

log = logging.getLogger("filechannel")

TRANSACTIONS_DIR = ".transactions"
_MAGIC = b"FCTX"
_HEAD = struct.Struct("<4sI")  # magic, crc32c of the rest
_HEAD_LEN = struct.Struct("<I")  # the JSON header's length, first of the rest
_RECORD = struct.Struct("<qiiH")
_HEADER = struct.Struct("<HI")
_COMMIT_TMP = re.compile(r"^.+\.commit\.\d+\.\d+\.tmp$")  # write_atomically's temp files of commit records


@dataclass(frozen=True)
class TxnRecord:
    """One record of a transaction, as it will be appended (timestamp fixed at send)."""

    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class Batch:
    """One partition's share of a transaction; ``start`` is the partition's end before the append."""

    topic: str
    partition: int
    records: list[TxnRecord]
    start: int = -1


@dataclass
class CommitRecord:
    """What a committed transaction writes: its batches and its groups' offsets."""

    transactional_id: str
    epoch: int
    batches: list[Batch]
    groups: dict[str, dict[TopicPartition, int]] = field(default_factory=dict)

    def encode(self) -> bytes:
        header = {
            "id": self.transactional_id,
            "epoch": self.epoch,
            "batches": [[b.topic, b.partition, b.start, len(b.records)] for b in self.batches],
            "groups": {g: {tp_key(tp): off for tp, off in offsets.items()} for g, offsets in self.groups.items()},
        }
        head = json.dumps(header, sort_keys=True).encode()
        parts = [head]
        for batch in self.batches:
            for r in batch.records:
                parts.append(
                    _RECORD.pack(
                        r.timestamp, -1 if r.key is None else len(r.key), -1 if r.value is None else len(r.value), len(r.headers)
                    )
                )
                if r.key is not None:
                    parts.append(r.key)
                if r.value is not None:
                    parts.append(r.value)
                for name, value in r.headers:
                    encoded = name.encode()
                    parts.append(_HEADER.pack(len(encoded), len(value)))
                    parts.append(encoded)
                    parts.append(value)
        rest = _HEAD_LEN.pack(len(head)) + b"".join(parts)
        return _HEAD.pack(_MAGIC, crc32c(rest)) + rest

    @classmethod
    def decode(cls, data: bytes, path: str) -> CommitRecord:
        """The record in ``data``; CorruptRecordError naming ``path`` if it is not a whole one (it
        was fsynced before its rename, so only damage makes it so)."""
        if len(data) < _HEAD.size + _HEAD_LEN.size:
            raise CorruptRecordError(f"commit record {path!r} is truncated; it cannot be applied")
        magic, crc = _HEAD.unpack_from(data)
        if magic != _MAGIC or crc32c(memoryview(data)[_HEAD.size :]) != crc:
            raise CorruptRecordError(f"commit record {path!r} is damaged (bad magic or CRC); it cannot be applied")
        try:
            return cls._decode_checked(data)
        except (ValueError, KeyError, TypeError, struct.error) as exc:  # a whole record of another layout
            raise CorruptRecordError(f"commit record {path!r} cannot be read ({exc}); it cannot be applied") from None

    @classmethod
    def _decode_checked(cls, data: bytes) -> CommitRecord:
        """The record in ``data``, whose magic and CRC were checked."""
        (head_len,) = _HEAD_LEN.unpack_from(data, _HEAD.size)
        pos = _HEAD.size + _HEAD_LEN.size
        header = json.loads(bytes(data[pos : pos + head_len]))
        pos += head_len
        batches = []
        for topic, partition, start, count in header["batches"]:
            records = []
            for _ in range(count):
                ts, klen, vlen, nheaders = _RECORD.unpack_from(data, pos)
                pos += _RECORD.size
                key = None if klen < 0 else bytes(data[pos : pos + klen])
                pos += max(klen, 0)
                value = None if vlen < 0 else bytes(data[pos : pos + vlen])
                pos += max(vlen, 0)
                headers = []
                for _ in range(nheaders):
                    nlen, hlen = _HEADER.unpack_from(data, pos)
                    pos += _HEADER.size
                    name = bytes(data[pos : pos + nlen]).decode()
                    pos += nlen
                    headers.append((name, bytes(data[pos : pos + hlen])))
                    pos += hlen
                records.append(TxnRecord(ts, key, value, tuple(headers)))
            batches.append(Batch(topic, partition, records, start))
        groups = {g: {tp_from_key(k): off for k, off in offsets.items()} for g, offsets in header["groups"].items()}
        return cls(header["id"], header["epoch"], batches, groups)


# Opens a partition for appending: (channel, its sender, a function to call when done with it).
ChannelFor = Callable[[str, int], tuple[FileChannel, Sender, Callable[[], None]]]


class TransactionLog:
    """``ROOT/.transactions/`` (see the module docstring). Thread-safe as its locks are."""

    def __init__(self, root: str, channel_for: ChannelFor) -> None:
        self.root = root
        self.folder = os.path.join(root, TRANSACTIONS_DIR)
        self._channel_for = channel_for

    def _path(self, transactional_id: str, suffix: str) -> str:
        return os.path.join(self.folder, validate_name(transactional_id, "transactional_id") + suffix)

    def _ensure_folder(self) -> None:
        with os_errors("create transactions folder", self.folder):
            os.makedirs(self.folder, exist_ok=True)

    @contextlib.contextmanager
    def _applying(self) -> Iterator[None]:
        """Hold ``apply.lock``, having applied every commit record left by a dead writer."""
        self._ensure_folder()
        lock = FileLock(os.path.join(self.folder, "apply.lock"))
        try:
            with lock.holding():
                self._recover_locked()
                yield
        finally:
            lock.close()

    def pending(self) -> bool:
        """Whether any commit record waits to be applied (one ``listdir``; no lock)."""
        try:
            return any(name.endswith(".commit") for name in os.listdir(self.folder))
        except FileNotFoundError:
            return False

    def recover(self) -> None:
        """Apply every commit record not yet wholly applied (a dead writer's)."""
        if self.pending():
            with self._applying():
                pass

    def epoch(self, transactional_id: str) -> int:
        """The id's current epoch (0: none taken yet)."""
        data = read_if_exists(self._path(transactional_id, ".epoch"), "transaction epoch")
        try:
            return int(data) if data else 0
        except ValueError:
            raise CorruptRecordError(
                f"epoch file {self._path(transactional_id, '.epoch')!r} is damaged; delete it (every producer of "
                f"{transactional_id!r} must then call init_transactions again)"
            ) from None

    def epoch_path(self, transactional_id: str) -> str:
        return self._path(transactional_id, ".epoch")

    def new_epoch(self, transactional_id: str) -> int:
        """Take the next epoch of ``transactional_id`` (init_transactions): from now on a producer
        holding an older one is fenced. The dead one's committed work is applied first."""
        self._ensure_folder()
        with self._id_lock(transactional_id):
            with self._applying():
                pass
            epoch = self.epoch(transactional_id) + 1
            write_atomically(self._path(transactional_id, ".epoch"), str(epoch).encode())
            return epoch

    @contextlib.contextmanager
    def _id_lock(self, transactional_id: str) -> Iterator[None]:
        lock = FileLock(self._path(transactional_id, ".lock"))
        try:
            with lock.holding():
                yield
        finally:
            lock.close()

    def commit(self, record: CommitRecord, owners: dict[str, tuple[str, list[TopicPartition]]]) -> list[list[int]]:
        """Commit ``record`` (see the module docstring); return each batch's offsets.

        ``owners``: per group, the consumer that must own the partitions whose offsets the
        transaction commits (checked under ``group.lock``, held until they are stored).
        ProducerFencedError if another producer took a newer epoch of the id;
        CommitFailedError if a consumer lost a partition. Either way nothing was written.
        """
        self._ensure_folder()
        tid = record.transactional_id
        path = self._path(tid, ".commit")
        with self._id_lock(tid):
            current = self.epoch(tid)
            if current != record.epoch:
                raise ProducerFencedError(
                    f"producer of transactional_id {tid!r} (epoch {record.epoch}) was fenced: another producer called "
                    f"init_transactions (epoch {current}); close this one"
                )
            with self._applying(), contextlib.ExitStack() as stack:
                groups = {g: GroupOffsets(self.root, g) for g in sorted(record.groups)}
                for g, offsets in groups.items():
                    stack.callback(offsets.close)
                    stack.enter_context(offsets.holding())
                    if g in owners:
                        offsets.check_owner(owners[g][0], owners[g][1])
                opened = []
                for batch in record.batches:
                    opened.append(self._channel_for(batch.topic, batch.partition))
                    stack.callback(opened[-1][2])
                    batch.start = opened[-1][0].end_offset
                write_atomically(path, record.encode(), sync_folder=False)  # see _recover_locked
                failpoints.hit("txn-record-written")
                results = self._apply(record, record.batches, opened, groups, fresh=True)
                self._retire(path, record)
                return results

    def _retire(self, path: str, record: CommitRecord) -> None:
        """Delete the applied record ``path``. With group offsets, durably: a record that came
        back after a power loss would store its offsets again, over newer ones a consumer
        committed since (its records, found in the partitions, would not be written again)."""
        unlink_if_exists(path)
        if record.groups:
            fsync_dir(self.folder)

    def _recover_locked(self) -> None:
        """Under ``apply.lock``: apply every commit record found, delete dead writers' temp files."""
        try:
            names = sorted(os.listdir(self.folder))
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(self.folder, name)
            if not (name.endswith(".commit") or _COMMIT_TMP.match(name)):
                continue
            data = read_if_exists(path, "commit record")
            if data is None:
                continue
            if name.endswith(".commit"):
                record = CommitRecord.decode(data, path)
            else:
                # A dead writer's temp file (its writer held apply.lock). Its rename was not
                # made durable (the folder is not fsynced before the appends, to spare an
                # fsync per commit), so after a machine crash it may stand for a record that
                # was renamed and applied in part: it was, if any of its records is in its
                # partition (appends begin only after the rename). Else the commit never
                # happened (or left nothing but offsets, which are stored durably already).
                try:
                    record = CommitRecord.decode(data, path)
                except CorruptRecordError:  # never fsynced whole: never renamed either
                    unlink_if_exists(path)
                    continue
                if not self._begun(record):
                    unlink_if_exists(path)
                    continue
            self._redo(path, record)

    def _redo(self, path: str, record: CommitRecord) -> None:
        """Apply ``record`` (found at ``path``) again: what of it is not in place yet."""
        with contextlib.ExitStack() as stack:
            groups = {g: GroupOffsets(self.root, g) for g in sorted(record.groups)}
            for offsets in groups.values():
                stack.callback(offsets.close)
                stack.enter_context(offsets.holding())
            batches, opened = [], []
            for batch in record.batches:
                try:
                    opened.append(self._channel_for(batch.topic, batch.partition))
                except UnknownTopicError:  # deleted since: its share goes with it
                    log.warning("commit record %s: %s[%d] was deleted; its share is dropped", path, batch.topic, batch.partition)
                    continue
                stack.callback(opened[-1][2])
                batches.append(batch)
            self._apply(record, batches, opened, groups, fresh=False)
            self._retire(path, record)

    def _begun(self, record: CommitRecord) -> bool:
        """Whether any record of ``record`` is in its partition (so its apply had begun)."""
        for batch in record.batches:
            try:
                ch, _, done = self._channel_for(batch.topic, batch.partition)
            except UnknownTopicError:
                continue
            try:
                if _already(ch, batch)[0]:
                    return True
            finally:
                done()
        return False

    def _apply(
        self,
        record: CommitRecord,
        batches: list[Batch],
        opened: Sequence[tuple[FileChannel, Sender, Callable[[], None]]],
        groups: dict[str, GroupOffsets],
        fresh: bool,
    ) -> list[list[int]]:
        """Append each batch (``fresh``: straight; else after what of it is there already), fsync
        each partition, then store the groups' offsets."""
        results = []
        for batch, (ch, sender, _) in zip(batches, opened, strict=True):
            results.append(_append_once(ch, sender, batch, fresh))
            failpoints.hit("txn-partition-applied")
        for g, offsets in groups.items():
            offsets.store(record.groups[g])
        failpoints.hit("txn-offsets-stored")
        return results


def _same(stored: Record, r: TxnRecord) -> bool:
    return (
        stored.timestamp == r.timestamp
        and stored.key == r.key
        and stored.value == r.value
        and tuple(map(tuple, stored.headers)) == r.headers
    )


def _already(ch: FileChannel, batch: Batch) -> tuple[int, int]:
    """How many of the batch's first records are in the partition from ``batch.start`` on (the
    longest run in order), and the offset of its first one (-1 if none)."""
    end = ch.end_offset
    start = max(batch.start, ch.first_offset)
    if start >= end or not batch.records:
        return 0, -1
    rx = ch.receiver(start)
    try:
        found, at, matched = False, -1, 0
        while True:
            try:
                got = rx.recv_many(1024, timeout=0)
            except OffsetOutOfRangeError:
                return 0, -1
            if not got:
                return matched, at
            for stored in got:
                if found:
                    if matched < len(batch.records) and _same(stored, batch.records[matched]):
                        matched += 1
                        continue
                    return matched, at
                if _same(stored, batch.records[0]):
                    found, at, matched = True, stored.offset, 1
            if found and matched == len(batch.records):
                return matched, at
    finally:
        rx.close()


def _append_once(ch: FileChannel, sender: Sender, batch: Batch, fresh: bool) -> list[int]:
    """Append what of ``batch`` the partition does not hold yet; fsync; return the offsets of
    all of its records."""
    records = batch.records
    done, at = (0, -1) if fresh else _already(ch, batch)
    offsets = list(range(at, at + done))
    send = sender.send
    half = done + (len(records) - done) // 2
    for i in range(done, len(records)):
        r = records[i]
        offsets.append(send(r.value, key=r.key, headers=list(r.headers) if r.headers else None, timestamp=r.timestamp))
        if i == half:
            failpoints.hit("txn-mid-append", before=sender.flush)
    sender.sync()
    return offsets


def to_headers(headers: Headers | None) -> tuple[tuple[str, bytes], ...]:
    """A transaction record's headers (as they are read back), from what ``send`` took."""
    if not headers:
        return ()
    return tuple((name, bytes(v)) for name, v in headers)


def recover_transactions(store: TopicSource) -> None:
    """Apply what dead transactional producers of ``store``'s root committed and did not finish
    (a consumer's recovery: before it reads its group's committed offsets, and at the open of
    a ``read_committed`` one). One ``listdir`` when there is nothing to do; nothing for the
    topics of a tier URL read alone (only committed records were ever uploaded)."""
    if not isinstance(store, TopicStore):
        return

    def opened(topic: str, partition: int) -> tuple[FileChannel, Sender, Callable[[], None]]:
        ch = store.open_partition(topic, partition)
        return ch, ch.sender(), ch.close

    TransactionLog(store.root, opened).recover()
