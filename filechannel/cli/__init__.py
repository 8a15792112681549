"""The ``filechannel`` command: topics, configs, delete-records, produce, consume, groups, check, bench, tier.

Every command takes ``--root`` (or ``FILECHANNEL_ROOT``). Bad input gets one clear line
on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import sys

import click

from ..errors import FileChannelError
from . import admin, configs, groups, records, tier, topics  # noqa: F401  (each registers its commands on cli)
from .common import cli, err, silence_closed_output

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: our errors become one line on stderr, exit 1."""
    try:
        code = cli.main(args=argv, prog_name="filechannel", standalone_mode=False)
        if isinstance(code, int) and code:  # ctx.exit(N): click returns N when not standalone
            sys.exit(code)
    except click.exceptions.Abort as exc:  # click's word for Ctrl-C, or for the end of input at a prompt
        err.print("aborted")
        sys.exit(130 if isinstance(exc.__context__, KeyboardInterrupt) else 1)
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
        silence_closed_output()
        sys.exit(0)
    except KeyboardInterrupt:
        sys.exit(130)
