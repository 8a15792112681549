"""Origins (many roots tiering into one bucket URL) and the bucket-only Consumer that reads them (issue 37).

Real roots with real daemons (``run(once=True)``, idle active segments sealed so every record is
uploaded) tier into one URL, a folder or SeaweedFS; a ``Consumer(tier=...)`` with no root reads
the union back from the bucket alone, and the bucket is listed before and after to show the
reader wrote nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from filechannel.bench.seaweed import SeaweedServer
from filechannel.client import Admin, AsyncConsumer, Consumer, Producer, TopicPartition
from filechannel.client.bucket import ORIGIN_HEADER
from filechannel.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidNameError,
    OriginLayoutError,
    StorageUnavailableError,
    UnknownTopicError,
)
from filechannel.root import RootLayout
from filechannel.spark.tier import TierPlanner
from filechannel.tiering import open_storage
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.defrag import DefragSettings, defrag_root
from filechannel.tiering.heads import head_name

from ..cli_helpers import SCRIPT, fc
from .conftest import FaultProxy, wait_for
from .test_daemon import tier_for
from .tier_helpers import SMALL

TOPIC_SETTINGS = {**SMALL, "local_retention_bytes": 0}


def edge_root(tmp_path: Path, origin: str | None, url: str, options: dict, partitions: int = 2) -> Path:
    """A root with ``origin`` (None: the default origin) and a tiered topic ``clicks`` at ``url``."""
    root = tmp_path / (origin or "default-root")
    if origin is not None:
        Admin(root).set_origin(origin)
    Admin(root).create_topic("clicks", partitions, tier=url, tier_options=options, **TOPIC_SETTINGS)
    return root


def produce(root: Path, origin: str, count: int, start: int = 0, partitions: int = 2, timestamp: int | None = None) -> None:
    with Producer(root=root) as producer:
        for i in range(start, start + count):
            producer.send("clicks", value(origin, i), partition=i % partitions, timestamp_ms=timestamp)


def value(origin: str, i: int) -> bytes:
    return f"{origin}-{i:06d}-".encode() + bytes(range(i % 7, i % 7 + 40))


def upload_all(root: Path) -> None:
    """One daemon pass that seals the idle active segments first: every record sent is uploaded."""
    with TieringDaemon(root, roll_idle_ms=0) as daemon:
        report = daemon.run(once=True)
    assert report.failures == [] and report.uploaded > 0


def listing(url: str, options: dict) -> dict[str, int]:
    with open_storage(url, **options) as storage:
        return {o.name: o.length for o in storage.list("")}


def drain(consumer: Consumer, want: int, timeout: float = 60.0) -> dict[TopicPartition, list]:
    """Poll until ``want`` records came (failing after ``timeout`` s), by partition."""
    got: dict[TopicPartition, list] = {}

    def more() -> bool:
        for tp, recs in consumer.poll(200).items():
            got.setdefault(tp, []).extend(recs)
        return sum(map(len, got.values())) >= want

    wait_for(more, timeout, f"{want} records")
    return got


def expected(origin: str, count: int, partitions: int = 2) -> dict[TopicPartition, list[bytes]]:
    out: dict[TopicPartition, list[bytes]] = {}
    for i in range(count):
        out.setdefault(TopicPartition(f"{origin}.clicks", i % partitions), []).append(value(origin, i))
    return out


def check_exactly_once(got: dict[TopicPartition, list], want: dict[TopicPartition, list[bytes]]) -> None:
    """Every origin-partition's records exactly once, in offset order, with the right bytes and origin header."""
    assert set(got) == set(want)
    for tp, recs in got.items():
        assert [r.value for r in recs] == want[tp], tp
        assert [r.offset for r in recs] == list(range(recs[0].offset, recs[0].offset + len(recs)))
        origin = tp.topic.split(".")[0].encode()
        assert all(r.headers == [(ORIGIN_HEADER, origin)] for r in recs)


@pytest.mark.s3
@pytest.mark.slow
def test_roots_with_origins_tier_into_one_bucket_url_and_a_bucket_consumer_reads_the_union_exactly_once(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, options = tier_for("s3", tmp_path, request, monkeypatch)
    roots = {origin: edge_root(tmp_path, origin, url, options) for origin in ("edge-1", "edge-2")}
    for origin, root in roots.items():
        produce(root, origin, 120)
        upload_all(root)
    assert {n.split("/")[0] for n in listing(url, options)} == {".origins", "edge-1", "edge-2"}  # one prefix per origin
    state = tmp_path / "reader"
    before = listing(url, options)

    consumer = Consumer(
        tier=url,
        tier_options=options,
        state_dir=state,
        group_id="g",
        auto_offset_reset="earliest",
        metadata_max_age_ms=200,
        tier_poll_ms=100,
    )
    consumer.subscribe(pattern=r".*\.clicks")
    got = drain(consumer, 240)
    check_exactly_once(got, {**expected("edge-1", 120), **expected("edge-2", 120)})
    assert listing(url, options) == before  # the reader wrote, rewrote and deleted nothing

    # Following: edge-1 uploads more; a third origin appears and the pattern picks it up.
    produce(roots["edge-1"], "edge-1", 40, start=120)
    upload_all(roots["edge-1"])
    roots["edge-3"] = edge_root(tmp_path, "edge-3", url, options)
    produce(roots["edge-3"], "edge-3", 60)
    upload_all(roots["edge-3"])
    more = drain(consumer, 100)
    check_exactly_once(
        {tp: got.get(tp, []) + more.get(tp, []) for tp in set(got) | set(more)},
        {**expected("edge-1", 160), **expected("edge-2", 120), **expected("edge-3", 60)},
    )
    consumer.commit()
    consumer.close()

    # The group's committed offsets survive reopening: nothing is read again, only what is new.
    produce(roots["edge-2"], "edge-2", 20, start=120)
    upload_all(roots["edge-2"])
    before = listing(url, options)
    with Consumer("edge-2.clicks", tier=url, tier_options=options, state_dir=state, group_id="g", tier_poll_ms=100) as again:
        newer = drain(again, 20)
        assert again.poll(300) == {}
    assert {tp: [r.value for r in recs] for tp, recs in newer.items()} == {
        tp: values[60:] for tp, values in expected("edge-2", 140).items()
    }
    assert listing(url, options) == before


def test_a_root_without_origin_is_the_default_origin_read_under_plain_topic_names(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    root = edge_root(tmp_path, None, url, {})
    produce(root, "x", 50)
    upload_all(root)
    assert (tmp_path / "bucket" / ".claim.json").exists() and (tmp_path / "bucket" / "clicks" / "0").is_dir()
    with Consumer("clicks", tier=url, state_dir=tmp_path / "reader", auto_offset_reset="earliest") as consumer:
        got = drain(consumer, 50)
    assert sorted(got) == [TopicPartition("clicks", 0), TopicPartition("clicks", 1)]
    assert [r.value for r in got[TopicPartition("clicks", 0)]] == [value("x", i) for i in range(0, 50, 2)]
    assert all(r.headers == [(ORIGIN_HEADER, b"")] for recs in got.values() for r in recs)


def test_seek_by_offset_time_beginning_and_end_on_a_bucket_partition(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    root = edge_root(tmp_path, "edge-1", url, {}, partitions=1)
    produce(root, "edge-1", 100, partitions=1, timestamp=1_000_000)
    produce(root, "edge-1", 100, start=100, partitions=1, timestamp=2_000_000)
    upload_all(root)
    tp = TopicPartition("edge-1.clicks", 0)
    with Consumer(tier=url, state_dir=tmp_path / "reader") as consumer:
        consumer.assign([tp])
        assert consumer.beginning_offsets([tp]) == {tp: 0} and consumer.end_offsets([tp]) == {tp: 200}
        assert consumer.position(tp) == 200  # auto_offset_reset "latest": the uploaded end
        consumer.seek(tp, 137)
        assert [r.value for r in drain(consumer, 3)[tp][:3]] == [value("edge-1", i) for i in (137, 138, 139)]
        found = consumer.offsets_for_times({tp: 1_500_000})[tp]
        assert found is not None and (found.offset, found.timestamp) == (100, 2_000_000)
        assert consumer.offsets_for_times({tp: 3_000_000})[tp] is None
        consumer.seek(tp, found.offset)
        assert drain(consumer, 1)[tp][0].value == value("edge-1", 100)
        consumer.seek_to_beginning(tp)
        assert consumer.position(tp) == 0 and drain(consumer, 1)[tp][0].value == value("edge-1", 0)
        consumer.seek_to_end(tp)
        assert consumer.position(tp) == 200 and consumer.poll(100) == {}


def test_a_partition_with_nothing_uploaded_yet_starts_at_its_first_upload(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    root = edge_root(tmp_path, "edge-1", url, {})
    produce(root, "edge-1", 20, partitions=1)  # partition 1 stays empty
    upload_all(root)
    with Consumer("edge-1.clicks", tier=url, state_dir=tmp_path / "reader", auto_offset_reset="earliest", tier_poll_ms=50) as c:
        assert len(drain(c, 20)[TopicPartition("edge-1.clicks", 0)]) == 20
        p1 = TopicPartition("edge-1.clicks", 1)
        assert c.position(p1) == 0 and c.end_offsets([p1]) == {p1: 0}
        with Producer(root=root) as producer:
            for i in range(5):
                producer.send("clicks", value("late", i), partition=1)
        upload_all(root)
        assert [r.value for r in drain(c, 5)[p1]] == [value("late", i) for i in range(5)]


def test_async_consumer_reads_a_bucket(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    for origin in ("a", "b"):
        root = edge_root(tmp_path, origin, url, {}, partitions=1)
        produce(root, origin, 30, partitions=1)
        upload_all(root)

    async def read() -> list:
        consumer = AsyncConsumer(tier=url, state_dir=str(tmp_path / "reader"), origins=["b"], auto_offset_reset="earliest")
        consumer.subscribe(pattern=".*")
        out: list = []
        try:
            while len(out) < 30:
                for recs in (await consumer.getmany(timeout_ms=500)).values():
                    out += recs
        finally:
            await consumer.stop()
        return out

    records = asyncio.run(asyncio.wait_for(read(), 60))
    assert [(r.topic, r.value, r.headers) for r in records] == [
        ("b.clicks", value("b", i), ((ORIGIN_HEADER, b"b"),)) for i in range(30)
    ]


def test_a_url_holds_one_layout_default_origin_or_named_origins(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    plain = edge_root(tmp_path, None, url, {})
    produce(plain, "x", 10)
    upload_all(plain)
    named = edge_root(tmp_path, "edge-1", url, {})
    produce(named, "edge-1", 10)
    with TieringDaemon(named) as daemon:
        failures = daemon.run(once=True).failures
    assert failures and all("claimed by a root without an origin" in f and "edge-1" in f for f in failures)
    assert listing(f"{url}/edge-1", {}) == {}  # nothing of the named root was written (but its registration)
    produce(plain, "x", 10, start=10)
    upload_all(plain)  # which does not stop the default root: the named root never claimed

    other = f"file://{tmp_path}/bucket2"
    first = edge_root(tmp_path / "b2", "edge-2", other, {})
    produce(first, "edge-2", 10)
    upload_all(first)
    late_plain = edge_root(tmp_path / "b2", None, other, {})
    produce(late_plain, "x", 10)
    with TieringDaemon(late_plain) as daemon:
        failures = daemon.run(once=True).failures
    assert failures and all("holds roots with origins (edge-2" in f and "tier.origin" in f for f in failures)
    assert not [n for n in listing(other, {}) if n == ".claim.json" or n.startswith("clicks/")]


def test_the_origin_is_set_before_the_first_tiered_topic_and_must_be_a_name(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for bad in ("", "a.b", "../x", ".hidden", "a/b"):
        with pytest.raises(InvalidNameError):
            Admin(root).set_origin(bad)
    Admin(root).set_origin("edge-1")
    Admin(root).set_origin("edge-1")  # the same again: fine
    assert Admin(root).origin() == "edge-1" and RootLayout(root).tier_config({"tier": "s3://b/fc"}) == {
        "tier": "s3://b/fc/edge-1"
    }
    Admin(root).create_topic("clicks", 1, tier=f"file://{tmp_path}/bucket")
    with pytest.raises(ConfigError, match=r"cannot be set now.*tiered topic"):
        Admin(root).set_origin("edge-2")
    assert fc(root, "config").stdout.decode().splitlines()[-1] == "tier.origin=edge-1"
    fresh = tmp_path / "fresh"
    assert fc(fresh, "config", "tier.origin=edge-9").stdout.decode().splitlines()[-1] == "tier.origin=edge-9"
    refused = fc(fresh, "config", "tier.origin=a.b", check=False)
    assert refused.returncode == 2 and b"no dot" in refused.stderr


def test_bucket_reader_errors_say_what_and_where(tmp_path: Path, unused_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "reader")  # (no server answers: any key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "reader")
    url = f"file://{tmp_path}/bucket"
    with pytest.raises(UnknownTopicError, match="holds no tiered root"):
        Consumer(tier=url, state_dir=tmp_path / "reader")
    with pytest.raises(ConfigError, match="state_dir"):
        Consumer(tier=url)
    with pytest.raises(ConfigError, match="not both"):
        Consumer(root=tmp_path, tier=url, state_dir=tmp_path / "reader")
    dead = {"endpoint_url": f"http://127.0.0.1:{unused_port}", "region_name": "us-east-1", "max_attempts": 1}
    with pytest.raises(StorageUnavailableError, match=f"127.0.0.1:{unused_port}"):
        Consumer(tier="s3://nobucket/fc", tier_options=dead, state_dir=tmp_path / "dead-reader")

    root = edge_root(tmp_path, "edge-1", url, {}, partitions=1)
    produce(root, "edge-1", 20, partitions=1)
    upload_all(root)
    with pytest.raises(ConfigError, match="belongs to a reader of"):
        Consumer(tier=f"file://{tmp_path}/elsewhere", state_dir=tmp_path / "dead-reader")
    with Consumer(tier=url, state_dir=tmp_path / "reader", auto_offset_reset="earliest", tier_poll_ms=50) as consumer:
        with pytest.raises(UnknownTopicError, match=r"'clicks' is not in .*edge-1\.clicks.*<origin>\.<topic>"):
            consumer.assign([TopicPartition("clicks", 0)])
        tp = TopicPartition("edge-1.clicks", 0)
        consumer.assign([tp])
        assert len(drain(consumer, 20)[tp]) == 20
        (tmp_path / "bucket" / "edge-1" / head_name("clicks/0")).write_bytes(b'{"crc32c":1,"head":{},"version":1}')
        produce(root, "edge-1", 1, start=20, partitions=1)  # (not uploaded: the damaged head is what is read)

        def damaged() -> bool:
            try:
                consumer.poll(100)
            except CorruptRecordError as exc:
                assert "edge-1/clicks/0/head.json" in str(exc) and "damaged" in str(exc)
                return True
            return False

        wait_for(damaged, 30, "the damaged head to be reported")


def test_cli_consume_reads_a_bucket_in_a_subprocess(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    for origin in ("edge-1", "edge-2"):
        root = edge_root(tmp_path, origin, url, {}, partitions=1)
        produce(root, origin, 25, partitions=1)
        upload_all(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = ["consume", "--tier", url, "--state-dir", str(tmp_path / "reader"), "--origin", "edge-2", "--include", ".*"]
    proc = subprocess.run(
        [str(SCRIPT), *args, "--from-beginning", "--format", "json", "--max", "25", "--timeout-ms", "30000"],
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [(r["topic"], r["offset"], r["value"]) for r in lines] == [
        ("edge-2.clicks", i, value("edge-2", i).decode("latin-1")) for i in range(25)
    ]
    assert all(r["headers"] == [{"key": ORIGIN_HEADER, "value": "edge-2", "encoding": "utf-8"}] for r in lines)
    missing = subprocess.run([str(SCRIPT), *args[:-2], "nope.clicks"], capture_output=True, env=env, timeout=120)
    assert missing.returncode != 0 and b"'nope.clicks' is not in" in missing.stderr


def test_two_roots_of_one_origin_are_two_roots_on_one_prefix_and_the_second_refuses(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    first = edge_root(tmp_path / "a", "edge-1", url, {}, partitions=1)
    produce(first, "edge-1", 10, partitions=1)
    upload_all(first)
    second = edge_root(tmp_path / "b", "edge-1", url, {}, partitions=1)
    produce(second, "other", 10, partitions=1)
    with TieringDaemon(second) as daemon:
        failures = daemon.run(once=True).failures
    assert failures and all("is owned by another root" in f and "edge-1" in f for f in failures)
    with Consumer("edge-1.clicks", tier=url, state_dir=tmp_path / "reader", auto_offset_reset="earliest") as consumer:
        assert [r.value for r in drain(consumer, 10)[TopicPartition("edge-1.clicks", 0)]] == [
            value("edge-1", i) for i in range(10)
        ]


def test_an_edge_root_reads_its_own_history_under_its_origin_and_is_rebuilt_from_there(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    root = edge_root(tmp_path, "edge-1", url, {}, partitions=1)
    produce(root, "edge-1", 60, partitions=1)
    upload_all(root)
    assert (TierPlanner(str(root)).tier_config("clicks") or {}).get("tier") == f"{url}/edge-1"  # Spark's driver: the same place
    with Consumer("clicks", root=root, auto_offset_reset="earliest") as own:  # local_retention_bytes=0: all in tier-2
        assert [r.value for r in drain(own, 60)[TopicPartition("clicks", 0)]] == [value("edge-1", i) for i in range(60)]

    rebuilt = tmp_path / "rebuilt"
    rebuild = ("tier", "rebuild", "--root", str(rebuilt), "--tier", url, "--origin")
    bad = fc(tmp_path, *rebuild, "edge.1", check=False)
    assert bad.returncode == 2 and b"--origin" in bad.stderr and not rebuilt.exists()
    done = fc(tmp_path, *rebuild, "edge-1")  # a lost edge root: its origin's prefix is a root's prefix
    assert b"rebuilt 1 topic(s), 1 partition(s)" in done.stdout
    produce(rebuilt, "again", 10, partitions=1)
    upload_all(rebuilt)  # it took the origin's claim over, and tiers there
    with Consumer("edge-1.clicks", tier=url, state_dir=tmp_path / "reader", auto_offset_reset="earliest") as reader:
        got = [r.value for r in drain(reader, 70)[TopicPartition("edge-1.clicks", 0)]]
    assert got == [value("edge-1", i) for i in range(60)] + [value("again", i) for i in range(10)]


def test_a_reader_refuses_a_url_that_holds_both_layouts(tmp_path: Path) -> None:
    """Mixed by hand (the daemons refuse to mix them): a reader names both, never guesses."""
    url = f"file://{tmp_path}/bucket"
    root = edge_root(tmp_path, "edge-1", url, {}, partitions=1)
    produce(root, "edge-1", 5, partitions=1)
    upload_all(root)
    (tmp_path / "bucket" / ".claim.json").write_bytes((tmp_path / "bucket" / "edge-1" / ".claim.json").read_bytes())
    with pytest.raises(OriginLayoutError, match=r"holds roots with origins \(edge-1"):
        Consumer(tier=url, state_dir=tmp_path / "reader")


def test_a_damaged_manifest_of_a_new_upload_is_reported_naming_it(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    root = edge_root(tmp_path, "edge-1", url, {}, partitions=1)
    produce(root, "edge-1", 20, partitions=1)
    upload_all(root)
    with Consumer("edge-1.clicks", tier=url, state_dir=tmp_path / "reader", auto_offset_reset="earliest", tier_poll_ms=50) as c:
        assert len(drain(c, 20)[TopicPartition("edge-1.clicks", 0)]) == 20
        old = set((tmp_path / "bucket" / "edge-1" / "clicks" / "0").glob("*.manifest"))
        produce(root, "edge-1", 20, start=20, partitions=1)
        upload_all(root)
        [new] = set((tmp_path / "bucket" / "edge-1" / "clicks" / "0").glob("*.manifest")) - old
        new.write_bytes(new.read_bytes().replace(b'"size"', b'"SIZE"'))

        def reported() -> bool:
            try:
                c.poll(100)
            except CorruptRecordError as exc:
                assert new.name in str(exc) and "unusable manifest" in str(exc) and "tier fsck" in str(exc)
                return True
            return False

        wait_for(reported, 30, "the damaged manifest to be reported")


def test_a_bucket_reader_follows_segments_that_defrag_moved_after_it_indexed_them(tmp_path: Path) -> None:
    """The reader indexed the segments, then ``tier defrag`` merged them and its next pass deleted the
    old chunks (garbage delay 0): the rest is read from the merged objects, every record once."""
    url = f"file://{tmp_path}/bucket"
    root = edge_root(tmp_path, "edge-1", url, {}, partitions=1)
    produce(root, "edge-1", 300, partitions=1)
    upload_all(root)
    tp = TopicPartition("edge-1.clicks", 0)
    with Consumer(tier=url, state_dir=tmp_path / "reader", auto_offset_reset="earliest", tier_poll_ms=50) as consumer:
        consumer.assign([tp])
        got = list(consumer.poll(1000, max_records=10)[tp])
        chunks_before = {p.name for p in (tmp_path / "bucket" / "edge-1" / "clicks" / "0").glob("*.chunk")}
        report = defrag_root(root, DefragSettings(merge_below_bytes=3000, target_bytes=20_000, garbage_delay_ms=0))
        with TieringDaemon(root) as daemon:  # deletes the chunks the merges replaced
            assert daemon.run(once=True).failures == []
        chunks_after = {p.name for p in (tmp_path / "bucket" / "edge-1" / "clicks" / "0").glob("*.chunk")}
        assert report.merges > 0 and len(chunks_before - chunks_after) > 10  # the chunks it had indexed are gone
        got += drain(consumer, 290)[tp]
    assert [r.value for r in got] == expected("edge-1", 300, partitions=1)[tp]
    assert [r.offset for r in got] == list(range(300))


@pytest.mark.s3
def test_a_bucket_unreachable_for_a_while_pauses_the_reader_it_does_not_fail_it(
    tmp_path: Path,
    seaweed: SeaweedServer,
    bucket: str,
    fault_proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What is indexed is served, polls past it return nothing while every request for the head is
    cut (a connection reset), one warning says so; once the bucket answers again, new uploads are read."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    url = f"s3://{bucket}/fc"
    root = edge_root(tmp_path, "edge-1", url, {"endpoint_url": seaweed.endpoint, "region_name": "us-east-1"}, partitions=1)
    produce(root, "edge-1", 30, partitions=1)
    upload_all(root)
    through = {"endpoint_url": fault_proxy.endpoint, "region_name": "us-east-1", "max_attempts": 1}
    tp = TopicPartition("edge-1.clicks", 0)
    with Consumer(
        tier=url, tier_options=through, state_dir=tmp_path / "reader", auto_offset_reset="earliest", tier_poll_ms=50
    ) as consumer:
        consumer.assign([tp])
        got = list(consumer.poll(1000, max_records=10)[tp])  # the head and manifests are indexed
        fault_proxy.reset_requests_containing(b"head.json")  # every connection, the pooled ones too
        caplog.set_level("WARNING", logger="filechannel")
        got += drain(consumer, 20)[tp]  # from the blocks already read
        for _ in range(5):
            assert consumer.poll(100) == {}  # past the index: nothing, no error
        assert [r for r in caplog.records if "cannot follow clicks/0 in s3://" in r.getMessage()]
        produce(root, "edge-1", 10, start=30, partitions=1)
        upload_all(root)
        fault_proxy.reset_requests_containing(None)
        got += drain(consumer, 10)[tp]
    assert [r.value for r in got] == expected("edge-1", 40, partitions=1)[tp]
