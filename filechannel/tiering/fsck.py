"""``filechannel tier fsck``: the tier-2 metadata checked against the bucket and the manifests, and repaired.

What is checked, per tiered partition of a root (one line per finding, naming the object
and the offsets it affects):

- every chunk of every uploaded segment is listed, with the length the metadata says
  (``missing``, ``length``);
- its manifest is there, decodes, and says what the metadata says, or what a merge in
  progress will make it say (a merge writes the manifests before it swaps the rows)
  (``manifest``);
- the uploaded (and lost) segments follow each other without a gap, and the first local
  segment begins at or below the tier's end (``gap``);
- no object is an ``orphan``: one that parses as a chunk or manifest name of the channel
  but that no row names. The grace rule needs no clock: an object counts as an orphan
  only if neither the metadata read *before* the listing nor the one read *after* it
  names it. An upload commits its row before it writes a byte, and a delete removes the
  objects before the row, so an object of a live upload or delete is always named by one
  of the two reads; only a fenced uploader's late writes, or an upload whose abandon
  died half-way, are left;
- a ``lost`` segment is reported as such (its offsets are known gone);
- with ``deep``: every uploaded segment is read whole from tier-2 through the readers'
  own code (the header and block-table CRC via :func:`~filechannel.engine.compressed.decode_table`,
  every block decompressed, every record's CRC via :func:`~filechannel.engine.record.decode_records`):
  ``damaged``.

``repair`` (only while no daemon runs: it holds the daemon's lock and takes an epoch):
orphans are deleted; a missing, short or damaged chunk is written again from the local
``.seg.z`` when it is still there and is the same segment (same table, same size: the
bytes tier-2 holds are the local file's, unchanged); a missing or disagreeing manifest is
written again from the row (the metadata is the truth); otherwise the segment is marked
``lost`` (:meth:`TierMetadata.mark_lost`): reads of its offsets raise
:class:`~filechannel.errors.TierDataLostError` naming them, nothing guesses. Gaps are
reported, not repaired (there is nothing to repair them from).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..engine.log import Log
from ..engine.record import Record, decode_records
from ..errors import CorruptRecordError, FileChannelError, os_errors
from .context import ROOT_METADATA, ROOT_TIER_DIR
from .daemon import Partition, exclusive, tiered_partitions
from .layout import (
    LISTED,
    LOST,
    STATES,
    UPLOADED,
    SegmentRecord,
    decode_manifest,
    encode_manifest,
    object_extents,
    parse_object_name,
)
from .metadata import TierMetadata
from .remote_segment import RemoteReader
from .storage import ChunkStorage, open_storage
from .uploader import SegmentToUpload, checked_size

Say = Callable[[str], None]
Bytes = Callable[[int], None]

_DEEP_CACHE_BYTES = 8 << 20


@dataclass(frozen=True)
class Finding:
    """One inconsistency: its kind, the channel, the object (if one), the offsets ``[first, end)`` it affects."""

    kind: str  # missing, length, manifest, orphan, gap, lost, damaged
    channel: str
    name: str | None
    first: int | None
    end: int | None
    detail: str

    def line(self) -> str:
        offsets = f" offsets {self.first} to {self.end - 1}" if self.first is not None and self.end is not None else ""
        where = f" {self.name}" if self.name else ""
        return f"{self.kind}: {self.channel}{where}{offsets}: {self.detail}"


@dataclass
class FsckReport:
    """What a check found, what a repair did, and how much it looked at."""

    findings: list[Finding] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    segments: int = 0
    objects: int = 0
    deep_bytes: int = 0


def deep_bytes_of(root: str) -> int:
    """How many bytes a deep check of ``root`` reads (the uploaded segments' sizes), for a progress bar."""
    path = os.path.join(root, ROOT_METADATA)
    if not os.path.exists(path):
        return 0
    with TierMetadata(path) as metadata:
        return sum(r.size for part in tiered_partitions(root) for r in metadata.segments(part.name, states=(UPLOADED,)))


def fsck(
    root: str | os.PathLike[str],
    *,
    deep: bool = False,
    repair: bool = False,
    say: Say | None = None,
    advance: Bytes | None = None,
) -> FsckReport:
    """Check (and with ``repair``, repair) the tier-2 copy of every tiered partition of ``root``.

    ``say`` gets one line per repair action; ``advance(nbytes)`` is called as a deep check
    reads. Raises TierError if ``repair`` and a daemon runs, or the storage cannot be reached.
    """
    root = os.path.abspath(os.fspath(root))
    path = os.path.join(root, ROOT_METADATA)
    report = FsckReport()
    if not os.path.exists(path):
        return report  # nothing was ever uploaded
    say = say or (lambda line: None)
    if not repair:
        with TierMetadata(path) as metadata:
            _check_root(root, metadata, None, deep, report, say, advance)
        return report
    with exclusive(os.path.join(root, ROOT_TIER_DIR), "repair tier-2"), TierMetadata(path) as metadata:
        epoch = metadata.take_epoch(f"fsck --repair:{os.getpid()}")
        _check_root(root, metadata, epoch, deep, report, say, advance)
    return report


def _check_root(
    root: str, metadata: TierMetadata, epoch: int | None, deep: bool, report: FsckReport, say: Say, advance: Bytes | None
) -> None:
    storages: dict[tuple[str, str], ChunkStorage] = {}
    try:
        for part in tiered_partitions(root):
            assert part.config.tier is not None
            key = (part.config.tier, repr(sorted((part.config.tier_options or {}).items())))
            if key not in storages:
                storages[key] = open_storage(part.config.tier, **(part.config.tier_options or {}))
            _check_partition(part, storages[key], metadata, epoch, deep, report, say, advance)
    finally:
        for storage in storages.values():
            storage.close()


def _named(records: list[SegmentRecord]) -> set[str]:
    return {c.name for r in records for c in r.chunks} | {r.manifest for r in records if r.manifest}


def _check_partition(
    part: Partition,
    storage: ChunkStorage,
    metadata: TierMetadata,
    epoch: int | None,
    deep: bool,
    report: FsckReport,
    say: Say,
    advance: Bytes | None,
) -> None:
    channel = part.name
    before = metadata.segments(channel, states=STATES)
    listing = storage.list(channel + "/")
    rows = metadata.segments(channel, states=STATES)
    report.objects += len(listing)
    sizes = {o.name: o.length for o in listing}
    found: list[Finding] = []

    # orphans: named by neither read of the metadata (see the module docstring), nor by a merge
    # in progress or the garbage of one (objects replaced, deleted after the garbage delay)
    merges = metadata.merges(channel)
    named = _named(before) | _named(rows) | set(metadata.garbage(channel))
    named |= {m.name for m in merges} | {n for m in merges for n in m.sources}
    orphans = [
        o for o in listing if (p := parse_object_name(o.name)) is not None and p.channel == channel and o.name not in named
    ]
    found += [Finding("orphan", channel, o.name, None, None, f"{o.length} bytes that no segment names") for o in orphans]

    listed = [r for r in rows if r.state in LISTED]
    report.segments += len(listed)
    damaged: dict[int, list[Finding]] = {}  # base offset -> findings about its chunks
    bad_manifest: dict[int, Finding] = {}
    extents = object_extents(r for r in listed if r.state == UPLOADED)  # merged objects: their whole length
    for r in listed:
        if r.state == LOST:
            found.append(Finding("lost", channel, None, r.base_offset, r.end_offset, "marked lost by an earlier repair"))
            continue
        for name in dict.fromkeys(c.name for c in r.chunks):
            held = ", ".join(
                f"bytes {c.position} to {c.position + c.length - 1} at {c.object_offset}" for c in r.chunks if c.name == name
            )
            if name not in sizes:
                detail = f"the object is missing (it holds {held})"
                finding = Finding("missing", channel, name, r.base_offset, r.end_offset, detail)
            elif sizes[name] != extents[name]:
                detail = f"the object holds {sizes[name]} bytes, the metadata says {extents[name]} (it holds {held})"
                finding = Finding("length", channel, name, r.base_offset, r.end_offset, detail)
            else:
                continue
            damaged.setdefault(r.base_offset, []).append(finding)
        planned = [replace(r, chunks=m.layout[r.base_offset]) for m in merges if r.base_offset in m.layout]
        problem = _manifest_problem(storage, r, sizes, planned)
        if problem:
            bad_manifest[r.base_offset] = Finding("manifest", channel, r.manifest, r.base_offset, r.end_offset, problem)
    if deep:
        reader = RemoteReader(storage, _DEEP_CACHE_BYTES, 1)
        try:
            for r in listed:
                if r.state == LOST or r.base_offset in damaged:
                    continue  # a missing or short chunk is found already: reading it says nothing more
                problem = _deep_problem(reader, r)
                if problem:
                    damaged[r.base_offset] = [Finding("damaged", channel, r.chunks[0].name, r.base_offset, r.end_offset, problem)]
                if advance is not None:
                    advance(r.size)
                report.deep_bytes += r.size
        finally:
            reader.close()
    for f in damaged.values():
        found += f
    found += bad_manifest.values()
    found += _gaps(part, listed)
    report.findings += found

    if epoch is None:
        return

    def done(line: str) -> None:
        report.repaired.append(line)
        say(line)

    for o in orphans:
        storage.delete(o.name)
        done(f"{o.name}: orphan deleted")
    by_base = {r.base_offset: r for r in listed}
    for base, findings in damaged.items():
        record = by_base[base]
        line = _upload_again(part, storage, record, findings, [r for r in listed if r.state == UPLOADED])
        if line is None:
            metadata.mark_lost(epoch, channel, base)
            line = (
                f"{channel} offsets {record.base_offset} to {record.end_offset - 1}: marked lost (no local copy of "
                "the segment to upload again); reads of them raise TierDataLostError"
            )
        done(line)
        bad_manifest.pop(base, None)  # a lost segment's manifest no longer matters; an uploaded one was rewritten
    for base, finding in bad_manifest.items():
        record = by_base[base]
        manifest = record.manifest or ""
        storage.write(manifest, encode_manifest(record))
        done(f"{manifest}: written again from the metadata ({finding.detail})")


def _manifest_problem(
    storage: ChunkStorage, record: SegmentRecord, sizes: dict[str, int], planned: list[SegmentRecord]
) -> str | None:
    """Why the manifest of ``record`` is not right (None if it is): it must say what the row says,
    or what a merge in progress will make it say (``planned``: it writes the manifests first)."""
    if record.manifest is None or record.manifest not in sizes:
        return "the manifest is missing"
    try:
        stored = decode_manifest(storage.read(record.manifest, 0, sizes[record.manifest]), record.manifest)
    except CorruptRecordError as exc:
        return str(exc)
    if stored != record and stored not in planned:
        return (
            f"the manifest says offsets [{stored.base_offset}, {stored.end_offset}), {stored.size} bytes in "
            f"{len(stored.chunks)} chunk(s); the metadata says [{record.base_offset}, {record.end_offset}), "
            f"{record.size} bytes in {len(record.chunks)}"
        )
    return None


def _deep_problem(reader: RemoteReader, record: SegmentRecord) -> str | None:
    """Why reading ``record`` whole fails (None if every table, block and record CRC checks),
    through the readers' own decoders: table, block decompression, record frames."""
    try:
        segment = reader.open(record)  # the header and block table, CRC-checked and compared with the metadata
    except CorruptRecordError as exc:
        return str(exc)
    try:
        info = segment.info
        for i, block in enumerate(info.blocks):
            following = info.blocks[i + 1].first_offset if i + 1 < len(info.blocks) else info.end_offset
            out: list[Record] = []
            try:
                data = segment.load(i)
                end, got = decode_records(data, 0, block.first_offset, len(data), out)
            except CorruptRecordError as exc:
                return f"block {i} (offsets from {block.first_offset}) in {segment.where(i)}: {exc}"
            if end != len(data) or block.first_offset + got != following:
                return (
                    f"block {i} in {segment.where(i)} holds offsets {block.first_offset} to {block.first_offset + got - 1}"
                    f" and {len(data) - end} bytes of a partial frame; the next block or the end is at {following}"
                )
    finally:
        segment.close()
    return None


def _gaps(part: Partition, listed: list[SegmentRecord]) -> list[Finding]:
    found = []
    for a, b in itertools.pairwise(listed):
        if a.end_offset != b.base_offset:
            found.append(Finding("gap", part.name, None, a.end_offset, b.base_offset, "in no uploaded segment"))
    if listed:
        log_ = Log(part.path, part.config)
        try:
            local = log_.local_segments()
        finally:
            log_.close()
        if local and local[0].base_offset > listed[-1].end_offset:
            end = local[0].base_offset
            found.append(Finding("gap", part.name, None, listed[-1].end_offset, end, "neither in tier-2 nor in the local folder"))
    return found


def _local_bytes(part: Partition, record: SegmentRecord, position: int, length: int) -> bytes | None:
    """Bytes ``[position, position + length)`` of ``record``'s local ``.seg.z``, if it is there and is
    the same segment (its table checked, its size the uploaded size); None otherwise."""
    log_ = Log(part.path, part.config)
    try:
        local = log_.compressed_path(record.base_offset)
    finally:
        log_.close()
    try:
        with os_errors("open segment", local):
            fd = os.open(local, os.O_RDONLY | os.O_CLOEXEC)
    except FileChannelError:
        return None
    try:
        if checked_size(fd, SegmentToUpload(local, record.base_offset, record.end_offset, record.max_timestamp)) != record.size:
            return None
        with os_errors("read", local):
            data = os.pread(fd, length, position)
    except CorruptRecordError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == length else None


def _upload_again(
    part: Partition, storage: ChunkStorage, record: SegmentRecord, findings: list[Finding], uploaded: list[SegmentRecord]
) -> str | None:
    """Write the damaged objects of ``record`` again from the local ``.seg.z`` files of every segment
    with bytes in them (a merged object holds several); return the line saying so, or None if a
    local copy is missing (nothing is written then)."""
    names = {c.name for c in record.chunks} if any(f.kind == "damaged" for f in findings) else {f.name for f in findings}
    objects: dict[str, bytes] = {}
    for name in sorted(n for n in names if n is not None):
        pieces = sorted(((c.object_offset, r, c) for r in uploaded for c in r.chunks if c.name == name), key=lambda p: p[0])
        data = bytearray()
        for object_offset, r, c in pieces:
            piece = _local_bytes(part, r, c.position, c.length)
            if piece is None or object_offset != len(data):
                return None
            data += piece
        objects[name] = bytes(data)
    for name, data in objects.items():
        storage.write(name, data)
    where = f"{part.name} offsets {record.base_offset} to {record.end_offset - 1}"
    return f"{where}: {len(objects)} object(s) written again from the local copies"
