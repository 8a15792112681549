"""``filechannel tier fsck``: the tier-2 metadata checked against the bucket and the manifests, and repaired.

What is checked, per tiered partition of a root (one line per finding, naming the object
and the offsets it affects):

- every chunk of every uploaded segment is listed, at least as long as the furthest chunk
  in it (``missing``, ``length``: an object too short). An object longer than that is
  whole: its ``extra bytes`` are a note (:attr:`FsckReport.notes`), not damage; no read
  ever reaches them (reads, ``deep`` included, ask for the chunks' ranges only);
- its manifest is there, decodes, and says what the metadata says, or what a merge in
  progress will make it say (a merge writes the manifests before it swaps the rows)
  (``manifest``);
- the uploaded (and lost) segments follow each other without a gap, and the first local
  segment begins at or below the tier's end (``gap``);
- no object is an ``orphan``. The bucket is the truth and the metadata store its index, so
  an object of the channel is an orphan only if (a) nothing in the store names it (no
  row's chunk or manifest, no merge, no garbage), and (b) no manifest in the bucket keeps
  it (:func:`referenced_by_manifests`). (a) needs no clock: an object counts only if
  neither the store read *before* the listing nor the one read *after* it names it (an
  upload commits its row before it writes a byte, a delete removes the objects before
  the row). (b) makes a lost, empty or stale ``metadata.db`` harmless: what the manifests
  describe is never called an orphan. Left are a fenced uploader's late writes, an upload
  whose abandon died half-way, objects a finished merge replaced;
- a readable manifest that the store lacks (kept by (b), named by no row) is reported as
  ``unindexed``: the store is behind the bucket (``filechannel tier rebuild`` makes a
  root from the bucket); it is never deleted;
- a ``lost`` segment is reported as such (its offsets are known gone);
- with ``deep``: every uploaded segment is read whole from tier-2 through the readers'
  own code (the header and block-table CRC via :func:`~filechannel.engine.compressed.read_table`,
  every block decompressed, every record's CRC via :func:`~filechannel.engine.record.decode_records`):
  ``damaged``.

``repair`` (only while no daemon runs: it holds the daemon's lock, and takes an epoch
unless the store is empty or absent, which it leaves so for ``tier import``): orphans are
deleted; a missing, short or damaged chunk is written again from the local ``.seg.z`` when
it is still there and is the same segment (same table, same size: the bytes tier-2 holds
are the local file's, unchanged); a missing or disagreeing manifest is written again from
the row (what readers follow); otherwise the segment is marked ``lost``
(:meth:`TierMetadata.mark_lost`): reads of its offsets raise
:class:`~filechannel.errors.TierDataLostError` naming them, nothing guesses. A segment is
never marked lost while its records read back intact (read again whole first). Gaps and
unindexed manifests are reported, not repaired (nothing to repair them from, nothing to
delete).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

from ..engine.log import Log
from ..engine.verify import checked_blocks
from ..errors import CorruptRecordError, FileChannelError, TierError, os_errors
from ..root import ROOT_METADATA, ROOT_TIER_DIR
from .bindings import StorageClients
from .daemon_lock import exclusive
from .layout import (
    LISTED,
    LOST,
    MANIFEST_SUFFIX,
    STATES,
    UPLOADED,
    SegmentRecord,
    decode_manifest,
    encode_manifest,
    object_extents,
    parse_object_name,
)
from .metadata import Merge, TierMetadata
from .ownership import not_owner, read_claim, root_identity
from .partitions import TieredChannel, storage_key, tier_of, tiered_partitions
from .reindex import referenced_by_manifests
from .remote_segment import RemoteReader
from .storage import ChunkStorage
from .uploader import SegmentToUpload, checked_size

Say = Callable[[str], None]
Bytes = Callable[[int], None]

_DEEP_CACHE_BYTES = 8 << 20


@dataclass(frozen=True)
class Finding:
    """One inconsistency: its kind, the channel, the object (if one), the offsets ``[first, end)`` it affects."""

    kind: str  # missing, length, manifest, orphan, unindexed, gap, lost, damaged; notes: extra bytes
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
    """What a check found, what a repair did, and how much it looked at.

    ``findings`` are inconsistencies (exit 1); ``notes`` are not (``extra bytes``: an object
    longer than its chunks need, whole and readable).
    """

    findings: list[Finding] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)
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

    A missing ``metadata.db`` is an empty store: the bucket is still checked (its manifests
    are ``unindexed``, true orphans are found), and the file is not created. A repair takes an
    epoch only in a store that has one already, so an empty store stays empty (``tier import``
    loads only into an empty store): it has no row to mark lost anyway.
    """
    root = os.path.abspath(os.fspath(root))
    path = os.path.join(root, ROOT_METADATA)
    report = FsckReport()
    if not os.path.exists(path) and not tiered_partitions(root):
        return report  # nothing is tiered
    say = say or (lambda line: None)
    with ExitStack() as stack:
        if repair:
            stack.enter_context(exclusive(os.path.join(root, ROOT_TIER_DIR), "repair tier-2"))
        metadata = stack.enter_context(TierMetadata(path)) if os.path.exists(path) else None
        epoch = None
        if repair and metadata is not None and metadata.current_epoch():
            epoch = metadata.take_epoch(f"fsck --repair:{os.getpid()}")
        _check_root(root, _Store(metadata, path), repair, epoch, deep, report, say, advance)
    return report


def _check_root(
    root: str,
    store: _Store,
    repair: bool,
    epoch: int | None,
    deep: bool,
    report: FsckReport,
    say: Say,
    advance: Bytes | None,
) -> None:
    storages = StorageClients()
    checked: set[tuple[str, str]] = set()
    try:
        for part in tiered_partitions(root):
            storage = storages.get(*tier_of(part.config))
            key = storage_key(part.config)
            if repair and key not in checked:
                # a repair deletes and rewrites: only in a prefix this root owns (or nobody claimed)
                checked.add(key)
                claim = read_claim(storage)
                if claim is not None and claim.root_id != root_identity(os.path.join(root, ROOT_TIER_DIR)):
                    raise not_owner(storage, claim)
            _check_partition(part, storage, store, repair, epoch, deep, report, say, advance)
    finally:
        storages.close()


def _named(records: list[SegmentRecord]) -> set[str]:
    return {c.name for r in records for c in r.chunks} | {r.manifest for r in records if r.manifest}


@dataclass(frozen=True)
class _Store:
    """The metadata store as fsck reads it: ``metadata``, or None while ``path`` does not exist
    (then it is empty, and read from ``path`` if it appears meanwhile)."""

    metadata: TierMetadata | None
    path: str

    def rows(self, channel: str) -> list[SegmentRecord]:
        return [] if self.metadata is None else self.metadata.segments(channel, states=STATES)

    def merges(self, channel: str) -> list[Merge]:
        return [] if self.metadata is None else self.metadata.merges(channel)

    def names(self, channel: str) -> set[str]:
        """Every object name the store keeps for ``channel``: its rows' chunks and manifests,
        merges in progress (the object and its sources), garbage waiting for its delay."""
        if self.metadata is None:
            if not os.path.exists(self.path):
                return set()
            with TierMetadata(self.path) as metadata:
                return _Store(metadata, self.path).names(channel)
        merges = self.metadata.merges(channel)
        named = _named(self.metadata.segments(channel, states=STATES)) | set(self.metadata.garbage(channel))
        return named | {m.name for m in merges} | {n for m in merges for n in m.sources}


def _check_partition(
    part: TieredChannel,
    storage: ChunkStorage,
    store: _Store,
    repair: bool,
    epoch: int | None,
    deep: bool,
    report: FsckReport,
    say: Say,
    advance: Bytes | None,
) -> None:
    channel = part.name
    named = store.names(channel)  # the store read before the listing...
    listing = storage.list(channel + "/")
    rows = store.rows(channel)
    named |= store.names(channel)  # ...and after it (see the module docstring)
    merges = store.merges(channel)
    report.objects += len(listing)
    sizes = {o.name: o.length for o in listing}
    found: list[Finding] = []

    # orphans: objects of the channel that neither read of the store names, nor a manifest in the
    # bucket keeps (the manifests are read only for these: none when the store names everything)
    unnamed = [
        o for o in listing if (p := parse_object_name(o.name)) is not None and p.channel == channel and o.name not in named
    ]
    decoded: dict[str, SegmentRecord | None] = {}
    kept = referenced_by_manifests(storage, listing, channel, [o.name for o in unnamed], decoded=decoded)
    orphans = [o for o in unnamed if o.name not in kept]
    found += [
        Finding("orphan", channel, o.name, None, None, f"{o.length} bytes that no segment names and no manifest keeps")
        for o in orphans
    ]
    for o in unnamed:
        unindexed = decoded.get(o.name) if o.name in kept and o.name.endswith(MANIFEST_SUFFIX) else None
        if unindexed is not None:
            detail = (
                f"a readable segment ({unindexed.size} bytes in {len(object_extents([unindexed]))} object(s)) that the "
                "metadata store lacks: the store is behind the bucket (a lost or replaced metadata.db?); make a root "
                "from the bucket with 'filechannel tier rebuild'; never deleted"
            )
            found.append(Finding("unindexed", channel, o.name, unindexed.base_offset, unindexed.end_offset, detail))

    listed = [r for r in rows if r.state in LISTED]
    report.segments += len(listed)
    damaged: dict[int, list[Finding]] = {}  # base offset -> findings about its chunks
    bad_manifest: dict[int, Finding] = {}
    # how long each object must be: the end of the furthest chunk in it (a merged object holds several)
    extents = object_extents(r for r in listed if r.state == UPLOADED)
    # objects longer than every row (any state) needs: whole, the rest is never read
    held = object_extents(rows)
    for name, extent in held.items():
        if name in extents and sizes.get(name, -1) > extent:
            holders = [r for r in listed if any(c.name == name for c in r.chunks)]
            detail = (
                f"the object holds {sizes[name]} bytes, {sizes[name] - extent} bytes after the furthest chunk in it "
                f"(which ends at {extent}); not damage: reads never reach them"
            )
            first, end = min(r.base_offset for r in holders), max(r.end_offset for r in holders)
            report.notes.append(Finding("extra bytes", channel, name, first, end, detail))
    for r in listed:
        if r.state == LOST:
            found.append(Finding("lost", channel, None, r.base_offset, r.end_offset, "marked lost by an earlier repair"))
            continue
        for name in dict.fromkeys(c.name for c in r.chunks):
            where = ", ".join(
                f"bytes {c.position} to {c.position + c.length - 1} at {c.object_offset}" for c in r.chunks if c.name == name
            )
            if name not in sizes:
                detail = f"the object is missing (it holds {where})"
                finding = Finding("missing", channel, name, r.base_offset, r.end_offset, detail)
            elif sizes[name] < extents[name]:
                detail = f"the object holds {sizes[name]} bytes, the metadata says {extents[name]} (it holds {where})"
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

    if not repair:
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
        if line is None and not any(f.kind == "damaged" for f in findings):
            line = _intact(storage, record)  # never mark lost what reads back (the shallow findings said otherwise)
        if line is None:
            if store.metadata is None or epoch is None:  # rows exist only in a store with an epoch
                raise TierError(f"cannot mark {channel} offsets {record.base_offset} to {record.end_offset - 1} lost: no epoch")
            store.metadata.mark_lost(epoch, channel, base)
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


def _intact(storage: ChunkStorage, record: SegmentRecord) -> str | None:
    """The line saying ``record`` was left uploaded because it reads back whole (table, blocks,
    record CRCs), or None if it does not."""
    reader = RemoteReader(storage, _DEEP_CACHE_BYTES, 1)
    try:
        if _deep_problem(reader, record) is not None:
            return None
    finally:
        reader.close()
    where = f"{record.channel} offsets {record.base_offset} to {record.end_offset - 1}"
    return f"{where}: not marked lost: every record reads back intact now"


def _deep_problem(reader: RemoteReader, record: SegmentRecord) -> str | None:
    """Why reading ``record`` whole fails (None if every table, block and record CRC checks),
    through the readers' own decoders: table, block decompression, record frames."""
    try:
        segment = reader.open(record)  # the header and block table, CRC-checked and compared with the metadata
    except CorruptRecordError as exc:
        return str(exc)
    try:
        for _, _, bad in checked_blocks(segment):
            if bad is not None:
                return str(bad)
    finally:
        segment.close()
    return None


def _gaps(part: TieredChannel, listed: list[SegmentRecord]) -> list[Finding]:
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


def _local_bytes(part: TieredChannel, record: SegmentRecord, position: int, length: int) -> bytes | None:
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
    part: TieredChannel, storage: ChunkStorage, record: SegmentRecord, findings: list[Finding], uploaded: list[SegmentRecord]
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
    for name, whole in objects.items():
        storage.write(name, whole)
    where = f"{part.name} offsets {record.base_offset} to {record.end_offset - 1}"
    return f"{where}: {len(objects)} object(s) written again from the local copies"
