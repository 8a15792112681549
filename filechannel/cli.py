"""The ``filechannel`` command: topics, produce, consume, groups, check, bench, tier.

Every command takes ``--root`` (or ``FILECHANNEL_ROOT``). Bad input gets one clear line
on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .channel import DamagedRange
from .cli_kafka import (
    CONSUMER_PROPERTIES,
    PRODUCER_PROPERTIES,
    ConsoleFormatter,
    Reset,
    delete_group,
    execute_reset,
    is_true,
    live_members,
    parse_datetime,
    parse_properties,
    plan_reset,
    require_inactive,
    reset_scope,
    topic_setting,
)
from .client import Admin, Consumer, Producer, TopicPartition
from .client.group import list_groups, read_group
from .errors import CorruptRecordError, FileChannelError, TopicExistsError, UnknownTopicError


class _Console(Console):
    """rich's console, except that a closed pipe is left to the command (rich exits 1 on it)."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError("the reader of the output has gone")


out = _Console()
err = _Console(stderr=True)


def _silence_closed_output() -> None:
    """After a reader closed our stdout (``| head -1``): point stdout and stderr at /dev/null,
    so the interpreter's last flush of what is still buffered cannot fail with a second
    "Exception ignored ... BrokenPipeError" line; the command then ends with exit 0."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader has closed it (Linux reports POLLERR on
    such a pipe): how a waiting ``consume --follow | head -1`` learns it can stop before its
    next record would fail with EPIPE. One poll(2), called once per consumer poll."""
    try:
        if not stat.S_ISFIFO(os.fstat(1).st_mode) and not stat.S_ISSOCK(os.fstat(1).st_mode):
            return False
        poller = select.poll()
        poller.register(1, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except OSError:
        return False


class _Cli(click.Group):
    """The top-level group: a closed stdout ends any command quietly with exit 0, as tools in a
    pipeline do (click itself would exit 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            if not _stdout_reader_gone():  # another pipe or socket (tier-2's connection) broke: an error
                raise click.ClickException(f"a pipe or connection broke: {exc}") from exc
            _silence_closed_output()
            raise click.exceptions.Exit(0) from None


def _root(ctx: click.Context, must_exist: bool = True) -> str:
    """The root folder; one that does not exist is an error unless the command is one that
    creates it (``topics create``, ``produce``, ``config``): a reader never makes a root."""
    root = ctx.obj["root"]
    if not root:
        raise click.UsageError("no root folder: pass --root PATH or set FILECHANNEL_ROOT")
    if must_exist and not os.path.isdir(root):
        raise click.ClickException(
            f"the root folder {os.path.abspath(root)!r} does not exist: check --root or FILECHANNEL_ROOT "
            "(a root is made by its first `filechannel topics create` or `produce`)"
        )
    return root


def _one(what: str, argument: str | None, option: str | None) -> str:
    """A topic or group given as an argument or as Kafka's ``--topic``/``--group`` (the same one if both)."""
    if argument and option and argument != option:
        raise click.UsageError(f"two {what}s given: {argument!r} and --{what} {option!r}")
    value = argument or option
    if not value:
        raise click.UsageError(f"missing the {what}: pass {what.upper()} or --{what} {what.upper()}")
    return value


def _store_root(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        ctx.find_root().obj["root"] = value
    return value


# --root after the subcommand too (`filechannel topics list --root d`): it overrides the one before.
_ROOT = click.option(
    "--root",
    type=click.Path(file_okay=False),
    expose_value=False,
    is_eager=True,
    callback=_store_root,
    help="Folder holding the topics (also before the command) [env: FILECHANNEL_ROOT].",
)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--root",
    envvar="FILECHANNEL_ROOT",
    type=click.Path(file_okay=False),
    help="Folder holding the topics [env: FILECHANNEL_ROOT].",
)
@click.version_option(None, "--version", package_name="filechannel", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, root: str | None) -> None:
    """filechannel: a durable, file-backed message log with a Kafka-like client."""
    ctx.ensure_object(dict)
    ctx.obj["root"] = root


# -- topics -------------------------------------------------------------------------------------


@cli.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


@topics.command("create")
@_ROOT
@click.argument("name", required=False)
@click.option("--topic", "topic_opt", default=None, help="The topic's name (Kafka's flag; same as NAME).")
@click.option("--partitions", "-p", default=1, show_default=True, type=click.IntRange(1, 10_000))
@click.option(
    "--config",
    "-c",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Topic setting, ours (retention_ms=3600000) or Kafka's (retention.ms=3600000) (repeatable).",
)
@click.option("--replication-factor", type=click.IntRange(1), default=None, help="Accepted and ignored (one machine).")
@click.option("--if-not-exists", is_flag=True, help="A topic of that name already there is left as it is (exit 0).")
@click.option("--bootstrap-server", hidden=True, help="Accepted and ignored (no broker).")
@click.pass_context
def topics_create(
    ctx: click.Context,
    name: str | None,
    topic_opt: str | None,
    partitions: int,
    settings: tuple[str, ...],
    replication_factor: int | None,
    if_not_exists: bool,
    bootstrap_server: str | None,
) -> None:
    """Create topic NAME (or --topic NAME)."""
    name = _one("topic", name, topic_opt)
    config = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--config")
        setting = topic_setting(key.strip(), value.strip())
        if setting is None:
            click.echo(f"note: topic config {key.strip()} means nothing on one machine; ignored", err=True)
        else:
            config[setting[0]] = setting[1]
    admin = Admin(_root(ctx, must_exist=False))
    try:
        admin.create_topic(name, partitions, **config)
    except TopicExistsError:
        if not if_not_exists:
            raise
        existing = admin.describe_topic(name)
        out.print(f"topic {name} already exists with {len(existing.partitions)} partition(s); left as it is")
        return
    out.print(f"created topic {name} with {partitions} partition(s)")


@topics.command("list")
@_ROOT
@click.pass_context
def topics_list(ctx: click.Context) -> None:
    """List the topics."""
    for name in Admin(_root(ctx)).list_topics():
        click.echo(name)


@topics.command("describe")
@_ROOT
@click.argument("name")
@click.pass_context
def topics_describe(ctx: click.Context, name: str) -> None:
    """Show NAME's partitions (first and end offsets, bytes on disk) and settings."""
    desc = Admin(_root(ctx)).describe_topic(name)
    table = Table(title=f"topic {name}")
    for col in ("partition", "first offset", "end offset", "records", "bytes on disk"):
        table.add_column(col, justify="right")
    for p in desc.partitions:
        table.add_row(
            str(p.partition), str(p.first_offset), str(p.end_offset), str(p.end_offset - p.first_offset), f"{p.size_bytes:,}"
        )
    out.print(table)
    out.print("settings: " + (", ".join(f"{k}={v}" for k, v in sorted(desc.config.items())) or "defaults"))


@topics.command("delete")
@_ROOT
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def topics_delete(ctx: click.Context, name: str, yes: bool) -> None:
    """Delete topic NAME and all its records."""
    admin = Admin(_root(ctx))
    if not yes:
        if not sys.stdin.isatty():  # a script: nobody to ask, so it must have said so
            raise click.UsageError(f"stdin is not a terminal, so nobody can confirm: pass --yes to delete topic {name}")
        click.confirm(f"delete topic {name} and all its records?", abort=True)
    admin.delete_topic(name)
    out.print(f"deleted topic {name}")


# -- produce / consume --------------------------------------------------------------------------


@cli.command()
@_ROOT
@click.argument("topic", required=False)
@click.option("--topic", "topic_opt", default=None, help="The topic (Kafka's console producer flag; same as TOPIC).")
@click.option("--file", "-f", "path", type=click.File("rb"), default="-", help="Read records from this file (default: stdin).")
@click.option("--key-separator", "-k", default=None, help="Split each line into KEY<sep>VALUE at the first SEP.")
@click.option("--partition", type=int, default=None, help="Send every record to this partition.")
@click.option(
    "--property",
    "properties",
    multiple=True,
    metavar="NAME=VALUE",
    help="Kafka's console producer properties: parse.key=true, key.separator=SEP (default tab), ignore.error=true.",
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
    bootstrap_server: str | None,
) -> None:
    """Send one record per line of input to TOPIC."""
    topic = _one("topic", topic, topic_opt)
    props = parse_properties(properties, PRODUCER_PROPERTIES, "produce")
    if key_separator is None and is_true(props, "parse.key"):
        key_separator = props["key.separator"]
    ignore_error = is_true(props, "ignore.error")
    # os.fsencode: an argument that is not UTF-8 (e.g. -k $'\xff') arrives with surrogate escapes; these
    # are its bytes, so the separator matches what the shell passed.
    sep = os.fsencode(key_separator) if key_separator else None
    root = _root(ctx, must_exist=False)
    _create_for_produce(Admin(root), topic, partition)
    count = 0
    with Producer(root, auto_create_topics=False) as producer:
        for line in path:
            line = line.rstrip(b"\r\n")
            key = None
            if sep is not None:
                key, found, value = line.partition(sep)
                if not found:
                    if not ignore_error:
                        raise click.UsageError(
                            f"line {count + 1} has no key separator {key_separator!r}; the {count} line(s) before it were "
                            "sent (--property ignore.error=true sends such a line as a value without key)"
                        )
                    key, value = None, line  # Kafka's ignore.error: the whole line is the value
            else:
                value = line
            producer.send(topic, value, key=key, partition=partition)
            count += 1
    err.print(f"sent {count} record(s) to {topic}")


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
    admin.create_topic(topic, 1, exist_ok=True)  # exist_ok: another producer may have created it meanwhile
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
            when = datetime.fromisoformat(spec)
            if when.tzinfo is None:
                when = when.astimezone()
            ts = int(when.timestamp() * 1000)
        except (ValueError, OverflowError, OSError) as exc:
            raise click.BadParameter(
                f"{spec!r} is not earliest, latest, an offset or an ISO time that can be converted ({exc})", param_hint="--from"
            ) from None
        found = consumer.offsets_for_times({tp: ts for tp in tps})
        ends = consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, found[tp].offset if found[tp] else ends[tp])


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
        if not batch and _stdout_reader_gone():  # waiting, with nobody left to print to
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
@_ROOT
@click.argument("topic", required=False)
@click.option("--topic", "topic_opt", default=None, help="The topic (Kafka's console consumer flag; same as TOPIC).")
@click.option("--include", default=None, metavar="REGEX", help="Instead of a topic: every topic whose whole name matches.")
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
    "properties",
    multiple=True,
    metavar="NAME=VALUE",
    help="Kafka's console consumer properties: print.key=true, key.separator=SEP, print.timestamp, print.partition, "
    "print.offset, print.headers, print.value, line.separator, null.literal.",
)
@click.option("--format", "fmt", type=click.Choice(["raw", "json"]), default="raw", show_default=True)
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
    bootstrap_server: str | None,
) -> None:
    """Print TOPIC's records, one per line, as Kafka's console consumer does.

    By default from the end (or the group's committed offsets), waiting for new records until
    interrupted, --max-messages or --timeout-ms.
    """
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
        topic = _one("topic", topic, topic_opt)
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
    if topic is not None:
        Admin(_root(ctx)).describe_topic(topic)  # a missing topic is an error (a Consumer would wait for it to appear)
    consumer = Consumer(
        *((topic,) if topic is not None and partition is None else ()),
        root=_root(ctx),
        group_id=group,
        auto_offset_reset="earliest" if from_beginning else "latest",
        enable_auto_commit=False,
    )
    count = 0
    try:
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
        signals = {signal.SIGINT: 130, signal.SIGTERM: 143}
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
        try:
            for rec in _records(consumer, follow, limit, timeout_ms, stop, commit_now_and_then):
                if fmt == "raw":
                    stdout.write(formatter.format(rec))
                else:
                    stdout.write(json.dumps(_as_json(rec)).encode() + b"\n")
                stdout.flush()
                printed[TopicPartition(rec.topic, rec.partition)] = rec.offset + 1
                count += 1
        except BrokenPipeError:  # `| head -1` has what it wanted: an end like --max, the last record unwritten
            if not _stdout_reader_gone():
                raise
            reader_gone = True
        except CorruptRecordError as exc:  # what was printed before the damage is committed still
            damage = exc
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if group is not None and printed:
            consumer.commit(printed)
        if damage is not None:
            raise click.ClickException(f"{damage}; {_where_to_seek(_root(ctx), consumer, group)}")
        if reader_gone:
            _silence_closed_output()
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


def _as_json(rec: Any) -> dict[str, Any]:
    def text(data: bytes | None) -> str | None:
        return data.decode("utf-8", "replace") if data is not None else None

    return {
        "topic": rec.topic,
        "partition": rec.partition,
        "offset": rec.offset,
        "timestamp": rec.timestamp,
        "key": text(rec.key),
        "value": text(rec.value),
        "headers": {k: text(v) for k, v in rec.headers},
    }


# -- groups -------------------------------------------------------------------------------------


@cli.group()
def groups() -> None:
    """List, describe and delete consumer groups; reset their offsets."""


@groups.command("list")
@_ROOT
@click.pass_context
def groups_list(ctx: click.Context) -> None:
    """List the consumer groups."""
    for g in list_groups(_root(ctx)):
        click.echo(g)


@groups.command("describe")
@_ROOT
@click.argument("group")
@click.pass_context
def groups_describe(ctx: click.Context, group: str) -> None:
    """Show GROUP's live members and, per partition, its committed offset, end offset, lag and owner.

    Only members whose process is alive are shown: the group's state keeps a killed member
    until a live one next polls, and a partition such a member owned says its owner is gone.
    """
    root = _root(ctx)
    state, offsets = read_group(root, group)
    live = set(live_members(root, group))
    admin = Admin(root)
    for member in sorted(live):
        info = state.members[member]
        out.print(f"member {member}: pid {info.get('pid', '?')}, topics {', '.join(info.get('topics', [])) or '-'}")
    table = Table(title=f"group {group} (generation {state.generation}, {len(live)} live member(s))")
    for col, just in (
        ("topic", "left"),
        ("partition", "right"),
        ("committed", "right"),
        ("end offset", "right"),
        ("lag", "right"),
        ("owner", "left"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    topics_seen = sorted({tp.topic for tp in offsets} | set(state.partitions))
    orphans: list[str] = []
    for topic in topics_seen:
        try:
            desc = admin.describe_topic(topic)
        except FileChannelError:
            continue
        for p in desc.partitions:
            tp = TopicPartition(topic, p.partition)
            committed = offsets.get(tp)
            lag = p.end_offset - (committed if committed is not None else p.first_offset)
            owner = state.owners.get(f"{topic}/{p.partition}", "")
            if owner and owner not in live:  # killed: a live member's next poll takes the partition over
                pid = state.members.get(owner, {}).get("pid", "?")
                orphans.append(f"{topic}[{p.partition}]: its owner (pid {pid}) is gone; a live member's next poll takes it over")
                owner = f"gone (pid {pid})"
            table.add_row(
                topic, str(p.partition), "-" if committed is None else str(committed), str(p.end_offset), str(lag), owner
            )
    out.print(table)
    for line in orphans:  # plain lines: rich would wrap them at the width of a terminal it does not have
        click.echo(line)


@groups.command("reset-offsets")
@_ROOT
@click.argument("group", required=False)
@click.option("--group", "group_opt", default=None, help="The group (Kafka's flag; same as GROUP).")
@click.option("--topic", "topics_", multiple=True, metavar="TOPIC[:P,...]", help="Reset these partitions (repeatable).")
@click.option("--all-topics", is_flag=True, help="Reset every partition of the topics the group has offsets for.")
@click.option("--to-earliest", is_flag=True, help="To the first offset of each partition.")
@click.option("--to-latest", is_flag=True, help="To the end of each partition.")
@click.option("--to-offset", type=click.IntRange(0), default=None, help="To this offset (clamped to the partition).")
@click.option("--to-datetime", default=None, help="To the first record at or after this ISO time (e.g. 2026-01-31T12:00:00.000).")
@click.option("--shift-by", type=int, default=None, help="Move the committed offsets by N (may be negative).")
@click.option("--to-current", is_flag=True, help="To the committed offsets (keep them).")
@click.option("--dry-run", is_flag=True, help="Show the new offsets, change nothing (the default).")
@click.option("--execute", is_flag=True, help="Commit the new offsets.")
@click.option("--bootstrap-server", hidden=True, help="Accepted and ignored (no broker).")
@click.pass_context
def groups_reset_offsets(
    ctx: click.Context,
    group: str | None,
    group_opt: str | None,
    topics_: tuple[str, ...],
    all_topics: bool,
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime: str | None,
    shift_by: int | None,
    to_current: bool,
    dry_run: bool,
    execute: bool,
    bootstrap_server: str | None,
) -> None:
    """Reset GROUP's committed offsets, as kafka-consumer-groups --reset-offsets does.

    Only while no member of the group is alive. Offsets outside a partition's records are
    set to its first offset or its end, with a warning. Without --execute nothing changes.
    """
    group = _one("group", group, group_opt)
    scenarios = [
        Reset("earliest") if to_earliest else None,
        Reset("latest") if to_latest else None,
        Reset("offset", to_offset) if to_offset is not None else None,
        Reset("datetime", parse_datetime(to_datetime)) if to_datetime is not None else None,
        Reset("shift", shift_by) if shift_by is not None else None,
        Reset("current") if to_current else None,
    ]
    chosen = [r for r in scenarios if r is not None]
    if len(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, --shift-by, --to-current"
        )
    if dry_run and execute:
        raise click.UsageError("options --dry-run and --execute cannot be specified together")
    if not dry_run and not execute:
        click.echo("WARN: No action will be performed as the --execute option is missing; showing the new offsets.", err=True)
    root = _root(ctx)
    tps = reset_scope(root, group, topics_, all_topics)
    require_inactive(root, group, "offsets can be reset")
    plan = plan_reset(root, group, tps, chosen[0], lambda msg: click.echo(f"WARN: {msg}", err=True))
    if execute:
        execute_reset(root, group, plan)
    click.echo(f"{'GROUP':<20} {'TOPIC':<30} {'PARTITION':>9} {'NEW-OFFSET':>12}")
    for tp, off in sorted(plan.items()):
        click.echo(f"{group:<20} {tp.topic:<30} {tp.partition:>9} {off:>12}")


@groups.command("delete")
@_ROOT
@click.argument("group", required=False)
@click.option("--group", "group_opt", default=None, help="The group (Kafka's flag; same as GROUP).")
@click.option("--bootstrap-server", hidden=True, help="Accepted and ignored (no broker).")
@click.pass_context
def groups_delete(ctx: click.Context, group: str | None, group_opt: str | None, bootstrap_server: str | None) -> None:
    """Delete GROUP and its committed offsets (only while no member of it is alive)."""
    group = _one("group", group, group_opt)
    delete_group(_root(ctx), group)
    click.echo(f"Deletion of requested consumer groups ('{group}') was successful.")


# -- root settings ------------------------------------------------------------------------------


@cli.command("config")
@_ROOT
@click.argument("settings", nargs=-1, metavar="[NAME=true|false]...")
@click.pass_context
def root_config(ctx: click.Context, settings: tuple[str, ...]) -> None:
    """Show the root's settings, or set them (stored in ROOT/.settings.json).

    auto.create.topics.enable (default true, as Kafka's broker setting): whether a send to a
    missing topic (`filechannel produce`, a Producer) creates it with one partition.
    """
    admin = Admin(_root(ctx, must_exist=bool(not settings)))
    for item in settings:
        name, sep, raw = item.partition("=")
        if not sep or raw.strip().lower() not in ("true", "false"):
            raise click.BadParameter(f"{item!r} is not NAME=true or NAME=false", param_hint="SETTINGS")
        admin.set_root_setting(name.strip(), raw.strip().lower() == "true")
    for name, value in admin.root_settings().items():
        click.echo(f"{name}={str(value).lower()}")


# -- check / bench ------------------------------------------------------------------------------


@cli.command()
@_ROOT
@click.argument("topics_", metavar="[TOPIC]...", nargs=-1)
@click.pass_context
def check(ctx: click.Context, topics_: tuple[str, ...]) -> None:
    """Verify the CRC of every record of every segment; changes no file.

    Every damaged range is listed on stderr (the file and byte or block, the offsets it
    makes unreadable, the first readable offset after it), then the exit code is 1.
    """
    admin = Admin(_root(ctx))
    damaged = 0
    names = list(topics_) or admin.list_topics()
    total_records = 0
    # The bars only on a terminal: into a file or a pipe, rich would write their last frame, and
    # with no partition to check, an empty line.
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=False,
        disable=not err.is_terminal or not names,
    ) as progress:
        for topic in names:
            desc = admin.describe_topic(topic)
            for p in desc.partitions:
                task = progress.add_task(f"{topic}[{p.partition}]", total=max(p.size_bytes, 1))
                found: list[DamagedRange] = []
                with admin.open_partition(topic, p.partition, read_only=True) as ch:
                    total_records += ch.check(
                        progress=lambda done, total, task=task: progress.update(task, completed=done, total=total),
                        on_damage=found.append,
                    )
                progress.update(task, completed=progress.tasks[task].total)
                for d in found:
                    err.print(f"damaged: {topic}[{p.partition}] {_damage_line(d, ch.path)}", soft_wrap=True, markup=False)
                damaged += len(found)
    if damaged:
        raise click.ClickException(
            f"{damaged} damaged range(s), listed above; {total_records:,} records can be read. Read past one with "
            "`filechannel consume TOPIC --partition P --from OFFSET`, or keep the records before it with `filechannel repair`"
        )
    out.print(f"ok: {total_records:,} records in {len(names)} topic(s), every CRC matches")


def _damage_line(d: DamagedRange, path: str) -> str:
    """One damaged range: its offsets, the first readable offset after it, and what is wrong where."""
    if d.readable_after is None:
        return (
            f"offsets from {d.first} on cannot be read, and no offset after them (the log ends in the damage; "
            f"`filechannel repair {path} --after {d.first - 1}` keeps the records before it): {d.message}"
        )
    return (
        f"offsets {d.first} to {d.readable_after - 1} cannot be read; first readable offset after them: "
        f"{d.readable_after}: {d.message}"
    )


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Run the benchmark harness (same options as `python -m bench`)."""
    if os.path.isdir(os.path.join(os.getcwd(), "bench")) and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the harness lives in the source checkout, not the package
    try:
        from bench.__main__ import main as bench_main  # type: ignore[import-not-found]
    except ImportError as exc:
        raise click.ClickException(
            f"the benchmark harness is not importable ({exc}); run it from a source checkout: python -m bench"
        ) from exc
    sys.exit(bench_main(ctx.args))


# -- repair ------------------------------------------------------------------------------------


@cli.command()
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--after", "after", type=int, required=True, help="The last offset to keep; every later record is deleted.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def repair(path: str, after: int, yes: bool) -> None:
    """Cut the channel (a partition folder) at PATH after offset --after.

    The answer to damage in the middle of a log, which recovery never cuts by itself:
    appends are refused until the operator chooses what to keep, usually every record
    before the damage (the error names the offset). Keeps every record up to --after and
    deletes every later one.
    """
    from .channel import FileChannel
    from .names import parse_segment_file

    if not os.path.isdir(path) or not any(parse_segment_file(f) for f in os.listdir(path)):
        raise click.ClickException(f"{path!r} is not a channel folder (no segment files in it)")
    with FileChannel(path, maintenance_interval=0) as ch:
        if not yes:
            click.confirm(f"keep the records of {ch.path} up to offset {after} and delete every later one?", abort=True, err=True)
        ch.repair(after)
        out.print(f"repaired: {ch.path} now ends after offset {ch.end_offset - 1}; sends go on from {ch.end_offset}")


# -- tier ---------------------------------------------------------------------------------------


@cli.group()
def tier() -> None:
    """Tier-2: the tiering daemon of a root, and what it has uploaded."""


_TIER_ROOT = click.option(
    "--root",
    "tier_root",
    type=click.Path(file_okay=False),
    help="Folder holding the topics (overrides the global --root / FILECHANNEL_ROOT).",
)


@tier.command("run")
@_TIER_ROOT
@click.option("--once", is_flag=True, help="One whole pass over every tiered partition, then exit.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(0.0), help="Seconds between passes.")
@click.option("--wait", is_flag=True, help="Wait for another daemon of this root to stop, instead of refusing.")
@click.pass_context
def tier_run(ctx: click.Context, tier_root: str | None, once: bool, interval: float, wait: bool) -> None:
    """Run the tiering daemon of a root: compress, upload, apply local and total retention.

    One daemon per root. Progress goes to stdout; SIGTERM or SIGINT stops it cleanly after
    the partition it is working on. With --once, exit 0 after one pass, or 1 with one line
    per failure on stderr.
    """
    import signal

    from .tiering.daemon import TieringDaemon

    root = tier_root or _root(ctx)

    def progress(line: str) -> None:
        click.echo(f"{datetime.now().strftime('%H:%M:%S')} {line}")

    daemon = TieringDaemon(root, wait=wait, interval=interval, progress=progress)

    def stop(signum: int, _frame: object) -> None:
        progress(f"{signal.Signals(signum).name}: stopping after the current partition")
        daemon.stop()

    daemon.start()  # with --wait, blocks on the lock: the default handlers still stop it there
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        report = daemon.run(once=once)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        daemon.close()
    if once:
        progress(
            f"pass done: {report.uploaded} segment(s) uploaded ({report.uploaded_bytes} bytes), "
            f"{report.deleted_local} local and {report.deleted_remote} tier-2 segment(s) deleted"
        )
    else:
        progress("stopped")
    for line in report.failures:
        click.echo(f"error: {line}", err=True)
    if report.failures:
        sys.exit(1)


@tier.command("status")
@_TIER_ROOT
@click.option("--json", "as_json", is_flag=True, help="One JSON object per partition instead of a table.")
@click.pass_context
def tier_status_cmd(ctx: click.Context, tier_root: str | None, as_json: bool) -> None:
    """Per tiered partition: local segments and bytes, uploaded, waiting, bytes in tier-2, upload lag, last error."""
    from .tiering.daemon import tier_status

    rows = tier_status(tier_root or _root(ctx))
    if as_json:
        for row in rows:
            click.echo(json.dumps(row.as_dict()))
        return
    if not rows:
        out.print("no tiered topic")
        return
    table = Table("partition", "local", "local bytes", "uploaded", "tier-2 bytes", "waiting", "lag (offsets)", "last error")
    for r in rows:
        table.add_row(
            r.partition,
            str(r.local_segments),
            str(r.local_bytes),
            str(r.uploaded_segments),
            str(r.tier_bytes),
            f"{r.waiting_segments} ({r.waiting_bytes} bytes)",
            str(r.upload_lag_offsets),
            r.last_error or "",
        )
    out.print(table)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: our errors become one line on stderr, exit 1."""
    try:
        code = cli.main(args=argv, prog_name="filechannel", standalone_mode=False)
        if isinstance(code, int) and code:  # ctx.exit(N): click returns N when not standalone
            sys.exit(code)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(1)
    except click.exceptions.NoArgsIsHelpError as exc:  # `filechannel topics`: say what is missing, in one line
        names = ", ".join(exc.ctx.command.list_commands(exc.ctx)) if isinstance(exc.ctx.command, click.Group) else ""
        click.echo(f"error: missing the command: one of {names} (see: {exc.ctx.command_path} --help)", err=True)
        sys.exit(exc.exit_code)
    except click.UsageError as exc:  # one line, like every other error, with where to look
        where = exc.ctx.command_path if exc.ctx is not None else "filechannel"
        click.echo(f"error: {exc.format_message()} (see: {where} --help)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except FileChannelError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except BrokenPipeError:  # stderr closed while an error was written
        _silence_closed_output()
        sys.exit(0)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
