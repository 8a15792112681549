"""Defragmentation of tier-2: bytes identical before and after (folder, SeaweedFS with parts above and
below 5 MiB, fsspec with and without concat), readers reading through the swap, the metadata's
objects per segment, and a daemon SIGKILLed in the middle of merges (real processes)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from filechannel.client import Admin
from filechannel.client.topics import TopicStore
from filechannel.engine import failpoints as failpoint
from filechannel.errors import ConfigError
from filechannel.root import ROOT_METADATA
from filechannel.tiering import open_storage
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.defrag import DefragSettings, clean_up, defrag_root, layout_after, objects_per_segment, plan
from filechannel.tiering.fsck import fsck
from filechannel.tiering.layout import (
    ChunkRecord,
    SegmentRecord,
    decode_manifest,
    encode_manifest,
    manifest_name,
    merged_name,
    parse_object_name,
    plan_chunks,
)
from filechannel.tiering.metadata import Merge, TierMetadata
from filechannel.tiering.rebuild import rebuild_root
from filechannel.tiering.remote_segment import RemoteReader, read_range
from filechannel.tiering.s3_storage import MIN_PART, plan_concat
from filechannel.tiering.status import tier_status

from .. import children
from ..cli_helpers import fc_text as fc
from .test_daemon import HELPERS, tier_for
from .test_rebuild import read_all
from .tier_helpers import DEFRAG_KILL_SETTINGS, manifest_of, segment_objects

SMALL: dict[str, Any] = {"segment_bytes": 8192, "compression_block_bytes": 1024, "tier_chunk_bytes": 1024}
KILLS = int(os.environ.get("FC_DEFRAG_KILLS", "24"))


def segment_bytes(storage, records: list[SegmentRecord]) -> dict[int, bytes]:
    """Every uploaded segment's .seg.z bytes, read the way readers read them."""
    reader = RemoteReader(storage, 1 << 20, 1)
    try:
        return {r.base_offset: read_range(reader, r, 0, r.size) for r in records}
    finally:
        reader.close()


def uploaded(root: Path, channel: str = "t/0") -> list[SegmentRecord]:
    with TierMetadata(root / ROOT_METADATA) as metadata:
        return metadata.segments(channel, states=("uploaded",))


def kind_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict]:
    if kind == "fsspec":
        return f"file://{tmp_path}/tier", {"backend": "fsspec"}  # fsspec's local filesystem: concat
    if kind == "memory":
        return f"memory://defrag-{os.getpid()}-{tmp_path.name}", {}  # no concat: read and written again
    if kind == "hdfs":
        return f"{request.getfixturevalue('hdfs_url')}/defrag-{tmp_path.name}", {}  # concat through a temporary file
    return tier_for(kind, tmp_path, request, monkeypatch)


@pytest.mark.parametrize(
    "kind", ["file", "fsspec", "memory", pytest.param("s3", marks=pytest.mark.s3), pytest.param("hdfs", marks=pytest.mark.hdfs)]
)
def test_defrag_keeps_every_byte_and_lowers_objects_per_segment(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    url, options = kind_url(kind, tmp_path, request, monkeypatch)
    Admin(root).create_topic("t", 1, tier=url, tier_options=options, local_retention_bytes=0, **SMALL)
    # HDFS closes a small file in 10-500 ms (README "HDFS"): fewer segments there, the same merges.
    sent = [os.urandom(100) for _ in range(250 if kind == "hdfs" else 500)]
    with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch, ch.sender() as tx:
        for value in sent:
            tx.send(value)
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    before = uploaded(root)
    with open_storage(url, **options) as storage:
        bytes_before = segment_bytes(storage, before)
    objects_before, segments = objects_per_segment(before)
    assert objects_before >= 5 * segments  # 1 KiB chunks of ~8 KiB segments

    report = defrag_root(root, DefragSettings(merge_below_bytes=3000, target_bytes=20_000, garbage_delay_ms=0))
    after = uploaded(root)
    objects_after, _ = objects_per_segment(after)
    assert report.merges > 0 and (report.objects_before, report.objects_after) == (objects_before, objects_after)
    assert objects_after * 4 <= objects_before  # whole segments, and runs of adjacent segments, are one object now
    assert any(len({c.name for c in r.chunks}) == 1 and len(r.chunks) == 1 for r in after)
    assert [(r.base_offset, r.end_offset, r.size, r.epoch) for r in after] == [
        (r.base_offset, r.end_offset, r.size, r.epoch) for r in before
    ]
    with open_storage(url, **options) as storage:
        assert segment_bytes(storage, after) == bytes_before  # every byte where the metadata says it is
    assert read_all(root, "t", 0) == list(enumerate(sent))
    assert fsck(root, deep=True).findings == []  # the manifests were written again for the new layout
    [status] = tier_status(root)
    assert (status.uploaded_segments, status.tier_objects) == (segments, objects_after)

    with TieringDaemon(root) as daemon:  # the next pass deletes what the merges replaced (delay 0)
        assert daemon.run(once=True).failures == []
    with open_storage(url, **options) as storage:
        names = segment_objects(storage, "t/0/")
        assert names == {c.name for r in after for c in r.chunks} | {r.manifest for r in after}
    if kind != "memory":  # the bucket alone still describes the merged layout: rebuild reads it
        rebuilt = tmp_path / "rebuilt"
        assert rebuild_root(rebuilt, url, tier_options=options).problems == []
        assert uploaded(rebuilt) == after
        assert read_all(rebuilt, "t", 0) == list(enumerate(sent[: after[-1].end_offset]))


@pytest.mark.s3
def test_s3_concat_copies_parts_of_5_mib_server_side_and_uploads_smaller_ones(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    url, options = tier_for("s3", tmp_path, request, monkeypatch)
    chunk = MIN_PART + (MIN_PART >> 1)  # 7.5 MiB chunks of 8 MiB segments: objects of 7.5 MiB and 0.5 MiB
    Admin(root).create_topic(
        "t", 1, tier=url, tier_options=options, local_retention_bytes=0, segment_bytes=8 << 20, tier_chunk_bytes=chunk
    )
    sent = [os.urandom(64 << 10) for _ in range(3 * 128 + 8)]  # three sealed 8 MiB segments, incompressible
    with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch, ch.sender() as tx:
        for value in sent:
            tx.send(value)
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    before = uploaded(root)
    sizes = [c.length for r in before for c in r.chunks]
    assert any(s >= MIN_PART for s in sizes) and any(s < MIN_PART for s in sizes)
    parts = plan_concat(sizes)
    assert any(p.copy for p in parts) and any(not p.copy for p in parts)  # UploadPartCopy and uploaded data both
    with open_storage(url, **options) as storage:
        bytes_before = segment_bytes(storage, before)
    report = defrag_root(root, DefragSettings(merge_below_bytes=8 << 20, target_bytes=64 << 20, garbage_delay_ms=0))
    after = uploaded(root)
    assert report.merges == 1 and objects_per_segment(after)[0] == 1  # the three segments are one object
    with open_storage(url, **options) as storage:
        assert segment_bytes(storage, after) == bytes_before
    assert fsck(root, deep=True).findings == []


def test_a_reader_keeps_reading_through_the_swap_and_the_garbage_deletion(tmp_path: Path) -> None:
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    Admin(root).create_topic("t", 1, tier=url, local_retention_bytes=0, tier_cache_bytes=1024, **SMALL)
    sent = [os.urandom(100) for _ in range(300)]
    with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch, ch.sender() as tx:
        for value in sent:
            tx.send(value)
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    end = uploaded(root)[-1].end_offset
    with TopicStore(root).open_partition("t", 0, maintenance_interval=0, read_only=True) as ch:
        slow = ch.receiver("earliest")  # planned with the old object names
        got = [slow.recv(timeout=5).value for _ in range(10)]
        defrag_root(root, DefragSettings(merge_below_bytes=3000, target_bytes=20_000, garbage_delay_ms=0))
        got += [slow.recv(timeout=5).value for _ in range(10)]  # old objects still there: read from them
        with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url) as storage:
            epoch = metadata.take_epoch("test")
            assert any("deleted" in line for line in clean_up(storage, metadata, epoch, "t/0", time.time_ns() // 10**6))
        while len(got) < end:  # the old objects are gone now: read where the metadata says the bytes are
            got.append(slow.recv(timeout=5).value)
    assert got == sent[:end]


def test_defrag_refuses_beside_a_running_daemon_and_reports_per_segment(tmp_path: Path) -> None:
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    Admin(root).create_topic("t", 1, tier=url, local_retention_bytes=0, **SMALL)
    with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch, ch.sender() as tx:
        for _ in range(200):
            tx.send(os.urandom(100))
    fc("tier", "run", "--root", str(root), "--once")
    with TieringDaemon(root):
        busy = fc("tier", "defrag", "--root", str(root), check=False)
    assert busy.returncode == 1 and busy.stderr.count("\n") == 1 and "stop it first" in busy.stderr
    done = fc("tier", "defrag", "--root", str(root), "--merge-below", "3000", "--target", "20000", "--garbage-delay", "0")
    assert "objects per segment" in done.stdout and "merged" in done.stderr
    bad = fc("tier", "defrag", "--root", str(root), "--merge-below", "3000", "--target", "100", check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--target" in bad.stderr
    [row] = [json.loads(line) for line in fc("tier", "status", "--root", str(root), "--format", "json").stdout.splitlines()]
    assert 0 < row["tier_objects"] < row["uploaded_segments"]  # fewer objects than segments after the merges

    with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch, ch.sender() as tx:
        for _ in range(300):
            tx.send(os.urandom(100))
    daemon = ["tier", "run", "--root", str(root), "--once", "--defrag", "--merge-below", "3000", "--target", "20000"]
    first = fc(*daemon)
    assert "uploaded offsets" in first.stdout and "merged" not in first.stdout  # busy uploading: no merge
    second = fc(*daemon)
    assert "merged" in second.stdout  # idle: the new small objects are merged
    assert fsck(root, deep=True).findings == []


# -- SIGKILL in the middle of merges ------------------------------------------------------------


class Child:
    """``python tier_helpers.py defrag-daemon ROOT``: a daemon that defragments when idle, printing each action.

    With ``failpoints`` (a folder), the child dies (``os._exit``: no cleanup, as SIGKILL) at the
    failpoint whose file the test created there."""

    def __init__(self, root: Path, failpoints: Path) -> None:
        self.proc = children.start(
            HELPERS, "defrag-daemon", str(root), stderr=True, env={**os.environ, failpoint.ENV: str(failpoints)}
        )

    def wait_line(self, word: str) -> None:
        """Wait for a line holding ``word`` (the child prints as it goes; a deadline kills it)."""
        assert self.proc.stdout is not None
        timer = threading.Timer(30, self.proc.kill)  # a child that never prints it fails the test, never hangs it
        timer.start()
        try:
            for line in self.proc.stdout:
                if word in line:
                    return
        finally:
            timer.cancel()
        raise AssertionError(f"the daemon never printed {word!r}: {self.proc.stderr.read() if self.proc.stderr else ''}")


def test_sigkill_in_the_middle_of_merges_leaves_data_readable_and_fsck_clean(tmp_path: Path) -> None:
    rng = random.Random(20)
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    Admin(root).create_topic("t", 1, tier=url, local_retention_bytes=0, **SMALL)
    sent: list[bytes] = []
    mid_merge = 0
    failpoints = tmp_path / "failpoints"
    failpoints.mkdir()
    windows = ("defrag-merge-begun", "defrag-object-written", "defrag-manifests-written")
    for k in range(KILLS):
        batch = [os.urandom(100) for _ in range(1200 if k == 0 else 40)]
        with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch, ch.sender() as tx:
            for value in batch:
                tx.send(value)
        sent += batch
        if k % 3 == 0:  # one kill in three inside a chosen window of the merge, in turn
            (failpoints / windows[(k // 3) % len(windows)]).touch()
        child = Child(root, failpoints)
        child.wait_line("merging")
        if k % 3:
            time.sleep(rng.uniform(0.0, 0.01))  # the random moment of the kill (not a synchronisation)
            child.proc.send_signal(signal.SIGKILL)
        _, err = child.proc.communicate(timeout=60)
        died = failpoint.EXIT_CODE if k % 3 == 0 else -signal.SIGKILL
        assert child.proc.returncode == died, f"kill {k}: the daemon had exited: {err[-2000:]}"
        with TierMetadata(root / ROOT_METADATA) as metadata:
            mid_merge += bool(metadata.merges("t/0"))
        records = read_all(root, "t", 0)  # readable after every kill: in order, identical, no hole
        assert records == list(enumerate(sent)), k
    assert mid_merge >= KILLS // 3, mid_merge  # at least the failpoint kills are between begin_merge and its swap
    with TieringDaemon(root, defrag=DEFRAG_KILL_SETTINGS, max_merges=10_000) as daemon:  # the next pass cleans up
        assert daemon.run(once=True).failures == []
        assert daemon.run(once=True).failures == []  # and deletes what the last merges replaced
    report = fsck(root, deep=True)
    assert report.findings == [], [f.line() for f in report.findings]
    segments = uploaded(root)
    assert objects_per_segment(segments)[0] <= 5 * len(segments)  # 8 chunks a segment before, 4 or 5 after
    assert read_all(root, "t", 0) == list(enumerate(sent))


def test_merged_names_and_version_2_manifests_round_trip() -> None:
    name = merged_name("t/0", 10, 3, 50, "0123456789abcdef")
    parsed = parse_object_name(name)
    assert parsed is not None and (parsed.kind, parsed.base_offset, parsed.epoch, parsed.start) == ("merged", 10, 3, 50)
    assert parsed.name == name
    for bad in (name.replace("0123456789abcdef", "0123"), name.replace(".00000000000000000050.", ".00000000000000000010.")):
        assert parse_object_name(bad) is None
    plain = SegmentRecord("t/0", 20, 30, 100, 0, "uploaded", 1, plan_chunks("t/0", 20, 1, 100, 40), manifest_name("t/0", 20, 1))
    assert b'"version":1' in encode_manifest(plain)  # never defragmented: version 1, readable by older readers
    merged = replace(plain, chunks=(ChunkRecord(name, 0, 80, 500), ChunkRecord(plain.chunks[2].name, 80, 20)))
    data = encode_manifest(merged)
    assert b'"version":2' in data and decode_manifest(data, manifest_of(plain)) == merged
    outside = replace(plain, base_offset=60, end_offset=70, manifest=manifest_name("t/0", 60, 1))
    with pytest.raises(ConfigError, match="holds other offsets"):
        encode_manifest(replace(outside, chunks=(ChunkRecord(name, 0, 100, 0),)))


def test_a_merge_cut_short_after_its_manifests_is_consistent_then_abandoned(tmp_path: Path) -> None:
    """The widest crash window, made by hand: the merge row, its object and the new manifests
    are written, the swap is not. fsck finds nothing wrong, a rebuild reads the new layout, and
    the next pass undoes it (manifests from the rows, object deleted)."""
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    Admin(root).create_topic("t", 1, tier=url, local_retention_bytes=0, **SMALL)
    sent = [os.urandom(100) for _ in range(300)]
    with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch, ch.sender() as tx:
        for value in sent:
            tx.send(value)
    fc("tier", "run", "--root", str(root), "--once")
    before = uploaded(root)
    settings = DefragSettings(merge_below_bytes=3000, target_bytes=20_000, garbage_delay_ms=0)
    run = plan(before, settings)[0]
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url) as storage:
        epoch = metadata.take_epoch("test")
        name = merged_name("t/0", run.records[0].base_offset, epoch, run.records[-1].end_offset, "00000000000000aa")
        merge = Merge(name, "t/0", epoch, run.sources, layout_after(run, name))
        metadata.begin_merge(epoch, merge)
        storage.concat(name, list(run.sources))
        for r in run.records:
            storage.write(manifest_of(r), encode_manifest(replace(r, chunks=merge.layout[r.base_offset])))
    assert fsck(root, deep=True).findings == []  # both layouts are whole; the object is named by the merge
    rebuilt = tmp_path / "rebuilt"  # from a copy of the bucket: a rebuild takes the prefix over
    shutil.copytree(tmp_path / "tier", tmp_path / "tier-copy")
    assert rebuild_root(rebuilt, f"file://{tmp_path}/tier-copy").problems == []
    assert {c.name for r in uploaded(rebuilt) for c in r.chunks} >= {name}  # the bucket describes the new layout
    assert read_all(rebuilt, "t", 0) == list(enumerate(sent[: before[-1].end_offset]))

    run_once = fc("tier", "run", "--root", str(root), "--once")
    assert f"abandoned the merge into {name}" in run_once.stdout
    assert uploaded(root) == before and fsck(root, deep=True).findings == []
    with open_storage(url) as storage, TierMetadata(root / ROOT_METADATA) as metadata:
        assert name in metadata.garbage("t/0")  # deleted once due: an overtaken merger may still name it
        assert all(decode_manifest(storage.read(manifest_of(r), 0, 1 << 20), manifest_of(r)) == r for r in before)
