"""``filechannel tier``: the tiering daemon (``run``), its ``status``, and tier-2 upkeep: ``export``,
``import``, ``rebuild``, ``fsck`` and ``defrag``."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from .common import FORMAT_OPTION, ROOT_OPTION, SECONDS, BadValue, cli, err, out, print_json, root_folder

if TYPE_CHECKING:
    from ..tiering.defrag import DefragSettings


@cli.group()
def tier() -> None:
    """Tier-2: the tiering daemon of a root, and what it has uploaded."""


def _defrag_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--merge-below, --target, --garbage-delay (of ``tier run --defrag`` and ``tier defrag``)."""
    for option in reversed(
        [
            click.option(
                "--merge-below",
                default=4 << 20,
                show_default=True,
                type=click.IntRange(1),
                help="Bytes: objects smaller than this are merged.",
            ),
            click.option(
                "--target", default=64 << 20, show_default=True, type=click.IntRange(1), help="Bytes: a merged object's most."
            ),
            click.option(
                "--garbage-delay",
                default=600.0,
                show_default=True,
                type=SECONDS,
                help="Seconds before replaced objects are deleted (readers that planned with them still read).",
            ),
        ]
    ):
        fn = option(fn)
    return fn


def _defrag_settings(merge_below: int, target: int, garbage_delay: float) -> DefragSettings:
    from ..tiering.defrag import DefragSettings

    if target < merge_below:
        raise click.BadParameter(f"--target ({target}) must be at least --merge-below ({merge_below})", param_hint="--target")
    return DefragSettings(merge_below, target, int(garbage_delay * 1000))


@tier.command("run")
@ROOT_OPTION
@click.option("--once", is_flag=True, help="One whole pass over every tiered partition, then exit.")
@click.option("--interval", default=1.0, show_default=True, type=SECONDS, help="Seconds between passes.")
@click.option("--wait", is_flag=True, help="Wait for another daemon of this root to stop, instead of refusing.")
@click.option(
    "--roll",
    is_flag=True,
    help="Seal the active segment of a partition no writer is writing to, so its records move now "
    "(else only segments sealed at segment_bytes or segment_ms move).",
)
@click.option(
    "--idle",
    default=0.0,
    show_default=True,
    type=SECONDS,
    help="With --roll: seal only an active segment not written to for this many seconds.",
)
@click.option("--defrag", is_flag=True, help="Merge small tier-2 objects of partitions with nothing to upload.")
@_defrag_options
@click.pass_context
def tier_run(
    ctx: click.Context,
    once: bool,
    interval: float,
    wait: bool,
    roll: bool,
    idle: float,
    defrag: bool,
    merge_below: int,
    target: int,
    garbage_delay: float,
) -> None:
    """Run the tiering daemon of a root: compress, upload, apply local and total retention.

    One daemon per root. Progress goes to stdout; SIGTERM or SIGINT stops it cleanly after
    the partition it is working on. With --once, exit 0 after one pass, or 1 with one line
    per failure on stderr.

    \b
      filechannel tier run --root /data/fc --once --roll      # move everything written so far
      filechannel tier run --root /data/fc --roll --idle 60   # daemon: quiet partitions move after a minute
    """

    from ..tiering.daemon import TieringDaemon

    root = root_folder(ctx)

    def progress(line: str) -> None:
        click.echo(f"{datetime.now().strftime('%H:%M:%S')} {line}")

    settings = _defrag_settings(merge_below, target, garbage_delay) if defrag else None
    roll_idle_ms = int(idle * 1000) if roll else None
    daemon = TieringDaemon(root, wait=wait, interval=interval, progress=progress, defrag=settings, roll_idle_ms=roll_idle_ms)

    caught: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        progress(f"{signal.Signals(signum).name}: stopping after the current partition")
        caught.append(signum)
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
    _exit_on_errors(report.failures)
    if caught:
        ctx.exit(128 + caught[0])  # 130 after Ctrl-C, 143 after SIGTERM, as a shell reports a stopped command


@tier.command("status")
@ROOT_OPTION
@FORMAT_OPTION
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as --format json.")
@click.pass_context
def tier_status_cmd(ctx: click.Context, fmt: str, as_json: bool) -> None:
    """Per tiered partition: the offsets in each tier, segments and bytes, what waits, the last error.

    "waiting" are sealed segments not uploaded yet; "active" the records of the segment being
    written, which moves once it is sealed (at segment_bytes, by a send once it is
    segment_ms old, or by `tier run --roll` once no writer is writing to it); "lag" every local offset not in tier-2 yet.
    """
    from ..tiering.status import tier_status

    rows = tier_status(root_folder(ctx))
    if as_json or fmt == "json":
        for row in rows:
            print_json(row.as_dict())
        return
    if not rows:
        out.print("no tiered topic under this root (a topic is tiered by its tier setting: -c tier=URL)")
        return
    table = Table("partition", "local offsets", "local", "tier-2 offsets", "tier-2", "waiting", "active", "lag", "last error")
    for r in rows:
        tier_offsets = "-" if r.tier_first_offset is None else f"{r.tier_first_offset}-{r.tier_end_offset}"
        objects = f", {r.tier_objects / r.uploaded_segments:.1f} objects/segment" if r.uploaded_segments else ""
        table.add_row(
            r.partition,
            f"{r.local_first_offset}-{r.local_end_offset}",
            f"{r.local_segments} segments, {r.local_bytes} bytes",
            tier_offsets,
            f"{r.uploaded_segments} segments, {r.tier_bytes} bytes{objects}",
            f"{r.waiting_segments} ({r.waiting_bytes} bytes)",
            str(r.active_offsets),
            str(r.upload_lag_offsets),
            r.last_error or "",
        )
    out.print(table)


def _tier_options(value: str | None) -> dict[str, Any] | None:
    """``--tier-options`` as a dict (None if not given); a bad value is one usage line."""
    if value is None:
        return None
    try:
        options = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc})", param_hint="--tier-options") from None
    if not isinstance(options, dict):
        raise click.BadParameter('must be a JSON object, e.g. {"endpoint_url": "http://host:8333"}', param_hint="--tier-options")
    return options


def _check_tier(url: str, options: dict[str, Any] | None) -> None:
    """``--tier URL`` with its options opens a storage (no request yet): a URL naming none, an
    unknown option or a missing library is a usage error (exit 2), before anything is done."""
    from ..errors import ConfigError
    from ..tiering.bindings import check_storage

    try:
        check_storage(url, options)
    except ConfigError as exc:
        raise BadValue(f"--tier {url}: {exc}") from None


_TIER_OPTIONS = click.option(
    "--tier-options",
    "tier_options",
    metavar="JSON",
    help='Storage options as a JSON object, e.g. \'{"endpoint_url": "http://host:8333"}\' (credentials: environment).',
)


def _progress_line(line: str) -> None:
    err.print(f"[dim]{datetime.now().strftime('%H:%M:%S')}[/dim] {line}", soft_wrap=True, highlight=False)


def _exit_on_errors(lines: list[str]) -> None:
    """One "error: ..." line on stderr for each of ``lines``, then exit 1 if there was any."""
    for line in lines:
        click.echo(f"error: {line}", err=True)
    if lines:
        sys.exit(1)


def _root_storages(root: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """The distinct storages of the root's tiered topics: URL -> (URL, options)."""
    from ..tiering.partitions import tiered_partitions

    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for part in tiered_partitions(root):
        assert part.config.tier is not None
        found.setdefault(part.config.tier, (part.config.tier, dict(part.config.tier_options or {})))
    return found


def _metadata_path(root: str) -> str:
    from ..root import ROOT_METADATA

    path = os.path.join(root, ROOT_METADATA)
    if not os.path.exists(path):
        raise click.ClickException(f"there is no tier metadata under {os.path.abspath(root)!r} ({path} is missing)")
    return path


@tier.command("export")
@ROOT_OPTION
@click.option("--topic", help="Export this topic's segments only (default: the whole root).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the export to this file.")
@click.option("--to-tier", is_flag=True, help="Write it to tier-2 too, as .exports/TIME.EEPOCH.export (what rebuild reads).")
@click.pass_context
def tier_export(ctx: click.Context, topic: str | None, output: str | None, to_tier: bool) -> None:
    """Export the tier-2 metadata (one consistent snapshot) and the groups' committed offsets.

    \b
      filechannel tier export --root /data/fc -o /backup/tier.export
      filechannel tier export --root /data/fc --to-tier
    """
    from ..client.group import group_offsets
    from ..tiering.bindings import open_storage
    from ..tiering.export import encode_export, export_object_name, take_export, write_export_file
    from ..tiering.metadata import TierMetadata
    from .progress import rates

    if not output and not to_tier:
        raise click.UsageError("say where to write the export: --output FILE and/or --to-tier")
    root = root_folder(ctx)
    started = time.monotonic()
    with TierMetadata(_metadata_path(root)) as metadata:
        export = take_export(metadata, topic=topic)
    export = dataclasses.replace(export, groups=group_offsets(root, topic))  # read after the metadata
    if output:
        write_export_file(export, output)
        _progress_line(f"wrote {output}")
    if to_tier:
        storages = _root_storages(root)
        if not storages:
            raise click.ClickException(f"no tiered topic under {os.path.abspath(root)!r}: nowhere in tier-2 to write to")
        name = export_object_name(export)
        for url, options in storages.values():
            with open_storage(url, **options) as storage:
                storage.write(name, encode_export(export))
            _progress_line(f"wrote {url.rstrip('/')}/{name}")
    groups = sum(len(g) for g in export.groups.values())
    out.print(
        f"exported {len(export.segments)} segment(s), epoch {export.epoch}, {len(export.groups)} group(s) "
        f"({groups} committed offset(s)) {rates(len(export.segments), 'segments', time.monotonic() - started)}",
        highlight=False,
        soft_wrap=True,
    )


@tier.command("import")
@ROOT_OPTION
@click.argument("source", required=False, type=click.Path(dir_okay=False))
@click.option("--from-tier", is_flag=True, help="Import the newest export found in tier-2 (.exports/) instead of a file.")
@click.option("--tier", "tier_url", metavar="URL", help="The storage to check against (default: the root's tiered topics').")
@_TIER_OPTIONS
@click.pass_context
def tier_import(
    ctx: click.Context,
    source: str | None,
    from_tier: bool,
    tier_url: str | None,
    tier_options: str | None,
) -> None:
    """Load an export into a root that has no tier metadata yet, after checking it against the bucket.

    \b
      filechannel tier import /backup/tier.export --root /data/fc
      filechannel tier import --from-tier --root /data/fc --tier s3://bucket/fc
    """
    from ..client.group import restore_groups
    from ..root import ROOT_METADATA, ROOT_TIER_DIR
    from ..tiering.bindings import open_storage
    from ..tiering.daemon_lock import exclusive
    from ..tiering.export import import_export, newest_export, read_export_file
    from ..tiering.metadata import TierMetadata
    from .progress import rates

    if bool(source) == from_tier:
        raise click.UsageError("give either an export FILE or --from-tier")
    root = root_folder(ctx)
    started = time.monotonic()
    options = _tier_options(tier_options)
    export = read_export_file(source) if source else None  # a missing or damaged file first: nothing else matters then
    if tier_url is None:
        storages = list(_root_storages(root).values())
        if len(storages) != 1:
            raise click.UsageError(
                f"the root's tiered topics use {len(storages)} storages: say which one with --tier URL"
                if storages
                else "the root has no tiered topic: say which storage with --tier URL"
            )
        tier_url, stored = storages[0]
        options = stored if options is None else options
    else:
        _check_tier(tier_url, options)
    with open_storage(tier_url, **(options or {})) as storage:
        if export is None:
            export = newest_export(storage)
            if export is None:
                raise click.ClickException(f"there is no export in {tier_url} (.exports/ is empty)")
        _progress_line(f"checking {len(export.segments)} segment(s) against {tier_url}")
        listing = storage.list("")
    with exclusive(os.path.join(root, ROOT_TIER_DIR), "import"), TierMetadata(os.path.join(root, ROOT_METADATA)) as metadata:
        import_export(export, metadata, listing)
        lines = restore_groups(root, export.groups)
    for line in lines:
        _progress_line(line)
    took = rates(len(export.segments), "segments", time.monotonic() - started)
    out.print(f"imported {len(export.segments)} segment(s), epoch {export.epoch} {took}", highlight=False, soft_wrap=True)


@tier.command("rebuild")
@click.option(
    "--root",
    "new_root",
    required=True,
    type=click.Path(file_okay=False),
    help="The new root (absent or empty); with --refresh, the replica.",
)
@click.option("--tier", "tier_url", metavar="URL", help="The storage holding the root's tier-2 copy.")
@click.option(
    "--origin",
    metavar="NAME",
    help="The lost root's origin (tier.origin), if it had one: its copy is under URL/NAME, and the new root tiers there.",
)
@_TIER_OPTIONS
@click.option(
    "--replica",
    is_flag=True,
    help="Make a read-only replica: the prefix stays its owner's (no claim, no epoch); sends, tier run and repairs are refused.",
)
@click.option("--refresh", is_flag=True, help="Bring the replica at --root up to date with its prefix (no --tier).")
def tier_rebuild(
    new_root: str, tier_url: str | None, origin: str | None, tier_options: str | None, replica: bool, refresh: bool
) -> None:
    """Rebuild a lost root from its tier-2 copy alone: topics, partitions, metadata, group offsets.

    Segments come from their manifests (chunks without one are orphans); producers continue
    at each partition's tier-2 end offset; committed group offsets come from the newest
    export in tier-2 (`tier export --to-tier`), if any. Exit 1 if offsets are lost (holes).
    The new root takes the prefix over: the lost root, should it come back, tiers nothing.

    With --replica, the root made is a read-only replica of a prefix another root keeps
    owning and writing to: consumers and Spark read it, a send raises ReadOnlyError, `tier
    run` refuses it; `tier rebuild --refresh --root R` brings it up to date (new uploads
    appear, what retention deleted disappears).

    \b
      filechannel tier rebuild --root /data/fc-new --tier s3://bucket/fc \\
          --tier-options '{"endpoint_url": "http://s3.local:8333"}'
      filechannel tier rebuild --root /data/edge-1 --tier s3://bucket/fc --origin edge-1
      filechannel tier rebuild --replica --root /data/fc-replica --tier s3://bucket/fc
      filechannel tier rebuild --refresh --root /data/fc-replica
    """
    from ..client.group import restore_groups
    from ..root import origin_url
    from ..tiering.rebuild import rebuild_root, refresh_replica
    from .progress import Meter, count_progress

    if refresh and (tier_url is not None or origin is not None or tier_options is not None or replica):
        raise click.UsageError("--refresh takes --root only: the replica's storage and options are those it was made with")
    if not refresh and tier_url is None:
        raise click.UsageError("say which storage to rebuild from with --tier URL (or refresh a replica with --refresh)")
    options = _tier_options(tier_options)
    if tier_url is not None:
        _check_tier(tier_url, options)
        if origin is not None:
            try:
                tier_url = origin_url(tier_url, origin)
            except ValueError as exc:  # the name's rule
                raise click.BadParameter(str(exc), param_hint="--origin") from None
    with count_progress(shown=True) as progress:
        manifests = Meter(progress, "reading manifests", "manifests")
        if refresh:
            report = refresh_replica(new_root, progress=_progress_line, counted=manifests.set)
        else:
            assert tier_url is not None
            report = rebuild_root(
                new_root, tier_url, tier_options=options, replica=replica, progress=_progress_line, counted=manifests.set
            )
    _progress_line(f"read {manifests.count} manifest(s) {manifests.summary()}")
    groups = [] if refresh else restore_groups(os.path.abspath(new_root), report.group_offsets, report.ends)
    for line in groups:
        _progress_line(line)
    for line in report.notes:
        _progress_line(f"note: {line}")
    done = "refreshed" if refresh else "rebuilt a replica of" if replica else "rebuilt"
    out.print(
        f"{done} {len(report.topics)} topic(s), {sum(report.topics.values())} partition(s), {report.segments} "
        f"segment(s) ({report.bytes} bytes), {len(groups)} group(s) in {os.path.abspath(new_root)}",
        highlight=False,
        soft_wrap=True,
    )
    _exit_on_errors(report.problems)


@tier.command("fsck")
@ROOT_OPTION
@click.option("--deep", is_flag=True, help="Also read every uploaded object: header and block-table CRC, every record's CRC.")
@click.option("--repair", is_flag=True, help="Fix what can be fixed (stop the daemon first); mark the rest lost.")
@click.pass_context
def tier_fsck(ctx: click.Context, deep: bool, repair: bool) -> None:
    """Check the tier-2 metadata against the bucket and the manifests; one line per finding.

    Finds missing objects, lengths that differ, manifests that disagree, orphans, gaps;
    with --deep, damaged bytes. Exit 1 if anything is found. --repair deletes orphans,
    writes missing or damaged chunks again from the local copy (or marks their offsets
    lost: reads then raise TierDataLostError naming them), rewrites bad manifests.

    \b
      filechannel tier fsck --root /data/fc
      filechannel tier fsck --root /data/fc --deep --repair
    """
    from ..tiering.fsck import deep_bytes_of, fsck
    from .progress import byte_progress

    root = root_folder(ctx)
    total = deep_bytes_of(root) if deep else 0
    with byte_progress(shown=deep) as progress:
        task = progress.add_task("reading tier-2", total=max(total, 1))
        report = fsck(
            root,
            deep=deep,
            repair=repair,
            say=lambda line: _progress_line(f"repaired: {line}"),
            advance=lambda n: progress.advance(task, n),
        )
    for finding in report.findings:
        click.echo(finding.line(), err=True)
    for note in report.notes:
        click.echo(f"note: {note.line()}", err=True)
    read = f", {report.deep_bytes} bytes read and decoded" if deep else ""
    summary = f"{report.segments} segment(s), {report.objects} object(s){read}: {len(report.findings)} finding(s)"
    if repair:
        summary += f", {len(report.repaired)} repair(s)"
    out.print(summary, highlight=False, soft_wrap=True)
    if report.findings:
        sys.exit(1)


@tier.command("defrag")
@ROOT_OPTION
@_defrag_options
@click.pass_context
def tier_defrag(ctx: click.Context, merge_below: int, target: int, garbage_delay: float) -> None:
    """Merge runs of small tier-2 objects (chunks, small segments of slow topics) into larger ones.

    Uses the storage's concat (S3: UploadPartCopy for parts of 5 MiB or more), else reads and
    writes again; the metadata is swapped in one transaction, and the replaced objects are
    deleted --garbage-delay seconds later (by the next defrag or daemon pass). Stop the daemon
    first (or run it with --defrag, which merges when a partition is idle).

    \b
      filechannel tier defrag --root /data/fc
      filechannel tier defrag --root /data/fc --merge-below 8388608 --target 134217728
    """
    from ..tiering.defrag import defrag_root

    root = root_folder(ctx)
    settings = _defrag_settings(merge_below, target, garbage_delay)
    report = defrag_root(root, settings, progress=_progress_line)
    per = (
        f"{report.objects_before / report.segments:.2f} -> {report.objects_after / report.segments:.2f}"
        if report.segments
        else "-"
    )
    out.print(
        f"{report.merges} merge(s), {report.bytes} bytes; objects per segment {per} "
        f"({report.objects_before} -> {report.objects_after} objects, {report.segments} segment(s))",
        highlight=False,
        soft_wrap=True,
    )
