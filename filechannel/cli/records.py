"""``filechannel produce`` and ``filechannel consume``: records in and out, as Kafka's console tools."""

from __future__ import annotations

import base64
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import click

from ..client import Admin, Consumer, Producer, TopicPartition
from ..engine.verify import DamagedRange
from ..errors import ConfigError, CorruptRecordError, TopicExistsError, UnknownTopicError
from ..tiering.storage import redact_url
from .common import (
    ROOT_OPTION,
    BadValue,
    cli,
    err,
    iso_time_ms,
    one_name,
    root_folder,
    silence_closed_output,
    stdout_reader_gone,
)
from .kafka import (
    CONSUMER_PROPERTIES,
    PRODUCER_PROPERTIES,
    ConsoleFormatter,
    LineFormatError,
    LineReader,
    client_properties,
    parse_properties,
    tier_options,
)


@cli.command()
@ROOT_OPTION
@click.argument("topic", required=False)
@click.option("--topic", "topic_opt", default=None, help="The topic (Kafka's console producer flag; same as TOPIC).")
@click.option("--file", "-f", "path", type=click.File("rb"), default="-", help="Read records from this file (default: stdin).")
@click.option("--key-separator", "-k", default=None, help="Split each line into KEY<sep>VALUE at the first SEP.")
@click.option("--partition", type=int, default=None, help="Send every record to this partition.")
@click.option(
    "--property",
    "--reader-property",
    "properties",
    multiple=True,
    metavar="NAME=VALUE",
    help="Kafka's console producer properties: parse.key=true, key.separator=SEP (default tab), parse.headers=true "
    "(lines are H1:V1,H2:V2<tab>[KEY<tab>]VALUE), headers.delimiter (tab), headers.separator (,), "
    "headers.key.separator (:), null.marker=TEXT (a key or value equal to it is absent: a tombstone), ignore.error=true.",
)
@click.option(
    "--producer-property",
    "--command-property",
    "producer_properties",
    multiple=True,
    metavar="NAME=VALUE",
    help="A producer setting by Kafka's name (acks=all, linger.ms=5, batch.size, compression.type, client.id, ...).",
)
@click.option(
    "--request-required-acks",
    default=None,
    help="Kafka's acks: 0 or 1 keep the topic's fsync policy; -1 or all waits for each record's fsync.",
)
@click.option("--sync", is_flag=True, help="Send each line only once the one before it is written (Kafka's --sync).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["raw", "json"]),
    default="raw",
    show_default=True,
    help="raw: lines as Kafka's console producer reads them (see --property). json: one object per line as "
    "consume --format json prints them: value (null: a tombstone), key, headers, timestamp, each with its encoding "
    '("utf-8" or "base64"); topic, partition and offset are ignored.',
)
@click.option("--bootstrap-server", hidden=True, help="Accepted and ignored (no broker).")
@click.pass_context
def produce(
    ctx: click.Context,
    topic: str | None,
    topic_opt: str | None,
    path: Any,
    key_separator: str | None,
    partition: int | None,
    properties: tuple[str, ...],
    producer_properties: tuple[str, ...],
    request_required_acks: str | None,
    sync: bool,
    fmt: str,
    bootstrap_server: str | None,
) -> None:
    """Send one record per line of input to TOPIC."""
    topic = one_name("topic", topic, topic_opt)
    if fmt == "json" and (properties or key_separator is not None):
        raise click.UsageError("--property and --key-separator describe raw lines; a --format json line names its fields")
    reader = LineReader(parse_properties(properties, PRODUCER_PROPERTIES, "produce"), key_separator)
    settings = client_properties(producer_properties, "--producer-property")
    if request_required_acks is not None:
        settings.update(client_properties([f"acks={request_required_acks}"], "--request-required-acks"))
    root = root_folder(ctx, must_exist=False)
    count = 0
    try:  # its settings checked before a topic is made
        producer = Producer(root, auto_create_topics=False, **settings)
    except ConfigError as exc:  # a --producer-property the client refuses: a bad value (exit 2)
        raise BadValue(str(exc)) from None
    from .progress import Meter, count_progress

    typed = path.isatty()  # someone typing: no bar under their lines
    with producer, count_progress(shown=not typed) as progress:
        _create_for_produce(Admin(root), topic, partition)
        meter = Meter(progress, f"sending to {topic}", "records")
        for line in path:
            timestamp = None
            try:
                if fmt == "json":
                    key, value, headers, timestamp = _from_json(line, count + 1)
                else:
                    key, value, headers = reader.read(line.rstrip(b"\r\n"), count + 1)
            except LineFormatError as exc:
                raise click.UsageError(
                    f"{exc}; the {count} line(s) before it were sent (--property ignore.error=true sends what it can of such "
                    "a line: no headers or no key when their delimiter is missing)"
                ) from None
            future = producer.send(topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp)
            if sync:
                future.get()
            count += 1
            meter.add(1, len(line))
        meter.show()  # the last counts in the bar's last frame
    rates = "" if typed else f" {meter.summary()}"
    err.print(f"sent {count} record(s) to {topic}{rates}", highlight=False)


def _create_for_produce(admin: Admin, topic: str, partition: int | None) -> None:
    """A missing topic is created (one partition, default settings) only if the root allows it,
    as Kafka's broker does, and the user is told so: never a silent new topic from a typo."""
    try:
        admin.describe_topic(topic)
        return
    except UnknownTopicError:
        allowed = admin.root_settings()["auto.create.topics.enable"]
        if not allowed or partition:
            why = (
                "auto.create.topics.enable is false for this root (filechannel config)"
                if not allowed
                else f"one created here would have no partition {partition}"
            )
            raise click.ClickException(
                f"topic {topic!r} does not exist under {admin.root!r} and {why}: "
                f"create it first with `filechannel topics create {topic} --partitions N`"
            ) from None
    try:
        admin.create_topic(topic, 1)
    except TopicExistsError:  # another producer created it meanwhile, maybe with other settings: use it
        return
    click.echo(
        f"note: created topic {topic} (1 partition, default settings): it did not exist and this root's "
        "auto.create.topics.enable is true (the default; `filechannel config auto.create.topics.enable=false` turns it off)",
        err=True,
    )


def _start_offsets(consumer: Consumer, spec: str) -> None:
    tps = sorted(consumer.assignment())
    if spec == "earliest":
        consumer.seek_to_beginning(*tps)
    elif spec == "latest":
        consumer.seek_to_end(*tps)
    elif spec.isascii() and spec.isdigit():  # not str.isdigit alone: "²" is a digit to it, not to int()
        for tp in tps:
            consumer.seek(tp, int(spec))
    else:
        try:
            ts = iso_time_ms(spec)
        except ValueError as exc:
            raise click.BadParameter(f"{spec!r} is not earliest, latest or an offset, and {exc}", param_hint="--from") from None
        found = consumer.offsets_for_times({tp: ts for tp in tps})
        ends = consumer.end_offsets(tps)
        for tp in tps:
            hit = found[tp]
            consumer.seek(tp, hit.offset if hit else ends[tp])


def _records(
    consumer: Consumer,
    follow: bool,
    limit: int | None,
    timeout_ms: int | None,
    stop: threading.Event,
    after_poll: Callable[[], None],
) -> Iterator[Any]:
    """Records as they come: until ``limit``, until ``timeout_ms`` without one, (not following) the
    end, or ``stop`` (set by a signal; seen within one poll's wait, 0.5 s). ``after_poll`` runs
    after every poll, before its records are handed out."""
    ends = consumer.end_offsets(consumer.assignment())
    seen = 0
    last = time.monotonic()
    while (limit is None or seen < limit) and not stop.is_set():
        wait = 500 if timeout_ms is None else max(0, min(500, timeout_ms - int((time.monotonic() - last) * 1000)))
        batch = consumer.poll(timeout_ms=wait, max_records=500 if limit is None else min(500, limit - seen))
        after_poll()
        for recs in batch.values():
            for rec in recs:
                if stop.is_set():
                    return
                yield rec
                seen += 1
                last = time.monotonic()
        if not follow and all(consumer.position(tp) >= end for tp, end in ends.items() if tp in consumer.assignment()):
            return
        if not batch and stdout_reader_gone():  # waiting, with nobody left to print to
            raise BrokenPipeError("stdout's reader has gone")
        if timeout_ms is not None and (time.monotonic() - last) * 1000 >= timeout_ms:
            return


_COMMIT_INTERVAL_S = 5.0  # Kafka's auto.commit.interval.ms, the console consumer's too


def _seek_partition(consumer: Consumer, tp: TopicPartition, offset: str) -> None:
    """Kafka's ``--offset``: earliest, latest or an offset (at most the end)."""
    if offset.lower() == "earliest":
        consumer.seek_to_beginning(tp)
    elif offset.lower() == "latest":
        consumer.seek_to_end(tp)
    elif offset.isascii() and offset.isdigit():
        consumer.seek(tp, min(int(offset), consumer.end_offsets([tp])[tp]))
    else:
        raise click.BadParameter(
            f"the offset {offset!r} is incorrect: earliest, latest or a non-negative integer", param_hint="--offset"
        )


@cli.command()
@ROOT_OPTION
@click.argument("topic", required=False)
@click.option("--topic", "topic_opt", default=None, help="The topic (Kafka's console consumer flag; same as TOPIC).")
@click.option(
    "--include",
    "--whitelist",
    "include",
    default=None,
    metavar="REGEX",
    help="Instead of a topic: every topic whose whole name matches (--whitelist: its older Kafka name).",
)
@click.option("--group", "-g", default=None, help="Consume as a member of this group (commits its offsets).")
@click.option(
    "--from",
    "start",
    default=None,
    help="earliest, latest, an OFFSET, or an ISO time [default: the group's committed offset, else the end].",
)
@click.option(
    "--from-beginning", is_flag=True, help="Without a committed offset, start at the earliest record instead of the end."
)
@click.option("--partition", type=click.IntRange(0), default=None, help="Read only this partition (not with --group).")
@click.option("--offset", default=None, help="With --partition: earliest, latest or an offset to start at.")
@click.option("--follow/--no-follow", default=True, show_default=True, help="Wait for new records; --no-follow stops at the end.")
@click.option("--max", "--max-messages", "limit", type=click.IntRange(1), default=None, help="Stop after N records.")
@click.option("--timeout-ms", type=click.IntRange(0), default=None, help="Stop once no record arrived for this long.")
@click.option(
    "--property",
    "--formatter-property",
    "properties",
    multiple=True,
    metavar="NAME=VALUE",
    help="Kafka's console consumer properties: print.key=true, key.separator=SEP, print.timestamp, print.partition, "
    "print.offset, print.headers, print.value, line.separator, headers.separator, headers.key.separator, null.literal.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["raw", "json"]),
    default="raw",
    show_default=True,
    help="raw: Kafka's console layout (see --property). json: one object per record and line, the keys topic, "
    "partition, offset, timestamp, key, key_encoding, value, value_encoding, headers ([{key, value, encoding}]); "
    'a key or value that is UTF-8 is the text with encoding "utf-8", any other bytes are base64 with encoding '
    '"base64" (an absent key or value, and its encoding, are null).',
)
@click.option(
    "--consumer-property",
    "--command-property",
    "consumer_properties",
    multiple=True,
    metavar="NAME=VALUE",
    help="A consumer setting by Kafka's name (max.poll.records=100, client.id, isolation.level, ...).",
)
@click.option(
    "--isolation-level",
    type=click.Choice(["read_uncommitted", "read_committed"]),
    default=None,
    help="Both read only committed records (a transaction's records are written at its commit); "
    "read_committed also first applies what a transactional producer that died mid-commit committed.",
)
@click.option(
    "--tier",
    "tier_url",
    default=None,
    metavar="URL",
    help="Instead of --root: read what roots uploaded to this tier URL, with no root (topics <origin>.<topic>).",
)
@click.option("--origin", "origins", multiple=True, help="With --tier: read only this origin (repeatable; default all).")
@click.option("--state-dir", default=None, help="With --tier: a local folder for the reader's indexes and groups (required).")
@click.option(
    "--tier-option",
    "tier_opts",
    multiple=True,
    metavar="KEY=VALUE",
    help="With --tier: a storage option, e.g. endpoint_url=http://s3:8333 (repeatable; credentials from the environment).",
)
@click.option("--bootstrap-server", hidden=True, help="Accepted and ignored (no broker).")
@click.pass_context
def consume(
    ctx: click.Context,
    topic: str | None,
    topic_opt: str | None,
    include: str | None,
    group: str | None,
    start: str | None,
    from_beginning: bool,
    partition: int | None,
    offset: str | None,
    follow: bool,
    limit: int | None,
    timeout_ms: int | None,
    properties: tuple[str, ...],
    fmt: str,
    consumer_properties: tuple[str, ...],
    isolation_level: str | None,
    tier_url: str | None,
    origins: tuple[str, ...],
    state_dir: str | None,
    tier_opts: tuple[str, ...],
    bootstrap_server: str | None,
) -> None:
    """Print TOPIC's records, one per line, as Kafka's console consumer does.

    By default from the end (or the group's committed offsets), waiting for new records until
    interrupted, --max-messages or --timeout-ms. With --tier URL --state-dir D instead of a
    root: the records the roots tiering into URL uploaded (TOPIC is <origin>.<topic>, or
    <topic> for a root without an origin), following new uploads.
    """
    if tier_url is None and (origins or state_dir is not None or tier_opts):
        raise click.UsageError("--origin, --state-dir and --tier-option go with --tier")
    if tier_url is not None and state_dir is None:
        raise click.UsageError("--tier needs --state-dir, a local folder for the reader's indexes and groups")
    source: dict[str, Any] = (
        {"root": root_folder(ctx)}
        if tier_url is None
        else {"tier": tier_url, "tier_options": tier_options(tier_opts), "origins": list(origins) or None, "state_dir": state_dir}
    )
    if include is not None:
        if topic or topic_opt:
            raise click.UsageError("give either a topic or --include, not both")
        if partition is not None:
            raise click.UsageError("the topic is required when partition is specified")
        try:
            re.compile(include)
        except re.error as exc:
            raise click.BadParameter(f"{include!r} is not a regular expression ({exc})", param_hint="--include") from None
    else:
        topic = one_name("topic", topic, topic_opt)
    if partition is not None and group is not None:
        raise click.UsageError("options --group and --partition cannot be specified together")
    if offset is not None and partition is None:
        raise click.UsageError("the partition is required when --offset is specified")
    if offset is not None and from_beginning:
        raise click.UsageError("options --from-beginning and --offset cannot be specified together")
    if start is not None and (from_beginning or offset is not None):
        raise click.UsageError("--from cannot be combined with --from-beginning or --offset")
    props = parse_properties(properties, CONSUMER_PROPERTIES, "consume")
    formatter = ConsoleFormatter(props)
    settings = client_properties(consumer_properties, "--consumer-property")
    if isolation_level is not None:
        settings["isolation_level"] = isolation_level
    if topic is not None and tier_url is None:
        Admin(root_folder(ctx)).describe_topic(topic)  # a missing topic is an error (a Consumer would wait for it to appear)
    try:
        consumer = Consumer(
            *((topic,) if topic is not None and partition is None else ()),
            **source,
            group_id=group,
            auto_offset_reset="earliest" if from_beginning else "latest",
            enable_auto_commit=False,
            **settings,
        )
    except ConfigError as exc:  # a --consumer-property the client refuses: a bad value (exit 2)
        raise BadValue(str(exc)) from None
    count = 0
    try:
        if topic is not None and tier_url is not None and consumer.partitions_for_topic(topic) is None:
            found = ", ".join(sorted(consumer.topics())) or "none"
            raise UnknownTopicError(f"topic {topic!r} is not in {redact_url(tier_url)} (topics: {found})")
        if include is not None:
            consumer.subscribe(pattern=f"(?:{include})\\Z")  # Kafka matches the whole name
        if partition is not None:
            assert topic is not None
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            _seek_partition(consumer, tp, offset or ("earliest" if from_beginning else "latest"))
        if start is not None:
            _start_offsets(consumer, start)
        stdout = sys.stdout.buffer
        # Ctrl-C or SIGTERM ends a console consumer between two records, never inside one: then
        # exactly what was written to stdout is counted and (with a group) committed, as Kafka's
        # console consumer commits on shutdown. poll hands out whole batches, so the commit names
        # the offsets printed rather than the consumer's positions.
        stop = threading.Event()
        signals: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}  # (a handler gets the number as an int)
        caught: list[int] = []

        def on_signal(signum: int, _frame: object) -> None:
            caught.append(signum)
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in signals}
        printed: dict[TopicPartition, int] = {}
        committed: dict[TopicPartition, int] = {}
        next_commit = time.monotonic() + _COMMIT_INTERVAL_S

        def commit_now_and_then() -> None:
            """With a group, what was printed is committed every 5 s (the consumer's auto-commit
            interval), so a consumer killed by SIGKILL or a crash repeats at most that much."""
            nonlocal next_commit
            if group is not None and printed != committed and time.monotonic() >= next_commit:
                consumer.commit(dict(printed))
                committed.update(printed)
                next_commit = time.monotonic() + _COMMIT_INTERVAL_S

        reader_gone = False
        damage: CorruptRecordError | None = None
        from .progress import Meter, count_progress

        progress = count_progress(shown=not sys.stdout.isatty())  # into a file or a pipe: a bar on a terminal's stderr
        meter = Meter(progress, "consuming", "records")
        try:
            progress.start()
            for rec in _records(consumer, follow, limit, timeout_ms, stop, commit_now_and_then):
                line = formatter.format(rec) if fmt == "raw" else json.dumps(_as_json(rec)).encode() + b"\n"
                stdout.write(line)
                stdout.flush()
                printed[TopicPartition(rec.topic, rec.partition)] = rec.offset + 1
                count += 1
                meter.add(1, len(line))
        except BrokenPipeError:  # `| head -1` has what it wanted: an end like --max, the last record unwritten
            if not stdout_reader_gone():
                raise
            reader_gone = True
        except CorruptRecordError as exc:  # what was printed before the damage is committed still
            damage = exc
        finally:
            meter.show()
            progress.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if group is not None and printed:
            consumer.commit(printed)
        if damage is not None:
            if tier_url is not None:  # the damage is in the bucket: the writing root's fsck is what mends it
                raise click.ClickException(str(damage))
            raise click.ClickException(f"{damage}; {_where_to_seek(root_folder(ctx), consumer, group)}")
        if reader_gone:
            silence_closed_output()
            return
        err.print(f"Processed a total of {count} messages")
        if caught:
            ctx.exit(signals[caught[0]])  # 130 after Ctrl-C, as a shell expects; 143 after SIGTERM
    finally:
        consumer.close(autocommit=False)


def _where_to_seek(root: str, consumer: Consumer, group: str | None) -> str:
    """After a poll met damage: the first readable offset after it, and the command that starts there.

    Which partition is found by its position (the damaged offset: every record before it was
    handed out) falling in a damaged range of a check of it; the check reads the partition,
    only on this error path.
    """
    for tp in sorted(consumer.assignment()):
        position = consumer.position(tp)
        found: list[DamagedRange] = []
        with Admin(root).open_partition(tp.topic, tp.partition, read_only=True) as ch:
            ch.check(on_damage=found.append)
        for d in found:
            if d.first <= position and (d.readable_after is None or position < d.readable_after):
                if d.readable_after is None:
                    return f"{tp.topic}[{tp.partition}] has no readable offset after {position}: the log ends in the damage"
                how = (
                    f"filechannel groups reset-offsets {group} --topic {tp.topic}:{tp.partition} "
                    f"--to-offset {d.readable_after} --execute"
                    if group is not None
                    else f"filechannel consume {tp.topic} --partition {tp.partition} --from {d.readable_after}"
                )
                return (
                    f"the first readable offset after it in {tp.topic}[{tp.partition}] is {d.readable_after} "
                    f"(offsets {d.first} to {d.readable_after - 1} are lost): seek there, e.g. `{how}`"
                )
    return "run `filechannel check` to list the damaged ranges and the first readable offset after each"


def _encoded(data: bytes | None) -> tuple[str | None, str | None]:
    """Bytes as JSON text and the encoding that gives them back: UTF-8 text as it is, other
    bytes in base64, so that no byte is lost or replaced; (None, None) for absent bytes."""
    if data is None:
        return None, None
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def _decoded(text: Any, encoding: Any, what: str, number: int) -> bytes | None:
    """The bytes of a JSON field and its encoding, as :func:`_encoded` wrote them (utf-8 if none given)."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise LineFormatError(f"line {number}: {what} must be a string or null, not {type(text).__name__}")
    if encoding in (None, "utf-8"):
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (\\udc80 in the JSON): no UTF-8 text has one
            raise LineFormatError(
                f'line {number}: {what} is not UTF-8 text; give such bytes in base64 ("encoding": "base64")'
            ) from None
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except ValueError:
            raise LineFormatError(f"line {number}: {what} is not valid base64") from None
    raise LineFormatError(f'line {number}: the encoding of {what} must be "utf-8" or "base64", not {encoding!r}')


def _from_json(line: bytes, number: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int | None]:
    """(key, value, headers, timestamp) of a ``produce --format json`` line: :func:`_as_json`'s inverse."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise LineFormatError(f"line {number} is not a JSON object ({exc})") from None
    if not isinstance(obj, dict) or "value" not in obj:
        raise LineFormatError(f'line {number} is not a JSON object with a "value" (null for a tombstone)')
    value = _decoded(obj["value"], obj.get("value_encoding"), "value", number)
    key = _decoded(obj.get("key"), obj.get("key_encoding"), "key", number)
    headers = []
    for h in obj.get("headers") or []:
        if not isinstance(h, dict) or not isinstance(h.get("key"), str):
            raise LineFormatError(f'line {number}: each header must be {{"key": name, "value": text, "encoding": ...}}')
        raw = _decoded(h.get("value"), h.get("encoding"), f"header {h['key']!r}", number)
        if raw is None:
            raise LineFormatError(f"line {number}: header {h['key']!r} has no value (header values are bytes, never null)")
        headers.append((h["key"], raw))
    timestamp = obj.get("timestamp")
    if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0):
        raise LineFormatError(f"line {number}: timestamp must be milliseconds since the epoch, not {timestamp!r}")
    return key, value, headers, timestamp


def _as_json(rec: Any) -> dict[str, Any]:
    """A record as ``consume --format json`` prints it: always the same keys, in this order."""
    key, key_encoding = _encoded(rec.key)
    value, value_encoding = _encoded(rec.value)
    headers = []
    for name, raw in rec.headers:
        text, encoding = _encoded(raw)
        headers.append({"key": name, "value": text, "encoding": encoding})
    return {
        "topic": rec.topic,
        "partition": rec.partition,
        "offset": rec.offset,
        "timestamp": rec.timestamp,
        "key": key,
        "key_encoding": key_encoding,
        "value": value,
        "value_encoding": value_encoding,
        "headers": headers,
    }
