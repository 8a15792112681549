"""``filechannel tier rebuild --replica`` and ``--refresh``: a read-only root made from a bucket another
root owns and keeps writing to, through the console script, on a folder and on SeaweedFS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from filechannel.client import Consumer, Producer, TopicPartition
from filechannel.client.topics import Admin
from filechannel.errors import ReadOnlyError
from filechannel.root import ROOT_METADATA, RootLayout
from filechannel.tiering import open_storage
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.metadata import TierMetadata
from filechannel.tiering.ownership import CLAIM, EPOCHS, IDENTITY_FILE

from ..cli_helpers import fc_text as fc
from .test_daemon import tier_for
from .tier_helpers import SMALL


def send(root: Path, partition: int, values: list[bytes]) -> None:
    with Producer(root=root) as producer:
        for value in values:
            producer.send("t", value, partition=partition)


def poll_all(consumer: Consumer) -> dict[int, list[tuple[int, bytes]]]:
    """What ``consumer`` polls until a poll returns nothing."""
    got: dict[int, list[tuple[int, bytes]]] = {}
    while batch := consumer.poll(timeout_ms=300, max_records=10_000):
        for tp, records in batch.items():
            got.setdefault(tp.partition, []).extend((r.offset, r.value) for r in records)
    return got


def reader(root: Path) -> Consumer:
    consumer = Consumer(root=root, auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([TopicPartition("t", p) for p in range(2)])
    return consumer


def bounds(root: Path) -> dict[int, tuple[int, int] | None]:
    with TierMetadata(root / ROOT_METADATA) as metadata:
        return {p: metadata.bounds(f"t/{p}") for p in range(2)}


@pytest.mark.parametrize("kind", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_replica_reads_the_owners_bucket_never_claims_it_and_refreshes(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, replica = tmp_path / "owner", tmp_path / "replica"
    url, options = tier_for(kind, tmp_path, request, monkeypatch)
    Admin(owner).create_topic("t", 2, tier=url, tier_options=options, local_retention_bytes=0, **SMALL)
    sent = {p: [b"p%d-%05d" % (p, i) * 8 for i in range(200)] for p in range(2)}
    for p in range(2):
        send(owner, p, sent[p])
    fc("tier", "run", "--root", str(owner), "--once", "--roll")
    with open_storage(url, **options) as storage:
        claim = storage.read(CLAIM, 0, 1 << 16)
        epochs = [o.name for o in storage.list(EPOCHS)]

    made = fc("tier", "rebuild", "--replica", "--root", str(replica), "--tier", url, "--tier-options", json.dumps(options))
    assert "rebuilt a replica of 1 topic(s), 2 partition(s)" in made.stdout and "took the prefix over" not in made.stderr
    with open_storage(url, **options) as storage:  # the owner's claim and epochs untouched: nothing written there
        assert storage.read(CLAIM, 0, 1 << 16) == claim and [o.name for o in storage.list(EPOCHS)] == epochs
    assert not (replica / ".tier" / IDENTITY_FILE).exists()

    consumer = reader(replica)  # stays open across the refresh below
    try:
        assert poll_all(consumer) == {p: list(enumerate(sent[p])) for p in range(2)}
        with Producer(root=replica) as producer, pytest.raises(ReadOnlyError, match=r"read-only replica of .*--refresh"):
            producer.send("t", b"x", partition=0).get(timeout=30)
        assert not [f for p in range(2) for f in (replica / "t" / str(p)).iterdir() if f.name.endswith((".seg", ".seg.z"))]
        with pytest.raises(ReadOnlyError, match=r"cannot create topic 'new': .* is a read-only replica"):
            Admin(replica).create_topic("new", 1)
        with pytest.raises(ReadOnlyError, match=r"cannot delete topic 't'"):
            Admin(replica).delete_topic("t")

        refused = fc("tier", "run", "--root", str(replica), "--once", check=False)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        [line] = [x for x in refused.stderr.splitlines() if x.startswith("error:")]
        assert "cannot run the tiering daemon" in line and "read-only replica" in line
        assert not refused.stdout  # refused before a pass: no epoch taken
        with pytest.raises(ReadOnlyError, match="cannot run the tiering daemon"):
            TieringDaemon(replica).start()  # the API too, before its lock or staging is made
        assert not (replica / ".tier" / "daemon.lock").exists()
        repair = fc("tier", "fsck", "--repair", "--root", str(replica), check=False)
        assert repair.returncode == 1 and "read-only replica" in repair.stderr

        # the owner goes on: more records, a deletion below offset 100 of partition 0, uploaded
        more = {p: [b"more-%d-%05d" % (p, i) * 8 for i in range(100)] for p in range(2)}
        for p in range(2):
            send(owner, p, more[p])
        Admin(owner).delete_records_before("t", 0, 100)
        Admin(owner).alter_topic("t", {"retention_ms": 123_456_789})  # the owner's daemon copies it to tier-2
        run = fc("tier", "run", "--root", str(owner), "--once", "--roll")
        assert "pass done" in run.stdout and "owned by another root" not in run.stdout + run.stderr
        owner_bounds = bounds(owner)
        assert owner_bounds[0] is not None and owner_bounds[0][0] > 0  # retention deleted the oldest segments

        refreshed = fc("tier", "rebuild", "--refresh", "--root", str(replica))
        assert "refreshed 1 topic(s), 2 partition(s)" in refreshed.stdout
        settings = RootLayout(replica).meta("t")["config"]  # the owner's new setting, the replica's own tier
        assert settings["retention_ms"] == 123_456_789 and settings["tier"] == url
        assert "settings now as the owner's: retention_ms=123456789" in refreshed.stdout + refreshed.stderr
        assert bounds(replica) == owner_bounds
        whole = {p: list(enumerate(sent[p] + more[p])) for p in range(2)}
        assert poll_all(consumer) == {p: whole[p][200:] for p in range(2)}  # the open reader goes on with the new uploads
    finally:
        consumer.close()
    fresh = reader(replica)
    try:
        got = poll_all(fresh)
    finally:
        fresh.close()
    assert got == {0: whole[0][owner_bounds[0][0] :], 1: whole[1]}  # what retention deleted is gone
    with open_storage(url, **options) as storage:
        assert storage.read(CLAIM, 0, 1 << 16) == claim


def test_refresh_and_replica_misuse_are_one_line_each(tmp_path: Path) -> None:
    root = tmp_path / "root"
    Admin(root).create_topic("t", 1, tier=f"file://{tmp_path}/tier", **SMALL)
    not_replica = fc("tier", "rebuild", "--refresh", "--root", str(root), check=False)
    assert not_replica.returncode == 1 and "is not a replica" in not_replica.stderr
    both = fc("tier", "rebuild", "--refresh", "--root", str(root), "--tier", f"file://{tmp_path}/tier", check=False)
    assert both.returncode == 2 and "--refresh takes --root only" in both.stderr
    missing = fc("tier", "rebuild", "--root", str(tmp_path / "new"), check=False)
    assert missing.returncode == 2 and "--tier URL" in missing.stderr


def test_a_replica_of_an_edge_roots_origin_follows_it(tmp_path: Path) -> None:
    """An edge root with an origin tiers under <url>/<origin>: a replica of that prefix reads it,
    and is refreshed as the edge root goes on; the origin's claim stays the edge root's."""
    edge, replica, url = tmp_path / "edge", tmp_path / "replica", f"file://{tmp_path}/bucket"
    Admin(edge).set_origin("edge-1")
    Admin(edge).create_topic("t", 2, tier=url, local_retention_bytes=0, **SMALL)
    sent = {p: [b"e%d-%05d" % (p, i) * 8 for i in range(120)] for p in range(2)}
    for p in range(2):
        send(edge, p, sent[p])
    fc("tier", "run", "--root", str(edge), "--once", "--roll")
    with open_storage(f"{url}/edge-1") as storage:
        claim = storage.read(CLAIM, 0, 1 << 16)
    fc("tier", "rebuild", "--replica", "--root", str(replica), "--tier", f"{url}/edge-1")
    consumer = reader(replica)
    try:
        assert poll_all(consumer) == {p: list(enumerate(sent[p])) for p in range(2)}
        for p in range(2):
            send(edge, p, [b"later-%d" % p])
        fc("tier", "run", "--root", str(edge), "--once", "--roll")
        fc("tier", "rebuild", "--refresh", "--root", str(replica))
        assert poll_all(consumer) == {p: [(120, b"later-%d" % p)] for p in range(2)}
    finally:
        consumer.close()
    with open_storage(f"{url}/edge-1") as storage:
        assert storage.read(CLAIM, 0, 1 << 16) == claim
