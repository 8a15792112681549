"""Uploading one sealed segment: chunks + manifest + metadata, on a local folder and on S3 (SeaweedFS);
a failed upload is abandoned (no row, no object); a fenced uploader writes no object; tier settings."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from filechannel import FileChannel
from filechannel.config import ChannelConfig
from filechannel.errors import ConfigError, CorruptRecordError, FencedError, StorageUnavailableError
from filechannel.tiering import ChunkStorage, open_storage
from filechannel.tiering.context import TierContext, tier_context_for
from filechannel.tiering.layout import UPLOADED, decode_manifest
from filechannel.tiering.metadata import TierMetadata
from filechannel.tiering.uploader import RateLimiter, SegmentToUpload, abandon, upload_segment


def sealed_segments(path: Path, records: int = 400) -> list[SegmentToUpload]:
    """A channel with several sealed, compressed segments of incompressible records."""
    with FileChannel(path, segment_bytes=4096, maintenance_interval=0, compression_block_bytes=1024) as ch:
        with ch.sender() as tx:
            for _ in range(records):
                tx.send(os.urandom(100))
        ch.compress_sealed()
        log_ = ch._log
        refs = log_.list_segments()
        out = []
        for ref in refs[:-1]:
            info = log_.compressed_info(ref)
            out.append(SegmentToUpload.of(ref.path, info))
    assert len(out) >= 3
    return out


def make_storage(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> ChunkStorage:
    if kind == "file":
        return open_storage(f"file://{tmp_path}/tier")
    server = request.getfixturevalue("seaweed")
    bucket = request.getfixturevalue("bucket")
    return open_storage(f"s3://{bucket}/t", endpoint_url=server.endpoint, **server.credentials())


@pytest.mark.parametrize("kind", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_upload_writes_chunks_manifest_then_metadata(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    segments = sealed_segments(tmp_path / "ch")
    with make_storage(kind, tmp_path, request) as storage, TierMetadata(tmp_path / "meta.db") as metadata:
        epoch = metadata.take_epoch("test")
        for segment in segments:
            data = Path(segment.path).read_bytes()
            record = upload_segment(
                storage, metadata, epoch, "t/0", segment, chunk_bytes=1024, concurrency=3, limiter=RateLimiter(None)
            )
            assert record.state == UPLOADED and record.size == len(data)
            assert len(record.chunks) == -(-len(data) // 1024)  # cut every 1024 bytes, the last one shorter
            joined = b"".join(storage.read(c.name, 0, c.length) for c in record.chunks)
            assert joined == data  # the segment's bytes go to tier-2 unchanged
            assert record.manifest is not None
            manifest = decode_manifest(storage.read(record.manifest, 0, 1 << 20), record.manifest)
            assert (manifest.base_offset, manifest.end_offset, manifest.chunks) == (
                segment.base_offset,
                segment.end_offset,
                record.chunks,
            )
        stored = metadata.segments("t/0")
        assert [(r.base_offset, r.end_offset) for r in stored] == [(s.base_offset, s.end_offset) for s in segments]
        names = {o.name for o in storage.list("t/0/")}
        assert names == {c.name for r in stored for c in r.chunks} | {r.manifest for r in stored}


@pytest.mark.s3
def test_failed_upload_is_abandoned(tmp_path: Path, seaweed, bucket: str, unused_port: int) -> None:
    """Storage unreachable: the error reaches the caller; the deletes failed too, so the row stays
    "uploading" and names what to delete; abandoning it once the storage is back leaves nothing."""
    segment = sealed_segments(tmp_path / "ch")[0]
    down = open_storage(
        f"s3://{bucket}/t",
        endpoint_url=f"http://127.0.0.1:{unused_port}",
        max_attempts=1,
        **seaweed.credentials(),
    )
    with down, TierMetadata(tmp_path / "meta.db") as metadata:
        epoch = metadata.take_epoch("test")
        with pytest.raises(StorageUnavailableError):
            upload_segment(down, metadata, epoch, "t/0", segment, chunk_bytes=1024)
        [row] = metadata.segments("t/0", states=("uploading", "uploaded", "deleting"))
        assert row.state == "uploading" and row.base_offset == segment.base_offset
        with open_storage(f"s3://{bucket}/t", endpoint_url=seaweed.endpoint, **seaweed.credentials()) as up:
            abandon(up, metadata, epoch, row)
            assert metadata.segments("t/0", states=("uploading", "uploaded", "deleting")) == []
            record = upload_segment(up, metadata, epoch, "t/0", segment, chunk_bytes=1024)
            assert {o.name for o in up.list("t/0/")} == {c.name for c in record.chunks} | {record.manifest}


def test_fenced_uploader_writes_no_object(tmp_path: Path) -> None:
    segment = sealed_segments(tmp_path / "ch")[0]
    with open_storage(f"file://{tmp_path}/tier") as storage, TierMetadata(tmp_path / "meta.db") as metadata:
        old = metadata.take_epoch("old")
        metadata.take_epoch("new")
        with pytest.raises(FencedError):
            upload_segment(storage, metadata, old, "t/0", segment, chunk_bytes=1024)
        assert storage.list() == []


def test_a_truncated_segment_is_never_uploaded(tmp_path: Path) -> None:
    segment = sealed_segments(tmp_path / "ch")[0]
    size = os.path.getsize(segment.path)
    os.truncate(segment.path, size - 3)
    with open_storage(f"file://{tmp_path}/tier") as storage, TierMetadata(tmp_path / "meta.db") as metadata:
        epoch = metadata.take_epoch("test")
        with pytest.raises(CorruptRecordError, match=f"{segment.path} is {size - 3} bytes .* table ends at byte {size}"):
            upload_segment(storage, metadata, epoch, "t/0", segment, chunk_bytes=1024)
        assert metadata.segments("t/0", states=("uploading", "uploaded")) == [] and storage.list() == []


def test_tier_settings_are_validated(tmp_path: Path) -> None:
    config = ChannelConfig(tier="s3://b/p", tier_options={"endpoint_url": "http://h:1", "region_name": "r"})
    assert config.as_dict()["tier_options"] == {"endpoint_url": "http://h:1", "region_name": "r"}
    for bad in ({"aws_secret_access_key": "x"}, {"key": "x"}, {"client_kwargs": {"aws_session_token": "x"}}):
        with pytest.raises(ConfigError, match="environment"):
            ChannelConfig(tier="s3://b/p", tier_options=bad)
    with pytest.raises(ConfigError, match="storage URL"):
        ChannelConfig(tier="/no/scheme")
    for name, value in [("tier_chunk_bytes", 10), ("tier_concurrency", 0), ("local_retention_bytes", -1)]:
        setting: dict[str, Any] = {name: value}
        with pytest.raises(ConfigError, match=name):
            ChannelConfig(**setting)
    assert tier_context_for(str(tmp_path / "c"), ChannelConfig()) is None


def test_channel_builds_its_tier_context_and_does_no_gc(tmp_path: Path) -> None:
    """With a tier, the channel's own GC deletes nothing, even past retention: only the daemon deletes."""
    tier = f"file://{tmp_path}/tier"
    with FileChannel(tmp_path / "ch", tier=tier, segment_bytes=4096, retention_bytes=0, maintenance_interval=0) as ch:
        ctx = ch._log.tier
        assert isinstance(ctx, TierContext) and ctx.name == "ch"
        assert ctx.metadata_path == str(tmp_path / "ch" / "tier" / "metadata.db")
        with ch.sender() as tx:
            for _ in range(200):
                tx.send(os.urandom(100))
        before = len(ch._log.list_segments())
        assert before > 2
        assert ch.collect_garbage() == []
        assert len(ch._log.list_segments()) == before
    name = f"x{uuid.uuid4().hex[:6]}"
    with FileChannel(tmp_path / name, tier=tier, tier_metadata=str(tmp_path / "m.db"), tier_name="t/3") as ch:
        ctx = ch._log.tier
        assert isinstance(ctx, TierContext) and (ctx.name, ctx.metadata_path) == ("t/3", str(tmp_path / "m.db"))
