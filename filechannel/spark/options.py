"""The source's and sink's options: parsed and checked on the driver, at ``load()``.

Names and meanings follow Spark's Kafka source (``KafkaSourceProvider``), so users need not
relearn them: one of ``subscribe``, ``subscribePattern`` or ``assign``; ``startingOffsets``,
``startingOffsetsByTimestamp`` and ``startingTimestamp`` (the last given wins in Kafka's order
of preference: global timestamp, then per-partition timestamps, then offsets), likewise for
the batch-only ending options; the offset combinations Kafka rejects are rejected here too,
with Kafka's meaning, so a query never returns zero rows quietly. ``kafka.*`` options mean
nothing without a broker: they are accepted and ignored, except those Kafka's source itself
refuses. Spark hands options over case-insensitively; we look them up lower-cased.

A query reads a root (``root``) or a tier URL alone (``tier``, with ``tierOptions`` and
``origins``: spark/bucket.py), never both; a tier query names its partitions
``<origin>.<topic>`` in offsets, as the bucket Consumer does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..client.topics import TopicStore
from ..config import credential_names
from ..engine.names import validate_name
from ..errors import ConfigError, UnknownTopicError
from ..root import validate_origin
from .bucket import BucketCatalog

EARLIEST, LATEST = -2, -1  # Kafka's sentinels in JSON offsets
UPLOADED = -3  # endingOffsets "uploaded": each partition's uploaded end (never accepted in JSON offsets)
_SENTINELS = {"earliest": EARLIEST, "latest": LATEST, "uploaded": UPLOADED}

# {"topic": {"partition": offset}}: Spark checkpoints these as JSON, so partitions are strings.
Offsets = dict[str, dict[str, int]]

STRATEGIES = ("assign", "subscribe", "subscribepattern")
SOURCE_OPTIONS = {
    "root",
    "tier",
    "tieroptions",
    "origins",
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

# kafka.metadata.max.age.ms: with option tier, how often the bucket's origins and topics are
# listed again (a stream picks up new ones); the bucket Consumer's default.
METADATA_MAX_AGE = "kafka.metadata.max.age.ms"
DEFAULT_METADATA_MAX_AGE_MS = 1000
_GLOB = re.compile(r"[A-Za-z0-9_\-*?\[\]!]{1,100}")

_TIME_UNITS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000  # Kafka's source: "15m"


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def require_root(opts: Mapping[str, str]) -> str:
    root = opts.get("root") or opts.get("path")
    if not root:
        raise ConfigError('option "root" is required: .option("root", "/path/to/filechannel/root")')
    return root


def _location(opts: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(root, tier): exactly one of the options ``root`` (or a path given to ``load``) and ``tier``."""
    root, tier = opts.get("root") or opts.get("path"), opts.get("tier")
    if root and tier:
        raise ConfigError('give option "root" (a folder of topics) or "tier" (a tier URL read alone, nothing mounted), not both')
    if tier is not None:
        tier = tier.strip()
        if "://" not in tier:
            raise ConfigError(f'option "tier" must be a storage URL (s3://bucket/prefix, file:///path...), not {tier!r}')
        return None, tier
    if not root:
        raise ConfigError(
            'option "root" is required: .option("root", "/path/to/filechannel/root"), or option "tier" to read '
            'what roots uploaded to a tier URL with nothing mounted: .option("tier", "s3://bucket/prefix")'
        )
    return root, None


def _tier_options(opts: Mapping[str, str]) -> dict[str, Any]:
    """``tierOptions``: a JSON object of non-secret storage options, like a topic's ``tier_options``."""
    raw = opts.get("tieroptions")
    if raw is None:
        return {}
    try:
        given = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f'option "tierOptions" is not JSON like {{"endpoint_url": "http://s3:8333"}} ({exc})') from None
    if not isinstance(given, dict):
        raise ConfigError('option "tierOptions" must be a JSON object like {"endpoint_url": "http://s3:8333"}')
    secret = credential_names(given)
    if secret:  # (no value is repeated in a message: it may be one)
        raise ConfigError(
            f'option "tierOptions" must not hold credentials ({", ".join(secret)}): the options of Spark reach its plans and '
            "logs; give them through the environment of the driver and the executors (AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY; spark.executorEnv.*) or boto3's credential chain"
        )
    return given


def _origins(opts: Mapping[str, str]) -> tuple[str, ...] | None:
    """``origins``: a comma-separated list of origin names or globs (``edge-*``); None: every origin."""
    raw = opts.get("origins")
    if raw is None:
        return None
    out = tuple(o.strip() for o in raw.split(",") if o.strip())
    if not out:
        raise ConfigError(f'option "origins" names no origin: {raw!r} (leave it out to read every origin)')
    for o in out:
        if not any(c in o for c in "*?["):
            validate_origin(o)  # a name: says what a name may be
        elif not _GLOB.fullmatch(o):
            raise ConfigError(
                f'option "origins": {o!r} is not a glob of origin names (names are 1 to 100 of [A-Za-z0-9_-]; '
                "a glob adds *, ?, [...], like edge-*)"
            )
    return out


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
    root: str | None  # None: a query of the tier URL ``tier`` alone
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
    tier: str | None = None  # option tier: the URL read alone (spark/bucket.py), instead of root
    tier_options: dict[str, Any] = field(default_factory=dict)  # option tierOptions: non-secret storage options
    origins: tuple[str, ...] | None = None  # option origins: names or globs; None: every origin
    metadata_max_age_ms: int = DEFAULT_METADATA_MAX_AGE_MS  # with tier: how often origins and topics are listed

    def catalog(self) -> BucketCatalog:
        """A new view of the tier URL (a query of ``tier``); close it when done."""
        assert self.tier is not None
        return BucketCatalog(self.tier, self.tier_options, self.origins, max_age_s=self.metadata_max_age_ms / 1000)

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
        root, tier = _location(opts)
        if tier is None:
            for name in ("tierOptions", "origins"):
                if name.lower() in opts:
                    raise ConfigError(f'option "{name}" goes with option "tier" (a tier URL read alone), not with "root"')
        else:
            if "groupid" in opts:
                raise ConfigError(
                    'option "groupId" advances a consumer group of a root (so its garbage collection frees what Spark '
                    'read); a query of option "tier" reads a bucket, which has none: leave it out'
                )
            if not parse_bool(opts, "tierDirectReads", True):
                raise ConfigError('option "tierDirectReads" cannot be false with option "tier": no channel to read through')
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
        if strategy != "subscribepattern" and root is not None:
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
            # (a query of a tier URL always ends at the uploaded end: its channels hold nothing else)
            uploaded_only=root is not None and (latest == "uploaded" or ending.raw.lower() == "uploaded"),
            read_committed=_isolation(opts) == "read_committed",
            tier=tier,
            tier_options=_tier_options(opts) if tier is not None else {},
            origins=_origins(opts),
            metadata_max_age_ms=parse_positive_int(opts, METADATA_MAX_AGE) or DEFAULT_METADATA_MAX_AGE_MS,
        )
        if tier is None:
            parsed.check_bounds(batch, None)
            return parsed
        with parsed.catalog() as catalog:  # the bucket is reached here: a wrong URL fails at load()
            if batch:
                name = {"subscribepattern": "subscribePattern"}.get(strategy, strategy)
                catalog.require_topics(name, value, parsed.partitions(catalog))
            parsed.check_bounds(batch, catalog)
        return parsed

    def partitions(self, catalog: BucketCatalog | None = None) -> dict[str, list[int]]:
        """The partitions read, as the topics are now: a pattern picks up topics created since.

        A query of a tier URL (``catalog``, required then) reads them in each origin it matches,
        keyed by the reader's name ``<origin>.<topic>``."""
        if self.tier is not None:
            assert catalog is not None
            return self._bucket_partitions(catalog)
        assert self.root is not None
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

    def _bucket_partitions(self, catalog: BucketCatalog) -> dict[str, list[int]]:
        """:meth:`partitions` of a tier URL: the strategy matched against each origin's plain topic names."""
        pattern = re.compile(self.topics[0]) if self.strategy == "subscribepattern" else None
        out = {}
        for name, entry in sorted(catalog.topics().items()):
            if pattern is not None and pattern.fullmatch(entry.topic):
                out[name] = list(range(entry.partitions))
            elif self.assigned is not None and entry.topic in self.assigned:
                out[name] = [p for p in self.assigned[entry.topic] if p < entry.partitions]
            elif self.strategy == "subscribe" and entry.topic in self.topics:
                out[name] = list(range(entry.partitions))
        return {name: ps for name, ps in out.items() if ps}

    def check_bounds(self, batch: bool | None, catalog: BucketCatalog | None) -> None:
        """Reject now what Kafka's source rejects when the query is created."""
        parts = self.partitions(catalog)
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

    def spec(self, bound: Bound, parts: dict[str, list[int]]) -> dict[str, dict[str, int]]:
        """``bound`` as {topic: {partition: offset, EARLIEST/LATEST, or timestamp}} covering every
        partition of ``parts`` (:meth:`partitions`)."""
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
