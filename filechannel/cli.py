"""The ``filechannel`` command: topics, produce, consume, groups, check, bench, tier.

Every command takes ``--root`` (or ``FILECHANNEL_ROOT``). Bad input gets one clear line
on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .client import Admin, Consumer, Producer, TopicPartition
from .client.group import list_groups, read_group
from .errors import FileChannelError

out = Console()
err = Console(stderr=True)


def _root(ctx: click.Context) -> str:
    root = ctx.obj["root"]
    if not root:
        raise click.UsageError("no root folder: pass --root PATH or set FILECHANNEL_ROOT")
    return root


def _parse_value(text: str) -> Any:
    if text.lower() == "null":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--root",
    envvar="FILECHANNEL_ROOT",
    type=click.Path(file_okay=False),
    help="Folder holding the topics [env: FILECHANNEL_ROOT].",
)
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
@click.argument("name")
@click.option("--partitions", "-p", default=1, show_default=True, type=click.IntRange(1, 10_000))
@click.option(
    "--config",
    "-c",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Topic setting, e.g. retention_ms=3600000 (repeatable).",
)
@click.pass_context
def topics_create(ctx: click.Context, name: str, partitions: int, settings: tuple[str, ...]) -> None:
    """Create topic NAME."""
    config = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--config")
        config[key.strip()] = _parse_value(value.strip())
    Admin(_root(ctx)).create_topic(name, partitions, **config)
    out.print(f"created topic {name} with {partitions} partition(s)")


@topics.command("list")
@click.pass_context
def topics_list(ctx: click.Context) -> None:
    """List the topics."""
    for name in Admin(_root(ctx)).list_topics():
        click.echo(name)


@topics.command("describe")
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
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def topics_delete(ctx: click.Context, name: str, yes: bool) -> None:
    """Delete topic NAME and all its records."""
    if not yes and sys.stdin.isatty():
        click.confirm(f"delete topic {name} and all its records?", abort=True)
    Admin(_root(ctx)).delete_topic(name)
    out.print(f"deleted topic {name}")


# -- produce / consume --------------------------------------------------------------------------


@cli.command()
@click.argument("topic")
@click.option("--file", "-f", "path", type=click.File("rb"), default="-", help="Read records from this file (default: stdin).")
@click.option("--key-separator", "-k", default=None, help="Split each line into KEY<sep>VALUE at the first SEP.")
@click.option("--partition", type=int, default=None, help="Send every record to this partition.")
@click.pass_context
def produce(ctx: click.Context, topic: str, path: Any, key_separator: str | None, partition: int | None) -> None:
    """Send one record per line of input to TOPIC."""
    # os.fsencode: an argument that is not UTF-8 (e.g. -k $'\xff') arrives with surrogate escapes; these
    # are its bytes, so the separator matches what the shell passed.
    sep = os.fsencode(key_separator) if key_separator else None
    count = 0
    with Producer(_root(ctx)) as producer:
        for line in path:
            line = line.rstrip(b"\r\n")
            key = None
            if sep is not None:
                key, found, value = line.partition(sep)
                if not found:
                    raise click.BadParameter(f"line {count + 1} has no key separator {key_separator!r}")
            else:
                value = line
            producer.send(topic, value, key=key, partition=partition)
            count += 1
    err.print(f"sent {count} record(s) to {topic}")


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


def _records(consumer: Consumer, follow: bool, limit: int | None) -> Iterator[Any]:
    ends = consumer.end_offsets(consumer.assignment())
    seen = 0
    while limit is None or seen < limit:
        batch = consumer.poll(timeout_ms=500, max_records=500 if limit is None else min(500, limit - seen))
        for recs in batch.values():
            for rec in recs:
                yield rec
                seen += 1
        if not follow and all(consumer.position(tp) >= end for tp, end in ends.items() if tp in consumer.assignment()):
            return


@cli.command()
@click.argument("topic")
@click.option("--group", "-g", default=None, help="Consume as a member of this group (commits its offsets).")
@click.option(
    "--from",
    "start",
    default=None,
    help="earliest, latest, an OFFSET, or an ISO time [default: the group's committed offset, else earliest].",
)
@click.option("--follow", is_flag=True, help="Keep waiting for new records.")
@click.option("--max", "limit", type=click.IntRange(1), default=None, help="Stop after N records.")
@click.option("--format", "fmt", type=click.Choice(["raw", "json"]), default="raw", show_default=True)
@click.pass_context
def consume(
    ctx: click.Context, topic: str, group: str | None, start: str | None, follow: bool, limit: int | None, fmt: str
) -> None:
    """Print TOPIC's records, one per line."""
    consumer = Consumer(topic, root=_root(ctx), group_id=group, auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        if start is not None:
            _start_offsets(consumer, start)
        stdout = sys.stdout.buffer
        for rec in _records(consumer, follow, limit):
            if fmt == "raw":
                stdout.write(rec.value + b"\n")
            else:
                line = {
                    "topic": rec.topic,
                    "partition": rec.partition,
                    "offset": rec.offset,
                    "timestamp": rec.timestamp,
                    "key": rec.key.decode("utf-8", "replace") if rec.key is not None else None,
                    "value": rec.value.decode("utf-8", "replace"),
                    "headers": {k: v.decode("utf-8", "replace") for k, v in rec.headers},
                }
                stdout.write(json.dumps(line).encode() + b"\n")
            stdout.flush()
        if group is not None:
            consumer.commit()
    finally:
        consumer.close(autocommit=False)


# -- groups -------------------------------------------------------------------------------------


@cli.group()
def groups() -> None:
    """List consumer groups and show their lag."""


@groups.command("list")
@click.pass_context
def groups_list(ctx: click.Context) -> None:
    """List the consumer groups."""
    for g in list_groups(_root(ctx)):
        click.echo(g)


@groups.command("describe")
@click.argument("group")
@click.pass_context
def groups_describe(ctx: click.Context, group: str) -> None:
    """Show GROUP's members and, per partition, its committed offset, end offset and lag."""
    root = _root(ctx)
    state, offsets = read_group(root, group)
    admin = Admin(root)
    table = Table(title=f"group {group} (generation {state.generation}, {len(state.members)} member(s))")
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
            table.add_row(
                topic, str(p.partition), "-" if committed is None else str(committed), str(p.end_offset), str(lag), owner
            )
    out.print(table)


# -- check / bench ------------------------------------------------------------------------------


@cli.command()
@click.argument("topics_", metavar="[TOPIC]...", nargs=-1)
@click.pass_context
def check(ctx: click.Context, topics_: tuple[str, ...]) -> None:
    """Verify the CRC of every record of every segment; exit 1 naming the first corrupt one."""
    admin = Admin(_root(ctx))
    names = list(topics_) or admin.list_topics()
    total_records = 0
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(), console=err, transient=False
    ) as progress:
        for topic in names:
            desc = admin.describe_topic(topic)
            for p in desc.partitions:
                task = progress.add_task(f"{topic}[{p.partition}]", total=max(p.size_bytes, 1))
                with admin.open_partition(topic, p.partition, maintenance_interval=0) as ch:
                    total_records += ch.check(
                        progress=lambda done, total, task=task: progress.update(task, completed=done, total=total)
                    )
                progress.update(task, completed=progress.tasks[task].total)
    out.print(f"ok: {total_records:,} records in {len(names)} topic(s), every CRC matches")


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
        cli.main(args=argv, prog_name="filechannel", standalone_mode=False)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(1)
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
    except BrokenPipeError:
        sys.stderr.close()
        sys.exit(0)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
