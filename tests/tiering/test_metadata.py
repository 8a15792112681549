"""The tier-2 metadata store: a state machine against an in-memory model, the invariants it refuses
to break, its errors, and real processes sharing one database (concurrent epochs, a paused uploader
fenced on resume, SIGKILL in the middle of a stream of transactions).

This file is also the child process of the cross-process tests: ``python test_metadata.py CMD ...``.
"""

import itertools
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from filechannel.errors import ConfigError, FencedError, InvalidNameError, MetadataDamagedError, TierError
from filechannel.tiering.layout import (
    STATES,
    ChunkRecord,
    SegmentRecord,
    chunks_problem,
    manifest_name,
    plan_chunks,
)
from filechannel.tiering.metadata import SCHEMA_VERSION, SEGMENT_AT, TierMetadata

from .conftest import wait_for

CHANNELS = ("a", "t/0")
PROCS = Path(__file__).with_name("metadata_procs.py")  # the child processes' side of the tests below


def upload(meta, epoch, channel, base, end, size=100, chunk_bytes=30, ts=0):
    """begin_upload then finish_upload of one segment; returns the committed record."""
    chunks = plan_chunks(channel, base, epoch, size, chunk_bytes)
    meta.begin_upload(epoch, channel, base, end, size, ts, chunks)
    return meta.finish_upload(epoch, channel, base, chunks, manifest_name(channel, base, epoch))


def dump(path):
    """Every row of every table, read with a separate connection."""
    with closing(sqlite3.connect(path)) as db, db:
        return {t: db.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in ("epochs", "segments", "chunks")}


@pytest.fixture
def meta(tmp_path):
    m = TierMetadata(tmp_path / "metadata.db")
    yield m
    m.close()


# -- the state machine ---------------------------------------------------------------------------


class MetadataMachine(RuleBasedStateMachine):
    """TierMetadata against a dict of SegmentRecords and a counter of epochs."""

    def __init__(self):
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="fc-tier-meta-")
        self.path = os.path.join(self.dir, "metadata.db")
        self.meta = TierMetadata(self.path)
        self.epoch = 0
        self.model: dict[tuple[str, int], SegmentRecord] = {}

    def teardown(self):
        try:
            self.meta.close()
        finally:
            shutil.rmtree(self.dir)

    @initialize(data=st.data())
    def first_epoch_and_some_segments(self, data):
        """Start with an epoch and a few segments per channel (some uploaded), so every rule has work."""
        self.take_epoch()
        for channel in CHANNELS:
            base = 0
            for _ in range(data.draw(st.integers(0, 4))):
                base += data.draw(st.integers(0, 3))
                end = base + data.draw(st.integers(1, 10))
                chunks = plan_chunks(channel, base, self.epoch, data.draw(st.integers(1, 100)), 40)
                self.meta.begin_upload(self.epoch, channel, base, end, self.model_size(chunks), 0, chunks)
                self.model[channel, base] = SegmentRecord(
                    channel, base, end, self.model_size(chunks), 0, "uploading", self.epoch, chunks, None
                )
                if data.draw(st.booleans()):
                    self.finish((channel, base))
                base = end

    @staticmethod
    def model_size(chunks):
        return chunks[-1].position + chunks[-1].length

    @rule()
    def take_epoch(self):
        self.epoch += 1
        assert self.meta.take_epoch(f"owner-{self.epoch}") == self.epoch

    def overlapping(self, channel, base, end):
        return [s for (c, _), s in self.model.items() if c == channel and s.base_offset < end and base < s.end_offset]

    def near_an_edge(self, data, channel):
        """An offset anywhere, or next to the edge of a segment of ``channel`` (where overlaps hide)."""
        edges = sorted(
            {o + d for (c, _), s in self.model.items() if c == channel for o in (s.base_offset, s.end_offset) for d in (-1, 0, 1)}
        )
        edges = [e for e in edges if e >= 0]
        return data.draw(st.integers(0, 60) | st.sampled_from(edges) if edges else st.integers(0, 60))

    @rule(channel=st.sampled_from(CHANNELS), data=st.data(), size=st.integers(1, 200), chunk_bytes=st.integers(1, 120))
    def begin_upload(self, channel, data, size, chunk_bytes):
        base = self.near_an_edge(data, channel)
        end = base + data.draw(st.integers(1, 2) | st.integers(1, 15))
        edge = self.near_an_edge(data, channel)
        if edge > base and data.draw(st.booleans()):
            end = edge
        chunks = plan_chunks(channel, base, self.epoch, size, chunk_bytes)
        ts = data.draw(st.sampled_from([base * 10, base * 10 + 5]) | st.integers(-5, 600))  # mostly in order, not always
        if self.overlapping(channel, base, end):
            with pytest.raises(TierError, match="overlaps"):
                self.meta.begin_upload(self.epoch, channel, base, end, size, ts, chunks)
            return
        self.meta.begin_upload(self.epoch, channel, base, end, size, ts, chunks)
        self.model[channel, base] = SegmentRecord(channel, base, end, size, ts, "uploading", self.epoch, chunks, None)

    def pick(self, data) -> tuple[str, int]:
        """A key of the model, or now and then one that is not there."""
        keys = [*sorted(self.model), ("a", 99), ("t/0", 98)]
        return data.draw(st.sampled_from(keys))

    def keys_in(self, state, epoch=None) -> list[tuple[str, int]]:
        return sorted(k for k, s in self.model.items() if s.state == state and epoch in (None, s.epoch))

    def finish(self, key: tuple[str, int]):
        seg = self.model[key]
        manifest = manifest_name(*key, seg.epoch)
        self.model[key] = replace(seg, state="uploaded", manifest=manifest)
        assert self.meta.finish_upload(self.epoch, *key, seg.chunks, manifest) == self.model[key]

    def delete(self, key):
        self.model[key] = replace(self.model[key], state="deleting")
        assert self.meta.begin_delete(self.epoch, *key) == self.model[key]

    def remove(self, key):
        self.meta.finish_delete(self.epoch, *key)
        del self.model[key]

    def abandon(self, key: tuple[str, int]):
        seg = self.model.pop(key)
        assert self.meta.abandon_upload(self.epoch, *key) == [c.name for c in seg.chunks] + [manifest_name(*key, seg.epoch)]

    @precondition(lambda self: self.keys_in("uploading", self.epoch))
    @rule(data=st.data())
    def finish_upload(self, data):
        self.finish(data.draw(st.sampled_from(self.keys_in("uploading", self.epoch))))

    @precondition(lambda self: self.keys_in("uploaded"))
    @rule(data=st.data())
    def begin_delete(self, data):
        self.delete(data.draw(st.sampled_from(self.keys_in("uploaded"))))

    @precondition(lambda self: self.keys_in("deleting"))
    @rule(data=st.data())
    def finish_delete(self, data):
        self.remove(data.draw(st.sampled_from(self.keys_in("deleting"))))

    @precondition(lambda self: self.keys_in("uploading"))
    @rule(data=st.data())
    def abandon_upload(self, data):
        self.abandon(data.draw(st.sampled_from(self.keys_in("uploading"))))

    @rule(data=st.data(), op=st.sampled_from(["finish_upload", "begin_delete", "finish_delete", "abandon_upload"]))
    def any_transition(self, data, op):
        """Any transition on any segment (or a missing one): done if the model allows it, else refused."""
        key = self.pick(data)
        seg = self.model.get(key)
        need = {
            "finish_upload": "uploading",
            "begin_delete": "uploaded",
            "finish_delete": "deleting",
            "abandon_upload": "uploading",
        }
        if seg is None or seg.state != need[op] or (op == "finish_upload" and seg.epoch != self.epoch):
            chunks = seg.chunks if seg else plan_chunks(*key, self.epoch, 10, 5)
            calls = {
                "finish_upload": lambda: self.meta.finish_upload(self.epoch, *key, chunks, manifest_name(*key, self.epoch)),
                "begin_delete": lambda: self.meta.begin_delete(self.epoch, *key),
                "finish_delete": lambda: self.meta.finish_delete(self.epoch, *key),
                "abandon_upload": lambda: self.meta.abandon_upload(self.epoch, *key),
            }
            with pytest.raises(TierError, match=f"{op} refused"):
                calls[op]()
            return
        {"finish_upload": self.finish, "begin_delete": self.delete, "finish_delete": self.remove, "abandon_upload": self.abandon}[
            op
        ](key)

    @precondition(lambda self: self.keys_in("uploading", self.epoch))
    @rule(data=st.data(), damage=st.sampled_from(["drop last", "shift", "rename", "manifest"]))
    def finish_upload_with_other_chunks_or_manifest(self, data, damage):
        key: tuple[str, int] = data.draw(st.sampled_from(self.keys_in("uploading", self.epoch)))
        chunks, manifest = self.model[key].chunks, manifest_name(*key, self.epoch)
        first = chunks[0]
        if damage == "drop last":
            chunks = chunks[:-1] if len(chunks) > 1 else (replace(first, length=first.length + 1),)
        elif damage == "shift":
            chunks = (replace(first, position=1), *chunks[1:])
        elif damage == "rename":
            chunks = (replace(first, name=first.name.replace(".chunk", ".part")), *chunks[1:])
        else:
            manifest = manifest_name(*key, self.epoch + 1)
        with pytest.raises(TierError, match="finish_upload refused"):
            self.meta.finish_upload(self.epoch, *key, chunks, manifest)

    @precondition(lambda self: self.epoch >= 2)
    @rule(data=st.data(), op=st.sampled_from(["begin_upload", "finish_upload", "begin_delete", "finish_delete", "abandon"]))
    def fenced_call_from_an_old_epoch(self, data, op):
        old = data.draw(st.integers(1, self.epoch - 1))
        channel, base = self.pick(data)
        before = dump(self.path)
        chunks = self.model[channel, base].chunks if (channel, base) in self.model else plan_chunks(channel, base, old, 9, 4)
        calls = {
            "begin_upload": lambda: self.meta.begin_upload(old, channel, 200, 201, 9, 0, plan_chunks(channel, 200, old, 9, 4)),
            "finish_upload": lambda: self.meta.finish_upload(old, channel, base, chunks, manifest_name(channel, base, old)),
            "begin_delete": lambda: self.meta.begin_delete(old, channel, base),
            "finish_delete": lambda: self.meta.finish_delete(old, channel, base),
            "abandon": lambda: self.meta.abandon_upload(old, channel, base),
        }
        with pytest.raises(FencedError, match=f"epoch {old} is fenced: another uploader .* epoch {self.epoch}"):
            calls[op]()
        assert dump(self.path) == before

    @rule(channel=st.sampled_from(CHANNELS), data=st.data())
    def segment_for(self, channel, data):
        offset = self.near_an_edge(data, channel)
        expected = [
            s
            for (c, _), s in self.model.items()
            if c == channel and s.state == "uploaded" and s.base_offset <= offset < s.end_offset
        ]
        assert self.meta.segment_for(channel, offset) == (expected[0] if expected else None)

    @invariant()
    def same_segments_as_the_model(self):
        for channel in CHANNELS:
            mine = sorted((s for (c, _), s in self.model.items() if c == channel), key=lambda s: s.base_offset)
            assert self.meta.segments(channel, STATES) == mine
            assert self.meta.segments(channel) == [s for s in mine if s.state == "uploaded"]
        assert self.meta.channels() == sorted({c for c, _ in self.model})
        assert self.meta.current_epoch() == self.epoch

    @invariant()
    def stale_uploads_are_the_uploading_rows_of_older_epochs(self):
        stale = sorted((k, s) for k, s in self.model.items() if s.state == "uploading" and s.epoch < self.epoch)
        assert self.meta.stale_uploads(self.epoch) == [s for _, s in stale]

    @invariant()
    def summary_counts_the_model(self):
        for summary in self.meta.summary():
            mine = [s for (c, _), s in self.model.items() if c == summary.channel]
            assert summary.segments == {state: sum(s.state == state for s in mine) for state in STATES}
            assert summary.bytes == {state: sum(s.size for s in mine if s.state == state) for state in STATES}
            up = [s for s in mine if s.state == "uploaded"]
            assert summary.first_offset == (min(s.base_offset for s in up) if up else None)
            assert summary.end_offset == (max(s.end_offset for s in up) if up else None)
        assert {x.channel for x in self.meta.summary()} == {c for c, _ in self.model}

    @invariant()
    def totals_and_probes_agree_with_the_model(self):
        """The totals the triggers keep, and the seam's probes, against the rows themselves."""
        for channel in CHANNELS:
            mine = sorted((s for (c, _), s in self.model.items() if c == channel), key=lambda s: s.base_offset)
            assert self.meta.object_count(channel) == len({ch.name for s in mine for ch in s.chunks})
            listed = [s for s in mine if s.state in ("uploaded", "lost")]
            assert self.meta.bounds(channel) == ((listed[0].base_offset, listed[-1].end_offset) if listed else None)
            for probe in {0, 5, 17, 40, *(s.base_offset for s in listed), *(s.end_offset for s in listed)}:
                below = [s for s in listed if s.base_offset <= probe]
                above = [s for s in listed if s.base_offset > probe]
                assert self.meta.floor(channel, probe) == (below[-1] if below else None)
                assert self.meta.after(channel, probe) == (above[0] if above else None)
                assert self.meta.segments(channel, from_offset=probe) == [s for s in listed if s.base_offset >= probe]
                assert (
                    self.meta.segments(channel, from_offset=probe, limit=2) == [s for s in listed if s.base_offset >= probe][:2]
                )
            for when in {-10, 0, 55, 300, 601, *(s.max_timestamp + d for s in mine for d in (-1, 0, 1))}:
                first = next((s for s in listed if s.max_timestamp >= when), None)
                assert self.meta.first_at_time(channel, when) == first, when


MetadataMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
test_metadata_against_a_model = MetadataMachine.TestCase


# -- invariants and errors, one by one -----------------------------------------------------------


def test_fenced_error_names_both_epochs_and_says_another_uploader_took_over(meta):
    e1 = meta.take_epoch("first")
    e2 = meta.take_epoch("second")
    with pytest.raises(FencedError) as err:
        meta.begin_upload(e1, "a", 0, 10, 5, 0, plan_chunks("a", 0, e1, 5, 5))
    message = str(err.value)
    assert f"epoch {e1} is fenced" in message and f"epoch {e2}" in message and "'second'" in message
    assert "took over" in message and meta.path in message
    assert meta.segments("a", STATES) == []


def test_an_epoch_never_taken_is_refused(meta):
    meta.take_epoch("only")
    with pytest.raises(FencedError, match="never taken"):
        meta.begin_delete(5, "a", 0)


def test_adjacent_segments_are_allowed_overlapping_ones_in_any_state_are_not(meta):
    e = meta.take_epoch("u")
    upload(meta, e, "a", 10, 20)
    meta.begin_upload(e, "a", 30, 40, 5, 0, plan_chunks("a", 30, e, 5, 5))
    meta.begin_delete(e, "a", 10)
    upload(meta, e, "a", 0, 10)
    upload(meta, e, "a", 20, 30)
    upload(meta, e, "b", 10, 20)  # another channel
    for base, end in [(5, 11), (9, 10), (19, 20), (19, 21), (10, 20), (12, 15), (0, 100), (35, 36), (39, 50)]:
        with pytest.raises(TierError, match="overlaps"):
            meta.begin_upload(e, "a", base, end, 5, 0, plan_chunks("a", base, e, 5, 5))
    assert [(s.base_offset, s.state) for s in meta.segments("a", STATES)] == [
        (0, "uploaded"),
        (10, "deleting"),
        (20, "uploaded"),
        (30, "uploading"),
    ]
    (summary,) = meta.summary("a")
    assert (summary.channel, summary.first_offset, summary.end_offset) == ("a", 0, 30)
    assert summary.segments == {"uploading": 1, "uploaded": 2, "deleting": 1, "lost": 0}
    assert summary.bytes == {"uploading": 5, "uploaded": 200, "deleting": 100, "lost": 0}
    assert [s.channel for s in meta.summary()] == ["a", "b"]


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ((), "has no chunks"),
        (lambda n: n[:-1], "cover 90 bytes, not its size 100"),
        (lambda n: (n[0], n[2], n[1], n[3]), "starts at 60, not at 30"),
        (lambda n: (ChunkRecord(n[0].name, 0, 40), *n[1:]), "starts at 30, not at 40"),
        (lambda n: (ChunkRecord("a/x.chunk", 0, 30), *n[1:]), "is named"),
        (lambda n: (*n[:-1], ChunkRecord(n[-1].name, 90, 0)), "length 0 is out of range"),
        (lambda n: (*n[:-1], (n[-1].name, 90, 10)), "is a tuple, not a ChunkRecord"),
    ],
)
def test_chunks_that_do_not_cover_the_segment_in_order_are_refused(meta, chunks, message):
    e = meta.take_epoch("u")
    planned = plan_chunks("a", 0, e, 100, 30)
    with pytest.raises(TierError, match=message):
        meta.begin_upload(e, "a", 0, 10, 100, 0, chunks(planned) if callable(chunks) else chunks)
    assert meta.segments("a", STATES) == []


def test_an_upload_begun_by_an_older_epoch_cannot_be_finished_only_abandoned(meta):
    e1 = meta.take_epoch("old")
    chunks = plan_chunks("a", 0, e1, 100, 30)
    meta.begin_upload(e1, "a", 0, 10, 100, 0, chunks)
    e2 = meta.take_epoch("new")
    assert meta.stale_uploads(e2) == meta.segments("a", ["uploading"])
    with pytest.raises(TierError, match="was begun by epoch 1, not 2: abandon it"):
        meta.finish_upload(e2, "a", 0, chunks, manifest_name("a", 0, e1))
    assert meta.abandon_upload(e2, "a", 0) == [c.name for c in chunks] + [manifest_name("a", 0, e1)]
    assert meta.stale_uploads(e2) == []
    assert upload(meta, e2, "a", 0, 10).epoch == e2


def test_a_stale_uploader_cannot_even_list_what_to_clean_up(meta):
    e1 = meta.take_epoch("old")
    meta.take_epoch("new")
    with pytest.raises(FencedError):
        meta.stale_uploads(e1)


def test_segment_for_probes_the_primary_key_instead_of_scanning(meta):
    e = meta.take_epoch("u")
    for i in range(50):
        upload(meta, e, "a", i * 10, i * 10 + 10, size=7, chunk_bytes=7)
    with closing(sqlite3.connect(meta.path)) as db, db:
        plan = " ".join(row[-1] for row in db.execute("EXPLAIN QUERY PLAN " + SEGMENT_AT, ("a", 123)))
    assert "SEARCH segments USING PRIMARY KEY (channel=? AND base_offset<?)" in plan, plan
    assert "SCAN" not in plan and "TEMP B-TREE" not in plan, plan
    assert meta.segment_for("a", 123).base_offset == 120
    assert meta.segment_for("a", 500) is None


def test_the_database_uses_wal_and_full_sync(meta):
    with closing(sqlite3.connect(meta.path)) as db, db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert meta._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_a_newer_schema_version_is_refused(tmp_path):
    path = tmp_path / "metadata.db"
    TierMetadata(path).close()
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(TierError, match=f"schema version {SCHEMA_VERSION + 1}, newer than this filechannel reads.*upgrade"):
        TierMetadata(path)


def test_reopening_keeps_everything(tmp_path):
    path = tmp_path / "metadata.db"
    with TierMetadata(path) as m:
        e = m.take_epoch("u")
        rec = upload(m, e, "t/0", 0, 10)
    with TierMetadata(path) as m:
        assert m.current_epoch() == e and m.segments("t/0") == [rec]


def test_a_file_that_is_not_a_database_gives_one_clear_error(tmp_path):
    path = tmp_path / "metadata.db"
    path.write_bytes(b"this is not sqlite " * 300)
    with pytest.raises(MetadataDamagedError) as err:  # the kind the tier context heals by rebuilding from the bucket
        TierMetadata(path)
    assert str(path) in str(err.value) and "rebuilt" in str(err.value)


def test_a_damaged_database_gives_one_clear_error(tmp_path):
    path = tmp_path / "metadata.db"
    with TierMetadata(path) as m:
        e = m.take_epoch("u")
        for i in range(40):
            upload(m, e, "a", i * 10, i * 10 + 10)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    data[4096:] = b"\xa5" * (len(data) - 4096)  # every page but the first
    path.write_bytes(bytes(data))
    with pytest.raises(MetadataDamagedError) as err, TierMetadata(path) as m:
        m.segments("a")
    assert str(path) in str(err.value) and "rebuilt" in str(err.value)


def test_a_missing_folder_gives_one_clear_error(tmp_path):
    with pytest.raises(TierError, match="check that its folder exists"):
        TierMetadata(tmp_path / "nowhere" / "metadata.db")


def test_a_closed_store_refuses_calls(tmp_path):
    m = TierMetadata(tmp_path / "metadata.db")
    m.close()
    m.close()
    with pytest.raises(TierError, match="is closed"):
        m.take_epoch("u")


def test_arguments_are_checked_before_any_transaction(meta):
    e = meta.take_epoch("u")
    with pytest.raises(InvalidNameError):
        meta.segments("../x")
    with pytest.raises(ConfigError):
        meta.begin_delete(e, "a", -1)
    with pytest.raises(ConfigError):
        meta.segment_for("a", "3")
    with pytest.raises(ConfigError, match="states"):
        meta.segments("a", ["gone"])
    with pytest.raises(ConfigError, match="owner"):
        meta.take_epoch("")


def test_waiting_longer_than_the_busy_timeout_gives_one_clear_error(tmp_path):
    path = tmp_path / "metadata.db"
    TierMetadata(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the database
        with TierMetadata(path, busy_timeout_ms=50) as m, pytest.raises(TierError, match="busy timeout; retry") as err:
            m.take_epoch("u")
        assert str(path) in str(err.value)
        holder.execute("ROLLBACK")
        with TierMetadata(path, busy_timeout_ms=50) as m:
            assert m.take_epoch("u") == 1
    finally:
        holder.close()


def test_threads_sharing_one_store_take_distinct_epochs(meta):
    got, errors = [], []

    def take():
        try:
            for _ in range(20):
                got.append(meta.take_epoch(threading.current_thread().name))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and sorted(got) == list(range(1, 81))


# -- real processes ------------------------------------------------------------------------------


def child(*args, **kwargs):
    """``metadata_procs.py ARGS`` in a fresh interpreter (which imports neither pytest nor hypothesis)."""
    return subprocess.Popen([sys.executable, str(PROCS), *map(str, args)], text=True, **kwargs)


def reap(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(30)


def test_two_processes_taking_epochs_at_once_get_distinct_increasing_epochs(tmp_path):
    db, go = tmp_path / "metadata.db", tmp_path / "go"  # both create the database, then wait for the go
    procs = [child("take_epochs", db, go, 25, stdout=subprocess.PIPE) for _ in range(2)]
    try:
        go.touch()
        outs = [p.communicate(timeout=60)[0].split() for p in procs]
        assert [p.returncode for p in procs] == [0, 0]
    finally:
        reap(procs)
    epochs = [[int(x) for x in out] for out in outs]
    for mine in epochs:
        assert mine == sorted(mine) and len(mine) == 25
    assert sorted(epochs[0] + epochs[1]) == list(range(1, 51))


def test_an_uploader_paused_before_its_commit_is_fenced_on_resume_and_changes_nothing(tmp_path):
    path = tmp_path / "metadata.db"
    TierMetadata(path).close()
    proc = child("paused_uploader", path, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        line = proc.stdout.readline().split()
        assert line[0] == "ready", line  # chunks and manifest "written", finish_upload next
        old = int(line[1])
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: Path(f"/proc/{proc.pid}/stat").read_text().split(")")[1].split()[0] == "T", 30, "the child to stop")
        proc.stdin.write("commit\n")  # read only once it runs again
        proc.stdin.flush()
        with TierMetadata(path) as m:
            new = m.take_epoch("the new uploader")
        before = dump(path)
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=60)
    finally:
        reap([proc])
    assert proc.returncode == 0, out
    assert out.startswith("fenced "), out
    assert f"epoch {old} is fenced" in out and f"epoch {new}" in out and "took over" in out
    assert dump(path) == before
    with TierMetadata(path) as m:
        assert m.segments("t/0") == []
        assert [s.epoch for s in m.stale_uploads(new)] == [old]


def check_consistent(path):
    """The database is whole and keeps every invariant: each segment has all its chunks, none overlap."""
    with closing(sqlite3.connect(path)) as db, db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
    with TierMetadata(path) as m:
        for channel in m.channels():
            segs = m.segments(channel, STATES)
            for seg in segs:
                assert chunks_problem(seg, seg.chunks) is None
                assert seg.manifest == (None if seg.state == "uploading" else manifest_name(channel, seg.base_offset, seg.epoch))
            for a, b in itertools.pairwise(segs):
                assert a.end_offset <= b.base_offset
        return m.current_epoch(), {s.base_offset: s.state for s in m.segments("t/0", STATES)}


# After the child printed EVENT for a segment, the kill may still have let the next commit of that
# segment through (unprinted): the states it can be in.
AFTER: dict[str, set[str | None]] = {
    "uploading": {"uploading", "uploaded"},
    "uploaded": {"uploaded", "deleting"},
    "deleting": {"deleting", None},
    "deleted": {None},
    "abandoned": {None, "uploading"},
}
PRINTED = {"uploading": "uploading", "uploaded": "uploaded", "deleting": "deleting", "deleted": None, "abandoned": None}


@pytest.mark.crash
def test_sigkill_in_a_stream_of_transactions_leaves_a_consistent_database(tmp_path):
    path = tmp_path / "metadata.db"
    TierMetadata(path).close()
    states: dict[int, str] = {}
    for kill in range(10):
        proc = child("stream", path, stdout=subprocess.PIPE)
        try:
            events: list[list[str]] = []
            for _ in range(3 + kill * 5):
                line = proc.stdout.readline()
                assert line, f"the child ended early after {events[-3:]}"
                events.append(line.split())
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            # printed but not yet read; a line the kill cut is one not printed (with PYTHONUNBUFFERED=1, as
            # on this machine, print writes each word and the newline with a write of its own)
            events += [line.split() for line in proc.stdout.read().splitlines(keepends=True) if line.endswith("\n")]
        finally:
            reap([proc])
        epoch, now = check_consistent(path)
        assert epoch == kill + 1
        last = {int(base): op for op, base in events if op != "epoch"}
        unprinted = 0  # commits the child made but did not live to print: at most the one in flight
        for base in set(states) | set(now) | set(last):
            if base in last:
                assert now.get(base) in AFTER[last[base]], (base, last[base], now.get(base))
                unprinted += now.get(base) != PRINTED[last[base]]
            elif base in states:  # untouched this round, or the one commit in flight (the oldest's begin_delete)
                assert now.get(base) in AFTER[states[base]], (base, states[base], now.get(base))
                unprinted += now.get(base) != states[base]
            else:  # a begin_upload committed just before the kill
                assert now[base] == "uploading" and base == max(now), (base, now)
                unprinted += 1
        assert unprinted <= 1, (events[-4:], now)
        states = now


def test_processes_creating_one_new_database_at_once_all_open_it(tmp_path):
    # SQLite answers "database is locked" at once (no busy wait) to a journal-mode switch racing
    # another process's: before the retry, 49 of 150 rounds of three processes had one fail.
    # (Real processes started fresh: forked from a test worker, whose threads may hold a lock at
    # the fork, a child hung once under load.)
    for round_ in range(10):
        path, go = tmp_path / f"round{round_}.db", tmp_path / f"go{round_}"
        procs = [child("open_and_take_epoch", path, go, stdout=subprocess.PIPE) for _ in range(3)]
        try:
            go.touch()
            outcomes = [p.communicate(timeout=60)[0].split(maxsplit=1) for p in procs]
        finally:
            reap(procs)
        assert all(kind == "ok" for kind, _ in outcomes), outcomes
        assert sorted(int(epoch) for _, epoch in outcomes) == [1, 2, 3]


def test_a_version_2_store_gets_its_totals_and_newest_timestamps_filled_when_opened(tmp_path):
    path = tmp_path / "metadata.db"
    with TierMetadata(path) as m:
        e = m.take_epoch("u")
        for i in range(12):
            upload(m, e, "t/0", i * 10, i * 10 + 10, size=100 + i, ts=i * 100)
        m.begin_delete(e, "t/0", 0)
        expected = (m.summary("t/0"), m.object_count("t/0"))
    with closing(sqlite3.connect(path)) as db, db:  # as version 2 left it: no totals, no triggers
        for trigger in [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")]:
            db.execute(f"DROP TRIGGER {trigger}")
        for table in ("state_totals", "object_refs", "object_totals"):
            db.execute(f"DROP TABLE {table}")
        db.execute("UPDATE schema_version SET version = 2")
        db.execute("DROP INDEX segments_by_time")
        db.execute("ALTER TABLE segments DROP COLUMN newest_through")
    with TierMetadata(path) as m:
        assert (m.summary("t/0"), m.object_count("t/0")) == expected
        assert m.first_at_time("t/0", 455) == m.segment_for("t/0", 50)  # the newest timestamps filled (ts = base * 10)
        upload(m, m.take_epoch("u"), "t/0", 120, 130, size=7)  # and the triggers count from now on
        [summary] = m.summary("t/0")
        assert summary.segments["uploaded"] == 12 and summary.bytes["uploaded"] == sum(100 + i for i in range(1, 12)) + 7
