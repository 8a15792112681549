"""The workloads beyond plain produce/consume: latency, durability, processes, compression.

Each runs in a fresh process (:func:`bench.measure.in_child`) and returns rows.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import multiprocessing as mp
import os
import random
import resource
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from crc32c import crc32c

from filechannel.engine.files import folder_bytes

from .bucket_consumer import run_bucket_consumer
from .cpu_bound import compressed_read_floor_s
from .freshness import run_freshness
from .measure import QUICK_SECONDS, REPEATS, Row, in_child, peak_rss_mb
from .optional import NotInstalled
from .peers import BENCH_CONFIG, DEFAULTS, NEVER
from .tiering import run_tiering

STAMP = struct.Struct("<Q")


def _channel(folder: str, **config: Any) -> Any:
    from filechannel import FileChannel

    return FileChannel(os.path.join(folder, "ch"), **{**BENCH_CONFIG, **config})


# -- produce and consume at once ---------------------------------------------------------------


def _concurrent(size: int, n: int) -> list[dict[str, Any]]:
    payload = os.urandom(size)
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder, _channel(folder) as ch:
        rx = ch.receiver("earliest")
        sender = ch.sender()

        def produce() -> None:
            chunk = [payload] * 1000
            for i in range(0, n, 1000):
                sender.send_many(chunk[: min(1000, n - i)])
            sender.flush()

        t0 = time.perf_counter()
        th = threading.Thread(target=produce)
        th.start()
        got = 0
        while got < n:
            got += len(rx.recv_many(4096, timeout=5))
        th.join()
        secs = time.perf_counter() - t0
    return [
        Row(
            "produce+consume at once",
            "filechannel send_many/recv_many",
            NEVER,
            size,
            n,
            n / secs,
            n * size / secs / 1e6,
            peak_rss_mb=peak_rss_mb(),
            ours=True,
        ).to_json()
    ]


# -- latency at a fixed offered rate --------------------------------------------------------------


def _paced_sender(path: str, size: int, rate: int, n: int, start_at: float) -> None:
    """Send n stamped records at ``rate``/s from ``start_at`` (CLOCK_MONOTONIC, system-wide)."""
    from filechannel import FileChannel

    pad = b"x" * max(0, size - STAMP.size)
    with FileChannel(path) as ch:
        send = ch.sender().send
        time.sleep(max(0.0, start_at - time.monotonic()))
        t0 = time.monotonic()
        for i in range(n):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            send(STAMP.pack(time.monotonic_ns()) + pad)


def _latency(size: int, rate: int, seconds: float, cross_process: bool) -> list[dict[str, Any]]:
    from filechannel import FileChannel

    n = int(rate * seconds)
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder, FileChannel(path := os.path.join(folder, "ch")) as ch:
        rx = ch.receiver("latest")
        start_at = time.monotonic() + 0.5
        sender: mp.process.BaseProcess | threading.Thread
        if cross_process:
            sender = mp.get_context("spawn").Process(target=_paced_sender, args=(path, size, rate, n, start_at + 1.0))
        else:
            sender = threading.Thread(target=_paced_sender, args=(path, size, rate, n, start_at))
        sender.start()
        lat: list[int] = []
        try:
            while len(lat) < n:
                r = rx.recv(timeout=30)
                lat.append(time.monotonic_ns() - STAMP.unpack_from(r.value or b"")[0])
        finally:
            sender.join(30)
    lat.sort()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] / 1e6

    where = "two processes" if cross_process else "one process"
    return [
        Row(
            f"latency, {where}, {rate:,}/s",
            "filechannel send/recv (defaults)",
            DEFAULTS,
            size,
            n,
            rate,
            rate * size / 1e6,
            ours=True,
            extra={"p50_ms": pct(50), "p99_ms": pct(99), "p99.9_ms": pct(99.9), "max_ms": lat[-1] / 1e6},
        ).to_json()
    ]


def _in_threads(loop: Any, threads: int) -> None:
    """Run ``loop(i)`` for i in range(threads), all at once, each in its own thread; wait for all."""
    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


# -- durable produce: group commit against one fsync per message ----------------------------------


def _durable(size: int, threads: int, seconds: float, api: str) -> list[dict[str, Any]]:
    """Records made durable per second: blocking ``Sender.send`` or ``Producer`` futures."""
    from filechannel.client import Admin, Producer

    payload = os.urandom(size)
    counts = [0] * threads
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        Admin(folder).create_topic("t", fsync="always")
        producer = Producer(folder)
        ch = Admin(folder).open_partition("t", 0, maintenance_interval=0)
        deadline = time.perf_counter() + seconds

        def blocking(i: int) -> None:
            send = ch.sender().send
            while time.perf_counter() < deadline:
                send(payload)  # returns after its fsync
                counts[i] += 1

        def futures(i: int) -> None:
            window: list[Any] = []
            while time.perf_counter() < deadline:
                window.append(producer.send("t", payload))
                counts[i] += 1
                if len(window) >= 1000:  # keep at most 1000 records in flight per thread
                    window.pop(0).result()

        t0 = time.perf_counter()
        _in_threads(blocking if api == "sender" else futures, threads)
        producer.flush()  # every future complete: every record counted is on disk
        secs = time.perf_counter() - t0
        producer.close()
        ch.close()
    n = sum(counts)
    backend = "filechannel Sender.send (blocks per record)" if api == "sender" else "filechannel Producer (durable futures)"
    return [
        Row(
            f'durable produce, fsync="always", {threads} thread(s)',
            backend,
            "fsync before ack",
            size,
            n,
            n / secs,
            n * size / secs / 1e6,
            ours=True,
        ).to_json()
    ]


def _fsync_per_message(size: int, seconds: float) -> list[dict[str, Any]]:
    """The reference of the durable rows, measured next to them: one write + fsync per message."""
    payload = os.urandom(size)
    n = 0
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        fd = os.open(os.path.join(folder, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while time.perf_counter() < deadline:
                os.write(fd, payload)
                os.fsync(fd)
                n += 1
            secs = time.perf_counter() - t0
        finally:
            os.close(fd)
    return [
        Row(
            'durable produce, fsync="always", 1 thread(s)',
            "one write + fsync per message (reference)",
            "fsync before ack",
            size,
            n,
            n / secs,
            n * size / secs / 1e6,
        ).to_json()
    ]


# -- threads: what CPython's lock contention leaves of a per-message API ---------------------------


def _gather_ceiling(count: int) -> list[dict[str, Any]]:
    """``asyncio.gather`` of coroutines that do nothing, as the gather row runs its sends:
    CHUNK at a time in one event loop run in this thread (``run_until_complete``), best of
    ``REPEATS``. ``gather`` makes a Task of each coroutine, and that is the most any gather
    of coroutines does on this machine; the gather row is measured against it. Beside it,
    ``gather`` of futures already done (no Task: the least a gather does per item).
    """
    import asyncio

    from .measure import CHUNK

    async def nothing() -> None:
        pass

    async def coroutines() -> None:
        await asyncio.gather(*[nothing() for _ in range(CHUNK)])

    async def done_futures() -> None:
        loop = asyncio.get_running_loop()
        futures = []
        for _ in range(CHUNK):
            future = loop.create_future()
            future.set_result(None)
            futures.append(future)
        await asyncio.gather(*futures)

    rows = []
    loop = asyncio.new_event_loop()
    try:
        for name, chunk in (("no-op coroutines", coroutines), ("done futures", done_futures)):
            best = 0.0
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                for _ in range(count // CHUNK):
                    loop.run_until_complete(chunk())
                best = max(best, count // CHUNK * CHUNK / (time.perf_counter() - t0))
            rows.append(Row("asyncio.gather ceiling", f"asyncio.gather of {name} (reference)", "none", 0, count, best).to_json())
    finally:
        loop.close()
    return rows


def _threads(size: int, threads: int, seconds: float, api: str) -> list[dict[str, Any]]:
    """Messages per second from ``threads`` threads calling ``Sender.send``, ``Producer.send``
    (one topic of one partition) or a bare locked call.

    The bare call (pack, crc32c, list append under a ``threading.Lock``) is the least any
    thread-safe per-message API does; how much it loses from 1 to 8 threads is CPython's.
    """
    payload = os.urandom(size)
    counts = [0] * threads
    make_send: Callable[[], Callable[[bytes], Any]]
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder, contextlib.ExitStack() as stack, _channel(folder) as ch:
        if api == "sender":
            make_send = lambda: ch.sender().send  # noqa: E731
        elif api == "producer":
            from filechannel.client import Admin, Producer

            Admin(folder).create_topic("t", fsync=BENCH_CONFIG["fsync"], compression="none")  # as peers._topic_root
            producer = stack.enter_context(Producer(folder))
            make_send = lambda: functools.partial(producer.send, "t")  # noqa: E731
        else:
            lock, out, pack = threading.Lock(), [], struct.Struct("<IIBq").pack

            def bare(value: bytes) -> None:
                ts = int(time.time() * 1000)
                with lock:
                    out.append(pack(len(value) + 9, crc32c(value), 0, ts))
                    out.append(value)
                    if len(out) > 20_000:
                        out.clear()

            make_send = lambda: bare  # noqa: E731
        deadline = time.perf_counter() + seconds

        def loop(i: int) -> None:
            send = make_send()
            while time.perf_counter() < deadline:
                send(payload)
                counts[i] += 1

        t0 = time.perf_counter()
        _in_threads(loop, threads)
        secs = time.perf_counter() - t0
    n = sum(counts)
    backend = {
        "sender": "filechannel Sender.send",
        "producer": "filechannel Producer.send",
        "bare": "bare locked call per message (reference)",
    }[api]
    return [
        Row(
            f"send from {threads} thread(s)",
            backend,
            "none" if api == "bare" else NEVER,
            size,
            n,
            n / secs,
            n * size / secs / 1e6,
            ours=api != "bare",
        ).to_json()
    ]


# -- two producer processes into one channel --------------------------------------------------------


def _produce_part(path: str, size: int, n: int, tag: int) -> None:
    from filechannel import FileChannel

    with FileChannel(path, **BENCH_CONFIG) as ch:
        send = ch.sender().send
        pad = b"p" * max(0, size - 8)
        for i in range(n):
            send(struct.pack("<II", tag, i) + pad)


def _two_producers(size: int, n: int) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder, _channel(folder) as ch:
        path = os.path.join(folder, "ch")
        procs = [ctx.Process(target=_produce_part, args=(path, size, n // 2, tag)) for tag in (1, 2)]
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        secs = time.perf_counter() - t0
        rx = ch.receiver("earliest")
        seen: set[tuple[int, ...]] = set()
        offsets: list[int] = []
        while batch := rx.recv_many(10_000, timeout=0):
            offsets.extend(r.offset for r in batch)
            seen.update(struct.unpack_from("<II", r.value) for r in batch)
    complete = offsets == list(range(n // 2 * 2)) and len(seen) == n // 2 * 2
    return [
        Row(
            "2 producer processes, one channel",
            "filechannel send",
            NEVER,
            size,
            n // 2 * 2,
            n / secs,
            n * size / secs / 1e6,
            ours=True,
            extra={"dense_and_complete": complete, "wall_s_incl_process_start": secs},
        ).to_json()
    ]


# -- reading compressed sealed segments ----------------------------------------------------------------


PAGES = [f"/product/{i}" for i in range(200)]
VIEW_JSON_BYTES = 75  # about, for one page view in json_records


def json_records(n: int, size: int = 100) -> list[bytes]:
    """n JSON records of about ``size`` bytes: a user and as many page views as fit (one at least)."""
    rng = random.Random(7)
    per = max(1, round(size / VIEW_JSON_BYTES))
    ts = 1_700_000_000_000
    out = []
    for _ in range(n):
        views = []
        for _ in range(per):
            ts += rng.randrange(1, 5000)
            views.append({"page": rng.choice(PAGES), "ts": ts, "duration_ms": rng.randrange(50, 30_000), "ok": True})
        out.append(json.dumps({"user": f"user-{rng.randrange(50_000)}", "views": views}).encode())
    return out


def _read_all(ch: Any, batch_size: int = 4096) -> tuple[int, float]:
    rx = ch.receiver("earliest")
    t0 = time.perf_counter()
    n = 0
    while batch := rx.recv_many(batch_size, timeout=0):
        n += len(batch)
    return n, time.perf_counter() - t0


# A zstd read keeps both CPUs busy (the reader, and readahead decompressing), a raw read
# one: when the host gives this VM's second CPU to someone else for a while, the zstd reads
# in that while slow down and the raw ones do not. Three turns of each (the produce/consume
# rows' REPEATS) put 1 KiB zstd at 0.59x and 0.89x of raw in two full runs, and the same
# function in a loop anywhere from 0.60x to 1.19x, the CPU bound being 1.0-1.6x; each read
# takes a fraction of a second, so taking the best of more turns costs little.
COMPRESSED_READS = 7


def _compressed(size: int, n: int) -> list[dict[str, Any]]:
    values = json_records(n, size)
    payload = sum(map(len, values))
    per_call = max(1, min(1000, (1 << 20) // size))  # about 1 MiB per send_many and per recv_many
    # About 40 segments: the active one (never compressed) is a small part of the read, and
    # moving between segments (a listing, an open) does not dominate reads of large records.
    segment_bytes = max(1 << 20, payload // 40)
    methods = ("none", "zstd")
    with contextlib.ExitStack() as stack:
        channels, raw, disk, folders = {}, {}, {}, {}
        for method in methods:
            folder = folders[method] = stack.enter_context(tempfile.TemporaryDirectory(prefix="fc-bench-"))
            ch = channels[method] = stack.enter_context(_channel(folder, segment_bytes=segment_bytes, compression=method))
            s = ch.sender()
            for i in range(0, n, per_call):
                s.send_many(values[i : i + per_call])
            s.flush()
            raw[method] = folder_bytes(folder)
            ch.compress_sealed()
            disk[method] = folder_bytes(folder)
        # Best of COMPRESSED_READS reads each, raw and zstd taking turns so that both see the
        # same moments of this shared machine (see COMPRESSED_READS).
        secs: dict[str, list[float]] = {m: [] for m in methods}
        for _ in range(COMPRESSED_READS):
            for method in methods:
                got, took = _read_all(channels[method], max(16, per_call))
                assert got == n, (got, n)
                secs[method].append(took)
        bound = _compressed_bound(os.path.join(folders["zstd"], "ch"), per_call, min(secs["none"]))
    return [
        Row(
            f"read back sealed segments ({'zstd' if method == 'zstd' else 'uncompressed'})",
            "filechannel recv_many",
            NEVER,
            size,
            n,
            n / min(secs[method]),
            payload / min(secs[method]) / 1e6,
            disk_per_payload=disk[method] / payload,
            ours=True,
            extra={
                "avg_record_bytes": payload // n,
                "compression_ratio": raw[method] / disk[method],
                "runs": COMPRESSED_READS,
                "alternating": True,
                **(bound if method == "zstd" else {}),
            },
        ).to_json()
        for method in methods
    ]


def _compressed_bound(folder: str, batch: int, raw_read_s: float) -> dict[str, Any]:
    """The most the zstd read could reach against the raw one on this machine's CPUs
    (cpu_bound.py): its compressed segments at their floor, its active segment (never
    compressed) at the raw read's speed."""
    floor = compressed_read_floor_s(folder, batch, REPEATS)
    if floor is None:
        return {}
    active = sum(os.path.getsize(p) for p in glob.glob(os.path.join(folder, "*.seg")))
    best_s = floor["floor_s"] + raw_read_s * active / (active + floor["raw_bytes"])
    return {
        "cpu_bound_ratio": round(raw_read_s / best_s, 3),
        "cpus": floor["cpus"],
        "decompress_gb_per_s_1_thread": round(floor["raw_bytes"] / floor["decompress_s"] / 1e9, 2),
        "decode_gb_per_s_1_thread": round(floor["raw_bytes"] / floor["decode_s"] / 1e9, 2),
    }


# -- a consumer group of 3 processes over 6 partitions ------------------------------------------------


def _group_member(root: str, n_total: int, counts: Any, index: int, done: Any, stop: Any) -> None:
    """Consume until told to stop; the member whose records complete ``n_total`` sets ``done``."""
    from filechannel.client import Consumer

    with Consumer("g6", root=root, group_id="bench", auto_offset_reset="earliest", heartbeat_interval_ms=100) as c:
        while not stop.is_set():
            got = sum(len(v) for v in c.poll(timeout_ms=100, max_records=2000).values())
            if got:
                with counts.get_lock():
                    counts[index] += got
                    if sum(counts[:]) >= n_total:
                        done.set()


def _group(size: int, n: int) -> list[dict[str, Any]]:
    from filechannel.client import Admin, Producer

    ctx = mp.get_context("spawn")
    payload = os.urandom(size)
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as root:
        Admin(root).create_topic("g6", partitions=6, fsync=BENCH_CONFIG["fsync"])
        with Producer(root) as p:
            for i in range(n):
                p.send("g6", payload, partition=i % 6)
        counts = ctx.Array("q", 3)
        done, stop = ctx.Event(), ctx.Event()
        procs = [ctx.Process(target=_group_member, args=(root, n, counts, i, done, stop)) for i in range(3)]
        t0 = time.perf_counter()
        for pr in procs:
            pr.start()
        try:
            done.wait(300)
            secs = time.perf_counter() - t0
        finally:
            stop.set()
            for pr in procs:
                pr.join(30)
                if pr.is_alive():
                    pr.kill()
        per_member = list(counts[:])
    return [
        Row(
            "consumer group, 3 processes x 6 partitions",
            "filechannel Consumer(group_id)",
            NEVER,
            size,
            sum(per_member),
            sum(per_member) / secs,
            sum(per_member) * size / secs / 1e6,
            ours=True,
            extra={"per_member": per_member, "complete": sum(per_member) == n, "wall_s_incl_process_start": secs},
        ).to_json()
    ]


# -- consuming a channel much larger than memory keeps RSS bounded -------------------------------------


def _write_big(folder: str, total_bytes: int) -> int:
    payload = os.urandom(65536)
    n = total_bytes // len(payload)
    with _channel(folder) as ch:
        s = ch.sender()
        for i in range(0, n, 64):
            s.send_many([payload] * min(64, n - i))
    return n


READER_MEMORY = 512 << 20  # the reader's address space: a quarter of the 2 GiB channel


def _consume_big(folder: str) -> dict[str, Any]:
    """Read the whole channel in a process whose address space is capped below its size."""
    base = peak_rss_mb()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (READER_MEMORY, hard))
    with _channel(folder) as ch:
        n, secs = _read_all(ch, 64)  # 64 records of 64 KiB: 4 MiB in hand at a time
    return {"n": n, "secs": secs, "rss_before_mb": base, "peak_rss_mb": peak_rss_mb()}


def _rss_bound(total_bytes: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="fc-bench-") as folder:
        _write_big(folder, total_bytes)
        size = folder_bytes(folder)
        r = in_child(_consume_big, folder)
    return [
        Row(
            "consume a large channel (RSS)",
            "filechannel recv_many",
            NEVER,
            65536,
            r["n"],
            r["n"] / r["secs"],
            r["n"] * 65536 / r["secs"] / 1e6,
            peak_rss_mb=r["peak_rss_mb"],
            ours=True,
            extra={
                "channel_mb": size / 1e6,
                "rss_before_read_mb": r["rss_before_mb"],
                "address_space_cap_mb": READER_MEMORY / 1e6,
            },
        ).to_json()
    ]


Workload = Callable[..., list[dict[str, Any]]]  # in a fresh process: the rows, as Row.to_json() dicts


def run(name: str, fn: Workload, *args: Any) -> list[Row]:
    """One workload in a fresh process; a failure is a row with its error, a part not installed a skipped row."""
    try:
        return [Row(**r) for r in in_child(fn, *args)]
    except Exception as exc:
        skipped = isinstance(exc, NotInstalled)
        return [Row(name, "filechannel", NEVER, 0, ours=True, error=str(exc).splitlines()[0], skipped=skipped)]


SIZES = (100, 1024, 65536)


def special(quick: bool) -> list[tuple[str, Workload, tuple[Any, ...]]]:
    """(name, function, args) of every workload beyond the throughput table, each size in turn."""
    secs = QUICK_SECONDS if quick else 5.0
    big = (256 << 20) if quick else (2 << 30)

    def count(size: int, small: int, large: int) -> int:
        """How many records: ``small`` of 100 B or 1 KiB, ``large`` of 64 KiB (1/25 in --quick)."""
        return (small if size < 65536 else large) // (25 if quick else 1)

    out: list[tuple[str, Workload, tuple[Any, ...]]] = []
    for size in SIZES:
        out.append(("produce+consume at once", _concurrent, (size, count(size, 500_000, 20_000))))
    for size in SIZES:
        rate = 10_000 if size < 65536 else 1_000  # 64 KiB at 10,000/s would be 655 MB/s: a throughput test
        out += [
            ("latency, one process", _latency, (size, rate, secs, False)),
            ("latency, two processes", _latency, (size, rate, secs, True)),
        ]
    for size in SIZES:
        out += [
            ("durable, one fsync per message", _fsync_per_message, (size, secs)),
            ("durable, 1 thread", _durable, (size, 1, secs, "sender")),
            ("durable, 8 threads", _durable, (size, 8, secs, "sender")),
            ("durable, 1 thread", _durable, (size, 1, secs, "producer")),
            ("durable, 8 threads", _durable, (size, 8, secs, "producer")),
        ]
    out.append(("asyncio.gather ceiling", _gather_ceiling, (count(100, 200_000, 0),)))
    out += [
        ("threads, bare locked call", _threads, (100, 1, secs, "bare")),
        ("threads, bare locked call", _threads, (100, 8, secs, "bare")),
        ("threads, Sender.send", _threads, (100, 1, secs, "sender")),
        ("threads, Sender.send", _threads, (100, 8, secs, "sender")),
        ("threads, Producer.send", _threads, (100, 1, secs, "producer")),
        ("threads, Producer.send", _threads, (100, 8, secs, "producer")),
    ]
    for size in SIZES:
        out.append(("2 producer processes", _two_producers, (size, count(size, 400_000, 10_000))))
    for size in SIZES:
        out.append(("compressed read", _compressed, (size, count(size, 400_000 if size < 1024 else 100_000, 2_000))))
    for size in SIZES:
        out.append(("consumer group", _group, (size, count(size, 300_000, 6_000))))
    out.append(("RSS bound", _rss_bound, (big,)))
    out.append(("tiering: upload and read on SeaweedFS", run_tiering, (quick,)))
    out.append(("tiering: a bucket-only consumer on SeaweedFS", run_bucket_consumer, (quick,)))
    out.append(("freshness: produce -> visible in tier-2", run_freshness, (quick,)))
    return out
