"""The source's and sink's options: parsed and checked on the driver, at ``load()``.

Names and meanings follow Spark's Kafka source (``KafkaSourceProvider``), so users need not
relearn them: one of ``subscribe``, ``subscribePattern`` or ``assign``; ``startingOffsets``,
``startingOffsetsByTimestamp`` and ``startingTimestamp`` (the last given wins in Kafka's order
of preference: global timestamp, then per-partition timestamps, then offsets), likewise for
the batch-only ending options; the offset combinations Kafka rejects are rejected here too,
with Kafka's meaning, so a query never returns zero rows quietly. ``kafka.*`` options mean
nothing without a broker: they are accepted and ignored, except those Kafka's source itself
refuses. Spark hands options over case-insensitively; we look them up lower-cased.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..client.topics import TopicStore
from ..engine.names import validate_name
from ..errors import ConfigError, UnknownTopicError

EARLIEST, LATEST = -2, -1  # Kafka's sentinels in JSON offsets
UPLOADED = -3  # endingOffsets "uploaded": each partition's uploaded end (never accepted in JSON offsets)
_SENTINELS = {"earliest": EARLIEST, "latest": LATEST, "uploaded": UPLOADED}

# {"topic": {"partition": offset}}: Spark checkpoints these as JSON, so partitions are strings.
Offsets = dict[str, dict[str, int]]

STRATEGIES = ("assign", "subscribe", "subscribepattern")
SOURCE_OPTIONS = {
    "root",
    *STRATEGIES,
    "startingoffsets",
    "startingoffsetsbytimestamp",
    "startingtimestamp",
    "startingoffsetsbytimestampstrategy",
    "endingoffsets",
    "endingoffsetsbytimestamp",
    "endingtimestamp",
    "latestoffset",
    "maxoffsetspertrigger",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "minpartitions",
    "maxrecordsperpartition",
    "failondataloss",
    "includeheaders",
    "groupid",
    "tierdirectreads",
}
# Options of Kafka's source about its consumers and the broker: nothing to tune here.
IGNORED_SOURCE_OPTIONS = {
    "groupidprefix",
    "kafkaconsumer.polltimeoutms",
    "fetchoffset.numretries",
    "fetchoffset.retryintervalms",
}
SINK_OPTIONS = {"root", "topic", "sinkid", "checkpointlocation", "path", "includeheaders"}

# kafka.* options Kafka's source refuses, with the reason it gives.
_REFUSED_KAFKA_SOURCE = {
    "kafka.auto.offset.reset": "set the source option startingOffsets to earliest or latest instead",
    "kafka.key.deserializer": "keys are always read as binary; deserialize them with DataFrame operations",
    "kafka.value.deserializer": "values are always read as binary; deserialize them with DataFrame operations",
    "kafka.enable.auto.commit": "the source commits no offsets itself (use option groupId)",
    "kafka.interceptor.classes": "interceptors could change the records",
}
REFUSED_KAFKA_SINK = {
    "kafka.key.serializer": "keys are written as they are (binary or string); serialize them with DataFrame operations",
    "kafka.value.serializer": "values are written as they are (binary or string); serialize them with DataFrame operations",
}

_TIME_UNITS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000  # Kafka's source: "15m"


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def require_root(opts: Mapping[str, str]) -> str:
    root = opts.get("root") or opts.get("path")
    if not root:
        raise ConfigError('option "root" is required: .option("root", "/path/to/filechannel/root")')
    return root


def refuse_kafka_options(opts: Mapping[str, str], refused: Mapping[str, str]) -> None:
    """Kafka options that Kafka's own source or sink refuses are refused here too, with its reason."""
    for name, why in refused.items():
        if name in opts:
            raise ConfigError(f'Kafka option "{name[len("kafka.") :]}" is not supported: {why}')


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


def parse_duration_ms(opts: Mapping[str, str], name: str, default: int) -> int:
    """A Spark time string ("15m", "30s", "500ms", "2h"; a bare number is milliseconds)."""
    raw = opts.get(name.lower())
    if raw is None:
        return default
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if not m or m.group(2) not in (*_TIME_UNITS, ""):
        raise ConfigError(f'option "{name}" must be a duration like 15m, 30s or 500ms, not {raw!r}')
    return int(int(m.group(1)) * _TIME_UNITS.get(m.group(2), 1))


def parse_timestamp(name: str, raw: str) -> int:
    try:
        ts = int(raw.strip())
    except ValueError:
        raise ConfigError(f'option "{name}": expected a single long value (milliseconds since the epoch), got {raw!r}') from None
    if ts < 0:
        raise ConfigError(f'option "{name}": a timestamp must be >= 0, not {ts}')
    return ts


@dataclass(frozen=True)
class Bound:
    """Where a query starts or ends, before it is resolved against the partitions.

    ``kind`` is ``"offsets"`` (``raw``: earliest, latest or JSON offsets), ``"timestamps"``
    (``raw``: JSON ``{"topic": {"partition": ms}}``) or ``"timestamp"`` (``raw``: one ms value
    for every partition). ``option`` is the option it came from, for messages.
    """

    kind: str
    raw: str
    option: str


def _bound(opts: Mapping[str, str], prefix: str, default: str) -> Bound:
    """Kafka's order of preference: the global timestamp, then per-partition timestamps, then offsets."""
    if f"{prefix}timestamp" in opts:
        return Bound("timestamp", opts[f"{prefix}timestamp"].strip(), f"{prefix}Timestamp")
    if f"{prefix}offsetsbytimestamp" in opts:
        return Bound("timestamps", opts[f"{prefix}offsetsbytimestamp"].strip(), f"{prefix}OffsetsByTimestamp")
    return Bound("offsets", opts.get(f"{prefix}offsets", default).strip(), f"{prefix}Offsets")


def _isolation(opts: Mapping[str, str]) -> str:
    """``kafka.isolation.level``, Kafka's consumer setting: read_uncommitted (the default) or read_committed."""
    level = opts.get("kafka.isolation.level", "read_uncommitted").strip().lower()
    if level not in ("read_uncommitted", "read_committed"):
        raise ConfigError(f'kafka.isolation.level must be "read_committed" or "read_uncommitted", not {level!r}')
    return level


@dataclass(frozen=True)
class SourceOptions:
    root: str
    strategy: str  # "subscribe", "subscribepattern" or "assign"
    topics: tuple[str, ...]  # subscribe: the topics; subscribePattern: the pattern; assign: the topics
    assigned: dict[str, tuple[int, ...]] | None  # assign: the partitions of each topic
    starting: Bound
    ending: Bound
    no_match_latest: bool  # startingOffsetsByTimestampStrategy=latest
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    min_partitions: int | None
    max_records_per_partition: int | None
    fail_on_data_loss: bool
    include_headers: bool
    group_id: str | None
    tier_direct_reads: bool = True  # offloaded ranges read by executors from tier-2 (spark/tier.py)
    # endingOffsets=uploaded (a batch) or latestOffset=uploaded (a stream): "latest" is each
    # partition's uploaded end, so every task reads tier-2 and none needs the root (spark/tier.py)
    uploaded_only: bool = False
    # kafka.isolation.level=read_committed: each "latest" is taken after the root's transactions
    # a dead producer committed and did not finish are applied (client/transaction_log.py)
    read_committed: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str], *, batch: bool | None) -> SourceOptions:
        """Check ``options``; a batch query starts at the earliest offsets by default, a stream at the latest.

        ``batch=None`` (what ``load()`` can check: pyspark does not say there whether the
        query is a batch or a stream) checks everything but what only one kind refuses.
        """
        opts = lower_keys(options)
        unknown = sorted(k for k in set(opts) - SOURCE_OPTIONS - IGNORED_SOURCE_OPTIONS - {"path"} if not k.startswith("kafka."))
        if unknown:
            raise ConfigError(f"unknown option(s) {', '.join(unknown)}; the source takes {', '.join(sorted(SOURCE_OPTIONS))}")
        refuse_kafka_options(opts, _REFUSED_KAFKA_SOURCE)
        root = require_root(opts)
        given = [s for s in STRATEGIES if s in opts]
        if not given:
            raise ConfigError(
                'option "subscribe" is required (a comma-separated list of topics), '
                'or "subscribePattern" (a regular expression) or "assign" (JSON like {"topic":[0,1]}) instead'
            )
        if len(given) > 1:
            raise ConfigError('only one of the options "assign", "subscribe" or "subscribePattern" can be given')
        strategy = given[0]
        value = opts[strategy].strip()
        assigned = None
        if strategy == "subscribe":
            topics = tuple(t.strip() for t in value.split(",") if t.strip())
            if not topics:
                raise ConfigError(f'no topics to subscribe to: option "subscribe" is {value!r}')
            for topic in topics:
                validate_name(topic, "topic")
        elif strategy == "subscribepattern":
            if not value:
                raise ConfigError('the pattern to subscribe to is empty: option "subscribePattern"')
            try:
                re.compile(value)
            except re.error as exc:
                raise ConfigError(f'option "subscribePattern" is not a regular expression: {value!r} ({exc})') from None
            topics = (value,)
        else:
            assigned = _parse_assign(value)
            topics = tuple(assigned)
        if strategy != "subscribepattern":
            store = TopicStore(root)
            for topic in topics:
                if store.read(topic) is None:
                    raise UnknownTopicError(
                        f"unknown topic {topic!r} under {root!r} (topics there: {', '.join(store.list()) or 'none'}); "
                        "create it first (filechannel topics create)"
                    )
                n = store.partitions(topic)
                if assigned is not None and assigned[topic][-1] >= n:
                    raise ConfigError(f'option "assign": topic {topic!r} has partitions 0 to {n - 1}, not {assigned[topic][-1]}')
        group_id = opts.get("groupid")
        if group_id is not None:
            validate_name(group_id, "groupId")
        strategy_name = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
        if strategy_name not in ("error", "latest"):
            raise ConfigError(f'option "startingOffsetsByTimestampStrategy" must be error or latest, not {strategy_name!r}')
        max_rows = parse_positive_int(opts, "maxOffsetsPerTrigger")
        min_rows = parse_positive_int(opts, "minOffsetsPerTrigger")
        if max_rows is not None and min_rows is not None and min_rows > max_rows:
            raise ConfigError(f"minOffsetsPerTrigger ({min_rows}) is higher than maxOffsetsPerTrigger ({max_rows})")
        if batch is False:
            for name in ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"):
                if name.lower() in opts:
                    raise ConfigError(
                        f'option "{name}" is not valid in streaming queries (a stream has no end); '
                        'option("latestOffset", "uploaded") makes each micro-batch end at the offsets uploaded to tier-2'
                    )
        latest = opts.get("latestoffset", "latest").strip().lower()
        if latest not in ("latest", "uploaded"):
            raise ConfigError(f'option "latestOffset" must be latest or uploaded, not {opts["latestoffset"]!r}')
        if batch and "latestoffset" in opts:
            raise ConfigError(
                'option "latestOffset" is for streams; a batch ends at the uploaded offsets with '
                'option("endingOffsets", "uploaded")'
            )
        ending = _bound(opts, "ending", "latest")
        if opts.get("startingoffsets", "").strip().lower() == "uploaded":
            raise ConfigError('startingOffsets cannot be "uploaded": it is an end (endingOffsets, or latestOffset for a stream)')
        parsed = cls(
            root=root,
            strategy=strategy,
            topics=topics,
            assigned=assigned,
            starting=_bound(opts, "starting", "latest" if batch is False else "earliest"),
            ending=ending,
            no_match_latest=strategy_name == "latest",
            max_offsets_per_trigger=max_rows,
            min_offsets_per_trigger=min_rows,
            max_trigger_delay_ms=parse_duration_ms(opts, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
            min_partitions=parse_positive_int(opts, "minPartitions"),
            max_records_per_partition=parse_positive_int(opts, "maxRecordsPerPartition"),
            fail_on_data_loss=parse_bool(opts, "failOnDataLoss", True),
            include_headers=parse_bool(opts, "includeHeaders", False),
            group_id=group_id,
            tier_direct_reads=parse_bool(opts, "tierDirectReads", True),
            uploaded_only=latest == "uploaded" or (ending.kind == "offsets" and ending.raw.lower() == "uploaded"),
            read_committed=_isolation(opts) == "read_committed",
        )
        parsed.check_bounds(batch)
        return parsed

    def partitions(self) -> dict[str, list[int]]:
        """The partitions read, as the topics are now: a pattern picks up topics created since."""
        store = TopicStore(self.root)
        if self.strategy == "assign":
            assert self.assigned is not None
            return {t: list(ps) for t, ps in self.assigned.items()}
        if self.strategy == "subscribe":
            names = list(self.topics)
        else:
            # Kafka matches a pattern against the whole topic name.
            pattern = re.compile(self.topics[0])
            names = [t for t in store.list() if pattern.fullmatch(t)]
        return {t: list(range(store.partitions(t))) for t in names}

    def check_bounds(self, batch: bool | None) -> None:
        """Reject now what Kafka's source rejects when the query is created."""
        parts = self.partitions()
        start = self.spec(self.starting, parts)
        end = self.spec(self.ending, parts)
        if batch:
            if self.starting.kind == "offsets" and self.starting.raw.lower() == "latest":
                raise ConfigError('startingOffsets cannot be "latest" for batch queries: they would read nothing')
            if self.ending.kind == "offsets" and self.ending.raw.lower() == "earliest":
                raise ConfigError('endingOffsets cannot be "earliest" for batch queries: they would read nothing')
            for topic, offsets in start.items():
                for p, off in offsets.items():
                    if self.starting.kind == "offsets" and off == LATEST:
                        raise ConfigError(f"startingOffsets for {topic}[{p}] cannot be latest (-1) for batch queries")
                    stop = end.get(topic, {}).get(p)
                    if self.ending.kind == "offsets" and stop == EARLIEST:
                        raise ConfigError(f"endingOffsets for {topic}[{p}] cannot be earliest (-2) for batch queries")
                    if self.starting.kind == self.ending.kind and stop is not None and off >= 0 and stop >= 0 and off > stop:
                        what = "offset" if self.starting.kind == "offsets" else "timestamp"
                        raise ConfigError(
                            f"the starting {what} of {topic}[{p}] ({off}) is after its ending {what} ({stop}): "
                            "the query would read nothing"
                        )

    def spec(self, bound: Bound, parts: dict[str, list[int]] | None = None) -> dict[str, dict[str, int]]:
        """``bound`` as {topic: {partition: offset, EARLIEST/LATEST, or timestamp}} covering every partition."""
        parts = self.partitions() if parts is None else parts
        name = bound.option
        if bound.kind == "timestamp":
            ts = parse_timestamp(name, bound.raw)
            return {t: {str(p): ts for p in ps} for t, ps in parts.items()}
        if bound.kind == "offsets" and bound.raw.lower() in _SENTINELS:
            sentinel = _SENTINELS[bound.raw.lower()]
            return {t: {str(p): sentinel for p in ps} for t, ps in parts.items()}
        example = '{"topic":{"0":23}}' if bound.kind == "offsets" else '{"topic":{"0":1700000000000}}'
        try:
            given = json.loads(bound.raw)
        except ValueError as exc:
            words = "earliest, latest nor JSON" if name == "startingOffsets" else "earliest, latest, uploaded nor JSON"
            lead = f"neither {words}" if bound.kind == "offsets" else "not JSON"
            raise ConfigError(f'option "{name}" is {lead} like {example}: {bound.raw!r} ({exc})') from None
        if not isinstance(given, dict) or not all(isinstance(v, dict) for v in given.values()):
            raise ConfigError(f'option "{name}" must be a JSON object of objects like {example}, not {bound.raw!r}')
        out: dict[str, dict[str, int]] = {}
        for topic, ps in parts.items():
            values = given.get(topic)
            if values is None:
                raise ConfigError(f'option "{name}" has no entry for topic {topic!r}: {bound.raw}')
            want = {str(p) for p in ps}
            if set(values) != want:
                raise ConfigError(
                    f'option "{name}" must give every partition of {topic!r} ({", ".join(sorted(want, key=int))}), '
                    f"got {', '.join(sorted(values)) or 'none'}"
                )
            low = EARLIEST if bound.kind == "offsets" else 0
            for p, off in values.items():
                if isinstance(off, bool) or not isinstance(off, int) or off < low:
                    raise ConfigError(f'option "{name}": the value of {topic}[{p}] must be an integer >= {low}, not {off!r}')
            out[topic] = {p: int(off) for p, off in values.items()}
        extra = set(given) - set(parts)
        if extra:
            raise ConfigError(f'option "{name}" names topics that are not read: {", ".join(sorted(extra))}')
        return out


def _parse_assign(value: str) -> dict[str, tuple[int, ...]]:
    """``{"topicA":[0,1],"topicB":[2,4]}``, as Kafka's source takes it."""
    if not value.startswith("{"):
        raise ConfigError(f'no partitions to assign: option "assign" must be JSON like {{"topic":[0,1]}}, not {value!r}')
    try:
        given = json.loads(value)
    except ValueError as exc:
        raise ConfigError(f'option "assign" is not JSON like {{"topic":[0,1]}}: {value!r} ({exc})') from None
    if not isinstance(given, dict) or not given:
        raise ConfigError(f'option "assign" must name at least one topic, like {{"topic":[0,1]}}, not {value!r}')
    out = {}
    for topic, ps in given.items():
        validate_name(topic, "topic")
        if not isinstance(ps, list) or not ps or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in ps):
            raise ConfigError(f'option "assign": the partitions of {topic!r} must be a list of integers >= 0, not {ps!r}')
        out[topic] = tuple(sorted(set(ps)))
    return out
