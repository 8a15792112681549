"""The results: a markdown table, the targets met or missed, a JSON file and a PNG chart."""

from __future__ import annotations

import json
import os
from typing import Any

from .measure import Row
from .optional import NotInstalled, needs

FLOOR = "python floor (frames in one file)"
FLOOR_PER_CALL = "python floor, one locked call per message"
SLOW_PEERS = ("persist-queue Queue (file)", "persist-queue SQLiteAckQueue", "diskcache Deque", "litequeue")
QUEUELIB = "queuelib FifoDiskQueue"


def _find(rows: list[Row], workload: str, backend: str, size: int) -> Row | None:
    return next((r for r in rows if r.workload == workload and r.backend == backend and r.size == size and not r.error), None)


def add_ratios(rows: list[Row]) -> None:
    """Each throughput row's ratio to the floor and to the best peer (same workload and size)."""
    for r in rows:
        if r.error or r.workload not in ("produce", "consume"):
            continue
        floor = _find(rows, r.workload, FLOOR, r.size)
        peers = [
            p
            for p in rows
            if p.workload == r.workload and p.size == r.size and not (p.ours or p.error or p.backend in (FLOOR, FLOOR_PER_CALL))
        ]
        if floor:
            r.extra["vs_floor"] = r.msgs_per_s / floor.msgs_per_s
        if peers:
            best = max(peers, key=lambda p: p.msgs_per_s)
            r.extra["vs_best_peer"] = r.msgs_per_s / best.msgs_per_s
            r.extra["best_peer"] = best.backend


def _fmt(x: float | None, digits: int = 2) -> str:
    if x is None:
        return ""
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def table(rows: list[Row]) -> str:
    columns = ["workload", "backend", "durability", "size", "N", "msgs/s", "MB/s", "vs floor", "vs best peer", "disk/payload"]
    columns += ["peak RSS MB", "notes"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        if r.error:
            why = f"{'skipped' if r.skipped else 'error'}: {r.error}"
            lines.append(f"| {r.workload} | {r.backend} | {r.durability} | {r.size} | | | | | | | | {why} |")
            continue
        notes = ", ".join(
            f"{k}={_fmt(v) if isinstance(v, float) else v}" for k, v in r.extra.items() if k not in ("vs_floor", "vs_best_peer")
        )
        lines.append(
            f"| {r.workload} | {'**' + r.backend + '**' if r.ours else r.backend} | {r.durability} | {r.size} | {r.n:,} | "
            f"{r.msgs_per_s:,.0f} | {_fmt(r.mb_per_s, 1)} | "
            f"{_fmt(r.extra.get('vs_floor'))} | {_fmt(r.extra.get('vs_best_peer'))} | "
            f"{_fmt(r.disk_per_payload)} | {_fmt(r.peak_rss_mb, 0)} | {notes} |"
        )
    return "\n".join(lines)


def targets(rows: list[Row], machine: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of the bench issue with the measured figure, met or missed."""
    out: list[dict[str, Any]] = []

    def target(
        name: str, measured: float | None, goal: float, higher_is_better: bool = True, unit: str = "x", note: str = ""
    ) -> None:
        met = None if measured is None else (measured >= goal if higher_is_better else measured <= goal)
        out.append(
            {
                "target": name,
                "goal": f"{'>=' if higher_is_better else '<='} {goal}{unit}",
                "measured": None if measured is None else round(measured, 3),
                "met": met,
                "note": note,
            }
        )

    def ratio(workload: str, ours: str, other: str, size: int) -> float | None:
        a, b = _find(rows, workload, ours, size), _find(rows, workload, other, size)
        return a.msgs_per_s / b.msgs_per_s if a and b else None

    for w in ("produce", "consume"):
        target(f"send_many/recv_many {w} 100 B vs Python floor", ratio(w, "filechannel send_many/recv_many", FLOOR, 100), 1.0)
        per_call = ratio(w, FLOOR_PER_CALL, FLOOR, 100)
        target(
            f"send/recv {w} 100 B vs Python floor",
            ratio(w, "filechannel send/recv", FLOOR, 100),
            0.5,
            note=f"a bare locked call per message reaches {per_call:.2f}x the floor" if per_call else "",
        )
        for size in (100, 1024):
            for peer, goal in ((QUEUELIB, 2.0), *((p, 100.0) for p in SLOW_PEERS)):
                target(
                    f"send_many/recv_many {w} {size} B vs {peer}",
                    ratio(w, "filechannel send_many/recv_many", peer, size),
                    goal,
                    note=_reach(rows, w, peer, size, goal),
                )

    def durable(threads: str, size: int = 100) -> Row | None:
        return max(
            (
                r
                for r in rows
                if r.workload.startswith("durable") and threads in r.workload and r.ours and r.size == size and not r.error
            ),
            key=lambda r: r.msgs_per_s,
            default=None,
        )

    def reference(size: int = 100) -> Row | None:
        """One write + fsync per message, measured next to the durable rows of this size."""
        refs = (r for r in rows if r.backend.startswith("one write + fsync per message") and r.size == size)
        return next((r for r in refs if not r.error), None)

    eight, one = durable("8 thread"), durable("1 thread")
    # One fsync per message, measured next to the durable rows (the disk is as busy then as
    # for them); the idle-disk figure from the start of the run is given as context.
    ref = reference()
    idle = machine.get("fsync", {}).get("one_fsync_per_message_msgs_per_s")
    per_fsync = ref.msgs_per_s if ref else idle
    bare = {r.workload: r for r in rows if r.backend.startswith("bare locked call") and not r.error}
    b1, b8 = bare.get("send from 1 thread(s)"), bare.get("send from 8 thread(s)")
    context = []
    if ref:
        context.append(f"one fsync per message: {ref.msgs_per_s:,.0f} msgs/s next to these rows")
    if idle:
        context.append(f"{idle:,.0f} on the idle disk at the start ({eight.msgs_per_s / idle:.1f}x that)" if eight else "")
    if one and per_fsync:
        context.append(f"1 thread: {one.msgs_per_s / per_fsync:.1f}x ({one.backend})")
    dd = machine.get("dd", {}).get("mb_per_s")
    for size in (1024, 65536):
        big, big_ref = durable("8 thread", size), reference(size)
        if big and big_ref:
            in_dd = dd * 1e6 / size / big_ref.msgs_per_s if dd else None
            ceiling = f" (the disk's dd bandwidth in {size} B messages: {in_dd:.1f}x)" if in_dd else ""
            context.append(f"{size} B: {big.msgs_per_s / big_ref.msgs_per_s:.1f}x{ceiling}")
    if b1 and b8:
        context.append(f"a bare locked call keeps {b8.msgs_per_s / b1.msgs_per_s:.2f} of its rate from 1 to 8 threads")
    target(
        "durable produce 100 B, 8 threads, vs one fsync per message",
        eight.msgs_per_s / per_fsync if eight and per_fsync else None,
        20.0,
        note="; ".join(c for c in context if c),
    )
    cross = next((r for r in rows if r.workload.startswith("latency, two processes") and r.size == 100 and not r.error), None)
    target("latency across processes p50, 100 B at 10k msgs/s (ms)", cross.extra["p50_ms"] if cross else None, 1.0, False, " ms")
    target("latency across processes p99, 100 B at 10k msgs/s (ms)", cross.extra["p99_ms"] if cross else None, 5.0, False, " ms")
    zstd = {r.size: r for r in rows if "(zstd)" in r.workload and not r.error}
    raw = {r.size: r for r in rows if "(uncompressed)" in r.workload and not r.error}
    speed = {size: z.msgs_per_s / raw[size].msgs_per_s for size, z in zstd.items() if size in raw}
    z = zstd.get(100)
    target(
        "reading zstd sealed segments vs uncompressed, 100 B",
        speed.get(100),
        0.7,
        note="; ".join(f"{size} B: {ratio:.2f}x{_bound_note(zstd[size])}" for size, ratio in speed.items() if size != 100),
    )
    target(
        "JSON-like records compress, 100 B",
        z.extra["compression_ratio"] if z else None,
        4.0,
        note="; ".join(f"{size} B: {r.extra['compression_ratio']:.1f}x" for size, r in zstd.items() if size != 100),
    )
    spark = {r.backend: r for r in rows if r.workload.startswith("spark") and not r.error}
    ours_spark, arrow = spark.get('format("filechannel")'), spark.get("in-memory Arrow source (API ceiling)")
    if ours_spark or arrow:
        target(
            "Spark availableNow source vs in-memory Arrow source",
            ours_spark.msgs_per_s / arrow.msgs_per_s if ours_spark and arrow else None,
            0.7,
        )
    for r in rows:  # Spark over tier-2 against raw ranged GETs of the same objects in Spark (issue 37), per input partitions
        if r.workload.startswith("spark availableNow") and "vs_raw_get" in r.extra and not r.error:
            parts = r.extra["input_partitions"]
            target(
                f"Spark over tier-2 vs raw ranged GETs of the same objects in Spark, {parts} input partition(s)",
                r.extra["vs_raw_get"],
                0.8,
            )
    big = next((r for r in rows if r.workload == "consume a large channel (RSS)" and not r.error), None)
    out.append(
        {
            "target": "consuming a channel larger than memory keeps RSS bounded",
            "goal": "peak RSS far below channel size",
            "measured": (
                f"{big.peak_rss_mb:.0f} MB peak RSS reading {big.extra['channel_mb']:.0f} MB, "
                f"the reader's address space capped at {big.extra['address_space_cap_mb']:.0f} MB"
            )
            if big
            else None,
            "met": (big.peak_rss_mb < big.extra["channel_mb"] / 4) if big else None,
        }
    )
    out += _tier_targets(rows)
    out += client_targets(rows)
    return out


PRODUCER = "filechannel Producer/Consumer"
ASYNC = "filechannel AsyncProducer/AsyncConsumer"
GATHER = "filechannel AsyncProducer, asyncio.gather of sends"
GATHER_CEILING = "asyncio.gather of no-op coroutines (reference)"
GATHER_FLOOR = "asyncio.gather of done futures (reference)"


def _gather_note(gather: Row | None, ceiling: Row | None, futures: Row | None) -> str:
    """How the gather row compares with gathering coroutines that do nothing (one Task each),
    and what a gather of futures already done (no Task) runs at."""
    if ceiling is None:
        return ""
    note = f"asyncio.gather of no-op coroutines: {ceiling.msgs_per_s:,.0f}/s in this run"
    note += f"; the gather of sends is {gather.msgs_per_s / ceiling.msgs_per_s:.2f}x that" if gather else ""
    return note + (f"; of done futures (no Task): {futures.msgs_per_s:,.0f}/s" if futures else "")


SEND = "filechannel send/recv"
SEND_MANY = "filechannel send_many/recv_many"
REDIS = ("Redis Streams XADD, one per call", "Redis Streams XADD, pipelined")
NATS = ("NATS JetStream publish, one at a time", "NATS JetStream publish, many in flight")


def client_targets(rows: list[Row]) -> list[dict[str, Any]]:
    """The Kafka-like client's targets (issue 22): against the channel's own API, queuelib,
    itself from 8 threads, and the servers users would run instead (their best mode)."""
    out: list[dict[str, Any]] = []

    def target(name: str, a: Row | None, b: Row | None, goal: float, note: str = "") -> None:
        measured = a.msgs_per_s / b.msgs_per_s if a and b else None
        out.append(
            {
                "target": name,
                "goal": f">= {goal}x",
                "measured": None if measured is None else round(measured, 3),
                "met": None if measured is None else measured >= goal,
                "note": note,
            }
        )

    for size in (100, 1024):

        def row(workload: str, backend: str, size: int = size) -> Row | None:
            return _find(rows, workload, backend, size)

        producer = row("produce", PRODUCER)
        target(f"Producer.send vs Sender.send, {size} B", producer, row("produce", SEND), 0.5)
        target(f"Producer.send vs queuelib, {size} B", producer, row("produce", QUEUELIB), 2.0)
        target(f"AsyncProducer.send vs Producer.send, {size} B", row("produce", ASYNC), producer, 0.5)
        gather = row("produce", GATHER)
        target(
            f"AsyncProducer, asyncio.gather of sends vs Producer.send, {size} B",
            gather,
            producer,
            0.5,
            note=_gather_note(
                gather,
                _find(rows, "asyncio.gather ceiling", GATHER_CEILING, 0),
                _find(rows, "asyncio.gather ceiling", GATHER_FLOOR, 0),
            ),
        )
        for api, backend in (("Consumer.poll", PRODUCER), ("AsyncConsumer.getmany", ASYNC)):
            target(f"{api} vs recv_many, {size} B", row("consume", backend), row("consume", SEND_MANY), 0.8)
        # The defaults a user gets (fsync every second and on flush, zstd sealed segments in the
        # background) against queuelib and against the same API with fsync off (issue 40).
        for api, w, backend in (
            ("Producer.send", "produce", PRODUCER),
            ("AsyncProducer.send", "produce", ASYNC),
            ("Consumer.poll", "consume", PRODUCER),
            ("AsyncConsumer.getmany", "consume", ASYNC),
        ):
            defaults = row(w, f"{backend} (defaults)")
            target(f"{api} with defaults vs queuelib, {size} B", defaults, row(w, QUEUELIB), 2.0)
            target(f"{api} with defaults vs fsync off, {size} B", defaults, row(w, backend), 0.7)
    threads = {r.workload: r for r in rows if r.backend == "filechannel Producer.send" and not r.error}
    target(
        "Producer.send from 8 threads vs 1 thread, 100 B",
        threads.get("send from 8 thread(s)"),
        threads.get("send from 1 thread(s)"),
        0.7,
    )
    for w in ("produce", "consume"):
        for backend in (SEND, SEND_MANY, PRODUCER, ASYNC):
            target(f"64 KiB {w}: {backend} vs queuelib", _find(rows, w, backend, 65536), _find(rows, w, QUEUELIB, 65536), 1.0)
    for server, modes in (("Redis Streams", REDIS), ("NATS JetStream", NATS)):
        for size in (100, 1024):
            for w in ("produce", "consume"):
                peers = [r for r in (_find(rows, w, m, size) for m in modes) if r]
                best = max(peers, key=lambda r: r.msgs_per_s, default=None)
                missing = next((r.error for r in rows if r.backend in modes and r.error), "")
                target(
                    f"Producer/Consumer {w} vs {server} (best mode), {size} B",
                    _find(rows, w, PRODUCER, size),
                    best,
                    10.0,
                    note=f"best mode: {best.backend}; {best.durability}" if best else missing,
                )
    return out


def _tier_targets(rows: list[Row]) -> list[dict[str, Any]]:
    """The tiering targets (tiering.py): ratios of .seg.z bytes per second, and the reader's RSS."""
    tier = {(r.workload, r.backend): r for r in rows if r.workload.startswith("tier") and not r.error}
    if not tier:
        return []

    def get(workload: str, backend: str) -> Row | None:
        return tier.get((workload, backend))

    def ratio(a: Row | None, b: Row | None) -> float | None:
        return a.mb_per_s / b.mb_per_s if a and b else None

    def where(r: Row | None) -> str:
        if r is None:
            return ""
        x = r.extra
        return (
            f"{x['segments']} segments of {x['segment_mb']:.0f} MiB ({x['seg_z_mb']:.0f} MB of .seg.z), "
            f"{x['chunk_mb']:.0f} MiB chunks, {r.size} B records, {x['server']}, {x['cpus']} CPUs shared with the server"
        )

    out: list[dict[str, Any]] = []
    daemon = get("tier upload", "filechannel TieringDaemon.run_once")
    raw_put = get("tier upload", "boto3 put_object (raw)")
    up = ratio(daemon, raw_put)
    out.append(
        {
            "target": "tier upload: daemon vs raw boto3 put_object of the same chunks, same concurrency",
            "goal": ">= 0.8x",
            "measured": None if up is None else round(up, 3),
            "met": None if up is None else up >= 0.8,
            "note": f"{where(daemon)}; {daemon.extra['in_flight']} in flight" if daemon else "",
        }
    )
    remote = get("tier read, local copies deleted", "filechannel Receiver from tier-2")
    raw_get = get("tier read, local copies deleted", "boto3 ranged get_object (raw, no decoding)")
    local = get("tier read, same segments local", "filechannel Receiver (local .seg.z)")
    read, vs_local = ratio(remote, raw_get), ratio(remote, local)
    note = where(remote)
    if remote and vs_local is not None:
        note += f"; {remote.extra['in_flight']} ranged GETs in flight; {vs_local:.2f}x the same segments read locally"
    out.append(
        {
            "target": "tier read: Receiver over an offloaded channel vs raw ranged GETs of the same objects, same concurrency",
            "goal": ">= 0.7x",
            "measured": None if read is None else round(read, 3),
            "met": None if read is None else read >= 0.7,
            "note": note,
        }
    )
    rss = get("tier read RSS", "filechannel Receiver from tier-2")
    if rss is not None:
        x = rss.extra
        growth = (rss.peak_rss_mb or 0.0) - x["rss_before_read_mb"]
        out.append(
            {
                "target": "tier read: a reader's RSS stays bounded however much of tier-2 it reads",
                "goal": "RSS growth in the read <= 1.5 x tier_cache_bytes + batch + fetches in flight "
                f"= {x['growth_bound_mb']:.0f} MB",
                "measured": f"{growth:.0f} MB growth ({rss.peak_rss_mb:.0f} MB peak) reading {x['seg_z_mb']:.0f} MB "
                f"with tier_cache_bytes = {x['cache_mb']:.0f} MiB",
                "met": growth <= x["growth_bound_mb"],
                "note": where(rss),
            }
        )
    return out


def _reach(rows: list[Row], workload: str, peer: str, size: int, goal: float) -> str:
    """What a ratio target asks in msgs/s, next to what the Python floor did in the same run:
    a target above the floor is out of reach for any Python implementation on this machine."""
    other, floor = _find(rows, workload, peer, size), _find(rows, workload, FLOOR, size)
    if not other or not floor:
        return ""
    need = goal * other.msgs_per_s
    verdict = "above the floor: out of reach here" if need > floor.msgs_per_s else "below the floor"
    return f"needs {need:,.0f} msgs/s; the Python floor did {floor.msgs_per_s:,.0f} ({verdict})"


def _bound_note(zstd_row: Row) -> str:
    """What the machine's CPUs allow a compressed read at most (cpu_bound.py)."""
    bound = zstd_row.extra.get("cpu_bound_ratio")
    return f" (at most {bound:.2f}x on {zstd_row.extra['cpus']} CPUs)" if bound else ""


def targets_markdown(items: list[dict[str, Any]]) -> str:
    lines = ["| target | goal | measured | | context |", "|---|---|---|---|---|"]
    for t in items:
        verdict = "MET" if t["met"] else "not measured" if t["met"] is None else "MISSED"
        measured = t["measured"] if t["measured"] is not None else ""
        lines.append(f"| {t['target']} | {t['goal']} | {measured} | {verdict} | {t.get('note', '')} |")
    return "\n".join(lines)


def chart(rows: list[Row], path: str) -> None:
    """The produce and consume rows as bars, log scale; :class:`NotInstalled` without matplotlib."""
    with needs("matplotlib"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 6), sharey=True)
    for ax, workload in zip(axes, ("produce", "consume"), strict=True):
        backends = list(dict.fromkeys(r.backend for r in rows if r.workload == workload))
        sizes = sorted({r.size for r in rows if r.workload == workload})
        width = 0.8 / max(1, len(backends))
        for i, b in enumerate(backends):
            ys = [(_find(rows, workload, b, s) or Row("", "", "", 0)).msgs_per_s for s in sizes]
            ax.bar([x + i * width for x in range(len(sizes))], ys, width, label=b, color=plt.cm.tab20(i % 20))
        ax.set_yscale("log")
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(sizes))], [f"{s} B" for s in sizes])
        ax.set_title(f"{workload} throughput (msgs/s, log scale)")
    if axes[0].get_legend_handles_labels()[0]:  # a run without produce rows (--only) has no bars to name
        axes[0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(out: str, rows: list[Row], machine: dict[str, Any], goals: list[dict[str, Any]]) -> str:
    """results.md, results.json and throughput.png in ``out``; the markdown. Without matplotlib there is
    no chart, and results.md says why."""
    os.makedirs(out, exist_ok=True)
    try:
        chart([r for r in rows if not r.error], os.path.join(out, "throughput.png"))
        drawn = ""
    except NotInstalled as exc:
        drawn = f"No chart (throughput.png): {exc}."
    md = "\n\n".join(
        [
            f"Machine: {machine['cpus']} CPUs ({machine['cpu']}), {machine['memory_gib']} GiB, {machine['platform']}, "
            f"Python {machine['python']}; disk: dd {_fmt(machine.get('dd', {}).get('mb_per_s'), 0)} MB/s, "
            f"fsync median {_fmt(machine.get('fsync', {}).get('median_us'), 0)} µs. "
            f"Command: `{machine['command']}`, {machine['date']}.",
            table(rows),
            "Targets:\n\n" + targets_markdown(goals),
            *([drawn] if drawn else []),
        ]
    )
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(md + "\n")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"machine": machine, "rows": [r.to_json() for r in rows], "targets": goals}, f, indent=1)
    return md
