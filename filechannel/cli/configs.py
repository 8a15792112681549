"""``filechannel configs`` (kafka-configs for topics) and ``filechannel delete-records`` (kafka-delete-records)."""

from __future__ import annotations

import json
from typing import Any

import click

from ..client import Admin, TopicPartition
from ..client.topic_configs import described_configs, removed_setting
from ..errors import ConfigError
from .common import FORMAT_OPTION, ROOT_OPTION, BadValue, cli, print_json, root_folder
from .kafka import topic_setting


def split_configs(text: str) -> list[str]:
    """kafka-configs' ``--add-config k1=v1,k2=[a,b]``: the items, split at commas outside
    brackets and braces (a list in ``[]``, our JSON ``tier_options={...}``)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


@cli.command("configs")
@ROOT_OPTION
@click.option("--describe", is_flag=True, help="Show the topic's configs (those set on it; --all: every one).")
@click.option("--alter", is_flag=True, help="Change the topic's configs (--add-config, --delete-config).")
@click.option("--entity-type", type=click.Choice(["topics"]), default=None, help="Only topics here (kafka-configs' flag).")
@click.option("--entity-name", default=None, help="The topic.")
@click.option("--topic", "topic_opt", default=None, help="The topic (same as --entity-type topics --entity-name).")
@click.option(
    "--add-config",
    "add_configs",
    multiple=True,
    metavar="K=V[,K=V]",
    help="Set these configs: Kafka's names (retention.ms=3600000, -1: no limit) or ours (retention_ms=3600000).",
)
@click.option("--delete-config", "delete_configs", multiple=True, metavar="K[,K]", help="Return these configs to their defaults.")
@click.option("--all", "show_all", is_flag=True, help="With --describe: every config, the defaults too.")
@FORMAT_OPTION
@click.option("--bootstrap-server", hidden=True, help="Accepted and ignored (no broker).")
@click.pass_context
def configs(
    ctx: click.Context,
    describe: bool,
    alter: bool,
    entity_type: str | None,
    entity_name: str | None,
    topic_opt: str | None,
    add_configs: tuple[str, ...],
    delete_configs: tuple[str, ...],
    show_all: bool,
    fmt: str,
    bootstrap_server: str | None,
) -> None:
    """Describe or alter a topic's configs, as kafka-configs does.

    \b
    filechannel configs --describe --entity-type topics --entity-name T [--all]
    filechannel configs --alter --entity-type topics --entity-name T --add-config retention.ms=60000 --delete-config segment.ms

    Open producers and consumers apply retention and segment settings within about a second;
    the others (compression, fsync, sizes) when a partition is opened again. ``tier`` cannot change.
    json (--describe): {"topic", "configs": {name: value}} (Kafka's names where there are, values as Kafka writes them).
    """
    if describe == alter:
        raise click.UsageError("give one of --describe or --alter")
    if entity_name and topic_opt and entity_name != topic_opt:
        raise click.UsageError(f"two topics given: --entity-name {entity_name!r} and --topic {topic_opt!r}")
    topic = entity_name or topic_opt
    if not topic:
        raise click.UsageError("missing the topic: pass --entity-type topics --entity-name TOPIC (or --topic TOPIC)")
    admin = Admin(root_folder(ctx))
    if alter:
        if not add_configs and not delete_configs:
            raise click.UsageError("--alter needs --add-config K=V or --delete-config K")
        changes: dict[str, Any] = {}
        for text in add_configs:
            for item in split_configs(text):
                key, sep, raw = item.partition("=")
                if not sep or not key.strip():
                    raise BadValue(f"--add-config: {item!r} is not KEY=VALUE")
                setting = topic_setting(key.strip(), raw.strip())
                if setting is None:
                    click.echo(f"note: topic config {key.strip()} means nothing on one machine; ignored", err=True)
                else:
                    changes[setting[0]] = setting[1]
        removed = []
        for text in delete_configs:
            for key in split_configs(text):
                try:
                    setting_name = removed_setting(key)
                except ConfigError as exc:
                    raise BadValue(str(exc)) from None
                if setting_name is not None:
                    removed.append(setting_name)
        admin.alter_topic(topic, changes, removed)
        click.echo(f"Completed updating config for topic {topic}.")
        return
    described = described_configs(admin.describe_topic(topic).config)
    shown = {k: v["value"] for k, v in described.items() if show_all or not v["is_default"]}
    if fmt == "json":
        print_json({"topic": topic, "configs": shown})
        return
    click.echo(f"{'All' if show_all else 'Dynamic'} configs for topic {topic} are:")
    for name, value in shown.items():
        click.echo(f"  {name}={'null' if value is None else value}")


@cli.command("delete-records")
@ROOT_OPTION
@click.option(
    "--offset-json-file",
    type=click.File("r"),
    required=True,
    help='kafka-delete-records\' JSON: {"partitions": [{"topic": "t", "partition": 0, "offset": 3}], "version": 1} '
    "(offset -1: all records).",
)
@click.option("--bootstrap-server", hidden=True, help="Accepted and ignored (no broker).")
@click.pass_context
def delete_records(ctx: click.Context, offset_json_file: Any, bootstrap_server: str | None) -> None:
    """Delete each partition's records below its offset, as kafka-delete-records does.

    Consumers positioned below it start again by their auto_offset_reset; whole segments below
    it are deleted now (with a tier, by the tiering daemon). It cannot be undone.
    """
    plan = parse_offset_json(offset_json_file.read(), offset_json_file.name)
    admin = Admin(root_folder(ctx))
    for tp in plan:  # every partition checked before any record goes
        count = len(admin.describe_topic(tp.topic).partitions)
        if tp.partition >= count:
            raise click.ClickException(f"topic {tp.topic} has partitions 0 to {count - 1}, not {tp.partition}; nothing deleted")
    click.echo("Executing records delete operation")
    lows = {tp: admin.delete_records_before(tp.topic, tp.partition, offset) for tp, offset in plan.items()}
    click.echo("Records delete operation completed:")
    for tp, low in lows.items():
        click.echo(f"partition: {tp.topic}-{tp.partition}\tlow_watermark: {low}")


def parse_offset_json(text: str, source: str) -> dict[TopicPartition, int]:
    """The partitions and offsets of a kafka-delete-records ``--offset-json-file`` (BadValue if it is not one)."""
    try:
        data = json.loads(text)
        entries = data["partitions"]
        if not isinstance(entries, list) or not entries:
            raise ValueError('"partitions" is not a list of at least one partition')
        plan: dict[TopicPartition, int] = {}
        for entry in entries:
            topic, partition, offset = entry["topic"], entry["partition"], entry["offset"]
            if not isinstance(topic, str) or not all(isinstance(v, int) and not isinstance(v, bool) for v in (partition, offset)):
                raise ValueError(f"{entry!r}: topic must be a string, partition and offset integers")
            if partition < 0 or offset < -1:
                raise ValueError(f"{entry!r}: partition must be >= 0 and offset >= -1")
            plan[TopicPartition(topic, partition)] = offset
    except (ValueError, KeyError, TypeError) as exc:
        raise BadValue(
            f"--offset-json-file {source}: not kafka-delete-records' format ({exc}); expected "
            '{"partitions": [{"topic": "t", "partition": 0, "offset": 3}], "version": 1}'
        ) from None
    return plan
