"""Names that become paths: validation, and the file names of a channel's parts.

A channel folder holds, for a segment with base offset B (zero-padded to 20
digits so a directory listing sorts by offset):

    B.seg      the segment's frames (the last one is the active segment)
    B.seg.z    the same segment once sealed and compressed (replaces B.seg)
    B.idx      sparse offset index of B.seg (derived data)
    B.tix      sparse time index of B.seg (derived data)

and ``writer.lock``, ``maintenance.lock``, ``recovery-point``, ``log-start`` (once
``delete_records`` ran) and ``positions/``.
"""

from __future__ import annotations

import re

from ..errors import InvalidNameError

_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")

SEGMENT_SUFFIX = ".seg"
COMPRESSED_SUFFIX = ".seg.z"
OFFSET_INDEX_SUFFIX = ".idx"
TIME_INDEX_SUFFIX = ".tix"
TEMP_SUFFIX = ".tmp"
_DIGITS = 20


def validate_name(name: object, what: str = "name") -> str:
    """Return ``name`` if it is safe as one path component, else raise :class:`InvalidNameError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidNameError(f"{what} {name!r} is not allowed: use 1 to 200 characters of [A-Za-z0-9._-], not '.' or '..'")
    return name


def segment_stem(base_offset: int) -> str:
    """The zero-padded base offset that names every file of one segment."""
    return f"{base_offset:0{_DIGITS}d}"


def parse_segment_file(filename: str) -> tuple[int, str] | None:
    """Split ``B.seg`` / ``B.seg.z`` / ``B.idx`` / ``B.tix`` into ``(B, suffix)``; None for other files."""
    stem, dot, _ = filename.partition(".")
    if len(stem) != _DIGITS or not stem.isdigit() or not dot:
        return None
    suffix = filename[_DIGITS:]
    if suffix not in (SEGMENT_SUFFIX, COMPRESSED_SUFFIX, OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        return None
    return int(stem), suffix
