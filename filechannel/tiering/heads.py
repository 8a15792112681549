"""A channel's head in tier-2: one small object saying which offsets its uploaded history spans.

``<channel>/head.json``, canonical ASCII JSON ``{"crc32c":N,"head":BODY,"version":1}``, BODY
``{"channel","end_offset","epoch","first_offset","updated_at_ms"}`` and N the CRC-32C of
BODY's bytes (any damaged byte is refused, as for manifests).

Invariants:

- The head is written by the uploader after each change of the channel's uploaded range
  is committed (uploads, retention, a purge): ``[first_offset, end_offset)`` is then what
  the manifests of the bucket describe. A crash before the write leaves the head behind
  the index, never ahead of the bucket; the next pass writes it again.
- It is a generation marker, not the truth: the manifests are. A reader compares it with
  the local index in one GET (:mod:`.reindex`); an index behind it (lost, restored from an
  old copy, replaced) is brought up to the bucket from the manifests. The head is never
  the only reason a record is readable or deletable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..engine.checksum import crc32c
from ..engine.clock import now_ms
from ..errors import CorruptRecordError
from .layout import validate_channel
from .storage import ChunkStorage

HEAD_FILE = "head.json"
HEAD_VERSION = 1


def head_name(channel: str) -> str:
    """The head object of ``channel``: ``<channel>/head.json`` (never parsed as a chunk or manifest)."""
    return f"{validate_channel(channel)}/{HEAD_FILE}"


@dataclass(frozen=True)
class ChannelHead:
    """Uploaded offsets ``[first_offset, end_offset)`` of ``channel`` (equal when nothing is), as of ``epoch``."""

    channel: str
    first_offset: int
    end_offset: int
    epoch: int
    updated_at_ms: int = 0

    def encode(self) -> bytes:
        body = json.dumps(
            {
                "channel": self.channel,
                "end_offset": self.end_offset,
                "epoch": self.epoch,
                "first_offset": self.first_offset,
                "updated_at_ms": self.updated_at_ms or now_ms(),
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode("ascii")
        return b'{"crc32c":%d,"head":%s,"version":%d}' % (crc32c(body), body, HEAD_VERSION)


def decode_head(data: bytes, name: str) -> ChannelHead:
    """The head an object holds; :class:`CorruptRecordError` naming it if damaged."""
    try:
        doc = json.loads(data.decode("ascii"))
        body = doc["head"]
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")
        if doc["version"] != HEAD_VERSION or crc32c(canonical) != doc["crc32c"]:
            raise ValueError("version or CRC-32C mismatch")
        head = ChannelHead(
            str(body["channel"]),
            int(body["first_offset"]),
            int(body["end_offset"]),
            int(body["epoch"]),
            int(body["updated_at_ms"]),
        )
        if not 0 <= head.first_offset <= head.end_offset or name != head_name(head.channel):
            raise ValueError("offsets out of order or another channel's head")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptRecordError(f"channel head {name!r} is damaged ({exc}); the next daemon pass writes it again") from None
    return head


def read_head(storage: ChunkStorage, channel: str) -> ChannelHead | None:
    """The head of ``channel``, or None if it has none (nothing uploaded, or a bucket from before heads)."""
    name = head_name(channel)
    try:
        data = storage.read(name, 0, 1 << 16)
    except FileNotFoundError:
        return None
    return decode_head(data, name)


def write_head(storage: ChunkStorage, head: ChannelHead) -> None:
    """Replace the head of its channel (an atomic write)."""
    storage.write(head_name(head.channel), head.encode())
