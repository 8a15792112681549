"""The tiering daemon on a root: uploads to a local folder and to S3 (SeaweedFS), local retention deletes
only uploaded segments, a failing storage deletes nothing and shows in the status, total retention
removes tier-2 copies, compression="none" topics, one daemon per root."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from filechannel import FileChannel
from filechannel.client.topics import Admin, TopicStore
from filechannel.config import ChannelConfig
from filechannel.errors import ConfigError, StorageUnavailableError, TierError
from filechannel.root import ROOT_METADATA
from filechannel.tiering import bindings, open_storage
from filechannel.tiering import daemon as daemon_module
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.layout import parse_object_name
from filechannel.tiering.local_storage import LocalStorage
from filechannel.tiering.metadata import TierMetadata
from filechannel.tiering.status import tier_status

from .conftest import wait_for
from .tier_helpers import local_bases, make_topic, produce, segment_objects, tier2_records

HELPERS = Path(__file__).with_name("tier_helpers.py")


def values(n: int, start: int = 0) -> list[bytes]:
    return [b"%06d" % i + os.urandom(90) for i in range(start, start + n)]


def tier_for(kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict]:
    """A storage URL and its (non-secret) options; S3 credentials come from the environment."""
    if kind == "file":
        return f"file://{tmp_path}/tier", {}
    server = request.getfixturevalue("seaweed")
    bucket = request.getfixturevalue("bucket")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    return f"s3://{bucket}/tier", {"endpoint_url": server.endpoint, "region_name": "us-east-1"}


@pytest.mark.parametrize("kind", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_pass_uploads_then_local_retention_keeps_only_what_is_not_uploaded(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    url, options = tier_for(kind, tmp_path, request, monkeypatch)
    make_topic(root, url, tier_options=options, local_retention_bytes=0)
    sent = values(300)
    produce(root, sent)
    before = local_bases(root)
    assert len(before) > 3
    lines: list[str] = []
    with TieringDaemon(root, progress=lines.append) as daemon:
        report = daemon.run(once=True)
    assert report.failures == []
    assert report.uploaded == len(before) - 1  # every sealed segment; never the active one
    assert local_bases(root) == [before[-1]]  # local retention 0: only the active segment stays
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url, **options) as storage:
        assert [r.base_offset for r in metadata.segments("t/0")] == before[:-1]
        got = tier2_records(storage, metadata, "t/0")
    assert [r.value for r in got] == sent[: before[-1]]
    assert [r.offset for r in got] == list(range(before[-1]))
    assert any("uploaded offsets" in line for line in lines)
    with open_storage(url, **options) as storage:
        copied = json.loads(storage.read("t/topic.json", 0, 1 << 20))  # the topic's description, copied
    assert (copied["name"], copied["partitions"]) == ("t", 1)
    assert copied["config"]["tier"] == url and copied["config"]["local_retention_bytes"] == 0
    [status] = tier_status(root)
    assert (status.uploaded_segments, status.waiting_segments, status.local_segments) == (len(before) - 1, 0, 1)


def test_local_retention_bytes_keeps_the_newest_uploaded(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_topic(root, f"file://{tmp_path}/tier", local_retention_bytes=3 * 4096)
    produce(root, values(300))
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
        kept = local_bases(root)
        with TierMetadata(root / ROOT_METADATA) as metadata:
            uploaded = [r.base_offset for r in metadata.segments("t/0")]
    assert 1 < len(kept) <= 4  # about 3 segments' worth of bytes stays local
    assert uploaded[0] < kept[0]  # the older ones are only in tier-2
    assert set(kept[:-1]) <= set(uploaded)  # every local sealed segment is uploaded too


def test_tier_after_ms_and_local_retention_ms_go_by_record_age(tmp_path: Path) -> None:
    """tier_after_ms goes by a segment's first record (uploaded once it is an hour old, the
    active segment sealed for it), local_retention_ms by its newest: segments holding only old
    records leave the disk, a segment starting with a new record is not uploaded."""
    root = tmp_path / "root"
    hour = 3600 * 1000
    make_topic(root, f"file://{tmp_path}/tier", tier_after_ms=hour, local_retention_ms=hour)
    now = time.time_ns() // 1_000_000
    produce(root, values(150), timestamp=now - 2 * hour)
    produce(root, values(150, 150), timestamp=now)
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    with TierMetadata(root / ROOT_METADATA) as metadata:
        uploaded = metadata.segments("t/0")
    assert (
        uploaded and uploaded[0].base_offset == 0 and all(a.end_offset == b.base_offset for a, b in itertools.pairwise(uploaded))
    )
    assert all(r.base_offset < 150 for r in uploaded)  # each starts with an old record
    assert uploaded[-1].end_offset >= 150 and uploaded[-1].end_offset in local_bases(root)  # the next starts with a new one
    holding = next((r.base_offset for r in uploaded if r.base_offset <= 150 < r.end_offset), 150)
    assert local_bases(root)[0] == holding  # every segment of old records only left the disk


def test_no_retention_deletes_a_segment_not_uploaded(tmp_path: Path) -> None:
    """Local and total retention both say "delete everything", but nothing is uploaded yet
    (tier_after_ms holds every segment back): nothing is deleted, locally or by the channel's GC."""
    root = tmp_path / "root"
    make_topic(
        root, f"file://{tmp_path}/tier", tier_after_ms=3600 * 1000, local_retention_bytes=0, retention_bytes=0, retention_ms=0
    )
    produce(root, values(200))
    before = local_bases(root)
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert (report.failures, report.uploaded, report.deleted_local, report.deleted_remote) == ([], 0, 0, 0)
    assert local_bases(root) == before
    with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch:
        assert ch.collect_garbage() == [] and local_bases(root) == before


@pytest.mark.s3
def test_unreachable_storage_deletes_nothing_and_status_shows_the_backlog(
    tmp_path: Path, seaweed, bucket: str, unused_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    root = tmp_path / "root"
    options = {"endpoint_url": f"http://127.0.0.1:{unused_port}", "region_name": "us-east-1", "max_attempts": 1}
    make_topic(root, f"s3://{bucket}/t", tier_options=options, local_retention_bytes=0, retention_bytes=0)
    produce(root, values(200))
    before = local_bases(root)
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert len(report.failures) == 1 and report.failures[0].startswith("t/0: ") and "unreachable" in report.failures[0]
    assert local_bases(root) == before  # neither local nor total retention deleted a segment not uploaded
    [status] = tier_status(root)
    assert status.uploaded_segments == 0
    assert status.waiting_segments == len(before) - 1 and status.waiting_bytes > 0 and status.upload_lag_offsets > 0
    assert status.last_error is not None and "unreachable" in status.last_error
    # the storage is back (the topic's endpoint fixed): the next daemon cleans up and uploads everything
    topic_file = root / "t" / "topic.json"
    meta = json.loads(topic_file.read_text())
    meta["config"]["tier_options"] = {**options, "endpoint_url": seaweed.endpoint}
    topic_file.write_text(json.dumps(meta))
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert report.failures == [] and report.uploaded == len(before) - 1
    [status] = tier_status(root)
    assert status.last_error is None and status.waiting_segments == 0


@pytest.mark.parametrize("page", [None, 1, 3])
def test_total_retention_removes_tier2_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page: int | None) -> None:
    """Total retention deletes the oldest uploaded segments while the log across both tiers is
    over its limit; it reads them a page at a time from the oldest (pages of 1 and 3 here, to
    cross page ends), and deletes the same prefix whatever the page."""
    if page is not None:
        monkeypatch.setattr(daemon_module, "_RETENTION_PAGE", page)
    root = tmp_path / "root"
    url = f"file://{tmp_path}/tier"
    make_topic(root, url, local_retention_bytes=0)
    produce(root, values(300))
    with TieringDaemon(root) as daemon:
        daemon.run(once=True)
    with TierMetadata(root / ROOT_METADATA) as metadata:
        all_uploaded = metadata.segments("t/0")
    total = sum(r.size for r in all_uploaded)
    # keep about half of what tier-2 holds
    topic_file = root / "t" / "topic.json"
    meta = json.loads(topic_file.read_text())
    meta["config"]["retention_bytes"] = total // 2
    topic_file.write_text(json.dumps(meta))
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert report.failures == [] and report.deleted_remote > 0
    local_bytes = sum(os.path.getsize(p) for p in (root / "t" / "0").glob("*.seg"))  # not uploaded: the active one
    sizes = [r.size for r in all_uploaded]
    expected = next(k for k in range(len(sizes) + 1) if sum(sizes[k:]) + local_bytes <= total // 2)
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url) as storage:
        kept = metadata.segments("t/0")
        assert len(kept) == len(all_uploaded) - expected
        assert sum(r.size for r in kept) + local_bytes <= total // 2 + 4096
        assert kept == all_uploaded[-len(kept) :]  # the oldest went, a prefix
        names = segment_objects(storage, "t/0/")
        assert names == {c.name for r in kept for c in r.chunks} | {r.manifest for r in kept}
        assert metadata.segments("t/0", states=("deleting",)) == []


def test_records_deleted_by_delete_records_leave_tier2_at_the_next_pass(tmp_path: Path) -> None:
    """``delete_records`` moves a tiered partition's start; the next pass deletes the uploaded
    segments wholly below it (objects and rows) and keeps the one it falls inside."""
    root = tmp_path / "root"
    url = f"file://{tmp_path}/tier"
    make_topic(root, url, local_retention_bytes=0)
    produce(root, values(300))
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    with TierMetadata(root / ROOT_METADATA) as metadata:
        uploaded = metadata.segments("t/0")
    assert len(uploaded) >= 4
    start = uploaded[2].base_offset + 1  # inside the third segment
    with TopicStore(root).open_partition("t", 0) as ch:
        assert ch.delete_records(start) == start
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert report.failures == [] and report.deleted_remote == 2
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url) as storage:
        kept = metadata.segments("t/0")
        assert kept == uploaded[2:]
        assert segment_objects(storage, "t/0/") == {c.name for r in kept for c in r.chunks} | {r.manifest for r in kept}
    with TopicStore(root).open_partition("t", 0, read_only=True) as ch:
        assert ch.first_offset == start


def test_compression_none_uploads_the_block_form_and_keeps_local_raw(tmp_path: Path) -> None:
    root = tmp_path / "root"
    url = f"file://{tmp_path}/tier"
    make_topic(root, url, compression="none", fsync="always")
    sent = values(200)
    produce(root, sent)
    before = local_bases(root)
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    folder = root / "t" / "0"
    assert not list(folder.glob("*.seg.z")) and local_bases(root) == before  # local copies stay raw, all kept
    assert os.listdir(root / ".tier" / "staging") == []
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url) as storage:
        got = tier2_records(storage, metadata, "t/0")
    assert [r.value for r in got] == sent[: before[-1]]


def test_one_daemon_per_root(tmp_path: Path) -> None:
    """A second daemon, in another process, refuses to start while the first holds the root's lock."""
    root = tmp_path / "root"
    make_topic(root, f"file://{tmp_path}/tier")
    with TieringDaemon(root):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        child = subprocess.run(
            [sys.executable, str(HELPERS), "daemon", str(root), "--once"], capture_output=True, text=True, env=env
        )
        assert child.returncode != 0
        assert "another tiering daemon holds" in child.stderr
    with pytest.raises(TierError, match="not started"):
        _ = TieringDaemon(root).metadata


def test_standalone_channel_is_tiered_by_its_own_daemon(tmp_path: Path) -> None:
    """A standalone FileChannel's settings are stored nowhere: the daemon is given them, and uses
    the channel's own metadata (CHANNEL/tier/metadata.db) under the folder's name, as the channel does."""
    url = f"file://{tmp_path}/tier"
    settings: dict[str, Any] = {"tier": url, "segment_bytes": 4096, "tier_chunk_bytes": 1024, "local_retention_bytes": 0}
    sent = values(200)
    with FileChannel(tmp_path / "solo", maintenance_interval=0, **settings) as ch, ch.sender() as tx:
        for value in sent:
            tx.send(value)
    before = sorted(int(n.split(".")[0]) for n in os.listdir(tmp_path / "solo") if n.endswith(".seg"))
    with TieringDaemon(tmp_path / "solo", channel=ChannelConfig(**settings)) as daemon:
        assert daemon.run(once=True).failures == []
    assert sorted(int(n.split(".")[0]) for n in os.listdir(tmp_path / "solo") if n.endswith((".seg", ".seg.z"))) == [before[-1]]
    with TierMetadata(tmp_path / "solo" / "tier" / "metadata.db") as metadata, open_storage(url) as storage:
        assert [r.value for r in tier2_records(storage, metadata, "solo")] == sent[: before[-1]]
    with pytest.raises(ConfigError, match="no tier setting"):
        TieringDaemon(tmp_path / "solo", channel=ChannelConfig())


def _answers_reads(url: str, options: dict) -> bool:
    """Whether the server reads back the bytes of every object under ``url``: a restarted
    SeaweedFS answers listings and HEADs (its filer) before its volumes serve data (an
    ``InternalError`` meanwhile), and the daemon's next pass reads objects' data."""
    try:
        with open_storage(url, **options) as storage:
            for info in storage.list():
                if info.length:
                    storage.read(info.name, 0, 1)
        return True
    except TierError:
        return False


@pytest.mark.s3
def test_s3_server_killed_mid_upload_then_restarted(tmp_path: Path, private_seaweed, monkeypatch: pytest.MonkeyPatch) -> None:
    """The S3 server dies while the daemon uploads: the pass reports the partition, deletes nothing
    locally, leaves at worst an "uploading" row; once the server is back, the next pass cleans up
    and uploads every segment once, and the records read back."""
    server = private_seaweed
    bucket = server.new_bucket()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    root = tmp_path / "root"
    url = f"s3://{bucket}/tier"
    options = {"endpoint_url": server.endpoint, "region_name": "us-east-1", "max_attempts": 2}
    # 8 KiB/s: a 1 KiB chunk every eighth of a second, so the kill lands inside an upload
    make_topic(root, url, tier_options=options, local_retention_bytes=0, tier_upload_bytes_per_s=8192)
    sent = values(250)
    produce(root, sent)
    before = local_bases(root)
    reports = []
    with TieringDaemon(root) as daemon:
        worker = threading.Thread(target=lambda: reports.append(daemon.run(once=True)))
        worker.start()
        with TierMetadata(root / ROOT_METADATA) as metadata:
            wait_for(lambda: bool(metadata.segments("t/0")), 60, "a first segment uploaded")
        server.kill()
        worker.join(timeout=120)
        assert not worker.is_alive()
    [report] = reports
    assert len(report.failures) == 1 and report.failures[0].startswith("t/0: ")
    with TierMetadata(root / ROOT_METADATA) as metadata:
        uploaded = metadata.segments("t/0")
    assert 0 < len(uploaded) < len(before) - 1
    # local retention still ran: only the uploaded segments left the local disk
    assert local_bases(root) == [b for b in before if b >= uploaded[-1].end_offset]

    server.start()
    wait_for(lambda: _answers_reads(url, options), 60, "the restarted server answering reads")  # not just list_buckets
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert report.failures == []
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url, **options) as storage:
        assert metadata.segments("t/0", states=("uploading", "deleting")) == []
        uploaded = metadata.segments("t/0")
        assert [r.base_offset for r in uploaded] == before[:-1]  # each sealed segment once
        names = segment_objects(storage, "t/0/")
        assert names == {c.name for r in uploaded for c in r.chunks} | {r.manifest for r in uploaded}
        assert [r.value for r in tier2_records(storage, metadata, "t/0")] == sent[: before[-1]]
    assert local_bases(root) == [before[-1]]


def test_deleted_topic_is_purged_from_tier2_before_it_can_be_created_again(tmp_path: Path) -> None:
    root = tmp_path / "root"
    url = f"file://{tmp_path}/tier"
    make_topic(root, url, partitions=2, local_retention_bytes=0)
    for p in range(2):
        produce(root, values(150), partition=p)
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    with open_storage(url) as storage:
        assert storage.list("t/0/") and storage.list("t/1/")
    Admin(root).delete_topic("t")
    with pytest.raises(ConfigError, match="not purged its tier-2 copies yet"):
        make_topic(root, url)  # the new topic would read the old one's records from tier-2
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert report.failures == []
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url) as storage:
        # what is left is the prefix's own: its claim and epoch marks, never a record of the topic
        assert metadata.channels() == [] and storage.list("t/") == []
        assert {o.name.split("/")[0] for o in storage.list()} == {".claim.json", ".epochs"}
    make_topic(root, url)
    produce(root, values(10))
    with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch:
        assert ch.first_offset == 0 and ch.end_offset == 10


class GatedStorage(LocalStorage):
    """A local folder whose first chunk write of one segment (``gate``) waits until a chunk of a
    later segment has been written, then either goes on or fails (``fail``): a real storage,
    with the timing of a slow chunk made deterministic."""

    def __init__(self, root: str, gate: int, fail: bool) -> None:
        super().__init__(root)
        self.gate, self.fail = gate, fail
        self.later_written = threading.Event()
        self.overlapped = False
        self._gated = threading.Lock()

    def _do_write(self, name: str, data: memoryview) -> None:
        parsed = parse_object_name(name)
        if parsed is not None and parsed.kind == "chunk" and parsed.base_offset == self.gate and self._gated.acquire(False):
            self.overlapped = self.later_written.wait(10)  # False: no later segment was under way
            if self.fail:
                raise StorageUnavailableError(f"injected: {name} not written")
        super()._do_write(name, data)
        if parsed is not None and parsed.kind == "chunk" and parsed.base_offset > self.gate:
            self.later_written.set()


def gated_daemon(root: Path, monkeypatch: pytest.MonkeyPatch, storage: GatedStorage) -> TieringDaemon:
    monkeypatch.setattr(bindings, "open_storage", lambda url, **options: storage)  # what the daemon's StorageClients open
    return TieringDaemon(root)


def test_segments_overlap_and_commit_in_offset_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next segment's chunks are written while an earlier one's are still in flight (the
    writes do not drain at each segment's end), and every segment still lands, in order."""
    root = tmp_path / "root"
    make_topic(root, f"file://{tmp_path}/tier", local_retention_bytes=0)
    sent = values(300)
    produce(root, sent)
    before = local_bases(root)
    storage = GatedStorage(str(tmp_path / "tier"), gate=before[1], fail=False)
    with gated_daemon(root, monkeypatch, storage) as daemon:
        report = daemon.run(once=True)
    assert report.failures == [] and report.uploaded == len(before) - 1
    assert storage.overlapped  # a later segment's chunk was written while this one's waited
    with TierMetadata(root / ROOT_METADATA) as metadata:
        records = metadata.segments("t/0")
        assert [r.base_offset for r in records] == before[:-1]
        assert [r.state for r in records] == ["uploaded"] * len(records)
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(f"file://{tmp_path}/tier") as tier:
        got = tier2_records(tier, metadata, "t/0")
    assert [r.value for r in got] == sent[: before[-1]]


def test_a_failed_segment_undoes_the_later_ones_under_way_and_the_next_pass_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk of the second segment fails while later segments are under way: the first stays
    uploaded, the second and every later one are undone (no row, no object), nothing is deleted
    locally that tier-2 lacks; the next pass uploads the rest."""
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    make_topic(root, url, local_retention_bytes=0)
    sent = values(300)
    produce(root, sent)
    before = local_bases(root)
    storage = GatedStorage(str(tmp_path / "tier"), gate=before[1], fail=True)
    with gated_daemon(root, monkeypatch, storage) as daemon:
        report = daemon.run(once=True)
    assert len(report.failures) == 1 and "injected" in report.failures[0]
    assert storage.overlapped
    with TierMetadata(root / ROOT_METADATA) as metadata:
        assert [(r.base_offset, r.state) for r in metadata.segments("t/0")] == [(before[0], "uploaded")]
    with open_storage(url) as tier:
        names = [parse_object_name(o.name) for o in tier.list("t/0/")]
    assert {n.base_offset for n in names if n is not None} == {before[0]}  # the undone segments' objects are gone
    assert local_bases(root) == before[1:]  # only the uploaded segment left the local disk
    with gated_daemon(root, monkeypatch, GatedStorage(str(tmp_path / "tier"), gate=-1, fail=False)) as daemon:
        report = daemon.run(once=True)
    assert report.failures == [] and report.uploaded == len(before) - 2
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url) as tier:
        assert [r.base_offset for r in metadata.segments("t/0")] == before[:-1]
        got = tier2_records(tier, metadata, "t/0")
    assert [r.value for r in got] == sent[: before[-1]]
