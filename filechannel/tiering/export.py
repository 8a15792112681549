"""Export and import of the tier-2 metadata: a versioned, checksummed copy of one root's (or one topic's).

An export holds what the metadata store holds, read in one transaction (every epoch
taken, every segment in every state with its chunks), plus the committed offsets of the
root's consumer groups, which the client reads and restores (``client.group.group_offsets``,
``restore_groups``: consumer groups are the client's, above tiering); here they are data.
It is written to a file, or to tier-2 as
``.exports/<exported_at_ms:015d>.E<epoch:010d>.export`` (a name no topic can have: topic
names never start with "."), where ``tier rebuild`` finds the newest one for the group
offsets.

Format (``EXPORT_VERSION`` 1): canonical ASCII JSON (keys sorted, no spaces)::

    {"crc32c":N,"export":BODY,"format":"filechannel-tier-export","version":1}

BODY: ``epoch`` (the newest epoch at export), ``exported_at_ms``, ``topic`` (the scope,
or null for the whole root), ``epochs`` ``[{"epoch","owner","taken_at_ms"}]``,
``segments`` ``[{"channel","base_offset","end_offset","size","max_timestamp","state",
"epoch","manifest","chunks":[{"name","position","length","object_offset"}]}]`` (sorted by channel and
base offset) and ``groups`` ``{GROUP: {"TOPIC/PARTITION": offset}}``. N is the CRC-32C of
BODY's bytes. A decoder accepts only this canonical form with a matching CRC, so an
export read back is exactly the one written (``decode(encode(x)) == x``), and any
damaged byte or foreign file is refused with one :class:`ExportFormatError`.

Import loads an export into an empty store only (:meth:`TierMetadata.load`), after
checking it against the bucket: every chunk of every uploaded segment listed with the
length the export says, its manifest present, and no manifest in the bucket that the
export lacks (segments uploaded after the export: importing would make their objects
orphans, which the next daemon deletes; ``tier rebuild`` recovers them instead). The
newest epoch named by any object in the bucket is recorded too, so the next daemon's
epoch is newer than every object name already written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..engine.checksum import crc32c
from ..engine.clock import now_ms
from ..engine.files import read_if_exists, write_atomically
from ..engine.names import validate_name
from ..errors import ExportFormatError, TierError
from ..root import split_partition_name
from .layout import (
    MANIFEST_SUFFIX,
    UPLOADED,
    ChunkRecord,
    SegmentRecord,
    object_extents,
    parse_object_name,
    segment_problem,
)
from .metadata import EpochRecord, TierMetadata
from .storage import ChunkStorage, ObjectInfo

EXPORT_FORMAT = "filechannel-tier-export"
EXPORT_VERSION = 1
EXPORTS_PREFIX = ".exports/"
EXPORT_SUFFIX = ".export"


@dataclass(frozen=True)
class Export:
    """The tier-2 metadata as one read transaction saw it, and group offsets (see the module docstring for its format)."""

    epoch: int
    exported_at_ms: int
    topic: str | None
    epochs: tuple[EpochRecord, ...]
    segments: tuple[SegmentRecord, ...]
    groups: dict[str, dict[str, int]] = field(default_factory=dict)


_T = TypeVar("_T")


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def _envelope(body: bytes) -> bytes:
    return b'{"crc32c":%d,"export":%s,"format":"%s","version":%d}' % (
        crc32c(body),
        body,
        EXPORT_FORMAT.encode(),
        EXPORT_VERSION,
    )


def _body(export: Export) -> dict[str, Any]:
    return {
        "epoch": export.epoch,
        "exported_at_ms": export.exported_at_ms,
        "topic": export.topic,
        "epochs": [{"epoch": e.epoch, "owner": e.owner, "taken_at_ms": e.taken_at_ms} for e in export.epochs],
        "segments": [
            {
                "channel": s.channel,
                "base_offset": s.base_offset,
                "end_offset": s.end_offset,
                "size": s.size,
                "max_timestamp": s.max_timestamp,
                "state": s.state,
                "epoch": s.epoch,
                "manifest": s.manifest,
                "chunks": [
                    {"name": c.name, "position": c.position, "length": c.length, "object_offset": c.object_offset}
                    for c in s.chunks
                ],
            }
            for s in export.segments
        ],
        "groups": {group: dict(offsets) for group, offsets in export.groups.items()},
    }


def encode_export(export: Export) -> bytes:
    """The bytes of ``export`` (canonical JSON with its CRC-32C)."""
    return _envelope(_canonical(_body(export)))


def _need(value: object, kind: type[_T], what: str) -> _T:
    """``value`` if it is exactly a ``kind`` (so never a bool where an int is expected), else ValueError."""
    if type(value) is not kind:
        raise ValueError(f"{what} is {value!r}, not a {kind.__name__}")
    return value


def decode_export(data: bytes | bytearray | memoryview, where: str) -> Export:
    """The export in ``data``; :class:`ExportFormatError` naming ``where`` if it is not one."""
    data = bytes(data)
    try:
        doc = json.loads(data.decode("ascii"))
        if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
            raise ExportFormatError(f"{where} is not a filechannel tier-2 metadata export (no format {EXPORT_FORMAT!r})")
        if doc.get("version") != EXPORT_VERSION:
            raise ExportFormatError(
                f"{where} is a tier-2 metadata export of version {doc.get('version')!r}; this filechannel reads "
                f"version {EXPORT_VERSION}: use the filechannel that wrote it, or a newer one"
            )
        if set(doc) != {"crc32c", "export", "format", "version"}:
            raise ValueError(f"fields {sorted(doc)}")
        body = _need(doc["export"], dict, "the body")
        canonical = _canonical(body)
        if crc32c(canonical) != doc["crc32c"]:
            raise ValueError(f"CRC-32C mismatch (stored {doc['crc32c']!r}, computed {crc32c(canonical)})")
        if _envelope(canonical) != data:
            raise ValueError("not in canonical form")
        export = _from_body(body)
    except ExportFormatError:
        raise
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError too
        raise ExportFormatError(f"{where} is not a valid tier-2 metadata export (damaged or not one): {exc}") from None
    return export


def _from_body(body: dict[str, Any]) -> Export:
    if set(body) != {"epoch", "exported_at_ms", "topic", "epochs", "segments", "groups"}:
        raise ValueError(f"body fields {sorted(body)}")
    epochs = tuple(
        EpochRecord(
            _need(e["epoch"], int, "an epoch"), _need(e["owner"], str, "an owner"), _need(e["taken_at_ms"], int, "a time")
        )
        for e in _need(body["epochs"], list, "epochs")
    )
    segments = []
    for s in _need(body["segments"], list, "segments"):
        chunks = tuple(
            ChunkRecord(
                _need(c["name"], str, "a chunk name"),
                _need(c["position"], int, "a position"),
                _need(c["length"], int, "a length"),
                _need(c["object_offset"], int, "an object offset"),
            )
            for c in _need(s["chunks"], list, "chunks")
        )
        record = SegmentRecord(
            _need(s["channel"], str, "a channel"),
            _need(s["base_offset"], int, "a base offset"),
            _need(s["end_offset"], int, "an end offset"),
            _need(s["size"], int, "a size"),
            _need(s["max_timestamp"], int, "a timestamp"),
            _need(s["state"], str, "a state"),
            _need(s["epoch"], int, "an epoch"),
            chunks,
            s["manifest"] if s["manifest"] is None else _need(s["manifest"], str, "a manifest"),
        )
        problem = segment_problem(record)
        if problem:
            raise ValueError(problem)
        segments.append(record)
    groups: dict[str, dict[str, int]] = {}
    for group, offsets in _need(body["groups"], dict, "groups").items():
        validate_name(group, "group name")  # it becomes a folder name at import
        for key in offsets:
            try:
                split_partition_name(str(key))
            except ValueError as exc:
                raise ValueError(f"group {group}: {exc}") from None
        groups[group] = {
            _need(k, str, "a partition"): _need(v, int, "an offset") for k, v in _need(offsets, dict, "offsets").items()
        }
    exported_topic = body["topic"] if body["topic"] is None else _need(body["topic"], str, "the topic")
    return Export(
        _need(body["epoch"], int, "the epoch"),
        _need(body["exported_at_ms"], int, "the time"),
        exported_topic,
        epochs,
        tuple(segments),
        groups,
    )


# -- export ------------------------------------------------------------------------------------


def take_export(metadata: TierMetadata, *, topic: str | None = None) -> Export:
    """An export of ``metadata`` (one read transaction), with no group offsets: the client adds
    them (``dataclasses.replace(export, groups=client.group.group_offsets(root, topic))``)."""
    epochs, segments = metadata.snapshot(topic)
    return Export(max((e.epoch for e in epochs), default=0), now_ms(), topic, tuple(epochs), tuple(segments))


def export_object_name(export: Export) -> str:
    """The object an export is written to in tier-2 (names sort by time)."""
    return f"{EXPORTS_PREFIX}{export.exported_at_ms:015d}.E{export.epoch:010d}{EXPORT_SUFFIX}"


def write_export_file(export: Export, path: str) -> None:
    """Write ``export`` to ``path`` atomically (temp file, fsync, rename)."""
    write_atomically(os.path.abspath(path), encode_export(export))


def read_export_file(path: str) -> Export:
    """The export in file ``path`` (:class:`ExportFormatError` if it is not one, TierError if missing)."""
    data = read_if_exists(path, "tier export")
    if data is None:
        raise TierError(f"there is no export file {path!r}")
    return decode_export(data, path)


def newest_export(storage: ChunkStorage) -> Export | None:
    """The newest export written to ``storage`` (None if there is none)."""
    names = [o.name for o in storage.list(EXPORTS_PREFIX) if o.name.endswith(EXPORT_SUFFIX)]
    if not names:
        return None
    name = names[-1]
    return decode_export(storage.read(name, 0, 1 << 40), f"{storage.url.rstrip('/')}/{name}")


# -- import ------------------------------------------------------------------------------------


def bucket_problems(export: Export, listing: Iterable[ObjectInfo]) -> list[str]:
    """Why ``export`` cannot be imported against a bucket holding ``listing`` (empty if it can)."""
    sizes = {o.name: o.length for o in listing}
    problems = []
    known = {(s.channel, s.base_offset, s.epoch) for s in export.segments}
    # "uploading"/"deleting" rows are cleaned up by the next daemon; "lost" ones are known gone
    uploaded = [s for s in export.segments if s.state == UPLOADED]
    for name, extent in object_extents(uploaded).items():
        if name not in sizes:
            problems.append(f"{name}: missing ({extent} bytes of uploaded segments)")
        elif sizes[name] != extent:
            problems.append(f"{name}: {sizes[name]} bytes in the bucket, the export says {extent}")
    for s in uploaded:
        if s.manifest is not None and s.manifest not in sizes:
            problems.append(f"{s.manifest}: missing (the manifest of {s.channel}@{s.base_offset})")
    for name in sizes:
        parsed = parse_object_name(name)
        if parsed is None or not name.endswith(MANIFEST_SUFFIX):
            continue
        in_scope = export.topic is None or parsed.channel == export.topic or parsed.channel.startswith(export.topic + "/")
        if in_scope and (parsed.channel, parsed.base_offset, parsed.epoch) not in known:
            problems.append(
                f"{name}: a segment the export does not know (uploaded after it?); use 'filechannel tier rebuild' instead"
            )
    return problems


def newest_epoch_named(listing: Iterable[ObjectInfo]) -> int:
    """The newest epoch named by an object of ``listing`` (0 if none)."""
    return max((p.epoch for o in listing if (p := parse_object_name(o.name)) is not None), default=0)


def import_export(export: Export, metadata: TierMetadata, listing: list[ObjectInfo]) -> None:
    """Load ``export`` into the empty store ``metadata`` after checking it against ``listing``
    (the bucket). Its group offsets are the client's to restore (``client.group.restore_groups``).

    Raises :class:`TierError` listing the problems (nothing loaded) if the bucket disagrees.
    """
    problems = bucket_problems(export, listing)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise TierError(f"import refused: the bucket does not hold what the export says: {shown}")
    epochs = list(export.epochs)
    newest = newest_epoch_named(listing)
    if newest > max((e.epoch for e in epochs), default=0):
        epochs.append(EpochRecord(newest, "import: the newest epoch named in the bucket", now_ms()))
    metadata.load(epochs, export.segments)
