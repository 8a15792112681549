"""``filechannel topics``: create, list, describe, alter, delete."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.table import Table

from ..client import Admin
from ..client.topics import TopicStore, validate_topic_config
from ..errors import TopicExistsError
from ..tiering.bindings import probe_storage
from .common import FORMAT_OPTION, ROOT_OPTION, cli, key_value, one_name, out, print_json, root_folder
from .kafka import tier_options, topic_setting


@cli.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


@topics.command("create")
@ROOT_OPTION
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
@click.option(
    "--tier-option",
    "tier_opts",
    multiple=True,
    metavar="KEY=VALUE",
    help="A tier-2 storage option stored with the topic, e.g. endpoint_url=http://s3:8333 (repeatable; no credentials).",
)
@click.option(
    "--skip-tier-check", is_flag=True, help="Do not reach the tier-2 storage now (by default: read, write and delete a probe)."
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
    tier_opts: tuple[str, ...],
    skip_tier_check: bool,
    replication_factor: int | None,
    if_not_exists: bool,
    bootstrap_server: str | None,
) -> None:
    """Create topic NAME (or --topic NAME).

    A topic with a tier (``-c tier=s3://bucket/prefix``) has its storage reached once first,
    unless --skip-tier-check: a bucket that is missing, unreachable or not writable fails
    the command, and no topic is made.
    """
    name = one_name("topic", name, topic_opt)
    config: dict[str, Any] = {}
    for item in settings:
        key, value = key_value(item, "--config")
        setting = topic_setting(key, value)
        if setting is None:
            click.echo(f"note: topic config {key} means nothing on one machine; ignored", err=True)
        else:
            config[setting[0]] = setting[1]
    if tier_opts:
        config["tier_options"] = {**(config.get("tier_options") or {}), **tier_options(tier_opts)}
    config = validate_topic_config(config)  # before the probe: credentials in tier_options are refused unsent
    if config.get("tier") is not None and not skip_tier_check:
        probe_storage(config["tier"], config.get("tier_options"))
    admin = Admin(root_folder(ctx, must_exist=False))
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
@ROOT_OPTION
@FORMAT_OPTION
@click.pass_context
def topics_list(ctx: click.Context, fmt: str) -> None:
    """List the topics (json: {"topic", "partitions"} per line)."""
    store = TopicStore(root_folder(ctx))
    for name in store.list():
        if fmt == "json":
            print_json({"topic": name, "partitions": store.partitions(name)})
        else:
            click.echo(name)


@topics.command("describe")
@ROOT_OPTION
@click.argument("names", nargs=-1)
@click.option("--topic", "topic_opts", multiple=True, help="A topic to describe (Kafka's flag; repeatable).")
@FORMAT_OPTION
@click.pass_context
def topics_describe(ctx: click.Context, names: tuple[str, ...], topic_opts: tuple[str, ...], fmt: str) -> None:
    """Show each topic's partitions (first and end offsets, records, bytes on disk) and settings: the
    topics NAMES (or --topic), every topic if none is named (as kafka-topics --describe).

    json: one object per topic and line, {"topic", "partitions": [{"partition",
    "first_offset", "end_offset", "records", "size_bytes"}], "config": {setting: value}}
    (config: the settings set on the topic; the others have their defaults).
    """
    admin = Admin(root_folder(ctx))
    for name in [*names, *topic_opts] or admin.list_topics():
        desc = admin.describe_topic(name)
        if fmt == "json":
            partitions = [
                {
                    "partition": p.partition,
                    "first_offset": p.first_offset,
                    "end_offset": p.end_offset,
                    "records": p.records,
                    "size_bytes": p.size_bytes,
                }
                for p in desc.partitions
            ]
            print_json({"topic": name, "partitions": partitions, "config": dict(sorted(desc.config.items()))})
            continue
        table = Table(title=f"topic {name}")
        for col in ("partition", "first offset", "end offset", "records", "bytes on disk"):
            table.add_column(col, justify="right")
        for p in desc.partitions:
            table.add_row(str(p.partition), str(p.first_offset), str(p.end_offset), str(p.records), f"{p.size_bytes:,}")
        out.print(table)
        out.print("settings: " + (", ".join(f"{k}={v}" for k, v in sorted(desc.config.items())) or "defaults"))


@topics.command("alter")
@ROOT_OPTION
@click.argument("name", required=False)
@click.option("--topic", "topic_opt", default=None, help="The topic's name (Kafka's flag; same as NAME).")
@click.option("--partitions", "-p", required=True, type=click.IntRange(1, 10_000), help="The partition count it grows to.")
@click.option("--bootstrap-server", hidden=True, help="Accepted and ignored (no broker).")
@click.pass_context
def topics_alter(
    ctx: click.Context, name: str | None, topic_opt: str | None, partitions: int, bootstrap_server: str | None
) -> None:
    """Add partitions to topic NAME (or --topic NAME), as kafka-topics --alter --partitions.

    Partitions are never removed (fewer than it has fails). The existing ones keep their
    records; keyed records go to other partitions from now on (a key's partition is its hash
    modulo the count), as in Kafka. Open producers and consumers see the new ones within a
    second. Its settings change with `filechannel configs --alter`.
    """
    name = one_name("topic", name, topic_opt)
    Admin(root_folder(ctx)).add_partitions(name, partitions)
    out.print(f"topic {name} now has {partitions} partition(s)")


@topics.command("delete")
@ROOT_OPTION
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def topics_delete(ctx: click.Context, name: str, yes: bool) -> None:
    """Delete topic NAME and all its records."""
    admin = Admin(root_folder(ctx))
    if not yes:
        if not sys.stdin.isatty():  # a script: nobody to ask, so it must have said so
            raise click.UsageError(f"stdin is not a terminal, so nobody can confirm: pass --yes to delete topic {name}")
        click.confirm(f"delete topic {name} and all its records?", abort=True)
    admin.delete_topic(name)
    out.print(f"deleted topic {name}")
