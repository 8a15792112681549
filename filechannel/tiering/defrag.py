"""Defragmentation of tier-2: runs of small objects of one channel merged into one larger object
(:func:`defrag_channel`, which a daemon's pass runs on an idle partition), and ``tier defrag``
over a whole root (:func:`defrag_root`).

Small objects come from segments uploaded in several chunks, and from slow topics whose
segments roll by ``segment_ms`` holding little (Redpanda merges adjacent segments; Pulsar's
PIP-76 names the same problem). A run is a sequence of objects, each smaller than
``merge_below_bytes``, holding consecutive bytes of the channel (chunks in order within a
segment, then the next segment, whose offsets continue the previous one's), at most
``target_bytes`` in all. It becomes one object, :func:`~.layout.merged_name` (the defragmenter's
epoch and the offsets of the segments it holds: a new, unique name), and each chunk record then
says where its bytes are inside it (``object_offset``). Segments keep their offsets, sizes and
bytes: only where the bytes live changes.

Invariants and the order of steps (a crash anywhere leaves the data readable):

1. ``begin_merge`` commits the merge (its name, its sources, the new layout of each segment
   it touches) before any write, so its object is never taken for an orphan;
2. the new object is written: the storage's ``concat`` where it has one (S3: a multipart
   upload whose parts of at least 5 MiB are copied server side with ``UploadPartCopy``, the
   smaller pieces read and uploaded as part data; a folder: the files appended), else the
   sources read and written as one object. Its length is checked;
3. each touched segment's manifest is written again for the new layout (the bucket keeps
   describing itself: ``tier rebuild`` after this point reads the new object);
4. ``finish_merge`` swaps the segments' chunk records in one transaction fenced by the
   epoch, and records the replaced objects as garbage, due after ``garbage_delay_ms``;
5. later passes delete due garbage, then forget it. Until then a reader that planned with
   the old names still reads them; after, a reader finding one missing asks the metadata
   where the bytes are now.

A failure or crash before 4 leaves a merge row: it is abandoned (each manifest written
again from the metadata, which still has the old layout, then the new object deleted,
then the row dropped) by the same pass, or by the next daemon or ``tier defrag``. Both
layouts are whole at every moment between 2 and 4, so the manifests may be either.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..engine import clock, failpoints
from ..errors import ConfigError, CorruptRecordError, FencedError, NotOwnerError
from ..root import ROOT_METADATA, ROOT_TIER_DIR
from .bindings import StorageClients
from .daemon_lock import exclusive
from .layout import UPLOADED, ChunkRecord, SegmentRecord, encode_manifest, merged_name, object_extents
from .metadata import Merge, TierMetadata
from .ownership import PrefixGuard, newest_epoch, root_identity
from .partitions import tier_of, tiered_partitions
from .reindex import open_index, referenced_by_manifests
from .storage import ChunkStorage
from .uploader import check_fence, delete_objects

log = logging.getLogger("filechannel")

ABANDONED_MERGE_DELAY_MS = 10 * 60 * 1000  # an abandoned merge's object is deleted this long after

Say = Callable[[str], None]


@dataclass(frozen=True)
class DefragSettings:
    """When objects are merged: each smaller than ``merge_below_bytes`` (default 4 MiB), into
    objects of at most ``target_bytes`` (64 MiB); replaced objects are deleted
    ``garbage_delay_ms`` after the swap (10 minutes: readers that planned with them still read)."""

    merge_below_bytes: int = 4 << 20
    target_bytes: int = 64 << 20
    garbage_delay_ms: int = 10 * 60 * 1000

    def __post_init__(self) -> None:
        for what in ("merge_below_bytes", "target_bytes", "garbage_delay_ms"):
            value = getattr(self, what)
            if type(value) is not int or value < (0 if what == "garbage_delay_ms" else 1):
                raise ConfigError(f"{what} must be an int >= {0 if what == 'garbage_delay_ms' else 1}, not {value!r}")
        if self.target_bytes < self.merge_below_bytes:
            raise ConfigError(f"target_bytes ({self.target_bytes}) must be at least merge_below_bytes ({self.merge_below_bytes})")


@dataclass
class DefragReport:
    """What a defragmentation did: merges, bytes merged, and objects per segment before and after
    (over the uploaded segments of the channels it went over)."""

    merges: int = 0
    bytes: int = 0
    segments: int = 0
    objects_before: int = 0
    objects_after: int = 0
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Run:
    """Objects to merge into one: their names in byte order, their sizes, the segments with chunks in them."""

    sources: tuple[str, ...]
    sizes: tuple[int, ...]
    records: tuple[SegmentRecord, ...]  # every segment with a chunk in a source


def objects_per_segment(records: list[SegmentRecord]) -> tuple[int, int]:
    """(distinct objects, segments) of ``records``: their ratio is what defragmentation lowers."""
    return len({c.name for r in records for c in r.chunks}), len(records)


def plan(records: list[SegmentRecord], settings: DefragSettings) -> list[Run]:
    """The runs to merge among the uploaded ``records`` of one channel (sorted by base offset)."""
    extents = object_extents(records)
    # the channel's objects in byte order, each with the segments it holds chunks of
    order: list[str] = []
    holders: dict[str, list[SegmentRecord]] = {}
    for r in records:
        for c in r.chunks:
            if not order or order[-1] != c.name:
                order.append(c.name)
            held = holders.setdefault(c.name, [])
            if not held or held[-1] is not r:
                held.append(r)
    once = _once(order)
    runs: list[Run] = []
    current: list[str] = []
    total = 0

    def flush() -> None:
        if len(current) >= 2:
            segs = {r.base_offset: r for n in current for r in holders[n]}
            runs.append(Run(tuple(current), tuple(extents[n] for n in current), tuple(segs[b] for b in sorted(segs))))

    for i, name in enumerate(order):
        size = extents[name]
        joins = (
            bool(current)
            and total + size <= settings.target_bytes
            and _follows(holders[order[i - 1]][-1], holders[name][0])
            and name in once
        )
        if size >= settings.merge_below_bytes or not joins:
            flush()
            current, total = [], 0
        if size < settings.merge_below_bytes and name in once:
            current.append(name)
            total += size
    flush()
    return runs


def _once(order: list[str]) -> set[str]:
    """The objects holding one stretch of the channel's bytes (an object named by chunks that are
    not consecutive is left alone: merging it would reorder bytes)."""
    seen: dict[str, int] = {}
    for name in order:
        seen[name] = seen.get(name, 0) + 1
    return {name for name, n in seen.items() if n == 1}


def _follows(a: SegmentRecord, b: SegmentRecord) -> bool:
    """Whether segment ``b`` is ``a`` or continues it (no offset between them)."""
    return a is b or a.end_offset == b.base_offset


def layout_after(run: Run, name: str) -> dict[int, tuple[ChunkRecord, ...]]:
    """Each segment's chunk list once the run's sources are one object ``name`` (consecutive
    chunks of a segment inside it become one record)."""
    starts = dict(zip(run.sources, _cumulative(run.sizes), strict=True))
    layout = {}
    for r in run.records:
        chunks: list[ChunkRecord] = []
        for c in r.chunks:
            moved = ChunkRecord(name, c.position, c.length, starts[c.name] + c.object_offset) if c.name in starts else c
            last = chunks[-1] if chunks else None
            if (
                last is not None
                and last.name == moved.name == name
                and last.position + last.length == moved.position
                and last.object_offset + last.length == moved.object_offset
            ):
                chunks[-1] = ChunkRecord(name, last.position, last.length + moved.length, last.object_offset)
            else:
                chunks.append(moved)
        layout[r.base_offset] = tuple(chunks)
    return layout


def _cumulative(sizes: tuple[int, ...]) -> list[int]:
    out, total = [], 0
    for size in sizes:
        out.append(total)
        total += size
    return out


def merge_run(
    storage: ChunkStorage,
    metadata: TierMetadata,
    epoch: int,
    channel: str,
    run: Run,
    settings: DefragSettings,
    guard: Callable[[], None] | None = None,
) -> list[str]:
    """Merge one run (steps 1 to 4 of the module docstring); return the objects now garbage.

    ``guard`` runs after the manifests are written and before the swap is committed (the
    bucket's claim and epoch marks read again: :meth:`.ownership.PrefixGuard.verify`). A
    merger found overtaken there, or by the index's fence while writing them, writes the
    manifests it changed back to the layout they had (the newer epoch's index keeps that
    one; a newer merge's layout is mended by its garbage deletion, see :func:`clean_up`).
    """
    name = merged_name(channel, run.records[0].base_offset, epoch, run.records[-1].end_offset, secrets.token_hex(8))
    merge = Merge(name, channel, epoch, run.sources, layout_after(run, name))
    metadata.begin_merge(epoch, merge)
    failpoints.hit("defrag-merge-begun")
    written = False
    try:
        check_fence(metadata, epoch)
        if storage.supports_concat:
            storage.concat(name, list(run.sources))
        else:
            storage.write(name, b"".join(storage.read(s, 0, size) for s, size in zip(run.sources, run.sizes, strict=True)))
        length = storage.info(name).length
        if length != sum(run.sizes):
            raise CorruptRecordError(
                f"merged object {name!r} in {storage.url} holds {length} bytes, not the {sum(run.sizes)} of its sources"
            )
        failpoints.hit("defrag-object-written")
        for r in run.records:
            check_fence(metadata, epoch)
            failpoints.hit("defrag-manifest-next")
            written = True
            storage.write(r.manifest or "", encode_manifest(replace(r, chunks=merge.layout[r.base_offset])))
        failpoints.hit("defrag-manifests-written")
        if guard is not None:
            guard()
        return metadata.finish_merge(epoch, name, settings.garbage_delay_ms)
    except (FencedError, NotOwnerError):
        if written:
            _restore_manifests(storage, run)
        raise  # the newer epoch (or the prefix's owner) abandons the merge
    except BaseException:
        try:
            abandon_merge(storage, metadata, epoch, merge)
        except Exception as exc:  # the original error is the one to see; the next pass abandons it
            log.warning("tier: the failed merge into %s stays to be abandoned: %s", name, exc)
        raise


def _restore_manifests(storage: ChunkStorage, run: Run) -> None:
    """Write the manifests of ``run`` back as they were before the merge (best effort: what is
    left wrong, the newer epoch's garbage deletion mends from its index)."""
    for r in run.records:
        try:
            storage.write(r.manifest or "", encode_manifest(r))
        except Exception as exc:
            log.warning("tier: an overtaken merge left the manifest %s to mend: %s", r.manifest, exc)


def abandon_merge(storage: ChunkStorage, metadata: TierMetadata, epoch: int, merge: Merge) -> None:
    """Undo a merge that was not swapped: manifests again from the metadata, the row dropped and
    its object made garbage due in ``ABANDONED_MERGE_DELAY_MS`` (not deleted at once: an overtaken
    defragmenter may still write a manifest naming it, which the deletion then mends first)."""
    for r in metadata.segments(merge.channel, states=(UPLOADED,)):
        if r.base_offset in merge.layout and r.manifest and all(c.name != merge.name for c in r.chunks):
            storage.write(r.manifest, encode_manifest(r))
    metadata.abandon_merge(epoch, merge.name, ABANDONED_MERGE_DELAY_MS)


def clean_up(storage: ChunkStorage, metadata: TierMetadata, epoch: int, channel: str, now_ms: int) -> list[str]:
    """Abandon the merges of ``channel`` left by a crash or a failure, delete its garbage due by ``now_ms``.

    Only where no merge of this process is running (a daemon's pass, ``tier defrag`` under the lock).
    No garbage object a manifest of the bucket still names is deleted: such a manifest (a late
    write of an overtaken defragmenter) is first written again from the index, whose layout
    never names garbage; one that cannot be mended keeps its objects, with a warning.
    """
    lines = []
    for merge in metadata.merges(channel):
        abandon_merge(storage, metadata, epoch, merge)
        lines.append(f"{channel}: abandoned the merge into {merge.name} (epoch {merge.epoch})")
    due = metadata.garbage(channel, due_by_ms=now_ms)
    if due:
        kept = _mend_manifests_naming(storage, metadata, channel, due)
        gone = [n for n in due if n not in kept]
        delete_objects(storage, gone)
        metadata.forget_garbage(epoch, gone)
        lines.append(f"{channel}: deleted {len(gone)} object(s) replaced by merges")
        if kept:
            log.warning(
                "tier: %s: %d garbage object(s) still named by manifests the index disagrees with: kept", channel, len(kept)
            )
    return lines


def _mend_manifests_naming(storage: ChunkStorage, metadata: TierMetadata, channel: str, names: list[str]) -> set[str]:
    """Write again from the index every manifest that names one of ``names``; return those still named after."""
    decoded: dict[str, SegmentRecord | None] = {}
    kept = referenced_by_manifests(storage, storage.list(channel + "/"), channel, names, decoded=decoded)
    if not kept:
        return kept
    for manifest, record in decoded.items():
        if record is None or not any(c.name in kept for c in record.chunks):
            continue
        row = metadata.segment_for(channel, record.base_offset)
        if row is not None and row.manifest == manifest and not any(c.name in kept for c in row.chunks):
            storage.write(manifest, encode_manifest(row))
            log.warning("tier: %s named garbage (an overtaken merge's late write); written again from the index", manifest)
    return referenced_by_manifests(storage, storage.list(channel + "/"), channel, names)


def defrag_channel(
    storage: ChunkStorage,
    metadata: TierMetadata,
    epoch: int,
    channel: str,
    settings: DefragSettings,
    report: DefragReport,
    *,
    max_merges: int | None = None,
    stop: Callable[[], bool] | None = None,
    say: Say | None = None,
    guard: Callable[[], None] | None = None,
) -> None:
    """Merge the runs of small objects of ``channel`` (at most ``max_merges``), adding to ``report``;
    ``guard`` as :func:`merge_run`'s."""
    records = metadata.segments(channel, states=(UPLOADED,))
    before, segments = objects_per_segment(records)
    done = 0
    while not (max_merges is not None and done >= max_merges) and not (stop is not None and stop()):
        runs = plan(records, settings) if done == 0 else plan(metadata.segments(channel, states=(UPLOADED,)), settings)
        if not runs:
            break
        run = runs[0]  # planned again after each merge: a segment may hold objects of two runs
        if say is not None:
            first, end = run.records[0].base_offset, run.records[-1].end_offset
            say(f"{channel}: merging {len(run.sources)} objects of offsets [{first}, {end})")
        merge_run(storage, metadata, epoch, channel, run, settings, guard)
        done += 1
        report.bytes += sum(run.sizes)
        line = (
            f"{channel}: merged {len(run.sources)} objects ({sum(run.sizes)} bytes) of offsets "
            f"[{run.records[0].base_offset}, {run.records[-1].end_offset})"
        )
        report.lines.append(line)
        if say is not None:
            say(line)
    after, _ = objects_per_segment(metadata.segments(channel, states=(UPLOADED,))) if done else (before, segments)
    report.merges += done
    report.segments += segments
    report.objects_before += before
    report.objects_after += after


def defrag_root(root: str | os.PathLike[str], settings: DefragSettings, progress: Say | None = None) -> DefragReport:
    """Defragment every tiered partition of ``root`` now (``filechannel tier defrag``): under the
    daemon's lock (TierError if a daemon runs) and an epoch of its own, above every epoch the
    bucket records and recorded there (a prefix another root owns is refused); merges left by a
    crash are abandoned and due garbage deleted first."""
    root = os.path.abspath(os.fspath(root))
    say = progress or (lambda line: log.info("tier: %s", line))
    report = DefragReport()
    tier_dir = os.path.join(root, ROOT_TIER_DIR)
    if not os.path.exists(os.path.join(root, ROOT_METADATA)):
        return report  # nothing was ever uploaded
    owner = f"tier defrag:{socket.gethostname()}:{os.getpid()}"
    storages = StorageClients()
    with exclusive(tier_dir, "defragment"), open_index(os.path.join(root, ROOT_METADATA)) as metadata:
        try:
            partitions = [(part, storages.get(*tier_of(part.config))) for part in tiered_partitions(root)]
            epoch = metadata.take_epoch(owner, above=max((newest_epoch(s) for s in storages.opened()), default=0))
            root_id = root_identity(tier_dir)
            guards = {id(storage): PrefixGuard(storage, root_id, owner, epoch) for storage in storages.opened()}
            for guard in guards.values():
                guard.enter()
            for part, storage in partitions:
                for line in clean_up(storage, metadata, epoch, part.name, clock.now_ms()):
                    say(line)
                defrag_channel(storage, metadata, epoch, part.name, settings, report, say=say, guard=guards[id(storage)].verify)
        finally:
            storages.close()
    return report
