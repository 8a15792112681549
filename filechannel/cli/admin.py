"""Root-wide commands: ``config`` (root settings), ``check``, ``bench``, ``repair``."""

from __future__ import annotations

import difflib
import os
from typing import TYPE_CHECKING

import click

from ..client import Admin
from ..client.topics import ROOT_SETTINGS
from ..engine.verify import DamagedRange
from ..errors import InvalidNameError
from ..root import ORIGIN_SETTING, validate_origin
from .common import ROOT_OPTION, BadValue, cli, err, out, root_folder

if TYPE_CHECKING:
    from rich.progress import TaskID

# -- root settings ------------------------------------------------------------------------------


@cli.command("config")
@ROOT_OPTION
@click.argument("settings", nargs=-1, metavar="[NAME=VALUE]...")
@click.pass_context
def root_config(ctx: click.Context, settings: tuple[str, ...]) -> None:
    """Show the root's settings, or set them (stored in ROOT/.settings.json; the origin in ROOT/.tier/origin.json).

    auto.create.topics.enable (default true, as Kafka's broker setting): whether a send to a
    missing topic (`filechannel produce`, a Producer) creates it with one partition.

    tier.origin (default none): the root's origin in tier-2; its tiered topics keep their objects
    under <tier-url>/<origin>/, so many roots can tier into one bucket URL. Set it before the
    root's first tiered topic; shown only once set.
    """
    admin = Admin(root_folder(ctx, must_exist=bool(not settings)))
    for name, value in [_root_setting(item) for item in settings]:  # all checked before any is stored
        if isinstance(value, str):
            admin.set_origin(value)
        else:
            admin.set_root_setting(name, value)
    for name, value in admin.root_settings().items():
        click.echo(f"{name}={str(value).lower()}")
    origin = admin.origin()
    if origin is not None:
        click.echo(f"{ORIGIN_SETTING}={origin}")


def _root_setting(item: str) -> tuple[str, bool | str]:
    """``NAME=true|false`` as (name, value), or ``tier.origin=NAME`` as (name, the name checked); an
    unknown name or a value the setting does not take is a usage error (exit 2) naming the
    closest known setting and every known one."""
    name, sep, raw = (part.strip() for part in item.partition("="))
    known = [*ROOT_SETTINGS, ORIGIN_SETTING]
    if name not in known:
        closest = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {closest[0]}? " if closest else ""
        raise BadValue(f"unknown root setting {name!r} in {item!r}: {hint}known: {', '.join(known)}")
    if name == ORIGIN_SETTING:
        try:
            return name, validate_origin(raw)
        except InvalidNameError as exc:
            raise BadValue(f"{item!r}: {exc}") from None
    if not sep or raw.lower() not in ("true", "false"):
        raise BadValue(f"{item!r}: {name} takes true or false, as {name}=true")
    return name, raw.lower() == "true"


# -- check / bench ------------------------------------------------------------------------------


@cli.command()
@ROOT_OPTION
@click.argument("topics_", metavar="[TOPIC]...", nargs=-1)
@click.pass_context
def check(ctx: click.Context, topics_: tuple[str, ...]) -> None:
    """Verify the CRC of every record of every segment; changes no file.

    Every damaged range is listed on stderr (the file and byte or block, the offsets it
    makes unreadable, the first readable offset after it), then the exit code is 1.
    """
    from .progress import byte_progress

    admin = Admin(root_folder(ctx))
    damaged = 0
    names = list(topics_) or admin.list_topics()
    total_records = 0
    with byte_progress(shown=bool(names)) as progress:
        for topic in names:
            desc = admin.describe_topic(topic)
            for p in desc.partitions:
                task = progress.add_task(f"{topic}[{p.partition}]", total=max(p.size_bytes, 1))
                found: list[DamagedRange] = []

                def show(done: int, total: int, task: TaskID = task) -> None:
                    progress.update(task, completed=done, total=total)

                with admin.open_partition(topic, p.partition, read_only=True) as ch:
                    total_records += ch.check(progress=show, on_damage=found.append)
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


@cli.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Benchmark filechannel against its peers.

    The options are the harness's: see `filechannel bench --help`.
    """
    # The harness (filechannel.bench, shipped in the package) is imported only here, when the
    # command runs: its options, --help included, are its own click command's, run in this process.
    from ..bench.harness import command

    with command.make_context("bench", list(ctx.args), parent=ctx.parent) as harness:
        command.invoke(harness)


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
    from ..channel import FileChannel
    from ..engine.names import parse_segment_file

    if not os.path.isdir(path) or not any(parse_segment_file(f) for f in os.listdir(path)):
        raise click.ClickException(f"{path!r} is not a channel folder (no segment files in it)")
    with FileChannel(path, maintenance_interval=0) as ch:
        if not yes:
            click.confirm(f"keep the records of {ch.path} up to offset {after} and delete every later one?", abort=True, err=True)
        ch.repair(after)
        out.print(f"repaired: {ch.path} now ends after offset {ch.end_offset - 1}; sends go on from {ch.end_offset}")
