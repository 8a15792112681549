"""``filechannel tier fsck [--deep] [--repair]``: each kind of damage injected into the bucket is found
(one line each, exit 1), and repaired where it can be (from the local copy, or marked lost)."""

from __future__ import annotations

import os
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from filechannel import TierDataLostError
from filechannel.client import Admin
from filechannel.client.topics import TopicStore
from filechannel.root import ROOT_METADATA
from filechannel.tiering import open_storage
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.defrag import DefragSettings, defrag_root
from filechannel.tiering.fsck import fsck
from filechannel.tiering.layout import (
    UPLOADED,
    ChunkRecord,
    SegmentRecord,
    chunk_name,
    encode_manifest,
    manifest_name,
    merged_name,
)
from filechannel.tiering.metadata import SCHEMA_VERSION, TierMetadata
from filechannel.tiering.rebuild import rebuild_root
from filechannel.tiering.reindex import referenced_by_manifests

from ..cli_helpers import fc_text as fc
from .test_rebuild import kind_url, read_all
from .tier_helpers import SMALL, manifest_of, produce


def kinds(proc_stderr: str) -> list[str]:
    return sorted(line.split(":")[0] for line in proc_stderr.splitlines())


def flip(storage, name: str, at: int) -> None:
    data = bytearray(storage.read(name, 0, 1 << 30))
    data[at] ^= 0x40
    storage.write(name, bytes(data))


@pytest.mark.parametrize("kind", ["file", "fsspec", pytest.param("s3", marks=pytest.mark.s3)])
def test_each_kind_of_damage_is_found_and_repair_marks_what_has_no_local_copy_lost(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    url, options = kind_url(kind, tmp_path, request, monkeypatch)
    Admin(root).create_topic("t", 1, tier=url, tier_options=options, local_retention_bytes=0, **SMALL)
    sent = [os.urandom(100) for _ in range(400)]
    produce(root, sent)
    fc("tier", "run", "--root", str(root), "--once")
    clean = fc("tier", "fsck", "--root", str(root), "--deep")
    assert clean.stderr == "" and "0 finding(s)" in clean.stdout
    with TierMetadata(root / ROOT_METADATA) as metadata:
        segs = metadata.segments("t/0")
    assert len(segs) >= 6 and all(len(s.chunks) >= 2 for s in segs[:4])
    with open_storage(url, **options) as storage:
        storage.delete(segs[0].chunks[1].name)  # deleted
        storage.write(segs[1].chunks[0].name, storage.read(segs[1].chunks[0].name, 0, 100))  # truncated
        flip(storage, segs[2].chunks[1].name, 30)  # one byte flipped inside a block
        orphan = f"t/0/{segs[-1].end_offset + 10**6:020d}.E0000000001.{0:020d}.chunk"
        storage.write(orphan, b"left by a fenced uploader")  # an orphan
        storage.write(manifest_of(segs[3]), encode_manifest(replace(segs[3], max_timestamp=segs[3].max_timestamp + 1)))
        storage.write(manifest_of(segs[4]), b'{"not": "a manifest"}')

    shallow = fc("tier", "fsck", "--root", str(root), check=False)
    assert shallow.returncode == 1
    assert kinds(shallow.stderr) == ["length", "manifest", "manifest", "missing", "orphan"]
    lines = shallow.stderr.splitlines()
    assert any(
        segs[0].chunks[1].name in line and f"offsets {segs[0].base_offset} to {segs[0].end_offset - 1}" in line for line in lines
    )
    assert any(orphan in line for line in lines)
    deep = fc("tier", "fsck", "--root", str(root), "--deep", check=False)
    assert kinds(deep.stderr) == ["damaged", "length", "manifest", "manifest", "missing", "orphan"]
    assert any(line.startswith("damaged") and segs[2].chunks[1].name in line for line in deep.stderr.splitlines())

    repaired = fc("tier", "fsck", "--root", str(root), "--deep", "--repair", check=False)
    assert repaired.returncode == 1 and "6 repair(s)" in repaired.stdout
    after = fc("tier", "fsck", "--root", str(root), "--deep", check=False)
    assert kinds(after.stderr) == ["lost", "lost", "lost"]  # no copy anywhere: known lost, never guessed
    with open_storage(url, **options) as storage:
        assert not storage.exists(orphan)
    with TopicStore(root).open_partition("t", 0, read_only=True) as ch:
        with pytest.raises(TierDataLostError, match=f"offsets {segs[0].base_offset} to {segs[0].end_offset - 1}"):
            ch.receiver("earliest").recv(timeout=5)
        rx = ch.receiver(segs[3].base_offset)  # past the lost ones: the rest reads
        got = [r.value for r in rx.recv_many(10_000, timeout=0)]
        while more := rx.recv_many(10_000, timeout=0):
            got += [r.value for r in more]
    assert got == sent[segs[3].base_offset :]
    with TieringDaemon(root) as daemon:  # the daemon goes on beside lost segments
        assert daemon.run(once=True).failures == []


def test_repair_uploads_damaged_chunks_again_from_the_local_copy(tmp_path: Path) -> None:
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    Admin(root).create_topic("t", 1, tier=url, **SMALL)  # no local retention: every local copy stays
    sent = [os.urandom(100) for _ in range(300)]
    produce(root, sent)
    fc("tier", "run", "--root", str(root), "--once")
    with TierMetadata(root / ROOT_METADATA) as metadata:
        segs = metadata.segments("t/0")
    with open_storage(url) as storage:
        storage.delete(segs[0].chunks[0].name)
        flip(storage, segs[1].chunks[-1].name, 5)
    report = fsck(root, deep=True, repair=True)
    assert sorted(f.kind for f in report.findings) == ["damaged", "missing"]
    assert all("written again" in line for line in report.repaired) and len(report.repaired) == 2
    again = fc("tier", "fsck", "--root", str(root), "--deep")
    assert again.stderr == "" and "0 finding(s)" in again.stdout
    os.remove(root / "t" / "0" / f"{segs[0].base_offset:020d}.seg.z")  # now tier-2 is the only copy
    assert read_all(root, "t", 0) == list(enumerate(sent))


def test_gaps_are_found_and_repair_refuses_beside_a_running_daemon(tmp_path: Path) -> None:
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    Admin(root).create_topic("t", 1, tier=url, local_retention_bytes=0, **SMALL)
    produce(root, [os.urandom(100) for _ in range(200)])
    fc("tier", "run", "--root", str(root), "--once")
    with TierMetadata(root / ROOT_METADATA) as metadata:
        segs = metadata.segments("t/0")
        epoch = metadata.take_epoch("test")
        metadata.begin_delete(epoch, "t/0", segs[1].base_offset)  # a segment of the middle goes from the metadata
        metadata.finish_delete(epoch, "t/0", segs[1].base_offset)
    proc = fc("tier", "fsck", "--root", str(root), check=False)
    gap = f"gap: t/0 offsets {segs[1].base_offset} to {segs[1].end_offset - 1}"
    assert proc.returncode == 1 and any(line.startswith(gap) for line in proc.stderr.splitlines())
    # its objects are named by no row now, but its manifest in the bucket still describes a readable
    # segment: the store is behind the bucket, which is not an orphan (a repair would delete records)
    assert "unindexed" in proc.stderr and "orphan" not in proc.stderr
    with TieringDaemon(root):
        busy = fc("tier", "fsck", "--root", str(root), "--repair", check=False)
    assert busy.returncode == 1 and busy.stderr.count("\n") == 1 and "stop it first" in busy.stderr


V1_SEGMENTS = """CREATE TABLE segments_v1 (
    channel TEXT NOT NULL, base_offset INTEGER NOT NULL CHECK (base_offset >= 0),
    end_offset INTEGER NOT NULL CHECK (end_offset > base_offset), size INTEGER NOT NULL CHECK (size > 0),
    max_timestamp INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('uploading', 'uploaded', 'deleting')),
    epoch INTEGER NOT NULL REFERENCES epochs (epoch), manifest TEXT,
    created_at_ms INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (channel, base_offset)
) WITHOUT ROWID"""
V1_CHUNKS = """CREATE TABLE chunks_v1 (
    channel TEXT NOT NULL, base_offset INTEGER NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL UNIQUE,
    position INTEGER NOT NULL, length INTEGER NOT NULL CHECK (length > 0),
    PRIMARY KEY (channel, base_offset, seq),
    FOREIGN KEY (channel, base_offset) REFERENCES segments (channel, base_offset) ON DELETE CASCADE
) WITHOUT ROWID"""


def test_a_version_1_store_is_migrated_on_open_with_its_rows(tmp_path: Path) -> None:
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    Admin(root).create_topic("t", 1, tier=url, local_retention_bytes=0, **SMALL)
    produce(root, [os.urandom(100) for _ in range(200)])
    fc("tier", "run", "--root", str(root), "--once")
    with TierMetadata(root / ROOT_METADATA) as metadata:
        before = metadata.snapshot()
    db = sqlite3.connect(root / ROOT_METADATA, isolation_level=None)  # back to the version 1 schema, by hand
    db.execute("PRAGMA foreign_keys = OFF")
    db.execute("BEGIN")
    db.execute(V1_SEGMENTS)
    db.execute(
        "INSERT INTO segments_v1 SELECT channel, base_offset, end_offset, size, max_timestamp, state, epoch, manifest, "
        "created_at_ms, updated_at_ms FROM segments"
    )
    db.execute("DROP TABLE segments")
    db.execute("ALTER TABLE segments_v1 RENAME TO segments")
    db.execute("CREATE INDEX segments_by_state ON segments (state, epoch)")
    db.execute(V1_CHUNKS)
    db.execute("INSERT INTO chunks_v1 SELECT channel, base_offset, seq, name, position, length FROM chunks")
    db.execute("DROP TABLE chunks")
    db.execute("ALTER TABLE chunks_v1 RENAME TO chunks")
    db.execute("DROP TABLE merges")
    db.execute("DROP TABLE garbage")
    db.execute("UPDATE schema_version SET version = 1")
    db.execute("COMMIT")
    with pytest.raises(sqlite3.IntegrityError):  # version 1 cannot hold a lost segment
        db.execute("UPDATE segments SET state = 'lost'")
    db.close()
    with TierMetadata(root / ROOT_METADATA) as metadata:
        assert metadata.snapshot() == before
        newest = before[1][-1].max_timestamp  # the newest timestamps are filled too: a search by time finds its segment
        first = next(s for s in before[1] if s.max_timestamp >= newest)
        assert metadata.first_at_time("t/0", newest) == metadata.segment_for("t/0", first.base_offset)
        epoch = metadata.take_epoch("test")
        metadata.mark_lost(epoch, "t/0", before[1][0].base_offset)
    db = sqlite3.connect(root / ROOT_METADATA)
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    assert db.execute("SELECT count(*) FROM chunks").fetchone()[0] == sum(len(s.chunks) for s in before[1])
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []
    db.close()


def test_an_unreachable_storage_is_one_line(tmp_path: Path, unused_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    root = tmp_path / "root"
    options = {"endpoint_url": f"http://127.0.0.1:{unused_port}", "max_attempts": 1, "connect_timeout": 1}
    Admin(root).create_topic("t", 1, tier="s3://bucket/x", tier_options=options, **SMALL)
    (root / ".tier").mkdir()
    TierMetadata(root / ROOT_METADATA).close()
    for command in (["fsck"], ["fsck", "--deep"], ["export", "--to-tier"]):
        proc = fc("tier", *command, "--root", str(root), check=False)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
        assert proc.returncode == 1 and len(errors) == 1 and "unreachable" in errors[0], (command, proc.stderr)


def _tiered_root_with_merged_and_chunk_objects(tmp_path: Path, sent: list[bytes]) -> tuple[Path, str]:
    """A root with no local copies left whose bucket holds merged objects (a defrag of the first
    segments) and chunk objects (segments uploaded after it), the defrag's garbage deleted."""
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    Admin(root).create_topic("t", 1, tier=url, local_retention_bytes=0, **SMALL)
    os.makedirs(root / ".tier", exist_ok=True)
    with TierMetadata(root / ROOT_METADATA) as metadata:  # the daemon's epoch is above 1: a fenced epoch 1 below
        metadata.take_epoch("test")
    produce(root, sent[: len(sent) * 2 // 3])
    fc("tier", "run", "--root", str(root), "--once")
    defrag_root(root, DefragSettings(merge_below_bytes=3000, target_bytes=20_000, garbage_delay_ms=0))
    produce(root, sent[len(sent) * 2 // 3 :])
    fc("tier", "run", "--root", str(root), "--once")  # uploads the rest as chunks, deletes the garbage
    return root, url


def test_extra_bytes_after_the_chunks_are_a_note_and_repair_never_marks_intact_records_lost(tmp_path: Path) -> None:
    sent = [os.urandom(100) for _ in range(300)]
    root, url = _tiered_root_with_merged_and_chunk_objects(tmp_path, sent)
    with TierMetadata(root / ROOT_METADATA) as metadata:
        segs = metadata.segments("t/0")
    merged = next(c.name for s in segs for c in s.chunks if c.name.endswith(".merged"))
    chunk = next(c.name for s in segs for c in s.chunks if c.name.endswith(".chunk"))
    with open_storage(url) as storage:
        for name in (merged, chunk):  # longer than the chunks in them need: garbage after the last one
            storage.write(name, storage.read(name, 0, 1 << 30) + b"\0" * 77)

    report = fsck(root, deep=True, repair=True)
    with TierMetadata(root / ROOT_METADATA) as metadata:
        assert [s.state for s in metadata.segments("t/0")] == [UPLOADED] * len(segs)  # nothing marked lost
    assert read_all(root, "t", 0) == list(enumerate(sent))  # every record reads back, through a consumer
    assert report.findings == [] and report.repaired == [] and report.deep_bytes == sum(s.size for s in segs)
    assert sorted((n.kind, n.name) for n in report.notes) == sorted([("extra bytes", chunk), ("extra bytes", merged)])
    assert all("77 bytes" in n.line() for n in report.notes)
    clean = fc("tier", "fsck", "--root", str(root), "--deep")  # not damage: exit 0, one note line each
    notes = clean.stderr.splitlines()
    assert len(notes) == 2 and all(n.startswith("note: extra bytes: ") and "77 bytes" in n for n in notes)
    assert "0 finding(s)" in clean.stdout


@pytest.mark.parametrize("store", ["empty", "deleted"])
def test_objects_a_manifest_keeps_are_never_orphans_whatever_the_metadata_store_says(store: str, tmp_path: Path) -> None:
    sent = [os.urandom(100) for _ in range(300)]
    root, url = _tiered_root_with_merged_and_chunk_objects(tmp_path, sent)
    with TierMetadata(root / ROOT_METADATA) as metadata:
        segs = metadata.segments("t/0")
    assert segs[0].epoch > 1
    in_merged = next(s for s in segs if any(c.name.endswith(".merged") for c in s.chunks))
    fresh = next(s for s in segs if all(c.name.endswith(".chunk") for c in s.chunks))
    far = segs[-1].end_offset + 10**6
    with open_storage(url) as storage:
        acknowledged = {o.name for o in storage.list("t/")}
        # a fenced uploader's attempt at `fresh` (epoch 1, overtaken, done again by the daemon's epoch):
        # whole, but superseded by the newer upload of the same offsets, as rebuild decides
        fenced = replace(
            fresh,
            epoch=1,
            chunks=tuple(replace(c, name=chunk_name("t/0", fresh.base_offset, 1, c.position)) for c in fresh.chunks),
            manifest=manifest_name("t/0", fresh.base_offset, 1),
        )
        for old, new in zip(fresh.chunks, fenced.chunks, strict=True):
            storage.write(new.name, storage.read(old.name, 0, 1 << 30))
        storage.write(manifest_of(fenced), encode_manifest(fenced))
        orphans = {  # true orphans: no manifest in the bucket names them
            chunk_name("t/0", far, 1, 0): b"a chunk whose manifest was never written",
            chunk_name("t/0", in_merged.base_offset, 1, 0): b"a chunk of an epoch with no manifest of that segment",
            merged_name("t/0", in_merged.base_offset, 1, in_merged.end_offset, "0123456789abcdef"): b"a merge never swapped in",
            manifest_name("t/0", far, 1): b'{"not": "a manifest"}',
        }
        for name, data in orphans.items():
            storage.write(name, data)
    expected = set(orphans) | {c.name for c in fenced.chunks} | {manifest_of(fenced)}
    checked = fsck(root)  # with the metadata intact first
    assert {f.name for f in checked.findings if f.kind == "orphan"} == expected
    assert all(f.kind == "orphan" for f in checked.findings)

    for suffix in ("", "-wal", "-shm"):  # the metadata store is lost...
        if os.path.exists(f"{root / ROOT_METADATA}{suffix}"):
            os.remove(f"{root / ROOT_METADATA}{suffix}")
    if store == "empty":  # ...or replaced by an empty file
        (root / ROOT_METADATA).write_bytes(b"")
    repaired = fc("tier", "fsck", "--root", str(root), "--repair", check=False)
    with open_storage(url) as storage:
        assert {o.name for o in storage.list("t/")} == acknowledged  # the orphans went, nothing a manifest keeps did
    assert repaired.returncode == 1
    repairs = [line for line in repaired.stderr.splitlines() if " repaired: " in line]
    lines = [line for line in repaired.stderr.splitlines() if " repaired: " not in line]  # the findings
    unindexed = [line for line in lines if line.startswith("unindexed:")]
    assert sorted(line.split()[2] for line in unindexed) == sorted(manifest_of(s) for s in segs)  # readable, not indexed
    assert all("tier rebuild" in line for line in unindexed)
    assert sorted(line.split()[2].rstrip(":") for line in lines if line.startswith("orphan:")) == sorted(expected)
    assert len(lines) == len(segs) + len(expected)
    assert len(repairs) == len(expected) and all(line.endswith("orphan deleted") for line in repairs)
    if store == "deleted":
        assert not os.path.exists(root / ROOT_METADATA)  # not created: `tier import` still finds it empty
    else:
        with TierMetadata(root / ROOT_METADATA) as metadata:
            assert metadata.current_epoch() == 0 and metadata.segments("t/0") == []  # still empty: import works
    rebuilt = tmp_path / "rebuilt"
    assert rebuild_root(rebuilt, url).problems == []  # the bucket alone still holds every uploaded record
    assert read_all(rebuilt, "t", 0) == list(enumerate(sent[: segs[-1].end_offset]))


def test_referenced_by_manifests_follows_the_bucket_alone(tmp_path: Path) -> None:
    ch = "t/0"

    def segment(base: int, epoch: int, lengths: list[int], merged: str | None = None, at: int = 0) -> SegmentRecord:
        chunks, position = [], 0
        for length in lengths:
            name = merged or chunk_name(ch, base, epoch, position)
            chunks.append(ChunkRecord(name, position, length, at + position if merged else 0))
            position += length
        return SegmentRecord(ch, base, base + 10, position, 0, UPLOADED, epoch, tuple(chunks), manifest_name(ch, base, epoch))

    whole = segment(0, 2, [100, 100])
    superseded = segment(0, 1, [100, 100])  # the same offsets, an older epoch: rebuild would not use it
    half_deleted = segment(10, 2, [100, 100])
    short = segment(20, 2, [100])
    merged = merged_name(ch, 30, 3, 50, "00000000000000aa")
    in_merged = [segment(30, 2, [100], merged), segment(40, 2, [100], merged, at=100)]
    undecodable = segment(50, 2, [100])
    with open_storage(f"file://{tmp_path}/tier") as storage:
        for s in (whole, superseded, half_deleted, short, *in_merged, undecodable):
            storage.write(manifest_of(s), encode_manifest(s))
            for c in s.chunks:
                storage.write(c.name, b"x" * (c.object_offset + c.length))
        storage.delete(half_deleted.chunks[1].name)
        storage.write(short.chunks[0].name, b"x" * 50)
        storage.write(manifest_of(undecodable), encode_manifest(undecodable)[:-1])
        strays = [
            chunk_name(ch, 1000, 1, 0),  # no manifest of its own
            chunk_name(ch, 0, 2, 5000),  # its manifest exists but does not name it
            merged_name(ch, 30, 3, 50, "00000000000000bb"),  # no manifest of [30, 50) names it
        ]
        for name in strays:
            storage.write(name, b"y")
        storage.write(chunk_name("t/1", 0, 1, 0), b"another channel")
        listing = storage.list("t/")
        kept = referenced_by_manifests(storage, listing, ch)
        assert kept == {
            *(c.name for c in whole.chunks),
            whole.manifest,
            half_deleted.chunks[0].name,  # named by a manifest, which itself is not whole
            short.chunks[0].name,
            merged,
            *(s.manifest for s in in_merged),
        }
        assert referenced_by_manifests(storage, listing, ch, [manifest_of(whole), strays[0]]) == {whole.manifest}
        assert referenced_by_manifests(storage, listing, ch, []) == set()
