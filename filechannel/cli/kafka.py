"""What the ``filechannel`` command takes from Kafka's console tools, kept out of ``cli.py``.

- Kafka's dotted topic configs (``retention.ms``, ``segment.bytes``, ...) as topic settings
  (the mapping is the client's, :mod:`filechannel.client.topic_configs`; a bad one exits 2 here).
- The console consumer's ``--property`` names (``print.key``, ``key.separator``, ...): how a
  record is printed; the console producer's (``parse.key``, ``key.separator``, ``ignore.error``).
- ``kafka-consumer-groups --reset-offsets``: its scenarios, its clamping to the log's range.
  The group operations themselves (delete a group or its offsets, which members live) are
  :mod:`filechannel.client.group`'s, refused while the group has a live member, as Kafka
  refuses them for a group that is not empty.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from ..client import Admin, Consumer, TopicPartition
from ..client.group import read_group
from ..client.topic_configs import topic_setting as client_topic_setting
from ..client.topics import TopicStore
from ..errors import ConfigError
from .common import BadValue, iso_time_ms, key_value


def topic_setting(key: str, raw: str) -> tuple[str, Any] | None:
    """``KEY=VALUE`` of ``topics create --config`` / ``configs --add-config`` as our setting, with
    Kafka's dotted names mapped (:mod:`filechannel.client.topic_configs`); None if ignored. An
    underscore name is ours, its value read by :func:`plain_value`. A bad one exits 2."""
    try:
        return client_topic_setting(key, raw if "." in key else plain_value(raw))
    except ConfigError as exc:
        raise BadValue(str(exc)) from None


def tier_options(items: Iterable[str]) -> dict[str, Any]:
    """``--tier-option KEY=VALUE`` items as a storage's options (each value read by :func:`plain_value`)."""
    return {key: plain_value(value) for key, value in (key_value(item, "--tier-option") for item in items)}


def plain_value(text: str) -> Any:
    """``null``, an int, a float, a JSON object or list (``tier_options={"endpoint_url": ...}``), else the text."""
    if text.lower() == "null":
        return None
    if text.startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise BadValue(f"{text!r} is not valid JSON ({exc})") from None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


_Value = TypeVar("_Value", str, str | None)  # a tool's properties: all with a default, or some without


def parse_properties(items: Iterable[str], known: Mapping[str, _Value], tool: str) -> dict[str, _Value]:
    """``--property NAME=VALUE`` items, each a name in ``known`` (its default is the value there)."""
    props = dict(known)
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise BadValue(f"--property {item!r} is not NAME=VALUE")
        if name not in known:
            raise BadValue(f"unknown --property {name!r} for {tool}; known: {', '.join(sorted(known))}")
        props[name] = value
    return props


# Kafka's DefaultMessageFormatter properties and defaults.
CONSUMER_PROPERTIES = {
    "print.timestamp": "false",
    "print.key": "false",
    "print.offset": "false",
    "print.partition": "false",
    "print.headers": "false",
    "print.value": "true",
    "key.separator": "\t",
    "line.separator": "\n",
    "headers.separator": ",",
    "headers.key.separator": ":",
    "null.literal": "null",
}
# Kafka's LineMessageReader properties and defaults (null.marker: none unless set).
PRODUCER_PROPERTIES: dict[str, str | None] = {
    "parse.key": "false",
    "key.separator": "\t",
    "parse.headers": "false",
    "headers.delimiter": "\t",
    "headers.separator": ",",
    "headers.key.separator": ":",
    "ignore.error": "false",
    "null.marker": None,
}


# What the console tools set themselves: a --producer-property / --consumer-property may not.
CONSOLE_OWNED = {
    "key_serializer": "the console sends the bytes of each line",
    "value_serializer": "the console sends the bytes of each line",
    "partitioner": "records without --partition go by their key's murmur2 hash",
    "group_id": "use --group",
    "auto_offset_reset": "use --from-beginning, --offset or --from",
    "enable_auto_commit": "with --group, consume commits what it printed",
    "key_deserializer": "the console prints bytes",
    "value_deserializer": "the console prints bytes",
}


def client_properties(items: Iterable[str], flag: str) -> dict[str, Any]:
    """``--producer-property`` / ``--consumer-property`` items, Kafka's dotted names (``linger.ms=5``)
    as the client's kafka-python names (``linger_ms=5``); whole numbers become ints and
    true/false bools. Which names exist is the client's check (a ConfigError naming the closest)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise BadValue(f"{flag} {item!r} is not NAME=VALUE")
        key = name.strip().replace(".", "_")
        if key in CONSOLE_OWNED:
            raise BadValue(f"{flag} {name.strip()}: {CONSOLE_OWNED[key]}")
        value: Any = raw.strip()
        if re.fullmatch(r"-?[0-9]+", value):
            value = int(value)
        elif value.lower() in ("true", "false"):
            value = value.lower() == "true"
        out[key] = value
    return out


def is_true(props: Mapping[str, str | None], name: str) -> bool:
    value = (props[name] or "").strip().lower()
    if value not in ("true", "false"):
        raise BadValue(f"--property {name} must be true or false, not {props[name]!r}")
    return value == "true"


class LineFormatError(ValueError):
    """A line of ``produce``'s input that does not have the layout its properties say."""


class LineReader:
    """A line of input as Kafka's console producer reads it (LineMessageReader):
    ``[HEADERS<headers.delimiter>][KEY<key.separator>]VALUE``, the headers
    ``name<headers.key.separator>value`` pairs split at ``headers.separator`` (a regular
    expression, as Kafka's); an empty headers field is no headers. A key or value equal to
    ``null.marker`` is absent (a tombstone, for the value). With ``ignore.error``, a missing
    delimiter means no headers or no key, and a pair without its separator is a header with
    an empty value (Kafka's is null; a header value here is always bytes).

    Lines are bytes: separators are the bytes of their arguments, header names are UTF-8.
    """

    def __init__(self, props: dict[str, str | None], key_separator: str | None = None) -> None:
        self.parse_key = key_separator is not None or is_true(props, "parse.key")
        self.parse_headers = is_true(props, "parse.headers")
        self.ignore_error = is_true(props, "ignore.error")
        seps = {
            name: props[name] or ""
            for name in ("key.separator", "headers.delimiter", "headers.separator", "headers.key.separator")
        }
        if key_separator is not None:
            seps["key.separator"] = key_separator
        marker = props["null.marker"]
        for a, b in (
            ("headers.delimiter", "headers.separator"),
            ("headers.delimiter", "headers.key.separator"),
            ("headers.separator", "headers.key.separator"),
        ):
            if seps[a] == seps[b]:
                raise BadValue(f"{a} and {b} may not be equal")
        for name in ("key.separator", "headers.separator", "headers.delimiter", "headers.key.separator"):
            if marker is not None and seps[name] == marker:
                raise BadValue(f"null.marker and {name} may not be equal")
        for name, sep in seps.items():
            if not sep:
                raise BadValue(f"--property {name} may not be empty")
        # os.fsencode: an argument that is not UTF-8 (e.g. $'\xff') arrives with surrogate escapes;
        # these are its bytes, so the separator matches what the shell passed.
        self.key_sep = os.fsencode(seps["key.separator"])
        self.headers_delim = os.fsencode(seps["headers.delimiter"])
        try:
            self.headers_split = re.compile(os.fsencode(seps["headers.separator"]))
        except re.error as exc:
            raise BadValue(f"headers.separator {seps['headers.separator']!r} is not a regular expression ({exc})") from None
        self.header_key_sep = os.fsencode(seps["headers.key.separator"])
        self.null = os.fsencode(marker) if marker is not None else None

    def read(self, line: bytes, number: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
        """(key, value, headers) of ``line`` (its ``number``, from 1, for messages)."""
        start = 0
        headers: list[tuple[str, bytes]] = []
        text = self._field(line, start, self.headers_delim, "headers delimiter", number) if self.parse_headers else None
        if text is not None:
            start = len(text) + len(self.headers_delim)
            if text and text != self.null:  # empty: no headers (Kafka refuses it: a pair without separator)
                headers = self._headers(text, number)
        key = self._field(line, start, self.key_sep, "key separator", number) if self.parse_key else None
        if key is not None:
            start += len(key) + len(self.key_sep)
        value = line[start:]
        return (None if key == self.null else key), (None if value == self.null else value), headers

    def _field(self, line: bytes, start: int, sep: bytes, what: str, number: int) -> bytes | None:
        end = line.find(sep, start)
        if end < 0:
            if self.ignore_error:
                return None
            raise LineFormatError(f"line {number} has no {what} {os.fsdecode(sep)!r}")
        return line[start:end]

    def _headers(self, text: bytes, number: int) -> list[tuple[str, bytes]]:
        parts = self.headers_split.split(text)
        while len(parts) > 1 and parts[-1] == b"":  # as Java's String.split: no trailing empty strings
            parts.pop()
        out = []
        for pair in parts:
            name, found, value = pair.partition(self.header_key_sep)
            if not found:
                if not self.ignore_error:
                    raise LineFormatError(
                        f"line {number}: the header {pair[:200]!r} has no header key separator "
                        f"{os.fsdecode(self.header_key_sep)!r}"
                    )
                value = b""
            if self.null is not None and name == self.null:
                raise LineFormatError(f"line {number}: a header name may not be the null marker {os.fsdecode(self.null)!r}")
            if self.null is not None and value == self.null:
                raise LineFormatError(
                    f"line {number}: the value of header {os.fsdecode(name)!r} is the null marker; header values are "
                    "bytes here, never null"
                )
            try:
                out.append((name.decode("utf-8"), value))
            except UnicodeDecodeError:
                raise LineFormatError(f"line {number}: the header name {name[:200]!r} is not UTF-8") from None
        return out


class ConsoleFormatter:
    """A record as Kafka's console consumer prints it (DefaultMessageFormatter's layout)."""

    def __init__(self, props: dict[str, str]) -> None:
        self.flags = {name: is_true(props, name) for name in CONSUMER_PROPERTIES if name.startswith("print.")}
        self.sep = props["key.separator"].encode()
        self.line_sep = props["line.separator"].encode()
        self.headers_sep = props["headers.separator"].encode()
        self.header_key_sep = props["headers.key.separator"].encode()
        self.null = props["null.literal"].encode()

    def format(self, rec: Any) -> bytes:
        parts: list[bytes] = []
        if self.flags["print.timestamp"]:
            parts.append(b"CreateTime:%d" % rec.timestamp)
        if self.flags["print.partition"]:
            parts.append(b"Partition:%d" % rec.partition)
        if self.flags["print.offset"]:
            parts.append(b"Offset:%d" % rec.offset)
        if self.flags["print.headers"]:
            headers = [k.encode() + self.header_key_sep + (v if v is not None else self.null) for k, v in rec.headers]
            parts.append(self.headers_sep.join(headers) if headers else b"NO_HEADERS")
        if self.flags["print.key"]:
            parts.append(rec.key if rec.key is not None else self.null)
        if self.flags["print.value"]:
            parts.append(rec.value if rec.value is not None else self.null)
        return self.sep.join(parts) + self.line_sep


@dataclass(frozen=True)
class Reset:
    """A ``--reset-offsets`` scenario: ``kind`` earliest, latest, offset, datetime (``value``:
    epoch ms; --by-duration too), shift, current, or file (``offsets``: each partition's own)."""

    kind: str
    value: int = 0
    offsets: dict[TopicPartition, int] = field(default_factory=dict)


# java.time.Duration.parse's text: [-]PnDTnHnMn.nS, letters in either case, each number signed.
_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?[0-9]+)D)?"
    r"(?:T(?:([-+]?[0-9]+)H)?(?:([-+]?[0-9]+)M)?(?:([-+]?[0-9]+)(?:[.,]([0-9]{0,9}))?S)?)?",
    re.IGNORECASE,
)


def parse_duration(text: str) -> timedelta:
    """``--by-duration`` as Kafka reads it (java.time.Duration.parse: ``PT15M``, ``P1DT2H``, ``PT0.5S``)."""
    m = _DURATION.fullmatch(text.strip())
    if m is None or not any(m.group(i) is not None for i in (2, 3, 4, 5)) or text.strip().upper().endswith("T"):
        raise BadValue(f"--by-duration {text!r} is not a duration like PT15M, P1DT2H or PT30S (Kafka's PnDTnHnMnS)")
    sign, days, hours, minutes, seconds, fraction = m.groups()
    secs = float(f"{seconds or 0}.{fraction or 0}")  # the fraction takes the seconds' sign, as in Java
    total = timedelta(days=int(days or 0), hours=int(hours or 0), minutes=int(minutes or 0), seconds=secs)
    return -total if sign == "-" else total


def parse_reset_file(text: str, group: str, source: str) -> dict[TopicPartition, int]:
    """A ``--from-file`` plan: CSV lines ``topic,partition,offset`` (Kafka's single-group export) or
    ``group,topic,partition,offset`` (only ``group``'s lines are taken), as ``--export`` writes them."""
    plan: dict[TopicPartition, int] = {}
    seen_groups = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 4:
            seen_groups.add(cells[0])
            if cells[0] != group:
                continue
            cells = cells[1:]
        if len(cells) != 3 or not re.fullmatch("[0-9]+", cells[1]) or not re.fullmatch("-?[0-9]+", cells[2]):
            raise BadValue(
                f"{source} line {number}: {raw[:100]!r} is not topic,partition,offset (or group,topic,partition,offset)"
            )
        plan[TopicPartition(cells[0], int(cells[1]))] = int(cells[2])
    if not plan:
        groups = f" (it has lines for {', '.join(sorted(seen_groups))})" if seen_groups else ""
        raise BadValue(f"No reset plan for group {group} found in {source}{groups}")
    return plan


def check_partitions(root: str, tps: Iterable[TopicPartition], what: str) -> None:
    """Every partition of ``tps`` exists (Kafka's checkAllTopicPartitionsValid)."""
    admin = Admin(root)
    counts: dict[str, int] = {}
    for tp in tps:
        if tp.topic not in counts:
            counts[tp.topic] = len(admin.describe_topic(tp.topic).partitions)
        if tp.partition >= counts[tp.topic]:
            raise BadValue(f"{what}: {tp.topic} has partitions 0 to {counts[tp.topic] - 1}, not {tp.partition}")


def parse_datetime(text: str) -> int:
    """``--to-datetime`` (Kafka's 'YYYY-MM-DDTHH:mm:SS.sss', a zone optional) as epoch milliseconds."""
    try:
        return iso_time_ms(text)
    except ValueError as exc:
        raise BadValue(f"--to-datetime {text!r} is {exc}") from None


def topic_spec(spec: str) -> tuple[str, list[int] | None]:
    """``--topic T`` or ``--topic T:0,1`` (kafka-consumer-groups' form) as T and its partitions
    (None: all of them); BadValue for a partition that is not a number, in Kafka's words."""
    name, colon, parts = spec.partition(":")
    if not colon:
        return name, None
    numbers = [p.strip() for p in parts.split(",")]
    for p in numbers:
        if not re.fullmatch(r"[0-9]+", p):
            raise BadValue(f"Invalid partition {p!r} specified in topic arg {spec!r}")
    return name, [int(p) for p in numbers]


def reset_scope(root: str, group: str, topics: Iterable[str], all_topics: bool) -> list[TopicPartition]:
    """The partitions ``--topic T`` / ``--topic T:0,1`` or ``--all-topics`` (the group's topics) name."""
    topics = list(topics)
    if bool(topics) == all_topics:
        raise BadValue("say which partitions to reset: --topic TOPIC[:P,...] (repeatable) or --all-topics")
    admin = Admin(root)
    if all_topics:
        state, offsets = read_group(root, group)
        names = sorted({tp.topic for tp in offsets} | set(state.partitions))
        return [TopicPartition(t, p.partition) for t in names for p in admin.describe_topic(t).partitions]
    out = []
    for spec in topics:
        name, parts = topic_spec(spec)
        count = len(admin.describe_topic(name).partitions)
        if parts is None:
            out += [TopicPartition(name, p) for p in range(count)]
            continue
        for p in parts:
            if p >= count:
                raise BadValue(f"--topic {spec}: {name} has partitions 0 to {count - 1}, not {p}")
            out.append(TopicPartition(name, p))
    return sorted(set(out))


def plan_reset(root: str, group: str, tps: list[TopicPartition], reset: Reset, warn: Any) -> dict[TopicPartition, int]:
    """The new offset of each partition, clamped to the log's range as Kafka clamps it (with a warning)."""
    consumer = Consumer(root=root, group_id=group, enable_auto_commit=False)
    try:
        firsts = consumer.beginning_offsets(tps)
        ends = consumer.end_offsets(tps)
        found = consumer.offsets_for_times({tp: reset.value for tp in tps}) if reset.kind == "datetime" else {}
        out = {}
        for tp in tps:
            if reset.kind == "earliest":
                target = firsts[tp]
            elif reset.kind == "latest":
                target = ends[tp]
            elif reset.kind == "offset":
                target = reset.value
            elif reset.kind == "datetime":
                hit = found.get(tp)
                target = hit.offset if hit else ends[tp]
            elif reset.kind == "file":
                target = reset.offsets[tp]
            else:
                current = consumer.committed(tp)
                if current is None:
                    raise BadValue(
                        f"group {group!r} has no committed offset for {tp.topic}[{tp.partition}] to "
                        f"{'shift' if reset.kind == 'shift' else 'keep'}; use --to-earliest, --to-latest or --to-offset"
                    )
                target = current + reset.value if reset.kind == "shift" else current
            name = f"{tp.topic}-{tp.partition}"
            if target > ends[tp]:
                warn(f"New offset ({target}) is higher than latest offset for {name}. Value will be set to {ends[tp]}")
                target = ends[tp]
            elif target < firsts[tp]:
                warn(f"New offset ({target}) is lower than earliest offset for {name}. Value will be set to {firsts[tp]}")
                target = firsts[tp]
            out[tp] = target
        return out
    finally:
        consumer.close(autocommit=False)


def execute_reset(root: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit ``offsets`` for ``group`` (a manual commit: refused for a partition a live member owns)."""
    consumer = Consumer(root=root, group_id=group, enable_auto_commit=False)
    try:
        consumer.assign(offsets)
        consumer.commit(offsets)
    finally:
        consumer.close(autocommit=False)


def offsets_scope(root: str, group: str, topics: Iterable[str]) -> list[TopicPartition]:
    """The partitions ``delete-offsets --topic T`` / ``--topic T:0,1`` names: T's partitions, or
    (T deleted since) those of T the group has offsets for; explicit partitions as given."""
    _, committed = read_group(root, group)
    store = TopicStore(root)
    out: set[TopicPartition] = set()
    for spec in topics:
        name, parts = topic_spec(spec)
        if parts is not None:
            out.update(TopicPartition(name, p) for p in parts)
        elif name in store.list():
            out.update(TopicPartition(name, p) for p in range(store.partitions(name)))
        else:
            known = {tp for tp in committed if tp.topic == name}
            if not known:
                raise BadValue(f"topic {name!r} does not exist and group {group!r} has no offsets for it")
            out.update(known)
    return sorted(out)
