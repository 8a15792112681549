"""``filechannel tier export|import``: the versioned export format (exact round trip, any damage
refused), import into an empty store checked against the bucket, group offsets restored."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filechannel.client import Admin, Consumer, TopicPartition
from filechannel.client.group import group_offsets
from filechannel.errors import ExportFormatError, TierError
from filechannel.root import ROOT_METADATA
from filechannel.tiering import open_storage
from filechannel.tiering.export import (
    Export,
    decode_export,
    encode_export,
    import_export,
    read_export_file,
    take_export,
)
from filechannel.tiering.layout import (
    STATES,
    ChunkRecord,
    SegmentRecord,
    encode_manifest,
    manifest_name,
    merged_name,
    plan_chunks,
)
from filechannel.tiering.metadata import EpochRecord, TierMetadata

from ..cli_helpers import fc_text as fc
from .tier_helpers import make_topic, produce

channels = st.sampled_from(["t/0", "t/1", "orders/3", "solo"])


@st.composite
def exports(draw: st.DrawFn) -> Export:
    epochs = draw(st.lists(st.integers(1, 10**10 - 1), min_size=1, max_size=4, unique=True))
    owners = [EpochRecord(e, draw(st.text(min_size=1, max_size=20)), draw(st.integers(0, 2**62))) for e in sorted(epochs)]
    segments = []
    for channel in draw(st.lists(channels, unique=True, max_size=3)):
        base = draw(st.integers(0, 2**40))
        for _ in range(draw(st.integers(0, 3))):
            end = base + draw(st.integers(1, 10**6))
            size = draw(st.integers(1, 5000))
            epoch = draw(st.sampled_from(epochs))
            state = draw(st.sampled_from(STATES))
            chunks = plan_chunks(channel, base, epoch, size, draw(st.integers(1, 2000)))
            if draw(st.booleans()):  # defragmented: its bytes inside a merged object
                token = draw(st.from_regex(r"[0-9a-f]{16}", fullmatch=True))
                merged = merged_name(channel, base, draw(st.sampled_from(epochs)), end, token)
                chunks = (ChunkRecord(merged, 0, size, draw(st.integers(0, 2**40))),)
            manifest = None if state == "uploading" else manifest_name(channel, base, epoch)
            stamp = draw(st.integers(-(2**63), 2**63 - 1))
            segments.append(SegmentRecord(channel, base, end, size, stamp, state, epoch, chunks, manifest))
            base = end
    groups = draw(
        st.dictionaries(
            st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True),
            st.dictionaries(st.sampled_from(["t/0", "t/1", "orders/3"]), st.integers(0, 2**63 - 1), max_size=3),
            max_size=3,
        )
    )
    return Export(
        max(epochs), draw(st.integers(0, 2**62)), draw(st.none() | st.just("t")), tuple(owners), tuple(segments), groups
    )


@settings(max_examples=60, deadline=None)
@given(exports())
def test_the_format_round_trips_exactly(export: Export) -> None:
    data = encode_export(export)
    assert decode_export(data, "x") == export
    assert encode_export(decode_export(data, "x")) == data


@settings(max_examples=60, deadline=None)
@given(exports(), st.data())
def test_any_damaged_byte_is_refused(export: Export, data: st.DataObject) -> None:
    raw = bytearray(encode_export(export))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(ExportFormatError):
        decode_export(bytes(raw), "damaged.export")


def test_files_that_are_not_exports_are_refused_in_one_line(tmp_path: Path) -> None:
    record = SegmentRecord("t/0", 0, 5, 10, 0, "uploaded", 1, plan_chunks("t/0", 0, 1, 10, 4), manifest_name("t/0", 0, 1))
    for i, content in enumerate([b"", b"hello", b"{}", b'{"format":"x"}', b"\xff\xfe", encode_manifest(record), b"[1,2]"]):
        path = tmp_path / f"f{i}"
        path.write_bytes(content)
        with pytest.raises(ExportFormatError, match="not"):
            read_export_file(str(path))
    newer = encode_export(Export(1, 0, None, (EpochRecord(1, "x", 0),), (), {})).replace(b'"version":1', b'"version":2')
    with pytest.raises(ExportFormatError, match="version 2"):
        decode_export(newer, "newer.export")


def _uploaded_root(tmp_path: Path, partitions: int = 2) -> tuple[Path, str]:
    root, url = tmp_path / "root", f"file://{tmp_path}/tier"
    make_topic(root, url, partitions=partitions, local_retention_bytes=0)
    for p in range(partitions):
        produce(root, [os.urandom(100) for _ in range(150)], partition=p)
    fc("tier", "run", "--root", str(root), "--once")
    return root, url


def test_export_then_import_into_an_empty_store_is_exact_and_checked_against_the_bucket(tmp_path: Path) -> None:
    root, _ = _uploaded_root(tmp_path)
    consumer = Consumer("t", root=root, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    while sum(len(v) for v in consumer.poll(timeout_ms=500, max_records=120).values()) == 0:
        pass
    consumer.commit()
    offsets = {p: consumer.committed(TopicPartition("t", p)) for p in range(2)}
    consumer.close(autocommit=False)
    with TierMetadata(root / ROOT_METADATA) as metadata:
        before = take_export(metadata)
    assert len(before.segments) >= 4 and group_offsets(str(root)) == {
        "g": {f"t/{p}": o for p, o in offsets.items() if o is not None}
    }

    fc("tier", "export", "--root", str(root), "-o", str(tmp_path / "backup.export"))
    os.remove(root / ROOT_METADATA)  # the metadata is lost, the bucket is not
    shutil.rmtree(root / ".groups")
    proc = fc("tier", "import", str(tmp_path / "backup.export"), "--root", str(root))
    assert "imported" in proc.stdout and "group g: restored" in proc.stderr
    with TierMetadata(root / ROOT_METADATA) as metadata:
        after = take_export(metadata)
    assert (after.epochs, after.segments, group_offsets(str(root)), after.epoch) == (
        before.epochs,
        before.segments,
        {"g": {f"t/{p}": o for p, o in offsets.items() if o is not None}},
        before.epoch,
    )

    again = fc("tier", "import", str(tmp_path / "backup.export"), "--root", str(root), check=False)
    assert again.returncode == 1 and again.stderr.splitlines()[-1].startswith("error: ") and "not empty" in again.stderr
    not_one = tmp_path / "notes.txt"
    not_one.write_text("hello")
    bad = fc("tier", "import", str(not_one), "--root", str(root), check=False)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "not a valid tier-2 metadata export" in bad.stderr


def test_import_refuses_a_bucket_that_disagrees(tmp_path: Path) -> None:
    root, url = _uploaded_root(tmp_path, partitions=1)
    with TierMetadata(root / ROOT_METADATA) as metadata:
        export = take_export(metadata)
    first = export.segments[0]
    with open_storage(url) as storage:
        listing = storage.list("")
        gone = [o for o in listing if o.name != first.chunks[0].name]
        with TierMetadata(tmp_path / "a.db") as fresh, pytest.raises(TierError, match="missing"):
            import_export(export, fresh, gone)
        older = Export(export.epoch, 0, None, export.epochs, export.segments[1:], {})  # a segment uploaded after it
        with TierMetadata(tmp_path / "b.db") as fresh, pytest.raises(TierError, match="does not know"):
            import_export(older, fresh, listing)
        with TierMetadata(tmp_path / "b.db") as fresh:
            assert fresh.snapshot() == ([], [])  # nothing was loaded
        # objects of a newer epoch than the export (an orphan): the store's epoch covers them
        storage.write(f"t/0/{10**6:020d}.E0000000007.{0:020d}.chunk", b"x")
        with TierMetadata(tmp_path / "c.db") as fresh:
            import_export(export, fresh, storage.list(""))
            assert fresh.current_epoch() == 7


def test_export_of_one_topic_and_to_tier(tmp_path: Path) -> None:
    root, url = _uploaded_root(tmp_path, partitions=1)
    Admin(root).create_topic("u", 1, tier=url, local_retention_bytes=0, segment_bytes=4096, compression_block_bytes=1024)
    with TierMetadata(root / ROOT_METADATA) as metadata:
        whole = take_export(metadata)
        only_t = take_export(metadata, topic="t")
    assert only_t.segments == tuple(s for s in whole.segments if s.channel.startswith("t/")) and only_t.topic == "t"
    proc = fc("tier", "export", "--root", str(root), "--topic", "t", "--to-tier")
    assert "exported" in proc.stdout
    with open_storage(url) as storage:
        [name] = [o.name for o in storage.list(".exports/")]
        assert decode_export(storage.read(name, 0, 1 << 30), name).segments == only_t.segments
    usage = fc("tier", "export", "--root", str(root), check=False)
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1
