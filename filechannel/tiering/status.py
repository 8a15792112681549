"""What ``filechannel tier status`` shows: per tiered partition, its local segments, what is in
tier-2 and what waits (:func:`tier_status`), with the last failure the daemon wrote in its
status file (``ROOT/.tier/status.json``, :func:`write_status`, after each pass).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from ..engine import retention
from ..engine.clock import now_ms
from ..engine.files import read_if_exists, write_atomically
from ..engine.log import Log
from ..root import ROOT_METADATA, ROOT_TIER_DIR
from .layout import LOST, UPLOADED
from .metadata import TierMetadata
from .partitions import tiered_partitions

STATUS_FILE = "status.json"


def write_status(tier_dir: str, epoch: int, owner: str, last_errors: dict[str, str]) -> None:
    """The daemon's status file after a pass: its epoch and owner, and each partition's last failure."""
    status: dict[str, Any] = {"epoch": epoch, "owner": owner, "at_ms": now_ms()}
    status["last_errors"] = dict(last_errors)
    write_atomically(os.path.join(tier_dir, STATUS_FILE), json.dumps(status, sort_keys=True).encode())


@dataclass(frozen=True)
class PartitionStatus:
    """What ``filechannel tier status`` shows for one partition."""

    partition: str
    local_segments: int
    local_bytes: int
    local_first_offset: int
    local_end_offset: int
    uploaded_segments: int
    tier_objects: int
    tier_bytes: int
    tier_first_offset: int | None
    tier_end_offset: int | None
    waiting_segments: int
    waiting_bytes: int
    active_offsets: int
    upload_lag_offsets: int
    last_error: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tier_status(root: str | os.PathLike[str]) -> list[PartitionStatus]:
    """Per tiered partition of ``root``: local segments and bytes, what is in tier-2, what waits.

    Reads only (the metadata store, the folders and the daemon's last status file); works
    while a daemon runs, and when none does (then ``last_error`` is the last daemon's).
    Offsets are ``[first, end)`` ranges: local, and in tier-2 (None when nothing is uploaded).
    ``waiting`` counts sealed local segments not uploaded yet; ``active_offsets`` the records
    of the active segment, which no daemon uploads before it is sealed (at ``segment_bytes``,
    or by a send once it is ``segment_ms`` old); ``upload_lag_offsets`` is every local offset
    not in tier-2 yet, the active segment's included.
    """
    root = os.path.abspath(os.fspath(root))
    tier_dir = os.path.join(root, ROOT_TIER_DIR)
    raw = read_if_exists(os.path.join(tier_dir, STATUS_FILE), "tier status")
    errors: dict[str, str] = {}
    if raw is not None:
        try:
            errors = dict(json.loads(raw).get("last_errors", {}))
        except (ValueError, AttributeError, TypeError):
            errors = {}
    partitions = tiered_partitions(root)
    if not partitions:
        return []
    result = []
    path = os.path.join(root, ROOT_METADATA)
    metadata = TierMetadata(path) if os.path.exists(path) else None  # no daemon ran yet: nothing uploaded
    try:
        for part in partitions:
            log_ = Log(part.path, part.config)
            try:
                refs = log_.list_segments()
                sizes = [retention.segment_bytes_on_disk(r) for r in refs]
                end = log_.end_offset() if refs else 0
            finally:
                log_.close()
            # aggregates in SQLite, and the rows the local segments overlap: no list of the whole history
            summary = metadata.summary(part.name) if metadata is not None else []
            uploaded = summary[0].segments[UPLOADED] + summary[0].segments[LOST] if summary else 0
            tier_bytes = summary[0].bytes[UPLOADED] + summary[0].bytes[LOST] if summary else 0
            overlapped = metadata.segments(part.name, from_offset=refs[0].base_offset) if metadata is not None and refs else []
            bases = {r.base_offset for r in overlapped}
            ends = [r.base_offset for r in refs[1:]]
            waiting = [(i, r) for i, r in enumerate(refs[:-1]) if r.base_offset not in bases and ends[i] != r.base_offset]
            active = end - refs[-1].base_offset if refs else 0
            result.append(
                PartitionStatus(
                    part.name,
                    len(refs),
                    sum(sizes),
                    refs[0].base_offset if refs else end,
                    end,
                    uploaded,
                    metadata.object_count(part.name) if metadata is not None else 0,
                    tier_bytes,
                    summary[0].first_offset if summary else None,
                    summary[0].end_offset if summary else None,
                    len(waiting),
                    sum(sizes[i] for i, _ in waiting),
                    active,
                    sum(ends[i] - r.base_offset for i, r in waiting) + active,
                    errors.get(part.name),
                )
            )
    finally:
        if metadata is not None:
            metadata.close()
    return result
