"""``filechannel tier rebuild``: a lost root rebuilt from its tier-2 copy alone (manifests, topic
descriptions, the newest export's group offsets), through the installed console script."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from filechannel.client import Consumer, Producer, TopicPartition
from filechannel.client.group import durable_offset
from filechannel.client.topics import Admin
from filechannel.errors import MissingSegmentError
from filechannel.root import ROOT_METADATA
from filechannel.tiering import open_storage
from filechannel.tiering.layout import ChunkRecord, decode_manifest, encode_manifest, manifest_name, merged_name, plan_chunks
from filechannel.tiering.metadata import SegmentRecord, TierMetadata
from filechannel.tiering.rebuild import rebuild_root

from ..cli_helpers import fc_text as fc
from .test_daemon import tier_for
from .tier_helpers import SMALL, make_topic, manifest_of, produce


def read_all(root: Path, topic: str, partition: int) -> list[tuple[int, bytes]]:
    """Every record of one partition, from its first offset, with no group."""
    consumer = Consumer(root=root, auto_offset_reset="earliest", enable_auto_commit=False)
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    got: list[tuple[int, bytes]] = []
    try:
        while batch := consumer.poll(timeout_ms=200, max_records=10_000):
            got += [(r.offset, r.value) for r in batch.get(tp, [])]
    finally:
        consumer.close()
    return got


def kind_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict]:
    if kind == "fsspec":
        return f"file://{tmp_path}/tier", {"backend": "fsspec"}
    return tier_for(kind, tmp_path, request, monkeypatch)


@pytest.mark.parametrize("kind", ["file", "fsspec", pytest.param("s3", marks=pytest.mark.s3)])
def test_disaster_rebuild_reads_every_uploaded_record_and_producers_continue_densely(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, new_root = tmp_path / "root", tmp_path / "new"
    url, options = kind_url(kind, tmp_path, request, monkeypatch)
    Admin(root).create_topic("t", 2, tier=url, tier_options=options, local_retention_bytes=0, **SMALL)
    sent = {p: [b"p%d-%06d-" % (p, i) + os.urandom(80) for i in range(220 + 30 * p)] for p in range(2)}
    with Producer(root=root) as producer:
        for p in range(2):
            for value in sent[p]:
                producer.send("t", value, partition=p)
    consumer = Consumer("t", root=root, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        consumed = 0
        while consumed < 300:
            consumed += sum(len(v) for v in consumer.poll(timeout_ms=500, max_records=100).values())
        consumer.commit()
        committed = {p: consumer.committed(TopicPartition("t", p)) or 0 for p in range(2)}
    finally:
        consumer.close(autocommit=False)
    assert sum(committed.values()) == consumed

    run = fc("tier", "run", "--root", str(root), "--once")
    assert "pass done" in run.stdout
    export = fc("tier", "export", "--root", str(root), "--to-tier")
    assert "2 committed offset(s)" in export.stdout
    with TierMetadata(root / ROOT_METADATA) as metadata:
        ends = {p: metadata.segments(f"t/{p}")[-1].end_offset for p in range(2)}
    assert all(ends[p] > committed[p] for p in range(2))
    shutil.rmtree(root)  # the disaster: the whole local root is gone

    (new_root).mkdir()
    (new_root / "stray").write_text("x")
    refused = fc("tier", "rebuild", "--root", str(new_root), "--tier", url, "--tier-options", json.dumps(options), check=False)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "not empty" in refused.stderr
    (new_root / "stray").unlink()
    rebuilt = fc("tier", "rebuild", "--root", str(new_root), "--tier", url, "--tier-options", json.dumps(options))
    assert "rebuilt 1 topic(s), 2 partition(s)" in rebuilt.stdout and "group g: restored" in rebuilt.stderr

    for p in range(2):  # every uploaded record, identical, at its offset
        assert read_all(new_root, "t", p) == list(enumerate(sent[p][: ends[p]]))
    consumer = Consumer("t", root=new_root, group_id="g", enable_auto_commit=False)
    try:
        assert {p: consumer.committed(TopicPartition("t", p)) for p in range(2)} == committed
    finally:
        consumer.close(autocommit=False)
    # restored as a commit leaves them: the partitions' durable positions too, which outlive a lost offsets.json
    assert {p: durable_offset(str(new_root), "g", TopicPartition("t", p)) for p in range(2)} == committed
    more = {p: [b"more-%d-%d" % (p, i) for i in range(40)] for p in range(2)}
    with Producer(root=new_root) as producer:
        futures = {p: [producer.send("t", v, partition=p) for v in more[p]] for p in range(2)}
        producer.flush()
    for p in range(2):  # the new active segment starts at the tier-2 end: offsets continue densely
        assert [f.get().offset for f in futures[p]] == list(range(ends[p], ends[p] + 40))
        assert read_all(new_root, "t", p) == list(enumerate(sent[p][: ends[p]] + more[p]))
    described = Admin(new_root).describe_topic("t")
    assert described.config["local_retention_bytes"] == 0
    # the history only in tier-2 is counted with the new local records
    assert [(d.first_offset, d.end_offset, d.records) for d in described.partitions] == [
        (0, ends[p] + 40, ends[p] + 40) for p in range(2)
    ]
    fc("tier", "run", "--root", str(new_root), "--once")  # the new root's daemon works on the rebuilt metadata


def uploaded_then_lost(tmp_path: Path) -> tuple[str, list[bytes], list[SegmentRecord]]:
    """A root whose 300 records were all uploaded (``tier run --once``), then deleted: the bucket's
    URL, the values, and the uploaded segments (at least 4)."""
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    make_topic(root, url, local_retention_bytes=0)
    values = [os.urandom(100) for _ in range(300)]
    produce(root, values)
    fc("tier", "run", "--root", str(root), "--once")
    with TierMetadata(root / ROOT_METADATA) as metadata:
        segments = metadata.segments("t/0")
    assert len(segments) >= 4
    shutil.rmtree(root)
    return url, values, segments


def test_rebuild_rules_orphans_superseded_attempts_and_holes(tmp_path: Path) -> None:
    url, values, segments = uploaded_then_lost(tmp_path)
    with open_storage(url) as storage:
        # an orphan chunk of a newer epoch (an upload that died before its manifest): not data
        storage.write(f"t/0/{segments[-1].end_offset:020d}.E0000000009.{0:020d}.chunk", b"junk")
        # a second whole copy of segment 1 by epoch 2 (a re-upload whose row was lost): the newest epoch wins
        old = segments[1]
        chunks = plan_chunks("t/0", old.base_offset, 2, old.size, 700)
        data = b"".join(storage.read(c.name, 0, c.length) for c in old.chunks)
        for c in chunks:
            storage.write(c.name, data[c.position : c.position + c.length])
        copy = replace(old, epoch=2, chunks=chunks, manifest=manifest_name("t/0", old.base_offset, 2))
        storage.write(manifest_of(copy), encode_manifest(copy))
        # a hole: segment 2's chunk goes
        storage.delete(segments[2].chunks[0].name)
    lines: list[str] = []
    report = rebuild_root(tmp_path / "new", url, progress=lines.append)
    assert report.topics == {"t": 1}
    assert [p for p in report.problems if "hole" in p or "lost" in p], report.problems
    assert any(manifest_of(old) in n and "superseded" in n for n in report.notes), report.notes
    with TierMetadata(tmp_path / "new" / ROOT_METADATA) as metadata:
        rebuilt = metadata.segments("t/0")
        assert [s.base_offset for s in rebuilt] == [s.base_offset for s in segments if s is not segments[2]]
        assert rebuilt[1] == copy
        assert metadata.current_epoch() == 9  # newer than every name in the bucket: the next daemon never reuses one
    got = []
    with pytest.raises(MissingSegmentError):
        consumer = Consumer(root=tmp_path / "new", auto_offset_reset="earliest", enable_auto_commit=False)
        consumer.assign([TopicPartition("t", 0)])
        try:
            while batch := consumer.poll(timeout_ms=200):
                got += [r.value for r in batch[TopicPartition("t", 0)]]
        finally:
            consumer.close()
    assert got == values[: segments[2].base_offset]  # everything before the hole, then a clear error


def test_rebuild_of_an_unreachable_storage_is_one_line(tmp_path: Path, unused_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    proc = fc(
        "tier",
        "rebuild",
        "--root",
        str(tmp_path / "new"),
        "--tier",
        "s3://bucket/x",
        "--tier-options",
        json.dumps({"endpoint_url": f"http://127.0.0.1:{unused_port}", "max_attempts": 1, "connect_timeout": 1}),
        check=False,
    )
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert proc.returncode == 1 and "unreachable" in error and not (tmp_path / "new").exists()
    bad = fc("tier", "rebuild", "--root", str(tmp_path / "n2"), "--tier", "file:///x", "--tier-options", "[1]", check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--tier-options" in bad.stderr


def test_a_manifest_naming_a_merged_object_that_is_gone_falls_back_to_the_segments_own_chunks(tmp_path: Path) -> None:
    """What a defragmenter killed after its late manifest write leaves (its merge abandoned, the
    merged object deleted): a manifest naming an object that is gone, while the segment's own
    chunks are still whole. A rebuild reads the records from those chunks, says so, and fsck
    --repair writes the manifest again from the index."""
    url, values, segments = uploaded_then_lost(tmp_path)
    target = segments[1]
    gone = merged_name("t/0", target.base_offset, target.epoch + 1, target.end_offset, "0123456789abcdef")
    late = replace(target, chunks=(ChunkRecord(gone, 0, target.size, 4096),))
    with open_storage(url) as storage:
        storage.write(manifest_of(target), encode_manifest(late))
    report = rebuild_root(tmp_path / "new", url)
    assert report.problems == []
    assert any(manifest_of(target) in n and "own chunks" in n for n in report.notes), report.notes
    assert read_all(tmp_path / "new", "t", 0) == list(enumerate(values))[: segments[-1].end_offset]
    fc("tier", "fsck", "--root", str(tmp_path / "new"), "--repair", check=False)
    with open_storage(url) as storage:
        assert decode_manifest(storage.read(manifest_of(target), 0, 1 << 20), manifest_of(target)) == target
    assert fc("tier", "fsck", "--root", str(tmp_path / "new"), "--deep").returncode == 0
