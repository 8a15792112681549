"""The tier-2 metadata store: which segments are in chunk storage, in which state, and who may change them.

One SQLite database per root (``ROOT/.tier/metadata.db``; a standalone channel:
``CHANNEL/tier-metadata.db``), shared by every process of the root.

Invariants, each checked inside the transaction that could break it:

- Every change is one transaction (``BEGIN IMMEDIATE``) whose first step checks that the
  caller's epoch is the current one, the newest taken (else :class:`FencedError`): an
  uploader that was paused and overtaken can change nothing, ever again.
- Segments of one channel never overlap in offsets, whatever their states; so uploaded
  segments never overlap, and the segment holding an offset is found by one index probe.
- A segment's chunks cover ``[0, size)`` of its ``.seg.z`` contiguously, in order, each
  named by :func:`.layout.chunk_name` of the segment and the epoch that uploads it.
- States move only ``uploading -> uploaded -> deleting -> (row removed)``,
  ``uploading -> (row removed: abandoned)`` or ``uploaded -> lost -> deleting`` (``lost``:
  ``filechannel tier fsck --repair`` found its objects missing or damaged with no local
  copy to upload again; reads of its offsets raise :class:`~filechannel.errors.TierDataLostError`),
  as Kafka's remote log metadata moves through
  COPY_SEGMENT_STARTED/FINISHED and DELETE_SEGMENT_STARTED/FINISHED. Each state is
  committed before and after the storage calls it covers, so a crash anywhere is
  recoverable:

  1. ``begin_upload`` records the segment "uploading" with its planned chunks (so every
     name the attempt may write is known before the first byte is written);
  2. the uploader writes the chunks, then the manifest;
  3. ``finish_upload`` commits "uploaded": only now may the local copy be deleted.

  A crash before 3 leaves an "uploading" row: the next uploader (a newer epoch) finds it
  with :meth:`TierMetadata.stale_uploads`, deletes the names :meth:`abandon_upload`
  returns and uploads the segment again. Deleting is the mirror: ``begin_delete`` commits
  "deleting" (readers stop using it), the objects are deleted (missing is success), then
  ``finish_delete`` removes the row. Objects that no row names (a fenced uploader's late
  writes) are orphans, found by listing and :func:`.layout.parse_object_name`.

Schema (version 3, in ``schema_version``; a newer version is refused, an older one is
migrated when opened: version 1 lacked the state ``lost`` and merges, version 2 the totals)::

    epochs   (epoch PK, owner, taken_at_ms)                      one row per epoch ever taken
    segments (channel, base_offset, end_offset, size, max_timestamp, state, epoch,
              manifest, created_at_ms, updated_at_ms)            PK (channel, base_offset)
    chunks   (channel, base_offset, seq, name, position, length, object_offset)
                                                                 PK (channel, base_offset, seq)
    merges, garbage                                              defragmentation under way
    state_totals (channel, state, segments, bytes), object_refs (channel, name, refs),
    object_totals (channel, objects)                             kept by triggers on segments
                                                                 and chunks: a status is probes

``segments.epoch`` is the epoch that uploaded the segment (its object names carry it),
not the last one that changed the row.

Thread-safe: one connection per instance behind a lock. Several processes may open
the same file; open one instance per process (never use one across ``fork``).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from itertools import groupby
from operator import itemgetter
from typing import Self

from ..engine.clock import now_ms
from ..errors import ConfigError, FencedError, MetadataDamagedError, TierError
from .layout import (
    DELETING,
    LISTED,
    LOST,
    MAX_EPOCH,
    MAX_OFFSET,
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    STATES,
    UPLOADED,
    UPLOADING,
    ChunkRecord,
    SegmentRecord,
    check_int,
    chunks_problem,
    manifest_name,
    segment_problem,
    validate_channel,
)

__all__ = ["SCHEMA_VERSION", "ChannelSummary", "ChunkRecord", "EpochRecord", "Merge", "SegmentRecord", "TierMetadata"]

SCHEMA_VERSION = 4

_SEGMENTS_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    channel TEXT NOT NULL,
    base_offset INTEGER NOT NULL CHECK (base_offset >= 0),
    end_offset INTEGER NOT NULL CHECK (end_offset > base_offset),
    size INTEGER NOT NULL CHECK (size > 0),
    max_timestamp INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('uploading', 'uploaded', 'deleting', 'lost')),
    epoch INTEGER NOT NULL REFERENCES epochs (epoch),
    manifest TEXT,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    newest_through INTEGER,
    PRIMARY KEY (channel, base_offset)
) WITHOUT ROWID"""
_SEGMENTS_INDEX = "CREATE INDEX IF NOT EXISTS segments_by_state ON segments (state, epoch)"
_CHUNKS_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    channel TEXT NOT NULL,
    base_offset INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    name TEXT NOT NULL,
    position INTEGER NOT NULL,
    length INTEGER NOT NULL CHECK (length > 0),
    object_offset INTEGER NOT NULL DEFAULT 0 CHECK (object_offset >= 0),
    PRIMARY KEY (channel, base_offset, seq),
    FOREIGN KEY (channel, base_offset) REFERENCES segments (channel, base_offset) ON DELETE CASCADE
) WITHOUT ROWID"""
_CHUNKS_INDEX = "CREATE INDEX IF NOT EXISTS chunks_by_name ON chunks (name)"
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS epochs (
    epoch INTEGER PRIMARY KEY CHECK (epoch >= 1),
    owner TEXT NOT NULL,
    taken_at_ms INTEGER NOT NULL
);
{_SEGMENTS_TABLE.format(name="segments")};
{_SEGMENTS_INDEX};
{_CHUNKS_TABLE.format(name="chunks")};
{_CHUNKS_INDEX};
CREATE TABLE IF NOT EXISTS merges (
    name TEXT PRIMARY KEY,
    channel TEXT NOT NULL,
    epoch INTEGER NOT NULL REFERENCES epochs (epoch),
    layout TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS garbage (
    name TEXT PRIMARY KEY,
    channel TEXT NOT NULL,
    due_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS segments_by_channel_state ON segments (channel, state, base_offset);
CREATE TABLE IF NOT EXISTS state_totals (
    channel TEXT NOT NULL,
    state TEXT NOT NULL,
    segments INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    PRIMARY KEY (channel, state)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS object_refs (
    channel TEXT NOT NULL,
    name TEXT NOT NULL,
    refs INTEGER NOT NULL,
    PRIMARY KEY (channel, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS object_totals (channel TEXT PRIMARY KEY, objects INTEGER NOT NULL) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS segments_counted AFTER INSERT ON segments BEGIN
    INSERT INTO state_totals VALUES (NEW.channel, NEW.state, 1, NEW.size)
        ON CONFLICT (channel, state) DO UPDATE SET segments = segments + 1, bytes = bytes + NEW.size;
END;
CREATE TRIGGER IF NOT EXISTS segments_uncounted AFTER DELETE ON segments BEGIN
    UPDATE state_totals SET segments = segments - 1, bytes = bytes - OLD.size WHERE channel = OLD.channel AND state = OLD.state;
END;
CREATE TRIGGER IF NOT EXISTS segments_recounted AFTER UPDATE OF state, size ON segments BEGIN
    UPDATE state_totals SET segments = segments - 1, bytes = bytes - OLD.size WHERE channel = OLD.channel AND state = OLD.state;
    INSERT INTO state_totals VALUES (NEW.channel, NEW.state, 1, NEW.size)
        ON CONFLICT (channel, state) DO UPDATE SET segments = segments + 1, bytes = bytes + NEW.size;
END;
CREATE INDEX IF NOT EXISTS segments_by_time ON segments (channel, newest_through, base_offset);
CREATE TRIGGER IF NOT EXISTS segments_timed AFTER INSERT ON segments BEGIN
    UPDATE segments SET newest_through = max(NEW.max_timestamp, coalesce((
        SELECT newest_through FROM segments WHERE channel = NEW.channel AND base_offset < NEW.base_offset
        ORDER BY base_offset DESC LIMIT 1), NEW.max_timestamp))
        WHERE channel = NEW.channel AND base_offset = NEW.base_offset;
    UPDATE segments SET newest_through = NEW.max_timestamp
        WHERE channel = NEW.channel AND base_offset > NEW.base_offset AND newest_through < NEW.max_timestamp;
END;
CREATE TRIGGER IF NOT EXISTS chunks_counted AFTER INSERT ON chunks BEGIN
    INSERT INTO object_refs VALUES (NEW.channel, NEW.name, 1) ON CONFLICT (channel, name) DO UPDATE SET refs = refs + 1;
END;
CREATE TRIGGER IF NOT EXISTS chunks_uncounted AFTER DELETE ON chunks BEGIN
    UPDATE object_refs SET refs = refs - 1 WHERE channel = OLD.channel AND name = OLD.name;
    DELETE FROM object_refs WHERE channel = OLD.channel AND name = OLD.name AND refs = 0;
END;
CREATE TRIGGER IF NOT EXISTS objects_counted AFTER INSERT ON object_refs BEGIN
    INSERT INTO object_totals VALUES (NEW.channel, 1) ON CONFLICT (channel) DO UPDATE SET objects = objects + 1;
END;
CREATE TRIGGER IF NOT EXISTS objects_uncounted AFTER DELETE ON object_refs BEGIN
    UPDATE object_totals SET objects = objects - 1 WHERE channel = OLD.channel;
END;
"""
# Version 2 -> 3: totals per channel kept by triggers (segments and bytes per state, objects),
# so a status costs the same at any history length; filled once from the rows.
_TO_VERSION_3 = (
    "DELETE FROM state_totals",
    "INSERT INTO state_totals SELECT channel, state, count(*), sum(size) FROM segments GROUP BY channel, state",
    "DELETE FROM object_refs",
    "INSERT INTO object_refs SELECT channel, name, count(*) FROM chunks GROUP BY channel, name",
    "DELETE FROM object_totals",
    "INSERT INTO object_totals SELECT channel, count(*) FROM object_refs GROUP BY channel",
)
# Version 3 -> 4: ``newest_through``, the newest timestamp of a segment and every older one of its
# channel (any state), which never decreases along the base offsets: an index on it finds the
# first segment a search by time reads in a few probes (``first_at_time``). Kept by the trigger
# ``segments_timed``; filled once from the rows.
_TO_VERSION_4 = (
    "UPDATE segments SET newest_through = t.newest FROM (SELECT channel, base_offset, max(max_timestamp) OVER "
    "(PARTITION BY channel ORDER BY base_offset ROWS UNBOUNDED PRECEDING) AS newest FROM segments) AS t "
    "WHERE segments.channel = t.channel AND segments.base_offset = t.base_offset",
)
# Version 1 -> 2: the state "lost", chunks inside merged objects (object_offset; a name may
# repeat), merges in progress and garbage. SQLite cannot change a CHECK or UNIQUE constraint,
# so both tables are rebuilt (foreign keys off meanwhile, or dropping segments would cascade).
_TO_VERSION_2 = (
    _SEGMENTS_TABLE.format(name="segments_v2"),
    "INSERT INTO segments_v2 ({columns}, created_at_ms, updated_at_ms) SELECT {columns}, created_at_ms, updated_at_ms "
    "FROM segments",
    "DROP TABLE segments",
    "ALTER TABLE segments_v2 RENAME TO segments",
    _SEGMENTS_INDEX,
    _CHUNKS_TABLE.format(name="chunks_v2"),
    "INSERT INTO chunks_v2 SELECT channel, base_offset, seq, name, position, length, 0 FROM chunks",
    "DROP TABLE chunks",
    "ALTER TABLE chunks_v2 RENAME TO chunks",
    _CHUNKS_INDEX,
)

_SEGMENT_COLUMNS = "channel, base_offset, end_offset, size, max_timestamp, state, epoch, manifest"
_SegmentRow = tuple[str, int, int, int, int, str, int, "str | None"]  # a row of _SEGMENT_COLUMNS
# The one segment that can hold OFFSET: segments never overlap, so it is the one with the
# greatest base offset <= OFFSET (a probe of the primary key, not a scan).
SEGMENT_AT = f"SELECT {_SEGMENT_COLUMNS} FROM segments WHERE channel = ? AND base_offset <= ? ORDER BY base_offset DESC LIMIT 1"
# The only segment that can overlap [base, end): the one with the greatest base offset < end.
_LAST_BEFORE = f"SELECT {_SEGMENT_COLUMNS} FROM segments WHERE channel = ? AND base_offset < ? ORDER BY base_offset DESC LIMIT 1"
_CHUNKS_OF = "SELECT name, position, length, object_offset FROM chunks WHERE channel = ? AND base_offset = ? ORDER BY seq"
_INSERT_CHUNK = (
    "INSERT INTO chunks (channel, base_offset, seq, name, position, length, object_offset) VALUES (?, ?, ?, ?, ?, ?, ?)"
)

_HINTS = {
    "SQLITE_CORRUPT": "the file is damaged: it is an index of the bucket, rebuilt from the manifests in tier-2 when next opened",
    "SQLITE_NOTADB": "the file is not a tier metadata database: it is an index of the bucket, rebuilt when next opened",
    "SQLITE_BUSY": "another process held it longer than the busy timeout; retry",
    "SQLITE_LOCKED": "another connection held it longer than the busy timeout; retry",
    "SQLITE_CANTOPEN": "check that its folder exists and is writable",
    "SQLITE_READONLY": "check that the file and its folder are writable",
    "SQLITE_PERM": "check that the file and its folder are writable",
    "SQLITE_FULL": "free some disk space and retry",
    "SQLITE_IOERR": "the disk failed to read or write it; check the disk",
}


@dataclass(frozen=True)
class ChannelSummary:
    """What tier-2 holds of one channel, for a status command.

    ``segments`` and ``bytes`` count per state (every state present, zero included);
    ``first_offset`` / ``end_offset`` span the uploaded segments (None if there are none).
    """

    channel: str
    segments: dict[str, int]
    bytes: dict[str, int]
    first_offset: int | None
    end_offset: int | None


@dataclass(frozen=True)
class EpochRecord:
    """One epoch taken in the store: by whom (e.g. host:pid) and when."""

    epoch: int
    owner: str
    taken_at_ms: int


@dataclass(frozen=True)
class Merge:
    """A defragmentation in progress: object ``name`` (a :func:`.layout.merged_name` of ``channel``
    and ``epoch``) is the concatenation of the objects ``sources``, in order, and ``layout``
    maps the base offset of each segment whose chunks move into it to its new chunk list."""

    name: str
    channel: str
    epoch: int
    sources: tuple[str, ...]
    layout: dict[int, tuple[ChunkRecord, ...]]

    def encode(self) -> str:
        return json.dumps(
            {
                "sources": list(self.sources),
                "segments": {
                    str(b): [[c.name, c.position, c.length, c.object_offset] for c in cs] for b, cs in self.layout.items()
                },
            },
            sort_keys=True,
        )

    @classmethod
    def decode(cls, name: str, channel: str, epoch: int, text: str) -> Merge:
        raw = json.loads(text)
        layout = {int(b): tuple(ChunkRecord(*c) for c in cs) for b, cs in raw["segments"].items()}
        return cls(name, channel, epoch, tuple(raw["sources"]), layout)


def _merge_problem(record: SegmentRecord, merge: Merge) -> str | None:
    """Why ``merge`` does not fit ``record`` as it is now (None if it does): the objects of the
    segment that are not sources must be the ones it keeps, and only sources may move."""
    now = {c.name for c in record.chunks}
    new = {c.name for c in merge.layout[record.base_offset]}
    if now - set(merge.sources) != new - {merge.name} or not now & set(merge.sources):
        return f"segment {record.channel}@{record.base_offset} does not hold what merge {merge.name!r} planned (it changed?)"
    return None


class TierMetadata:
    """The metadata of the segments of one root in tier-2 (see the module docstring for its invariants).

    ``busy_timeout_ms`` is how long an operation waits for another process's transaction
    before failing with a :class:`TierError`.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 30_000) -> None:
        self.path = os.fspath(path)
        check_int("busy_timeout_ms", busy_timeout_ms, 0, 2**31 - 1)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        with self._errors("open"):
            db = sqlite3.connect(self.path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False)
        try:
            with self._errors("open"):
                self._configure(db, deadline=time.monotonic() + busy_timeout_ms / 1000)
            self._migrate(db)
        except BaseException:
            db.close()
            raise
        self._db = db
        self._file_id = _file_id(self.path)

    def replaced(self) -> bool:
        """Whether the file at ``path`` is no longer the one this instance opened (moved aside,
        deleted or replaced by another process): its commits would go to a file nobody reads.
        One ``stat``; the caller reopens."""
        return _file_id(self.path) != self._file_id

    def _configure(self, db: sqlite3.Connection, deadline: float) -> None:
        mode = _journal_mode_wal(db, deadline)
        if mode.lower() != "wal":
            raise TierError(
                f"tier metadata {self.path!r} cannot use write-ahead logging (journal mode {mode!r}); use a local disk"
            )
        # FULL, not NORMAL: with WAL, NORMAL syncs the log only at checkpoints, so a commit can
        # be lost on a power cut. A committed "uploaded" lets the local copy be deleted right
        # after; losing that commit would leave a segment neither on local disk nor in the
        # metadata (its objects then look like orphans). One fsync per commit is cheap: commits
        # are per segment, not per record.
        db.execute("PRAGMA synchronous = FULL")
        db.execute("PRAGMA foreign_keys = ON")

    def _schema_version(self, db: sqlite3.Connection) -> int | None:
        """The schema version of the database (None if it has no schema yet); refuses a newer one."""
        has_version = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
        version = db.execute("SELECT max(version) FROM schema_version").fetchone()[0] if has_version else None
        if version is not None and version > SCHEMA_VERSION:
            raise TierError(
                f"tier metadata {self.path!r} has schema version {version}, newer than this filechannel reads "
                f"({SCHEMA_VERSION}): upgrade filechannel"
            )
        return version

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Create the schema if it is missing, or migrate an older one, in one transaction (a
        read suffices when it is current: opening never waits for a writer)."""
        with self._transaction("open", db=db, write=False):
            if self._schema_version(db) == SCHEMA_VERSION:
                return
        with self._errors("migrate the schema"):
            db.execute("PRAGMA foreign_keys = OFF")  # a no-op inside a transaction: set before it
        try:
            with self._transaction("create the schema", db=db, write=True):
                version = self._schema_version(db)  # again: another process may have done it meanwhile
                if version == 1:
                    for statement in _TO_VERSION_2:
                        db.execute(statement.format(columns=_SEGMENT_COLUMNS))
                    if db.execute("PRAGMA foreign_key_check").fetchone() is not None:
                        raise TierError(f"cannot migrate tier metadata {self.path!r}: a chunk names no segment")
                if version is not None and "newest_through" not in {c[1] for c in db.execute("PRAGMA table_info(segments)")}:
                    db.execute("ALTER TABLE segments ADD COLUMN newest_through INTEGER")
                for statement in _schema_statements():
                    db.execute(statement)
                if version is not None:
                    for statement in _TO_VERSION_3 + _TO_VERSION_4:
                        db.execute(statement)
                if version is None:
                    db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                else:
                    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        finally:
            with self._errors("migrate the schema"):
                db.execute("PRAGMA foreign_keys = ON")

    # -- transactions and errors ------------------------------------------------------------

    def _tier_error(self, action: str, exc: sqlite3.Error) -> TierError:
        name = getattr(exc, "sqlite_errorname", "") or ""
        hint = next((h for code, h in _HINTS.items() if name == code or name.startswith(code + "_")), "")
        damaged = name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))
        kind = MetadataDamagedError if damaged else TierError
        return kind(f"cannot {action}: tier metadata {self.path!r}: {exc}" + (f"; {hint}" if hint else ""))

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Translate sqlite3 errors into :class:`TierError` naming the action and the database."""
        try:
            yield
        except sqlite3.Error as exc:
            raise self._tier_error(action, exc) from exc

    @contextmanager
    def _transaction(
        self, action: str, *, write: bool, epoch: int | None = None, db: sqlite3.Connection | None = None
    ) -> Iterator[sqlite3.Connection]:
        """One transaction: BEGIN IMMEDIATE (a write) or BEGIN (a consistent read), the epoch check
        first when ``epoch`` is given, COMMIT if the body returns, ROLLBACK if it raises."""
        with self._lock, self._errors(action):
            db = db or self._db
            if db is None:
                raise TierError(f"cannot {action}: tier metadata {self.path!r} is closed")
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                if epoch is not None:
                    self._check_epoch(db, epoch)
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    # the error being raised says more than a failed rollback; SQLite rolls back a broken transaction itself
                    with suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise

    @staticmethod
    def _current(db: sqlite3.Connection) -> tuple[int, str | None]:
        row = db.execute("SELECT epoch, owner FROM epochs ORDER BY epoch DESC LIMIT 1").fetchone()
        return (row[0], row[1]) if row else (0, None)

    def _check_epoch(self, db: sqlite3.Connection, epoch: int) -> None:
        current, owner = self._current(db)
        if epoch == current:
            return
        if epoch < current:
            raise FencedError(
                f"uploader epoch {epoch} is fenced: another uploader ({owner!r}) took over with epoch {current} "
                f"in tier metadata {self.path!r}; stop this uploader (the new one cleans up after it)"
            )
        raise FencedError(
            f"uploader epoch {epoch} was never taken in tier metadata {self.path!r} (its current epoch is {current}): "
            "was the file replaced? stop this uploader"
        )

    @staticmethod
    def _record(db: sqlite3.Connection, row: _SegmentRow) -> SegmentRecord:
        chunks = tuple(ChunkRecord(*c) for c in db.execute(_CHUNKS_OF, (row[0], row[1])))
        return SegmentRecord(*row[:7], chunks=chunks, manifest=row[7])

    def _require(
        self, db: sqlite3.Connection, action: str, channel: str, base_offset: int, state: str | tuple[str, ...]
    ) -> SegmentRecord:
        row = db.execute(
            f"SELECT {_SEGMENT_COLUMNS} FROM segments WHERE channel = ? AND base_offset = ?", (channel, base_offset)
        ).fetchone()
        if row is None:
            raise TierError(f"{action} refused: no segment {channel}@{base_offset} in tier metadata {self.path!r}")
        wanted = (state,) if isinstance(state, str) else state
        if row[5] not in wanted:
            raise TierError(
                f"{action} refused: segment {channel}@{base_offset} is {row[5]}, not {' or '.join(wanted)} "
                f"(tier metadata {self.path!r})"
            )
        return self._record(db, row)

    @staticmethod
    def _key(channel: str, base_offset: int) -> tuple[str, int]:
        return validate_channel(channel), check_int("base offset", base_offset, 0, MAX_OFFSET)

    @staticmethod
    def _epoch(epoch: int) -> int:
        return check_int("epoch", epoch, 1, MAX_EPOCH)

    # -- epochs -------------------------------------------------------------------------------

    def take_epoch(self, owner: str, *, above: int = 0) -> int:
        """A new epoch for an uploader named ``owner`` (e.g. host and pid), newer than every epoch
        before and than ``above`` (the newest epoch the bucket holds: the store may have been lost).

        From this commit on, every change made with an older epoch raises :class:`FencedError`.
        """
        if not isinstance(owner, str) or not owner:
            raise ConfigError(f"owner {owner!r} must be a non-empty str (e.g. host and pid)")
        check_int("above", above, 0, MAX_EPOCH)
        with self._transaction("take an epoch", write=True) as db:
            current = max(self._current(db)[0], above)
            if current >= MAX_EPOCH:
                raise TierError(f"tier metadata {self.path!r} has used every epoch up to {MAX_EPOCH}")
            db.execute("INSERT INTO epochs (epoch, owner, taken_at_ms) VALUES (?, ?, ?)", (current + 1, owner, now_ms()))
        return current + 1

    def current_epoch(self) -> int:
        """The newest epoch taken (0 if none was)."""
        with self._transaction("read the current epoch", write=False) as db:
            return self._current(db)[0]

    # -- state changes ------------------------------------------------------------------------

    def begin_upload(
        self,
        epoch: int,
        channel: str,
        base_offset: int,
        end_offset: int,
        size: int,
        max_timestamp: int,
        chunks: Sequence[ChunkRecord],
    ) -> None:
        """Record segment ``[base_offset, end_offset)`` as "uploading", with the chunks it will be written as.

        Call before writing any object. ``chunks`` (e.g. from :func:`.layout.plan_chunks`) must
        cover ``[0, size)`` and be named for this segment and ``epoch``. Refused (TierError) if
        the range overlaps any segment of the channel in any state.
        """
        self._epoch(epoch)
        self._key(channel, base_offset)
        check_int("end offset", end_offset, 0, MAX_OFFSET)
        check_int("size", size, 1, MAX_OFFSET)
        check_int("max timestamp", max_timestamp, MIN_TIMESTAMP, MAX_TIMESTAMP)
        record = SegmentRecord(channel, base_offset, end_offset, size, max_timestamp, UPLOADING, epoch, tuple(chunks), None)
        problem = segment_problem(record)
        if problem:
            raise TierError(f"begin_upload refused: {problem}")
        with self._transaction(f"begin the upload of {channel}@{base_offset}", write=True, epoch=epoch) as db:
            row = db.execute(_LAST_BEFORE, (channel, end_offset)).fetchone()
            if row is not None and row[2] > base_offset:
                what = "abandon that upload first" if row[5] == UPLOADING else "it is already in tier-2"
                raise TierError(
                    f"begin_upload refused: segment {channel}@[{base_offset}, {end_offset}) overlaps segment "
                    f"@[{row[1]}, {row[2]}) which is {row[5]} (epoch {row[6]}): {what}"
                )
            now = now_ms()
            db.execute(
                f"INSERT INTO segments ({_SEGMENT_COLUMNS}, created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (channel, base_offset, end_offset, size, max_timestamp, UPLOADING, epoch, None, now, now),
            )
            db.executemany(
                _INSERT_CHUNK,
                [
                    (channel, base_offset, seq, c.name, c.position, c.length, c.object_offset)
                    for seq, c in enumerate(record.chunks)
                ],
            )

    def finish_upload(
        self, epoch: int, channel: str, base_offset: int, chunks: Sequence[ChunkRecord], manifest: str
    ) -> SegmentRecord:
        """Mark an upload begun by this epoch "uploaded", once its chunks and then its manifest are written.

        ``chunks`` must be the chunks given to :meth:`begin_upload` and ``manifest`` the
        segment's :func:`.layout.manifest_name`. After this commit the local copy may go.
        """
        self._epoch(epoch)
        self._key(channel, base_offset)
        with self._transaction(f"finish the upload of {channel}@{base_offset}", write=True, epoch=epoch) as db:
            record = self._require(db, "finish_upload", channel, base_offset, UPLOADING)
            if record.epoch != epoch:
                raise TierError(
                    f"finish_upload refused: the upload of {channel}@{base_offset} was begun by epoch {record.epoch}, "
                    f"not {epoch}: abandon it and upload the segment again"
                )
            if tuple(chunks) != record.chunks:
                problem = chunks_problem(record, tuple(chunks)) or "they are not the chunks given to begin_upload"
                raise TierError(f"finish_upload refused: {problem}")
            expected = manifest_name(channel, base_offset, epoch)
            if manifest != expected:
                raise TierError(
                    f"finish_upload refused: the manifest of {channel}@{base_offset} is {expected!r}, not {manifest!r}"
                )
            db.execute(
                "UPDATE segments SET state = ?, manifest = ?, updated_at_ms = ? WHERE channel = ? AND base_offset = ?",
                (UPLOADED, manifest, now_ms(), channel, base_offset),
            )
        return replace(record, state=UPLOADED, manifest=manifest)

    def begin_delete(self, epoch: int, channel: str, base_offset: int) -> SegmentRecord:
        """Mark an uploaded (or lost) segment "deleting" (readers stop using it) before its objects are deleted."""
        what = f"begin deleting {channel}@{base_offset}"
        return self._move(epoch, channel, base_offset, "begin_delete", what, LISTED, DELETING)

    def mark_lost(self, epoch: int, channel: str, base_offset: int) -> SegmentRecord:
        """Mark an uploaded segment "lost": its objects are missing or damaged and no copy is left.

        Its row stays (its offsets are never reused, and never silently skipped): readers
        list it and raise :class:`~filechannel.errors.TierDataLostError` naming its offsets;
        retention deletes it like any other segment.
        """
        return self._move(epoch, channel, base_offset, "mark_lost", f"mark {channel}@{base_offset} lost", UPLOADED, LOST)

    def _move(
        self, epoch: int, channel: str, base_offset: int, action: str, what: str, before: str | tuple[str, ...], after: str
    ) -> SegmentRecord:
        """Move a segment from a state in ``before`` to ``after``, in one fenced transaction."""
        self._epoch(epoch)
        self._key(channel, base_offset)
        with self._transaction(what, write=True, epoch=epoch) as db:
            record = self._require(db, action, channel, base_offset, before)
            db.execute(
                "UPDATE segments SET state = ?, updated_at_ms = ? WHERE channel = ? AND base_offset = ?",
                (after, now_ms(), channel, base_offset),
            )
        return replace(record, state=after)

    def finish_delete(self, epoch: int, channel: str, base_offset: int) -> None:
        """Remove a "deleting" segment and its chunks, once its objects are deleted."""
        self._epoch(epoch)
        self._key(channel, base_offset)
        with self._transaction(f"finish deleting {channel}@{base_offset}", write=True, epoch=epoch) as db:
            self._require(db, "finish_delete", channel, base_offset, DELETING)
            db.execute("DELETE FROM segments WHERE channel = ? AND base_offset = ?", (channel, base_offset))

    def abandon_upload(self, epoch: int, channel: str, base_offset: int) -> list[str]:
        """Drop an "uploading" segment (of any epoch) and return every object name its attempt may have written.

        The caller deletes those names (missing is success) before the segment is uploaded again: a
        retry in the same epoch writes the same names, so its objects must not race the deletes.
        """
        self._epoch(epoch)
        self._key(channel, base_offset)
        with self._transaction(f"abandon the upload of {channel}@{base_offset}", write=True, epoch=epoch) as db:
            record = self._require(db, "abandon_upload", channel, base_offset, UPLOADING)
            db.execute("DELETE FROM segments WHERE channel = ? AND base_offset = ?", (channel, base_offset))
        return [c.name for c in record.chunks] + [manifest_name(channel, base_offset, record.epoch)]

    def stale_uploads(self, epoch: int) -> list[SegmentRecord]:
        """The "uploading" segments of older epochs, of every channel: what a new uploader must abandon first."""
        self._epoch(epoch)
        with self._transaction("list stale uploads", write=True, epoch=epoch) as db:
            rows = db.execute(
                f"SELECT {_SEGMENT_COLUMNS} FROM segments WHERE state = ? AND epoch < ? ORDER BY channel, base_offset",
                (UPLOADING, epoch),
            ).fetchall()
            return [self._record(db, row) for row in rows]

    # -- queries ------------------------------------------------------------------------------

    def segments(
        self, channel: str, states: Iterable[str] = LISTED, *, from_offset: int = 0, limit: int | None = None
    ) -> list[SegmentRecord]:
        """The segments of ``channel`` in ``states`` with a base offset >= ``from_offset``, by base
        offset, the first ``limit`` of them if given (by default what readers list: "uploaded", and
        "lost" ones whose reads raise naming their offsets). A range of the primary key: what the
        local segments overlap, or a page from the oldest, costs the same at any history length."""
        validate_channel(channel)
        check_int("from_offset", from_offset, 0, MAX_OFFSET)
        if limit is not None:
            check_int("limit", limit, 1, MAX_OFFSET)
        wanted = tuple(states)
        if not wanted or any(s not in STATES for s in wanted):
            raise ConfigError(f"states {wanted!r} must be some of {STATES}")
        marks = ", ".join("?" * len(wanted))
        # Rows in a passing state ("uploading", "deleting") are few: find them by the state's
        # index, never by a walk of the channel's rows (which SQLite's planner may prefer).
        by = "INDEXED BY segments_by_channel_state " if UPLOADED not in wanted else ""
        with self._transaction(f"list the segments of {channel}", write=False) as db:
            rows = db.execute(
                f"SELECT {_SEGMENT_COLUMNS} FROM segments {by}WHERE channel = ? AND base_offset >= ? AND state IN ({marks}) "
                "ORDER BY base_offset LIMIT ?",
                (channel, from_offset, *wanted, -1 if limit is None else limit),
            ).fetchall()
            return [self._record(db, row) for row in rows]

    def segment_for(self, channel: str, offset: int) -> SegmentRecord | None:
        """The uploaded (or lost) segment of ``channel`` holding ``offset``, or None (one probe of the index)."""
        validate_channel(channel)
        check_int("offset", offset, 0, MAX_OFFSET)
        with self._transaction(f"find offset {offset} of {channel}", write=False) as db:
            row = db.execute(SEGMENT_AT, (channel, offset)).fetchone()
            if row is None or row[5] not in LISTED or offset >= row[2]:
                return None
            return self._record(db, row)

    def floor(self, channel: str, offset: int) -> SegmentRecord | None:
        """The listed segment of ``channel`` with the greatest base offset <= ``offset`` (it may end
        before ``offset``: a hole follows it), or None: one probe of the primary key."""
        return self._probe(channel, "base_offset <= ? ORDER BY base_offset DESC", offset)

    def after(self, channel: str, base_offset: int) -> SegmentRecord | None:
        """The listed segment of ``channel`` with the least base offset > ``base_offset``, or None."""
        return self._probe(channel, "base_offset > ? ORDER BY base_offset", base_offset)

    def first_at_time(self, channel: str, timestamp: int) -> SegmentRecord | None:
        """The listed segment of ``channel`` with the least base offset whose newest record is at
        or after ``timestamp`` (the segment a search by time reads), or None.

        One probe of ``segments_by_time``: ``newest_through`` never decreases along the base
        offsets, so ordering by it orders by base offset, and the first row at or after
        ``timestamp`` is the oldest that can hold such a record; the rows after it that the
        index visits are only those whose own newest record is older (timestamps out of order)
        or that readers do not list."""
        validate_channel(channel)
        check_int("timestamp", timestamp, -(2**63), 2**63 - 1)
        marks = ", ".join("?" * len(LISTED))
        with self._transaction(f"find time {timestamp} in {channel}", write=False) as db:
            row = db.execute(
                f"SELECT {_SEGMENT_COLUMNS} FROM segments INDEXED BY segments_by_time WHERE channel = ? "
                f"AND newest_through >= ? AND max_timestamp >= ? AND state IN ({marks}) "
                "ORDER BY newest_through, base_offset LIMIT 1",
                (channel, timestamp, timestamp, *LISTED),
            ).fetchone()
            return None if row is None else self._record(db, row)

    def _probe(self, channel: str, where: str, offset: int) -> SegmentRecord | None:
        validate_channel(channel)
        check_int("offset", offset, 0, MAX_OFFSET)
        marks = ", ".join("?" * len(LISTED))
        with self._transaction(f"find offset {offset} of {channel}", write=False) as db:
            row = db.execute(
                f"SELECT {_SEGMENT_COLUMNS} FROM segments WHERE channel = ? AND state IN ({marks}) AND {where} LIMIT 1",
                (channel, *LISTED, offset),
            ).fetchone()
            return None if row is None else self._record(db, row)

    def bounds(self, channel: str) -> tuple[int, int] | None:
        """The first and end offsets of the segments readers list for ``channel`` (uploaded or
        lost), or None if it has none: two probes of the primary key, whatever the history."""
        validate_channel(channel)
        with self._transaction(f"read the bounds of {channel}", write=False) as db:
            return _span(db, channel, LISTED)

    def add_from_bucket(
        self, channel: str, segments: Sequence[SegmentRecord], epochs: Sequence[EpochRecord], first_offset: int
    ) -> tuple[int, int]:
        """Bring the index of ``channel`` up to the bucket, in one transaction; return (added, dropped).

        ``segments`` are what the bucket's manifests describe (see :mod:`.reindex`): each one
        that overlaps no row of the channel, in any state, is added as uploaded (a row under
        way is the running uploader's, never replaced); uploaded or lost rows that end at or
        below ``first_offset`` (retention deleted them from the bucket) are dropped. ``epochs``
        (the bucket's, and every epoch a segment names) are added where missing, so a running
        uploader whose epoch the bucket records keeps committing. No epoch check: the index
        follows the bucket whoever holds an epoch.
        """
        validate_channel(channel)
        for record in segments:
            problem = segment_problem(record)
            if problem or record.channel != channel:
                raise TierError(f"reindex refused: {problem or f'{record.channel} is not {channel}'}")
        marks = ", ".join("?" * len(LISTED))
        with self._transaction(f"reindex {channel} from the bucket", write=True) as db:
            db.executemany(
                "INSERT OR IGNORE INTO epochs (epoch, owner, taken_at_ms) VALUES (?, ?, ?)",
                [(e.epoch, e.owner, e.taken_at_ms) for e in epochs],
            )
            dropped = db.execute(
                f"DELETE FROM segments WHERE channel = ? AND state IN ({marks}) AND end_offset <= ?",
                (channel, *LISTED, first_offset),
            ).rowcount
            rows = db.execute("SELECT base_offset, end_offset FROM segments WHERE channel = ?", (channel,)).fetchall()
            added = [r for r in segments if not any(b < r.end_offset and r.base_offset < e for b, e in rows)]
            _insert_segments(db, [replace(r, state=UPLOADED) for r in added])
            return len(added), dropped

    def relocate(self, record: SegmentRecord) -> bool:
        """Give the listed row of ``record``'s segment (same channel, base offset, epoch, size and
        offsets) ``record``'s chunks, in one transaction: a bucket reader following a manifest that
        ``tier defrag`` rewrote after the reader indexed it. Whether the row was there to change;
        a row that differs in anything but its chunks is left alone (False)."""
        problem = segment_problem(record)
        if problem:
            raise TierError(f"relocate refused: {problem}")
        with self._transaction(f"relocate {record.channel}@{record.base_offset}", write=True) as db:
            row = db.execute(
                "SELECT end_offset, size, epoch FROM segments WHERE channel = ? AND base_offset = ? AND state = ?",
                (record.channel, record.base_offset, UPLOADED),
            ).fetchone()
            if row is None or tuple(row) != (record.end_offset, record.size, record.epoch):
                return False
            _replace_chunks(db, record.channel, record.base_offset, record.chunks)
            return True

    def snapshot(self, topic: str | None = None) -> tuple[list[EpochRecord], list[SegmentRecord]]:
        """Every epoch, and every segment (all states, with its chunks) of the store or of one
        ``topic`` (its channels ``topic/N``, or a standalone channel of that name), read in one
        transaction: a consistent picture even while a daemon commits."""
        where = ""
        args: tuple[object, ...] = ()
        if topic is not None:
            validate_channel(topic)
            where, args = "WHERE channel = ? OR substr(channel, 1, ?) = ?", (topic, len(topic) + 1, topic + "/")
        with self._transaction("read a snapshot", write=False) as db:
            epochs = [EpochRecord(*row) for row in db.execute("SELECT epoch, owner, taken_at_ms FROM epochs ORDER BY epoch")]
            rows = db.execute(f"SELECT {_SEGMENT_COLUMNS} FROM segments {where} ORDER BY channel, base_offset", args)
            return epochs, [self._record(db, row) for row in rows.fetchall()]

    def load(self, epochs: Sequence[EpochRecord], segments: Sequence[SegmentRecord]) -> None:
        """Fill an empty store with ``epochs`` and ``segments`` in one transaction (an import, a rebuild).

        Refused (TierError, nothing written) if the store holds any epoch or segment, if a
        segment breaks an invariant of :class:`SegmentRecord`, names an epoch not given, or
        overlaps another segment of its channel.
        """
        _check_snapshot("load", epochs, segments)
        with self._transaction("load a snapshot", write=True) as db:
            if db.execute("SELECT 1 FROM epochs UNION ALL SELECT 1 FROM segments LIMIT 1").fetchone():
                raise TierError(
                    f"load refused: tier metadata {self.path!r} is not empty; import into a root that has no tier metadata yet"
                )
            db.executemany(
                "INSERT INTO epochs (epoch, owner, taken_at_ms) VALUES (?, ?, ?)",
                [(e.epoch, e.owner, e.taken_at_ms) for e in epochs],
            )
            _insert_segments(db, segments)

    def mirror(self, epochs: Sequence[EpochRecord], segments: Sequence[SegmentRecord]) -> tuple[int, int]:
        """Make the store list exactly ``segments`` (what the bucket's manifests describe), in one
        transaction: a replica's refresh (``tier rebuild --refresh``), whose index is the bucket's
        alone (no uploader of its own, so no row under way to keep, no epoch to check). Uploads
        since appear, segments retention deleted vanish, a merge's new layout replaces the old;
        ``epochs`` are added where missing. Checked as :meth:`load` checks. Returns (rows before,
        rows after). A reader of the store sees the old listing or the new one, never a mix."""
        _check_snapshot("refresh", epochs, segments)
        with self._transaction("refresh from the bucket", write=True) as db:
            db.executemany(
                "INSERT OR IGNORE INTO epochs (epoch, owner, taken_at_ms) VALUES (?, ?, ?)",
                [(e.epoch, e.owner, e.taken_at_ms) for e in epochs],
            )
            before = db.execute("SELECT count(*) FROM segments").fetchone()[0]
            db.execute("DELETE FROM chunks")
            db.execute("DELETE FROM segments")
            _insert_segments(db, segments)
            return int(before), len(segments)

    # -- defragmentation ---------------------------------------------------------------------

    def begin_merge(self, epoch: int, merge: Merge) -> None:
        """Record a merge before its object is written (so it is never taken for an orphan).

        Refused (TierError) unless every segment of ``merge.layout`` is uploaded, its new
        chunks are valid for it, and only its objects among ``merge.sources`` change.
        """
        self._epoch(epoch)
        validate_channel(merge.channel)
        if merge.epoch != epoch or not merge.layout:
            raise TierError(
                f"begin_merge refused: merge {merge.name!r} of epoch {merge.epoch} with {len(merge.layout)} segment(s)"
            )
        with self._transaction(f"begin merging into {merge.name}", write=True, epoch=epoch) as db:
            for base, chunks in merge.layout.items():
                record = self._require(db, "begin_merge", merge.channel, base, UPLOADED)
                problem = chunks_problem(record, chunks) or _merge_problem(record, merge)
                if problem:
                    raise TierError(f"begin_merge refused: {problem}")
            db.execute(
                "INSERT INTO merges (name, channel, epoch, layout, created_at_ms) VALUES (?, ?, ?, ?, ?)",
                (merge.name, merge.channel, epoch, merge.encode(), now_ms()),
            )

    def finish_merge(self, epoch: int, name: str, garbage_delay_ms: int) -> list[str]:
        """Swap the segments of merge ``name`` to their new chunks in one transaction, and record
        the objects no chunk names any more as garbage, to delete ``garbage_delay_ms`` from now
        (a reader that planned with the old names still reads them meanwhile). Returns those names."""
        self._epoch(epoch)
        with self._transaction(f"finish merging into {name}", write=True, epoch=epoch) as db:
            merge = self._merge(db, name)
            for base, chunks in merge.layout.items():
                record = self._require(db, "finish_merge", merge.channel, base, UPLOADED)
                problem = _merge_problem(record, merge)
                if problem:
                    raise TierError(f"finish_merge refused: {problem}")
                _replace_chunks(db, merge.channel, base, chunks)
            unused = [n for n in merge.sources if db.execute("SELECT 1 FROM chunks WHERE name = ?", (n,)).fetchone() is None]
            due = now_ms() + garbage_delay_ms
            db.executemany(
                "INSERT OR REPLACE INTO garbage (name, channel, due_at_ms) VALUES (?, ?, ?)",
                [(n, merge.channel, due) for n in unused],
            )
            db.execute("DELETE FROM merges WHERE name = ?", (name,))
        return unused

    def abandon_merge(self, epoch: int, name: str, garbage_delay_ms: int | None = None) -> Merge:
        """Drop merge ``name`` (of any epoch); the caller restores the manifests. With
        ``garbage_delay_ms``, its object becomes garbage due that much later (a defragmenter
        overtaken mid-merge may still write a manifest naming it: see :func:`.defrag.clean_up`);
        without, the caller deletes it."""
        self._epoch(epoch)
        with self._transaction(f"abandon the merge into {name}", write=True, epoch=epoch) as db:
            merge = self._merge(db, name)
            db.execute("DELETE FROM merges WHERE name = ?", (name,))
            if garbage_delay_ms is not None:
                db.execute(
                    "INSERT OR REPLACE INTO garbage (name, channel, due_at_ms) VALUES (?, ?, ?)",
                    (name, merge.channel, now_ms() + garbage_delay_ms),
                )
        return merge

    def _merge(self, db: sqlite3.Connection, name: str) -> Merge:
        row = db.execute("SELECT name, channel, epoch, layout FROM merges WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise TierError(f"no merge into {name!r} in tier metadata {self.path!r}")
        return Merge.decode(*row)

    def merges(self, channel: str | None = None) -> list[Merge]:
        """The merges begun and neither finished nor abandoned (of ``channel``, or all)."""
        where, args = ("WHERE channel = ?", (channel,)) if channel is not None else ("", ())
        with self._transaction("list merges", write=False) as db:
            rows = db.execute(f"SELECT name, channel, epoch, layout FROM merges {where} ORDER BY name", args).fetchall()
        return [Merge.decode(*row) for row in rows]

    def garbage(self, channel: str, due_by_ms: int | None = None) -> list[str]:
        """Objects of ``channel`` replaced by a merge and not deleted yet (only those due by ``due_by_ms`` if given)."""
        validate_channel(channel)
        limit = MAX_OFFSET if due_by_ms is None else due_by_ms
        with self._transaction(f"list the garbage of {channel}", write=False) as db:
            rows = db.execute("SELECT name FROM garbage WHERE channel = ? AND due_at_ms <= ? ORDER BY name", (channel, limit))
            return [row[0] for row in rows]

    def forget_garbage(self, epoch: int, names: Sequence[str]) -> None:
        """Drop garbage rows once their objects are deleted."""
        self._epoch(epoch)
        with self._transaction("forget deleted garbage", write=True, epoch=epoch) as db:
            db.executemany("DELETE FROM garbage WHERE name = ?", [(n,) for n in names])

    def shared(self, channel: str, base_offset: int, names: Sequence[str]) -> set[str]:
        """Those of ``names`` that chunks of another segment than ``channel@base_offset`` still name
        (a merged object shared by segments: deleting one segment must leave it)."""
        with self._transaction("find shared objects", write=False) as db:
            return {
                n
                for n in names
                if db.execute(
                    "SELECT 1 FROM chunks WHERE name = ? AND NOT (channel = ? AND base_offset = ?) LIMIT 1",
                    (n, channel, base_offset),
                ).fetchone()
            }

    def channels(self) -> list[str]:
        """Every channel with a segment in the metadata, sorted."""
        with self._transaction("list channels", write=False) as db:
            return [row[0] for row in db.execute("SELECT DISTINCT channel FROM segments ORDER BY channel")]

    def object_count(self, channel: str) -> int:
        """Distinct objects the chunks of ``channel`` are in, whatever their segments' states (a total
        the triggers keep: one probe)."""
        validate_channel(channel)
        with self._transaction(f"count the objects of {channel}", write=False) as db:
            row = db.execute("SELECT objects FROM object_totals WHERE channel = ?", (channel,)).fetchone()
            return 0 if row is None else int(row[0])

    def summary(self, channel: str | None = None) -> list[ChannelSummary]:
        """Per channel (or for ``channel`` only): segments and bytes per state (totals the triggers
        keep), and the uploaded offsets' span (two probes): the same cost at any history length."""
        if channel is not None:
            validate_channel(channel)
        where, args = ("WHERE channel = ?", (channel,)) if channel is not None else ("", ())
        with self._transaction("summarize", write=False) as db:
            rows = db.execute(
                f"SELECT channel, state, segments, bytes FROM state_totals {where} ORDER BY channel", args
            ).fetchall()
            summaries = []
            for name, group in groupby(rows, key=itemgetter(0)):
                per_state = {state: (count, size) for _, state, count, size in group}
                if not any(count for count, _ in per_state.values()):
                    continue
                counts = {state: per_state.get(state, (0, 0))[0] for state in STATES}
                sizes = {state: per_state.get(state, (0, 0))[1] for state in STATES}
                span = _span(db, name, (UPLOADED,))
                summaries.append(ChannelSummary(name, counts, sizes, *(span or (None, None))))
        return summaries

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise :class:`TierError`."""
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            with self._errors("close"):
                db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TierMetadata({self.path!r})"


def _span(db: sqlite3.Connection, channel: str, states: Sequence[str]) -> tuple[int, int] | None:
    """First and end offsets of ``channel``'s segments in ``states`` (two probes of an index), or None."""
    marks = ", ".join("?" * len(states))
    where = f"FROM segments WHERE channel = ? AND state IN ({marks}) ORDER BY base_offset"
    first = db.execute(f"SELECT base_offset {where} LIMIT 1", (channel, *states)).fetchone()
    last = db.execute(f"SELECT end_offset {where} DESC LIMIT 1", (channel, *states)).fetchone()
    return None if first is None else (first[0], last[0])


def _check_snapshot(what: str, epochs: Sequence[EpochRecord], segments: Sequence[SegmentRecord]) -> None:
    """Refuse (TierError, ``what`` refused) epochs without an owner or out of range, and segments
    that break an invariant of :class:`SegmentRecord`, name an epoch not given, or overlap
    another segment of their channel."""
    named = set()
    for e in epochs:
        check_int("epoch", e.epoch, 1, MAX_EPOCH)
        if not isinstance(e.owner, str) or not e.owner:
            raise TierError(f"{what} refused: epoch {e.epoch} has no owner")
        named.add(e.epoch)
    last: dict[str, SegmentRecord] = {}
    for record in sorted(segments, key=lambda r: (r.channel, r.base_offset)):
        problem = segment_problem(record)
        if problem:
            raise TierError(f"{what} refused: {problem}")
        if record.epoch not in named:
            where = f"{record.channel}@{record.base_offset}"
            raise TierError(f"{what} refused: segment {where} names epoch {record.epoch}, which is not given")
        before = last.get(record.channel)
        if before is not None and before.end_offset > record.base_offset:
            raise TierError(
                f"{what} refused: segment {record.channel}@[{record.base_offset}, {record.end_offset}) overlaps "
                f"@[{before.base_offset}, {before.end_offset})"
            )
        last[record.channel] = record


def _replace_chunks(db: sqlite3.Connection, channel: str, base_offset: int, chunks: Sequence[ChunkRecord]) -> None:
    """The segment's chunks become ``chunks`` (its bytes moved: a merge), in the caller's transaction."""
    db.execute("DELETE FROM chunks WHERE channel = ? AND base_offset = ?", (channel, base_offset))
    db.executemany(
        _INSERT_CHUNK,
        [(channel, base_offset, seq, c.name, c.position, c.length, c.object_offset) for seq, c in enumerate(chunks)],
    )
    db.execute("UPDATE segments SET updated_at_ms = ? WHERE channel = ? AND base_offset = ?", (now_ms(), channel, base_offset))


def _insert_segments(db: sqlite3.Connection, segments: Sequence[SegmentRecord]) -> None:
    """Insert ``segments`` (checked by the caller) and their chunks, in the caller's transaction."""
    now = now_ms()
    db.executemany(
        f"INSERT INTO segments ({_SEGMENT_COLUMNS}, created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (r.channel, r.base_offset, r.end_offset, r.size, r.max_timestamp, r.state, r.epoch, r.manifest, now, now)
            for r in segments
        ],
    )
    db.executemany(
        _INSERT_CHUNK,
        [
            (r.channel, r.base_offset, seq, c.name, c.position, c.length, c.object_offset)
            for r in segments
            for seq, c in enumerate(r.chunks)
        ],
    )


def _schema_statements() -> list[str]:
    """``_SCHEMA`` cut into statements (a trigger's body holds semicolons: it ends at ``END;``)."""
    statements, current = [], ""
    for piece in _SCHEMA.split(";"):
        current += piece + ";"
        if current.strip() == ";":
            current = ""
            continue
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return statements


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _journal_mode_wal(db: sqlite3.Connection, deadline: float) -> str:
    """Switch ``db`` to WAL and return the journal mode it then has.

    SQLite does not call the busy handler for this pragma: while another process creates or
    switches the same new database, it fails at once with "database is locked" (often, when
    a few processes open one new file together). So it is retried with a short
    randomised wait until ``deadline`` (the busy timeout), like any other locked statement.
    """
    wait = 0.001
    while True:
        try:
            return str(db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if (
                getattr(exc, "sqlite_errorcode", None) not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                or time.monotonic() >= deadline
            ):
                raise
        time.sleep(random.uniform(0, wait))
        wait = min(wait * 2, 0.05)
