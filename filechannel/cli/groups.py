"""``filechannel groups``: list, describe, reset-offsets, delete (also as kafka-consumer-groups' --list, --describe, --delete)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from ..client import Admin, TopicPartition
from ..client.group import (
    GroupState,
    delete_group,
    delete_offsets,
    list_groups,
    live_members,
    read_group,
    require_inactive,
    tp_key,
)
from ..engine.clock import now_ms
from ..errors import FileChannelError
from .common import FORMAT_OPTION, ROOT_OPTION, cli, one_name, out, print_json, root_folder
from .kafka import (
    Reset,
    check_partitions,
    execute_reset,
    offsets_scope,
    parse_datetime,
    parse_duration,
    parse_reset_file,
    plan_reset,
    reset_scope,
)

if TYPE_CHECKING:
    from rich.console import JustifyMethod


@cli.group(invoke_without_command=True)
@ROOT_OPTION
@click.option("--list", "list_", is_flag=True, help="List the groups (kafka-consumer-groups' flag; same as `groups list`).")
@click.option("--describe", is_flag=True, help="Describe --group G (or --all-groups) (same as `groups describe`).")
@click.option("--delete", is_flag=True, help="Delete --group G (same as `groups delete`).")
@click.option("--group", "group_opts", multiple=True, help="The group of --describe or --delete (repeatable).")
@click.option("--all-groups", is_flag=True, help="With --describe: every group.")
@FORMAT_OPTION
@click.option("--bootstrap-server", hidden=True, help="Accepted and ignored (no broker).")
@click.pass_context
def groups(
    ctx: click.Context,
    list_: bool,
    describe: bool,
    delete: bool,
    group_opts: tuple[str, ...],
    all_groups: bool,
    fmt: str,
    bootstrap_server: str | None,
) -> None:
    """List, describe and delete consumer groups; reset their offsets.

    Also as kafka-consumer-groups spells it: ``groups --list``, ``groups --describe --group G``
    (or ``--all-groups``), ``groups --delete --group G``.
    """
    flags = [name for name, on in (("--list", list_), ("--describe", describe), ("--delete", delete)) if on]
    if ctx.invoked_subcommand is not None:
        if flags or group_opts or all_groups:
            raise click.UsageError(f"give either the command {ctx.invoked_subcommand} or kafka-consumer-groups' flags, not both")
        return
    if len(flags) != 1:
        raise click.UsageError(
            "give a command (list, describe, reset-offsets, delete, delete-offsets) or one of --list, --describe, --delete"
        )
    if list_:
        ctx.invoke(groups_list, fmt=fmt)
    elif describe:
        ctx.invoke(groups_describe, names=(), group_opts=group_opts, all_groups=all_groups, fmt=fmt)
    else:
        if not group_opts:
            raise click.UsageError("--delete needs --group GROUP")
        for group in group_opts:
            ctx.invoke(groups_delete, group=None, group_opt=group, bootstrap_server=None)


@groups.command("list")
@ROOT_OPTION
@FORMAT_OPTION
@click.pass_context
def groups_list(ctx: click.Context, fmt: str) -> None:
    """List the consumer groups (json: {"group"} per line)."""
    for g in list_groups(root_folder(ctx)):
        if fmt == "json":
            print_json({"group": g})
        else:
            click.echo(g)


@groups.command("describe")
@ROOT_OPTION
@click.argument("names", nargs=-1)
@click.option("--group", "group_opts", multiple=True, help="A group to describe (Kafka's flag; repeatable).")
@click.option("--all-groups", is_flag=True, help="Describe every group.")
@FORMAT_OPTION
@click.pass_context
def groups_describe(ctx: click.Context, names: tuple[str, ...], group_opts: tuple[str, ...], all_groups: bool, fmt: str) -> None:
    """Show each group's live members and, per partition, its committed offset, end offset, lag
    and owner: the groups NAMES (or --group), or --all-groups.

    Only members whose process is alive are shown: the group's state keeps a killed member
    until a live one next polls, and a partition such a member owned says its owner is gone.

    json: one object per group and line, {"group", "generation", "members": [{"member",
    "pid", "topics"}], "partitions": [{"topic", "partition", "committed", "end_offset", "lag",
    "owner", "owner_pid", "owner_alive"}]} (committed, lag, owner, owner_pid: null when there is none).
    """
    root = root_folder(ctx)
    chosen = [*names, *group_opts]
    if bool(chosen) == all_groups:
        raise click.UsageError("name the groups to describe (GROUP or --group GROUP) or pass --all-groups")
    for group in list_groups(root) if all_groups else chosen:
        _describe_group(root, group, fmt)


def _describe_group(root: str, group: str, fmt: str) -> None:
    """One group's description: a JSON line, or its members, a table and lines for gone owners."""
    state, offsets = read_group(root, group)
    live = set(live_members(root, group))
    admin = Admin(root)
    rows = _partition_rows(admin, state, offsets, live)
    if fmt == "json":
        members = [
            {"member": m, "pid": state.members[m].get("pid"), "topics": list(state.members[m].get("topics", []))}
            for m in sorted(live)
        ]
        print_json({"group": group, "generation": state.generation, "members": members, "partitions": rows})
        return
    for member in sorted(live):
        info = state.members[member]
        out.print(f"member {member}: pid {info.get('pid', '?')}, topics {', '.join(info.get('topics', [])) or '-'}")
    table = Table(title=f"group {group} (generation {state.generation}, {len(live)} live member(s))")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("topic", "left"),
        ("partition", "right"),
        ("committed", "right"),
        ("end offset", "right"),
        ("lag", "right"),
        ("owner", "left"),
    )
    for col, just in columns:
        table.add_column(col, justify=just)
    orphans: list[str] = []
    for row in rows:
        owner = row["owner"] or ""
        if owner and not row["owner_alive"]:  # killed: a live member's next poll takes the partition over
            orphans.append(
                f"{row['topic']}[{row['partition']}]: its owner (pid {row['owner_pid'] or '?'}) is gone; "
                "a live member's next poll takes it over"
            )
            owner = f"gone (pid {row['owner_pid'] or '?'})"
        committed = row["committed"]
        table.add_row(
            row["topic"],
            str(row["partition"]),
            "-" if committed is None else str(committed),
            str(row["end_offset"]),
            "-" if row["lag"] is None else str(row["lag"]),
            owner,
        )
    out.print(table)
    for line in orphans:  # plain lines: rich would wrap them at the width of a terminal it does not have
        click.echo(line)


def _partition_rows(admin: Admin, state: GroupState, offsets: dict[TopicPartition, int], live: set[str]) -> list[dict[str, Any]]:
    """Per partition of the group's topics: its committed offset, end, lag (None when nothing
    is committed, as Kafka shows ``-``) and owner, and whether the owner's process lives."""
    rows: list[dict[str, Any]] = []
    for topic in sorted({tp.topic for tp in offsets} | set(state.partitions)):
        try:
            desc = admin.describe_topic(topic)
        except FileChannelError:  # deleted since the group read it
            continue
        for p in desc.partitions:
            committed = offsets.get(TopicPartition(topic, p.partition))
            owner = state.owners.get(tp_key(TopicPartition(topic, p.partition))) or None
            rows.append(
                {
                    "topic": topic,
                    "partition": p.partition,
                    "committed": committed,
                    "end_offset": p.end_offset,
                    "lag": None if committed is None else p.end_offset - committed,
                    "owner": owner,
                    "owner_pid": state.members.get(owner, {}).get("pid") if owner else None,
                    "owner_alive": owner in live if owner else None,
                }
            )
    return rows


@groups.command("reset-offsets")
@ROOT_OPTION
@click.argument("group", required=False)
@click.option("--group", "group_opt", default=None, help="The group (Kafka's flag; same as GROUP).")
@click.option("--topic", "topics_", multiple=True, metavar="TOPIC[:P,...]", help="Reset these partitions (repeatable).")
@click.option("--all-topics", is_flag=True, help="Reset every partition of the topics the group has offsets for.")
@click.option("--to-earliest", is_flag=True, help="To the first offset of each partition.")
@click.option("--to-latest", is_flag=True, help="To the end of each partition.")
@click.option("--to-offset", type=click.IntRange(0), default=None, help="To this offset (clamped to the partition).")
@click.option("--to-datetime", default=None, help="To the first record at or after this ISO time (e.g. 2026-01-31T12:00:00.000).")
@click.option(
    "--by-duration",
    default=None,
    metavar="PnDTnHnMnS",
    help="To the first record at or after now minus this duration (Kafka's format: PT15M, P1DT2H).",
)
@click.option("--shift-by", type=int, default=None, help="Move the committed offsets by N (may be negative).")
@click.option(
    "--from-file",
    type=click.File("r"),
    default=None,
    metavar="CSV",
    help="To the offsets in this CSV file: topic,partition,offset lines (or group,topic,partition,offset), as --export writes.",
)
@click.option("--to-current", is_flag=True, help="To the committed offsets (keep them).")
@click.option("--dry-run", is_flag=True, help="Show the new offsets, change nothing (the default).")
@click.option("--execute", is_flag=True, help="Commit the new offsets.")
@click.option("--export", is_flag=True, help="Print the new offsets as CSV (topic,partition,offset), the input of --from-file.")
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
    by_duration: str | None,
    shift_by: int | None,
    from_file: Any,
    to_current: bool,
    dry_run: bool,
    execute: bool,
    export: bool,
    bootstrap_server: str | None,
) -> None:
    """Reset GROUP's committed offsets, as kafka-consumer-groups --reset-offsets does.

    Only while no member of the group is alive. Offsets outside a partition's records are
    set to its first offset or its end, with a warning. Without --execute nothing changes.
    """
    group = one_name("group", group, group_opt)
    scenarios = [
        Reset("earliest") if to_earliest else None,
        Reset("latest") if to_latest else None,
        Reset("offset", to_offset) if to_offset is not None else None,
        Reset("datetime", parse_datetime(to_datetime)) if to_datetime is not None else None,
        Reset("datetime", now_ms() - parse_duration(by_duration) // timedelta(milliseconds=1)) if by_duration else None,
        Reset("shift", shift_by) if shift_by is not None else None,
        Reset("file", offsets=parse_reset_file(from_file.read(), group, from_file.name)) if from_file is not None else None,
        Reset("current") if to_current else None,
    ]
    chosen = [r for r in scenarios if r is not None]
    if len(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, --by-duration, --shift-by, "
            "--from-file, --to-current"
        )
    if dry_run and execute:
        raise click.UsageError("options --dry-run and --execute cannot be specified together")
    if not dry_run and not execute:
        click.echo("WARN: No action will be performed as the --execute option is missing; showing the new offsets.", err=True)
    root = root_folder(ctx)
    if chosen[0].kind == "file":
        if topics_ or all_topics:
            raise click.UsageError("--from-file takes its partitions from the file: no --topic or --all-topics")
        tps = sorted(chosen[0].offsets)
        check_partitions(root, tps, f"--from-file {from_file.name}")
    else:
        tps = reset_scope(root, group, topics_, all_topics)
    require_inactive(root, group, "offsets can be reset")
    plan = plan_reset(root, group, tps, chosen[0], lambda msg: click.echo(f"WARN: {msg}", err=True))
    if execute:
        execute_reset(root, group, plan)
    if export:
        for tp, off in sorted(plan.items()):
            click.echo(f"{tp.topic},{tp.partition},{off}")
        return
    click.echo(f"{'GROUP':<20} {'TOPIC':<30} {'PARTITION':>9} {'NEW-OFFSET':>12}")
    for tp, off in sorted(plan.items()):
        click.echo(f"{group:<20} {tp.topic:<30} {tp.partition:>9} {off:>12}")


@groups.command("delete")
@ROOT_OPTION
@click.argument("group", required=False)
@click.option("--group", "group_opt", default=None, help="The group (Kafka's flag; same as GROUP).")
@click.option("--bootstrap-server", hidden=True, help="Accepted and ignored (no broker).")
@click.pass_context
def groups_delete(ctx: click.Context, group: str | None, group_opt: str | None, bootstrap_server: str | None) -> None:
    """Delete GROUP and its committed offsets (only while no member of it is alive)."""
    group = one_name("group", group, group_opt)
    delete_group(root_folder(ctx), group)
    click.echo(f"Deletion of requested consumer groups ('{group}') was successful.")


@groups.command("delete-offsets")
@ROOT_OPTION
@click.argument("group", required=False)
@click.option("--group", "group_opt", default=None, help="The group (Kafka's flag; same as GROUP).")
@click.option(
    "--topic",
    "topics_",
    multiple=True,
    required=True,
    metavar="TOPIC[:P,...]",
    help="Forget these partitions' offsets (repeatable).",
)
@click.option("--bootstrap-server", hidden=True, help="Accepted and ignored (no broker).")
@click.pass_context
def groups_delete_offsets(
    ctx: click.Context, group: str | None, group_opt: str | None, topics_: tuple[str, ...], bootstrap_server: str | None
) -> None:
    """Delete GROUP's committed offsets of some partitions, as kafka-consumer-groups --delete-offsets.

    The group then starts those partitions by its auto_offset_reset. Only while no member of
    the group is alive (Kafka also allows it for topics no live member subscribes to). A
    topic deleted since still has its offsets deleted (--topic T: those the group has).
    """
    group = one_name("group", group, group_opt)
    root = root_folder(ctx)
    tps = offsets_scope(root, group, topics_)
    require_inactive(root, group, "offsets can be deleted")
    delete_offsets(root, group, tps)
    click.echo(f"Request succeeded for deleting offsets from group {group}.")
    width = max([15, *(len(tp.topic) for tp in tps)])
    click.echo(f"\n{'TOPIC':<{width}} {'PARTITION':<10} {'STATUS':<15}")
    for tp in tps:
        click.echo(f"{tp.topic:<{width}} {tp.partition:<10} {'Successful':<15}")
