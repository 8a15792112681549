"""The source's and sink's options: parsed and checked on the driver, before a query starts.

Names follow Spark's Kafka source (``subscribe``, ``startingOffsets``, ``endingOffsets``,
``maxOffsetsPerTrigger``, ``minPartitions``, ``failOnDataLoss``), so users need not relearn
them. Spark hands options over case-insensitively; we look them up lower-cased.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ..client.topics import TopicStore
from ..errors import ConfigError, UnknownTopicError
from ..names import validate_name

EARLIEST, LATEST = -2, -1  # Kafka's sentinels in JSON offsets

# {"topic": {"partition": offset}}: Spark checkpoints these as JSON, so partitions are strings.
Offsets = dict[str, dict[str, int]]

SOURCE_OPTIONS = {
    "root",
    "subscribe",
    "startingoffsets",
    "endingoffsets",
    "maxoffsetspertrigger",
    "minpartitions",
    "failondataloss",
    "groupid",
}
SINK_OPTIONS = {"root", "topic", "sinkid", "checkpointlocation", "path"}


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def require_root(opts: Mapping[str, str]) -> str:
    root = opts.get("root") or opts.get("path")
    if not root:
        raise ConfigError('option "root" is required: .option("root", "/path/to/filechannel/root")')
    return root


def parse_bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise ConfigError(f'option "{name}" must be true or false, not {raw!r}')


def parse_positive_int(opts: Mapping[str, str], name: str) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f'option "{name}" must be a positive integer, not {raw!r}')
    return value


@dataclass(frozen=True)
class SourceOptions:
    root: str
    partitions: dict[str, int]  # subscribed topic -> number of partitions
    starting: str  # "earliest", "latest" or JSON offsets
    ending: str
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    group_id: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, batch: bool) -> SourceOptions:
        """Check ``options``; a batch query starts at the earliest offsets by default, a stream at the latest."""
        opts = lower_keys(options)
        unknown = sorted(set(opts) - SOURCE_OPTIONS - {"path"})
        if unknown:
            raise ConfigError(f"unknown option(s) {', '.join(unknown)}; the source takes {', '.join(sorted(SOURCE_OPTIONS))}")
        root = require_root(opts)
        topics = [t.strip() for t in opts.get("subscribe", "").split(",") if t.strip()]
        if not topics:
            raise ConfigError('option "subscribe" is required: a comma-separated list of topics')
        store = TopicStore(root)
        partitions = {}
        for topic in topics:
            validate_name(topic, "topic")
            if store.read(topic) is None:
                raise UnknownTopicError(
                    f"unknown topic {topic!r} under {root!r} (topics there: {', '.join(store.list()) or 'none'}); "
                    "create it first (filechannel topics create)"
                )
            partitions[topic] = store.partitions(topic)
        group_id = opts.get("groupid")
        if group_id is not None:
            validate_name(group_id, "groupId")
        parsed = cls(
            root=root,
            partitions=partitions,
            starting=opts.get("startingoffsets", "earliest" if batch else "latest").strip(),
            ending=opts.get("endingoffsets", "latest").strip(),
            max_offsets_per_trigger=parse_positive_int(opts, "maxOffsetsPerTrigger"),
            min_partitions=parse_positive_int(opts, "minPartitions"),
            fail_on_data_loss=parse_bool(opts, "failOnDataLoss", True),
            group_id=group_id,
        )
        parsed.spec("startingOffsets", parsed.starting)  # fail on a malformed value now
        parsed.spec("endingOffsets", parsed.ending)
        return parsed

    def spec(self, name: str, raw: str) -> dict[str, dict[str, int]]:
        """``raw`` as {topic: {partition: offset or EARLIEST/LATEST}} covering every partition."""
        if raw.lower() in ("earliest", "latest"):
            sentinel = EARLIEST if raw.lower() == "earliest" else LATEST
            return {t: {str(p): sentinel for p in range(n)} for t, n in self.partitions.items()}
        try:
            given = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(
                f'option "{name}" is neither earliest, latest nor JSON like {{"topic":{{"0":23}}}}: {raw!r} ({exc})'
            ) from None
        if not isinstance(given, dict) or not all(isinstance(v, dict) for v in given.values()):
            raise ConfigError(f'option "{name}" must be a JSON object of objects like {{"topic":{{"0":23}}}}, not {raw!r}')
        out: dict[str, dict[str, int]] = {}
        for topic, n in self.partitions.items():
            offsets = given.get(topic)
            if offsets is None:
                raise ConfigError(f'option "{name}" has no offsets for subscribed topic {topic!r}: {raw}')
            want = {str(p) for p in range(n)}
            if set(offsets) != want:
                raise ConfigError(
                    f'option "{name}" must give every partition of {topic!r} ({", ".join(sorted(want, key=int))}), '
                    f"got {', '.join(sorted(offsets)) or 'none'}"
                )
            for p, off in offsets.items():
                if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                    raise ConfigError(f'option "{name}": offset of {topic}[{p}] must be an integer >= -2, not {off!r}')
            out[topic] = {p: int(off) for p, off in offsets.items()}
        extra = set(given) - set(self.partitions)
        if extra:
            raise ConfigError(f'option "{name}" names topics that are not subscribed: {", ".join(sorted(extra))}')
        return out
