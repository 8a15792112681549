"""Tier-2 trusts the bucket: ``metadata.db`` is an index the bucket rebuilds, the prefix has one owner,
epochs come from the bucket, and Tier-1 never waits on tier-2.

Each scenario as an operator meets it: the index emptied, truncated, filled with garbage, deleted
or moved aside (then the daemon restarted); two roots on one prefix; a rebuilt root and the old one
back; local sends with a damaged index and an unreachable bucket.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import sqlite3
import threading
import time
from contextlib import closing
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from filechannel.client import Producer
from filechannel.client.topics import Admin
from filechannel.errors import CorruptRecordError, FencedError, NotOwnerError, TierError
from filechannel.root import ROOT_METADATA
from filechannel.tiering import open_storage
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.daemon_lock import LOCK_FILE
from filechannel.tiering.defrag import DefragSettings, defrag_root
from filechannel.tiering.fsck import fsck
from filechannel.tiering.heads import ChannelHead, decode_head, head_name, read_head
from filechannel.tiering.layout import decode_manifest, encode_manifest
from filechannel.tiering.metadata import TierMetadata
from filechannel.tiering.ownership import CLAIM, PrefixGuard, newest_epoch, read_claim, root_identity
from filechannel.tiering.rebuild import rebuild_root

from .. import children
from .conftest import wait_for
from .test_daemon import HELPERS, tier_for
from .test_defrag import Child
from .test_rebuild import read_all as read_partition
from .tier_helpers import SMALL, manifest_of

RECORDS = 400


def read_all(root: Path) -> list[tuple[int, bytes]]:
    """Every record of partition 0 of topic t, from its first offset, with no group."""
    return read_partition(root, "t", 0)


def tiered_root(root: Path, url: str, options: dict | None = None, records: int = RECORDS, tag: bytes = b"a") -> list[bytes]:
    """A one-partition tiered topic whose older segments live only in tier-2 after one daemon pass."""
    Admin(root).create_topic("t", 1, tier=url, tier_options=options or {}, local_retention_bytes=0, **SMALL)
    values = [tag + b"-%06d-" % i + os.urandom(60) for i in range(records)]
    with Producer(root=root) as producer:
        for value in values:
            producer.send("t", value, partition=0)
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert report.failures == [] and report.uploaded > 3 and report.deleted_local > 3
    return values


def objects(url: str) -> dict[str, int]:
    with open_storage(url) as storage:
        return {o.name: o.length for o in storage.list("")}


def damage(path: Path, how: str) -> None:
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif how == "garbage":
        path.write_bytes(os.urandom(8192))
    elif how == "missing":
        path.unlink()
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["empty", "truncated", "garbage", "missing"])
def test_a_lost_or_damaged_index_is_rebuilt_from_the_bucket_and_nothing_is_hidden_or_deleted(
    how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    values = tiered_root(root, url)
    with TierMetadata(root / ROOT_METADATA) as metadata:
        first_local = metadata.segments("t/0")[-1].end_offset
    assert first_local > 0
    before = objects(url)
    damage(root / ROOT_METADATA, how)

    with caplog.at_level(logging.WARNING, logger="filechannel"):
        got = read_all(root)
    assert got == list(enumerate(values))  # from offset 0, not from the first local offset
    assert any("behind the bucket" in r.getMessage() or "damaged" in r.getMessage() for r in caplog.records)

    # the daemon's next pass deletes nothing the manifests name, and the index holds every segment again
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert report.failures == [] and report.deleted_remote == 0
    after = objects(url)
    assert {n: s for n, s in before.items() if n.endswith((".chunk", ".manifest"))}.items() <= after.items()
    with TierMetadata(root / ROOT_METADATA) as metadata:
        assert metadata.segments("t/0")[-1].end_offset == first_local
    assert read_all(root) == list(enumerate(values))


def test_index_moved_aside_then_the_daemon_restarted_takes_a_newer_epoch_and_deletes_nothing(tmp_path: Path) -> None:
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    values = tiered_root(root, url)
    with TierMetadata(root / ROOT_METADATA) as metadata:
        old_epoch = metadata.current_epoch()
    before = objects(url)
    os.replace(root / ROOT_METADATA, tmp_path / "aside.db")  # as the old error message advised

    with TieringDaemon(root) as daemon:
        assert daemon.epoch > old_epoch  # from the bucket's epoch marks, not 1 again
        report = daemon.run(once=True)
    assert report.failures == [] and report.deleted_remote == 0
    assert {n for n in before if n.endswith((".chunk", ".manifest"))} <= set(objects(url))
    with open_storage(url) as storage:
        assert newest_epoch(storage) > old_epoch
    assert read_all(root) == list(enumerate(values))


def test_an_index_restored_from_an_old_copy_is_brought_up_to_the_bucket(tmp_path: Path) -> None:
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    Admin(root).create_topic("t", 1, tier=url, local_retention_bytes=0, **SMALL)
    values = [b"v-%06d" % i + os.urandom(60) for i in range(2 * RECORDS)]
    with Producer(root=root) as producer:
        for value in values[:RECORDS]:
            producer.send("t", value, partition=0)
    with TieringDaemon(root) as daemon:
        daemon.run(once=True)
    shutil.copy(root / ROOT_METADATA, tmp_path / "backup.db")  # an old copy (the WAL is checkpointed at close)
    with Producer(root=root) as producer:
        for value in values[RECORDS:]:
            producer.send("t", value, partition=0)
    with TieringDaemon(root) as daemon:
        daemon.run(once=True)
    with open_storage(url) as storage:
        head = read_head(storage, "t/0")
    assert head is not None and head.end_offset > RECORDS
    for suffix in ("-wal", "-shm"):
        Path(str(root / ROOT_METADATA) + suffix).unlink(missing_ok=True)
    shutil.copy(tmp_path / "backup.db", root / ROOT_METADATA)  # the restore

    assert read_all(root) == list(enumerate(values))


def test_two_roots_on_one_prefix_the_second_refuses_and_deletes_nothing(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/tier"
    a, b = tmp_path / "a", tmp_path / "b"
    values_a = tiered_root(a, url, tag=b"a")
    before = objects(url)

    Admin(b).create_topic("t", 1, tier=url, local_retention_bytes=0, **SMALL)
    with Producer(root=b) as producer:
        for i in range(RECORDS):
            producer.send("t", b"b-%06d" % i, partition=0)
    lines: list[str] = []
    with TieringDaemon(b, progress=lines.append) as daemon:
        report = daemon.run(once=True)
    assert len(report.failures) == 1 and "owned by another root" in report.failures[0]
    with open_storage(url) as storage:
        claim = read_claim(storage)
    assert claim is not None and claim.root_id == root_identity(str(a / ".tier"))
    assert report.failures[0].count(claim.root_id) == 1
    assert objects(url) == {**before, **{n: s for n, s in objects(url).items() if n.startswith(".epochs/")}}
    assert report.uploaded == 0 and report.deleted_local == 0
    assert len(read_all(b)) == RECORDS  # b's records stay local, all of them
    assert read_all(a) == list(enumerate(values_a))  # a never sees b's records


def test_a_rebuilt_root_owns_the_prefix_and_the_old_root_back_refuses_to_tier(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/tier"
    old, new = tmp_path / "old", tmp_path / "new"
    values = tiered_root(old, url)
    shutil.copytree(old, tmp_path / "old-copy")  # the old root, as it was when the machine was lost
    shutil.rmtree(old)

    report = rebuild_root(new, url)
    assert any("took the prefix over" in n for n in report.notes)
    uploaded = report.ends["t/0"]  # records only on the lost disk are gone; the rest is in the bucket
    assert 0 < uploaded < len(values)
    with Producer(root=new) as producer:
        for i in range(RECORDS):
            producer.send("t", b"new-%06d" % i, partition=0)
    with TieringDaemon(new) as daemon:
        assert daemon.run(once=True).failures == []
    before = objects(url)

    os.replace(tmp_path / "old-copy", old)  # the old root comes back
    with TieringDaemon(old) as daemon:
        refused = daemon.run(once=True)
    assert refused.failures and "owned by another root" in refused.failures[0]
    assert refused.uploaded == 0 and refused.deleted_remote == 0
    assert objects(url).keys() - {n for n in objects(url) if n.startswith(".epochs/")} == before.keys() - {
        n for n in before if n.startswith(".epochs/")
    }
    got = read_all(new)
    assert got[:uploaded] == list(enumerate(values[:uploaded]))
    assert got[uploaded:] == [(uploaded + i, b"new-%06d" % i) for i in range(RECORDS)]


def test_an_overtaken_uploader_is_fenced_by_the_bucket_and_a_foreign_claim_stops_it(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/tier"
    with open_storage(url) as storage:
        first = PrefixGuard(storage, "root-a", "host:1", 5)
        first.enter()
        first.verify()
        with pytest.raises(FencedError, match="already records epoch 5"):
            PrefixGuard(storage, "root-a", "host:2", 5).enter()  # the same epoch twice: refused
        PrefixGuard(storage, "root-a", "host:2", 6).enter()
        with pytest.raises(FencedError, match=r"overtaken .* by epoch 6"):
            first.verify()
        with pytest.raises(NotOwnerError, match=r"root-a"):
            PrefixGuard(storage, "root-b", "host:3", 7).enter()
        storage.write(CLAIM, b'{"by":"x","claimed_at_ms":0,"root_id":"root-b","took_over_from":null}')
        with pytest.raises(NotOwnerError, match=r"root-b"):
            PrefixGuard(storage, "root-a", "host:2", 6).verify()


@pytest.mark.parametrize("kind", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_local_sends_go_on_with_a_damaged_index_and_an_unreachable_bucket(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    url, options = tier_for(kind, tmp_path, request, monkeypatch)
    values = tiered_root(root, url, options)
    damage(root / ROOT_METADATA, "garbage")
    if kind == "file":
        os.replace(tmp_path / "tier", tmp_path / "tier-away")  # the folder tier is gone
    else:
        topic = root / "t" / "topic.json"  # point the topic at a port nothing listens on, tried once a call
        meta = json.loads(topic.read_text())
        meta["config"]["tier_options"] = {**options, "endpoint_url": "http://127.0.0.1:9", "max_attempts": 1}
        topic.write_text(json.dumps(meta))
    more = [b"more-%06d" % i for i in range(300)]
    with Producer(root=root) as producer:
        offsets = [producer.send("t", value, partition=0).get(timeout=30).offset for value in more]
    assert offsets == list(range(len(values), len(values) + len(more)))
    # a reader of the offloaded offsets gets an error naming what is wrong, never a jump to the first local offset
    with pytest.raises(TierError, match=r"cannot tell what tier-2 holds of t/0.*retry once the storage is reachable"):
        read_all(root)


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _manifests_agree_with_the_index(root: Path, url: str) -> list:
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url) as storage:
        rows = metadata.segments("t/0")
        for r in rows:
            assert decode_manifest(storage.read(manifest_of(r), 0, 1 << 20), manifest_of(r)) == r
    return rows


def test_an_overtaken_defragmenter_held_with_sigstop_publishes_no_manifest_that_outlives_it(tmp_path: Path) -> None:
    """A daemon defragmenting is stopped (SIGSTOP, at a failpoint) after its fence check and before
    it writes a manifest; a newer daemon takes over and abandons the merge; the old one, continued,
    writes the manifest, finds itself fenced, writes it back, and exits. The bucket alone still
    describes every segment: a rebuild from it reads every uploaded record."""
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    Admin(root).create_topic("t", 1, tier=url, local_retention_bytes=0, **SMALL)
    sent = [os.urandom(100) for _ in range(1200)]
    with Producer(root=root) as producer:
        for value in sent:
            producer.send("t", value, partition=0)
    with TieringDaemon(root) as daemon:
        assert daemon.run(once=True).failures == []
    failpoints = tmp_path / "failpoints"
    failpoints.mkdir()
    (failpoints / "defrag-manifest-next").write_bytes(b"stop")
    old = Child(root, failpoints)
    try:
        old.wait_line("merging")
        deadline = time.monotonic() + 30
        while not _stopped(old.proc.pid):
            assert time.monotonic() < deadline, "the defragmenter never reached its failpoint"
            time.sleep(0.01)
        os.unlink(root / ".tier" / LOCK_FILE)  # it looks dead: an operator starts another daemon
        with TieringDaemon(root) as newer:
            report = newer.run(once=True)
        assert report.failures == []
        old.proc.send_signal(signal.SIGCONT)
        _, err = old.proc.communicate(timeout=60)
    finally:
        if old.proc.poll() is None:
            old.proc.kill()
            old.proc.wait()
    assert old.proc.returncode != 0 and "FencedError" in err
    _manifests_agree_with_the_index(root, url)
    with closing(sqlite3.connect(root / ROOT_METADATA)) as db, db:  # the abandoned merge's object falls due now
        db.execute("UPDATE garbage SET due_at_ms = 0")
    with TieringDaemon(root) as newer:
        assert newer.run(once=True).failures == []
    with open_storage(url) as storage:
        assert not [o.name for o in storage.list("t/0/") if o.name.endswith(".merged")]  # the merge never happened
    rows = _manifests_agree_with_the_index(root, url)
    shutil.copytree(tmp_path / "tier", tmp_path / "tier-copy")
    rebuilt = rebuild_root(tmp_path / "rebuilt", f"file://{tmp_path}/tier-copy")
    assert rebuilt.problems == []
    assert read_all(tmp_path / "rebuilt") == list(enumerate(sent[: rows[-1].end_offset]))
    assert fsck(root, deep=True).findings == []


def test_garbage_a_late_manifest_still_names_is_deleted_only_after_the_manifest_is_mended(tmp_path: Path) -> None:
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    values = tiered_root(root, url)
    with TierMetadata(root / ROOT_METADATA) as metadata:
        before = metadata.segments("t/0")
    defrag_root(root, DefragSettings(merge_below_bytes=1 << 20, target_bytes=1 << 20, garbage_delay_ms=0))
    with TierMetadata(root / ROOT_METADATA) as metadata:
        garbage = metadata.garbage("t/0")
        assert garbage and metadata.segments("t/0") != before
    with open_storage(url) as storage:  # an overtaken merger's late write: the layout before the merge
        storage.write(manifest_of(before[0]), encode_manifest(before[0]))
    with TieringDaemon(root) as daemon:  # its first pass deletes the due garbage
        assert daemon.run(once=True).failures == []
    with TierMetadata(root / ROOT_METADATA) as metadata:
        assert metadata.garbage("t/0") == []
    _manifests_agree_with_the_index(root, url)
    with open_storage(url) as storage:
        assert not any(storage.exists(name) for name in garbage)
    shutil.copytree(tmp_path / "tier", tmp_path / "tier-copy")
    assert rebuild_root(tmp_path / "rebuilt", f"file://{tmp_path}/tier-copy").problems == []
    assert read_all(tmp_path / "rebuilt")[: before[-1].end_offset] == list(enumerate(values[: before[-1].end_offset]))


STORM_ROUNDS = int(os.environ.get("FC_TIER_STORM_ROUNDS", "24"))


class _Proc:
    """A helper process of tier_helpers.py (forked from the fork server: tests/children.py), its stdout
    lines collected by a thread."""

    def __init__(self, *args: str) -> None:
        self.proc = children.start(HELPERS, *args)
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def printed_or_ended(self, prefix: str) -> bool:
        """Whether a line starting with ``prefix`` came, or the process ended."""
        return any(line.startswith(prefix) for line in self.lines) or self.proc.poll() is not None

    def kill(self) -> list[str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._thread.join(timeout=10)
        return self.lines


@pytest.mark.crash
@pytest.mark.slow
def test_sigkill_storm_with_the_index_deleted_or_truncated_loses_hides_and_repeats_nothing(tmp_path: Path) -> None:
    """Rounds of a daemon, a producer and a reader, each SIGKILLed at a random moment; between
    rounds the index is deleted, truncated, filled with garbage or moved aside at random. No
    acknowledged record is lost, hidden or read twice; fsck --deep is clean after the next pass."""
    rng = random.Random(34)
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    Admin(root).create_topic("t", 1, tier=url, local_retention_bytes=0, **SMALL)
    acked: list[str] = []
    damages = {"kept": 0, "deleted": 0, "truncated": 0, "garbage": 0, "aside": 0}
    for k in range(STORM_ROUNDS):
        procs = [
            _Proc("daemon", str(root), "--grace-ms", "0"),
            producer := _Proc("producer", str(root), f"r{k}", "300"),
            _Proc("reader", str(root)),
        ]
        # The random moment counts from the producer's first acknowledgement, not from the start:
        # three interpreters starting beside a busy suite may take longer than a round (no record
        # acknowledged in 24 rounds in one CI run, 2026-11-28, when the moment counted from the start).
        try:
            wait_for(partial(producer.printed_or_ended, "acked "), 60, "the producer's first acknowledgement")
        except AssertionError:
            for p in procs:
                p.kill()
            raise
        time.sleep(rng.uniform(0.0, 0.9))
        rng.shuffle(procs)
        for p in procs:
            lines = p.kill()
            assert not [line for line in lines if line.startswith("BAD")], (k, lines)
            acked += [line.split(" ", 1)[1] for line in lines if line.startswith("acked ")]
        how = rng.choice(list(damages))
        damages[how] += 1
        index = root / ROOT_METADATA
        if how == "deleted":
            for suffix in ("", "-wal", "-shm"):
                Path(str(index) + suffix).unlink(missing_ok=True)
        elif how == "truncated" and index.exists():
            with open(index, "r+b") as f:
                f.truncate(rng.randrange(0, max(1, index.stat().st_size)))
        elif how == "garbage" and index.exists():
            index.write_bytes(os.urandom(4096))
        elif how == "aside" and index.exists():
            os.replace(index, tmp_path / f"aside-{k}.db")
    assert len(acked) >= STORM_ROUNDS * 20 and damages["kept"] < STORM_ROUNDS  # each round waited for a first flush of 20
    with TieringDaemon(root, orphan_grace_ms=0) as daemon:  # the next pass
        assert daemon.run(once=True).failures == []
    report = fsck(root, deep=True)
    assert report.findings == [], [f.line() for f in report.findings]
    got = read_all(root)
    assert [o for o, _ in got] == list(range(len(got)))  # dense, in order
    values = [v.decode() for _, v in got]
    assert len(values) == len(set(values))  # nothing twice
    assert set(acked) <= set(values)  # nothing acknowledged lost or hidden


@given(
    first=st.integers(0, 2**62),
    length=st.integers(0, 2**62),
    epoch=st.integers(1, 10**10 - 1),
    at=st.integers(1, 2**50),
    flip=st.data(),
)
def test_a_head_round_trips_and_any_flipped_byte_is_refused(
    first: int, length: int, epoch: int, at: int, flip: st.DataObject
) -> None:
    head = ChannelHead("t/0", first, first + length, epoch, at)
    data = head.encode()
    assert decode_head(data, head_name("t/0")) == head
    i = flip.draw(st.integers(0, len(data) - 1))
    damaged = data[:i] + bytes([data[i] ^ flip.draw(st.integers(1, 255))]) + data[i + 1 :]
    try:
        assert decode_head(damaged, head_name("t/0")) == head  # a flip JSON ignores (whitespace) is harmless
    except CorruptRecordError as exc:
        assert "head.json" in str(exc)
    with pytest.raises(CorruptRecordError, match="another channel"):
        decode_head(data, head_name("t/1"))
