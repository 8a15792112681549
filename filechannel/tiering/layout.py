"""How a segment lies in tier-2: the records that describe it, its object names, its manifest.

A sealed segment ``B.seg.z`` of a channel goes to chunk storage unchanged, cut into one
or more chunks, followed by one small manifest beside them. Names are relative to the
storage root (the storage URL carries any prefix)::

    <channel>/<base:020d>.E<epoch:010d>.<start:020d>.chunk    bytes [start, start+length) of B.seg.z
    <channel>/<base:020d>.E<epoch:010d>.manifest              the segment record, as versioned JSON
    <channel>/<base:020d>.E<epoch:010d>.<end:020d>.<token:16x>.merged
                                                              a defragmented object: the bytes of
                                                              chunks of the segments of [base, end)

``channel`` is ``<topic>/<partition>`` for a topic's partition, or a standalone channel's
name: parts of ``[A-Za-z0-9._-]`` joined by ``/``. ``epoch`` is the uploader's epoch
(see :mod:`.metadata`), so two uploaders never write the same object, and an object
names what it holds: a listing alone finds every upload attempt and its orphans. A merged
object is named by the epoch of the defragmenter that wrote it, the offsets of the
segments whose chunks it holds and a random token (one epoch may merge the same segments
twice: a run, then that object with its neighbours); a chunk record then says where its bytes are inside it
(``object_offset``). Offsets and positions are zero-padded, so a listing sorts by offset,
as local segment files do. :func:`parse_object_name` inverts the three names exactly: it
accepts a name if and only if one of the three functions produces it.

The manifest is ASCII JSON in canonical form (keys sorted, no spaces)::

    {"crc32c":N,"segment":BODY,"version":V}

where BODY holds channel, base_offset, end_offset, size, max_timestamp, epoch and the
chunk list, and N is the CRC-32C of BODY's bytes. Version 1 (a segment as uploaded: each
chunk its own object) lists chunks as ``{"length":L,"name":S,"position":P}``; version 2
(a segment whose chunks were merged by defragmentation) adds ``"object_offset":O`` to
every chunk. A segment is written in version 1 whenever it can be, so the manifests of
segments never defragmented stay readable by older readers. A decoder accepts only this
canonical form with a matching CRC, so any damaged byte is refused (CRC-32C detects
every error burst of up to 32 bits) and never read as another record.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from ..engine.checksum import crc32c
from ..errors import ConfigError, CorruptRecordError, InvalidNameError

UPLOADING, UPLOADED, DELETING, LOST = "uploading", "uploaded", "deleting", "lost"
STATES = (UPLOADING, UPLOADED, DELETING, LOST)
# What readers list: "lost" segments too, so a read of their offsets raises TierDataLostError
# naming them instead of finding a hole (or, below the first one, an offset out of range).
LISTED = (UPLOADED, LOST)

MAX_OFFSET = 2**63 - 1  # offsets, positions and sizes are SQLite integers (signed 64-bit)
MAX_EPOCH = 10**10 - 1  # ten digits in object names
MIN_TIMESTAMP, MAX_TIMESTAMP = -(2**63), 2**63 - 1
MAX_NAME_CHARS = 1024  # what every chunk storage accepts (the storage contract's limit)
CHUNK_SUFFIX = ".chunk"
MANIFEST_SUFFIX = ".manifest"
MERGED_SUFFIX = ".merged"
MANIFEST_VERSION = 2  # the newest this filechannel writes and reads (it reads 1 too)

_PART = re.compile(r"[A-Za-z0-9._-]{1,200}")
_LONGEST_TAIL = len(f"/{0:020d}.E{0:010d}.{0:020d}{CHUNK_SUFFIX}")
MAX_CHANNEL_CHARS = MAX_NAME_CHARS - _LONGEST_TAIL
_OBJECT = re.compile(
    r"(?P<channel>[A-Za-z0-9._/-]+)/(?P<base>[0-9]{20})\.E(?P<epoch>[0-9]{10})"
    r"(?:\.(?P<start>[0-9]{20})\.(?:(?P<token>[0-9a-f]{16})\.)?(?P<kind>chunk|merged)|\.manifest)"
)


@dataclass(frozen=True)
class ChunkRecord:
    """Bytes ``[position, position + length)`` of a segment's ``.seg.z``, held by object ``name``
    at ``[object_offset, object_offset + length)`` (0 unless the object is a merged one)."""

    name: str
    position: int
    length: int
    object_offset: int = 0


@dataclass(frozen=True)
class SegmentRecord:
    """A segment in tier-2: offsets ``[base_offset, end_offset)``, ``size`` bytes of ``.seg.z``.

    Invariants (see :func:`segment_problem`): ``end_offset > base_offset``, ``size > 0``;
    ``chunks`` cover ``[0, size)`` contiguously, in order, each named by :func:`chunk_name`
    of this segment and ``epoch`` (the epoch of the uploader that wrote them);
    ``manifest`` is None or :func:`manifest_name` of the same.
    """

    channel: str
    base_offset: int
    end_offset: int
    size: int
    max_timestamp: int
    state: str
    epoch: int
    chunks: tuple[ChunkRecord, ...]
    manifest: str | None


class ObjectName(NamedTuple):
    """A parsed chunk or manifest name; ``start`` is None for a manifest."""

    kind: str  # "chunk" or "manifest"
    channel: str
    base_offset: int
    epoch: int
    start: int | None

    @property
    def name(self) -> str:
        """The object name this was parsed from."""
        if self.start is None:
            return manifest_name(self.channel, self.base_offset, self.epoch)
        return chunk_name(self.channel, self.base_offset, self.epoch, self.start)


class MergedObjectName(NamedTuple):
    """A parsed merged object name: ``start`` is the end offset of the segments it holds chunks of."""

    kind: str  # "merged"
    channel: str
    base_offset: int
    epoch: int
    start: int
    token: str

    @property
    def name(self) -> str:
        """The object name this was parsed from."""
        return merged_name(self.channel, self.base_offset, self.epoch, self.start, self.token)


def _channel_problem(channel: object) -> str | None:
    if not isinstance(channel, str):
        return f"channel {channel!r} is not a str"
    if len(channel) > MAX_CHANNEL_CHARS:
        return f"channel {channel[:40]!r}... is longer than {MAX_CHANNEL_CHARS} characters"
    for part in channel.split("/"):
        if not _PART.fullmatch(part) or part in (".", ".."):
            return (
                f"channel {channel!r} is not allowed: use parts of 1 to 200 characters of [A-Za-z0-9._-] "
                "joined by '/', no empty part, no '.' or '..'"
            )
    return None


def validate_channel(channel: object) -> str:
    """Return ``channel`` if it can name objects, else raise :class:`InvalidNameError`."""
    problem = _channel_problem(channel)
    if problem:
        raise InvalidNameError(problem)
    return cast(str, channel)  # _channel_problem found none: it is a str


def _int_problem(what: str, value: object, low: int, high: int) -> str | None:
    if type(value) is not int:
        return f"{what} {value!r} is not an int"
    if not low <= value <= high:
        return f"{what} {value} is out of range [{low}, {high}]"
    return None


def check_int(what: str, value: object, low: int, high: int) -> int:
    """Return ``value`` if it is an int (not a bool) in ``[low, high]``, else raise :class:`ConfigError`."""
    problem = _int_problem(what, value, low, high)
    if problem:
        raise ConfigError(problem)
    return cast(int, value)  # _int_problem found none: it is an int


def chunk_name(channel: str, base_offset: int, epoch: int, start: int) -> str:
    """The object holding the bytes of segment ``base_offset`` from ``start``, written by ``epoch``."""
    validate_channel(channel)
    check_int("base offset", base_offset, 0, MAX_OFFSET)
    check_int("epoch", epoch, 1, MAX_EPOCH)
    check_int("chunk start", start, 0, MAX_OFFSET)
    return f"{channel}/{base_offset:020d}.E{epoch:010d}.{start:020d}{CHUNK_SUFFIX}"


def manifest_name(channel: str, base_offset: int, epoch: int) -> str:
    """The manifest object of segment ``base_offset`` uploaded by ``epoch``."""
    validate_channel(channel)
    check_int("base offset", base_offset, 0, MAX_OFFSET)
    check_int("epoch", epoch, 1, MAX_EPOCH)
    return f"{channel}/{base_offset:020d}.E{epoch:010d}{MANIFEST_SUFFIX}"


def merged_name(channel: str, base_offset: int, epoch: int, end_offset: int, token: str) -> str:
    """The merged object holding chunks of the segments of ``[base_offset, end_offset)``, written by
    ``epoch``; ``token`` is 16 random lowercase hex digits (``secrets.token_hex(8)``)."""
    validate_channel(channel)
    check_int("base offset", base_offset, 0, MAX_OFFSET)
    check_int("epoch", epoch, 1, MAX_EPOCH)
    check_int("end offset", end_offset, base_offset + 1, MAX_OFFSET)
    if not isinstance(token, str) or not re.fullmatch("[0-9a-f]{16}", token):
        raise ConfigError(f"merged object token {token!r} must be 16 lowercase hex digits")
    return f"{channel}/{base_offset:020d}.E{epoch:010d}.{end_offset:020d}.{token}{MERGED_SUFFIX}"


def parse_object_name(name: str) -> ObjectName | MergedObjectName | None:
    """Invert :func:`chunk_name` / :func:`manifest_name` / :func:`merged_name`; None for any other name.

    Used by listing-based recovery and orphan detection: ``parse_object_name(n).name == n``
    whenever the result is not None.
    """
    match = _OBJECT.fullmatch(name) if isinstance(name, str) else None
    if match is None or _channel_problem(match["channel"]):
        return None
    base, epoch = int(match["base"]), int(match["epoch"])
    start = None if match["start"] is None else int(match["start"])
    if base > MAX_OFFSET or epoch < 1 or (start is not None and start > MAX_OFFSET):
        return None
    if (match["kind"] == "merged") != (match["token"] is not None):
        return None
    if match["kind"] == "merged":
        if start is None or start <= base:  # (the pattern gives a merged name a start)
            return None
        return MergedObjectName("merged", match["channel"], base, epoch, start, match["token"])
    return ObjectName(match["kind"] or "manifest", match["channel"], base, epoch, start)


def object_extents(segments: Iterable[SegmentRecord]) -> dict[str, int]:
    """For each object the chunks of ``segments`` name, how many bytes they say it holds (the end of
    the furthest chunk in it): its whole length, when ``segments`` are all that name it."""
    extents: dict[str, int] = {}
    for segment in segments:
        for c in segment.chunks:
            extents[c.name] = max(extents.get(c.name, 0), c.object_offset + c.length)
    return extents


def plan_chunks(channel: str, base_offset: int, epoch: int, size: int, chunk_bytes: int) -> tuple[ChunkRecord, ...]:
    """The chunks of a ``size``-byte segment cut every ``chunk_bytes`` (the last one may be shorter)."""
    check_int("segment size", size, 1, MAX_OFFSET)
    check_int("chunk_bytes", chunk_bytes, 1, MAX_OFFSET)
    return tuple(
        ChunkRecord(chunk_name(channel, base_offset, epoch, start), start, min(chunk_bytes, size - start))
        for start in range(0, size, chunk_bytes)
    )


def chunks_problem(segment: SegmentRecord, chunks: Sequence[ChunkRecord]) -> str | None:
    """Why ``chunks`` are not a valid chunk list of ``segment`` (None if they are).

    They must be ChunkRecords covering ``[0, size)`` contiguously, in order, each either
    named by :func:`chunk_name` of this segment, its epoch and its position (at object
    offset 0), or held by a merged object of the same channel whose offsets include the
    segment's (:func:`merged_name`).
    """
    where = f"segment {segment.channel}@{segment.base_offset}"
    if not chunks:
        return f"{where} has no chunks; they must cover its {segment.size} bytes"
    position = 0
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, ChunkRecord):
            return f"chunk {i} of {where} is a {type(chunk).__name__}, not a ChunkRecord"
        problem = _int_problem(f"chunk {i} length", chunk.length, 1, MAX_OFFSET)
        if problem:
            return f"{where}: {problem}"
        if chunk.position != position:
            return f"chunk {i} of {where} starts at {chunk.position!r}, not at {position} where chunk {i - 1} ended"
        problem = _int_problem(f"chunk {i} object offset", chunk.object_offset, 0, MAX_OFFSET)
        if problem:
            return f"{where}: {problem}"
        expected = chunk_name(segment.channel, segment.base_offset, segment.epoch, position)
        merged = parse_object_name(chunk.name) if chunk.name != expected else None
        if merged is not None and merged.kind == "merged" and merged.channel == segment.channel:
            if not merged.base_offset <= segment.base_offset < segment.end_offset <= (merged.start or 0):
                return f"chunk {i} of {where} is in merged object {chunk.name!r}, which holds other offsets"
        elif chunk.name != expected or chunk.object_offset:
            return f"chunk {i} of {where} is named {chunk.name!r} at object offset {chunk.object_offset}, not {expected!r} at 0"
        position += chunk.length
    if position != segment.size:
        return f"the chunks of {where} cover {position} bytes, not its size {segment.size}"
    return None


def segment_problem(segment: SegmentRecord) -> str | None:
    """Why ``segment`` breaks an invariant of :class:`SegmentRecord` (None if it keeps them all)."""
    problem = (
        _channel_problem(segment.channel)
        or _int_problem("base offset", segment.base_offset, 0, MAX_OFFSET)
        or _int_problem("end offset", segment.end_offset, 0, MAX_OFFSET)
        or _int_problem("size", segment.size, 1, MAX_OFFSET)
        or _int_problem("max timestamp", segment.max_timestamp, MIN_TIMESTAMP, MAX_TIMESTAMP)
        or _int_problem("epoch", segment.epoch, 1, MAX_EPOCH)
    )
    if problem:
        return problem
    if segment.end_offset <= segment.base_offset:
        return f"segment {segment.channel}@{segment.base_offset} ends at {segment.end_offset}: it must hold at least one record"
    if segment.state not in STATES:
        return f"segment state {segment.state!r} is not one of {STATES}"
    if not isinstance(segment.chunks, tuple):
        return f"the chunks of segment {segment.channel}@{segment.base_offset} are not a tuple"
    expected = manifest_name(segment.channel, segment.base_offset, segment.epoch)
    if segment.manifest not in (None, expected):
        return f"segment {segment.channel}@{segment.base_offset} has manifest {segment.manifest!r}, not {expected!r}"
    return chunks_problem(segment, segment.chunks)


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def _merged(segment: SegmentRecord) -> bool:
    return any(c.object_offset or c.name.endswith(MERGED_SUFFIX) for c in segment.chunks)


def _body(segment: SegmentRecord) -> dict[str, Any]:
    chunks: list[dict[str, Any]] = [{"name": c.name, "position": c.position, "length": c.length} for c in segment.chunks]
    if _merged(segment):
        for chunk, c in zip(chunks, segment.chunks, strict=True):
            chunk["object_offset"] = c.object_offset
    return {
        "channel": segment.channel,
        "base_offset": segment.base_offset,
        "end_offset": segment.end_offset,
        "size": segment.size,
        "max_timestamp": segment.max_timestamp,
        "epoch": segment.epoch,
        "chunks": chunks,
    }


def _envelope(body: bytes, version: int) -> bytes:
    return b'{"crc32c":%d,"segment":%s,"version":%d}' % (crc32c(body), body, version)


def encode_manifest(segment: SegmentRecord) -> bytes:
    """The manifest of ``segment`` (its state is not stored: a manifest describes an uploaded copy).

    Raises :class:`ConfigError` if the record breaks an invariant of :class:`SegmentRecord`.
    """
    problem = segment_problem(segment)
    if problem:
        raise ConfigError(f"cannot write a manifest: {problem}")
    return _envelope(_canonical(_body(segment)), 2 if _merged(segment) else 1)


_BODY_FIELDS = {"channel": str, "base_offset": int, "end_offset": int, "size": int, "max_timestamp": int, "epoch": int}
_CHUNK_FIELDS = {"name": str, "position": int, "length": int}
_MERGED_CHUNK_FIELDS = {**_CHUNK_FIELDS, "object_offset": int}


def _fields_problem(value: object, fields: dict[str, type], what: str) -> str | None:
    if not isinstance(value, dict):
        return f"{what} is not an object"
    if set(value) != set(fields):
        return f"{what} has fields {sorted(value)}, expected {sorted(fields)}"
    for key, kind in fields.items():
        if type(value[key]) is not kind:
            return f"{what} field {key!r} is not a {kind.__name__}"
    return None


def decode_manifest(data: bytes | bytearray | memoryview, name: str) -> SegmentRecord:
    """The uploaded segment a manifest object describes (state "uploaded", ``manifest`` = ``name``).

    Raises :class:`CorruptRecordError` naming the object if the data is not a canonical
    manifest of a known version with a matching CRC-32C, if the record breaks an invariant
    of :class:`SegmentRecord`, or if it is not the manifest that ``name`` should hold.
    """
    data = bytes(data)

    def corrupt(why: str) -> CorruptRecordError:
        return CorruptRecordError(f"manifest {name!r} is corrupt (damaged in storage, or not a filechannel manifest): {why}")

    try:
        doc = json.loads(data.decode("ascii"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise corrupt(f"not ASCII JSON ({exc})") from exc
    if not isinstance(doc, dict) or "version" not in doc:
        raise corrupt("no version field")
    if doc["version"] not in (1, MANIFEST_VERSION) or type(doc["version"]) is not int:
        raise corrupt(f"unknown manifest version {doc['version']!r} (this filechannel reads version {MANIFEST_VERSION})")
    problem = _fields_problem(doc, {"version": int, "crc32c": int, "segment": dict}, "the manifest")
    if problem:
        raise corrupt(problem)
    body = doc["segment"]
    problem = _fields_problem(body, {**_BODY_FIELDS, "chunks": list}, "the segment")
    if problem:
        raise corrupt(problem)
    for i, chunk in enumerate(body["chunks"]):
        chunk_fields = _CHUNK_FIELDS if doc["version"] == 1 else _MERGED_CHUNK_FIELDS
        problem = _fields_problem(chunk, chunk_fields, f"chunk {i}")
        if problem:
            raise corrupt(problem)
    canonical = _canonical(body)
    if crc32c(canonical) != doc["crc32c"]:
        raise corrupt(f"CRC-32C mismatch (stored {doc['crc32c']}, computed {crc32c(canonical)})")
    chunks = tuple(ChunkRecord(c["name"], c["position"], c["length"], c.get("object_offset", 0)) for c in body["chunks"])
    fields = {key: body[key] for key in _BODY_FIELDS}
    segment = SegmentRecord(**fields, state=UPLOADED, chunks=chunks, manifest=None)
    if _envelope(canonical, doc["version"]) != data or (doc["version"] == 2) != _merged(segment):
        raise corrupt("not in canonical form")
    problem = segment_problem(segment)
    if problem:
        raise corrupt(problem)
    expected = manifest_name(segment.channel, segment.base_offset, segment.epoch)
    if name != expected:
        raise corrupt(f"it describes the segment whose manifest is {expected!r}")
    return SegmentRecord(**fields, state=UPLOADED, chunks=chunks, manifest=name)
