"""What every command shares: the top-level group, --root, the consoles, and the quiet end of a closed pipe."""

from __future__ import annotations

import json
import math
import os
import select
import stat
import sys
from datetime import datetime
from typing import Any

import click
from rich.console import Console

from .. import __version__, native_extensions
from ..engine.clock import datetime_ms
from ..engine.files import opened
from ..errors import ConfigError


class _Console(Console):
    """rich's console, except that a closed pipe is left to the command (rich exits 1 on it)."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError("the reader of the output has gone")


# In a pipe, rich would cut tables to 80 columns (or $COLUMNS): a table there is as wide as its content.
_PIPE_WIDTH = None if sys.stdout.isatty() else 1000
out = _Console(width=_PIPE_WIDTH)
err = _Console(stderr=True)


def silence_closed_output() -> None:
    """After a reader closed our stdout (``| head -1``): point stdout and stderr at /dev/null,
    so the interpreter's last flush of what is still buffered cannot fail with a second
    "Exception ignored ... BrokenPipeError" line; the command then ends with exit 0."""
    with opened(os.devnull, os.O_WRONLY) as devnull:
        for fd in (1, 2):
            os.dup2(devnull, fd)


def stdout_reader_gone() -> bool:
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


class CliGroup(click.Group):
    """The top-level group: a closed stdout ends any command quietly with exit 0, as tools in a
    pipeline do (click itself would exit 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            if not stdout_reader_gone():  # another pipe or socket (tier-2's connection) broke: an error
                raise click.ClickException(f"a pipe or connection broke: {exc}") from exc
            silence_closed_output()
            raise click.exceptions.Exit(0) from None


def root_folder(ctx: click.Context, must_exist: bool = True) -> str:
    """The root folder; one that does not exist is an error unless the command is one that
    creates it (``topics create``, ``produce``, ``config``): a reader never makes a root."""
    root: str | None = ctx.obj["root"]
    if not root:
        raise click.UsageError("no root folder: pass --root PATH or set FILECHANNEL_ROOT")
    if must_exist and not os.path.isdir(root):
        raise click.ClickException(
            f"the root folder {os.path.abspath(root)!r} does not exist: check --root or FILECHANNEL_ROOT "
            "(a root is made by its first `filechannel topics create` or `produce`)"
        )
    return root


def key_value(item: str, option: str) -> tuple[str, str]:
    """``KEY=VALUE`` given to ``option`` as (key, value), stripped; a usage error if it is not that."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=option)
    return key.strip(), value.strip()


def one_name(what: str, argument: str | None, option: str | None) -> str:
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
ROOT_OPTION = click.option(
    "--root",
    type=click.Path(file_okay=False),
    expose_value=False,
    is_eager=True,
    callback=_store_root,
    help="Folder holding the topics (also before the command) [env: FILECHANNEL_ROOT].",
)


# --format of the commands that describe things (topics list|describe, groups list|describe).
FORMAT_OPTION = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: for people (a table on a terminal); json: one JSON object per line, the same keys every time, "
    "whole numbers, for scripts.",
)


def print_json(obj: dict[str, Any]) -> None:
    """One JSON object on one line of stdout (JSON Lines): nothing a terminal width could cut."""
    click.echo(json.dumps(obj, ensure_ascii=False))


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``filechannel 0.1.0 (native codec: yes, readahead: yes)``: "no" means the pure-Python
    fallback runs (no C compiler at install, or not x86-64 with SSE4.2 for the codec)."""
    if not value or ctx.resilient_parsing:
        return
    native = native_extensions()
    yes = {True: "yes", False: "no"}
    click.echo(f"filechannel {__version__} (native codec: {yes[native['codec']]}, readahead: {yes[native['readahead']]})")
    ctx.exit()


@click.group(cls=CliGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--root",
    envvar="FILECHANNEL_ROOT",
    type=click.Path(file_okay=False),
    help="Folder holding the topics [env: FILECHANNEL_ROOT].",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and whether the C extensions are loaded, and exit.",
)
@click.pass_context
def cli(ctx: click.Context, root: str | None) -> None:
    """filechannel: a durable, file-backed message log with a Kafka-like client."""
    ctx.ensure_object(dict)
    ctx.obj["root"] = root


class BadValue(click.UsageError, ConfigError):
    """A bad option or argument value found past click's own parsing (a property, a setting, a
    time, a plan): exit 2 with one ``error:`` line, as a usage error; still a
    :class:`ConfigError` to code that calls the parsers directly."""

    def __init__(self, message: str) -> None:
        super().__init__(message, click.get_current_context(silent=True))


class Seconds(click.types.FloatParamType):
    """A finite number of seconds >= 0 (``nan`` and ``inf`` refused: an interval of nan made a
    daemon pass in a busy loop)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        seconds: float = super().convert(value, param, ctx)
        if not math.isfinite(seconds) or seconds < 0:
            self.fail(f"{value!r} is not a finite number of seconds >= 0", param, ctx)
        return seconds


SECONDS = Seconds()


def iso_time_ms(text: str) -> int:
    """An ISO 8601 time a user typed (``2026-01-31T12:00:00.000``, a zone optional: local if
    none) as epoch milliseconds; a ValueError saying "not a time like ..." (and why) otherwise."""
    try:
        return datetime_ms(datetime.fromisoformat(text))
    except (ValueError, OverflowError, OSError) as exc:
        raise ValueError(f"not a time like 2026-01-31T12:00:00.000 ({exc})") from None
