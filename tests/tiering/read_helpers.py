"""Helpers of the tier-2 read tests (test_tiered_channel.py, test_remote_reads.py): upload a channel's sealed segments with the real uploader,
then remove their local copies as local retention does (oldest first, a prefix, never the active one)."""

from __future__ import annotations

from filechannel import FileChannel
from filechannel.engine.record import Record
from filechannel.engine.retention import delete_sealed_prefix
from filechannel.receiver import Receiver
from filechannel.tiering.context import TierContext
from filechannel.tiering.layout import SegmentRecord
from filechannel.tiering.uploader import SegmentToUpload, upload_segment


def tier_of(ch: FileChannel) -> TierContext:
    """The channel's tier-2 (it must have one: its topic names a ``tier``)."""
    assert ch._tier is not None, f"{ch.path} has no tier-2"
    return ch._tier


def offload(ch: FileChannel, keep_local: int, drop_first: int = 0) -> list[SegmentRecord]:
    """Upload every sealed compressed segment of ``ch``; delete the local copies of all but
    the last ``keep_local`` local segments (the active one always stays); then remove the
    first ``drop_first`` uploaded segments from tier-2 too (total retention). Returns the
    segments left in tier-2, oldest first."""
    ctx, log = tier_of(ch), ch._log
    epoch = ctx.metadata.take_epoch("test")
    refs = log.local_segments()
    uploaded = []
    for ref in refs[:-1]:
        assert ref.compressed, f"{ref.path} is not compressed"
        info = log.compressed_info(ref)
        segment = SegmentToUpload.of(ref.path, info)
        uploaded.append(
            upload_segment(
                ctx.storage, ctx.metadata, epoch, ctx.name, segment, chunk_bytes=ch.config.tier_chunk_bytes, concurrency=2
            )
        )
    gone = max(0, min(len(refs) - 1, len(refs) - keep_local))
    if gone:
        with log.maintenance_lock.holding():  # as the daemon's local retention deletes
            assert delete_sealed_prefix(log, refs[gone].base_offset) == [r.base_offset for r in refs[:gone]]
    for record in uploaded[:drop_first]:
        ctx.metadata.begin_delete(epoch, ctx.name, record.base_offset)
        for name in [c.name for c in record.chunks] + ([record.manifest] if record.manifest else []):
            ctx.storage.delete(name)
        ctx.metadata.finish_delete(epoch, ctx.name, record.base_offset)
    log.list_segments()
    return uploaded[drop_first:]


def read_all(rx: Receiver, n: int) -> list[Record]:
    """``n`` records from ``rx`` (each within 10 s), then the receiver is closed."""
    out: list[Record] = []
    try:
        while len(out) < n:
            out.extend(rx.recv_many(n - len(out), timeout=10) or _none(rx, len(out)))
    finally:
        rx.close()
    return out


def _none(rx: Receiver, got: int) -> list[Record]:
    raise AssertionError(f"no record within 10 s at position {rx.position} after {got} records")
