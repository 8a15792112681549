"""``filechannel tier``: the tiering daemon (``run``) and its ``status``."""

from __future__ import annotations

import json
import signal
import sys
from datetime import datetime

import click
from rich.table import Table

from .common import cli, out, root_folder


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

    from ..tiering.daemon import TieringDaemon

    root = tier_root or root_folder(ctx)

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
    from ..tiering.daemon import tier_status

    rows = tier_status(tier_root or root_folder(ctx))
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
