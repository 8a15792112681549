"""The backends measured side by side: the Python floor, the peers, and filechannel's APIs.

Every backend has the same tiny interface: ``open(folder)``, ``produce(values)`` (append a
chunk, durably in the backend's own sense), ``finish()`` (make it readable), ``consume(n)``
(read n back, returning the payload bytes seen), ``close()``. ``durability`` says what the
backend promises, in the table next to its figures.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import struct
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from crc32c import crc32c

from .optional import NotInstalled, needs
from .seaweed import die_with_parent, free_ports

if TYPE_CHECKING:
    from filechannel.client import AsyncProducer, Producer

FRAME = struct.Struct("<II")


class Backend(ABC):
    name = ""
    durability = ""
    ours = False

    def open(self, folder: str) -> None:
        self.folder = folder

    @abstractmethod
    def produce(self, values: list[bytes]) -> None:
        """Append ``values``."""

    def finish(self) -> None:  # noqa: B027 - an optional hook: most backends need no flush
        """Make everything produced readable (flush buffers)."""

    deadline = float("inf")  # a time.perf_counter() past which a slow consume may stop early
    sizes: tuple[int, ...] | None = None  # the message sizes it runs at (None: every size)
    size = 0  # the payload size of this run, set before open()

    @abstractmethod
    def consume(self, n: int) -> int:
        """Read up to n messages back; return their payload bytes."""

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release files."""


class Floor(Backend):
    """The physical floor for Python: buffered [len][crc32c][payload] frames in one file."""

    name = "python floor (frames in one file)"
    durability = "none: no index, no recovery, no fsync"

    def open(self, folder: str) -> None:
        self.path = os.path.join(folder, "frames.bin")
        self.f = open(self.path, "wb", buffering=1 << 20)  # noqa: SIM115 (closed in close())

    def produce(self, values: list[bytes]) -> None:
        write, pack = self.f.write, FRAME.pack
        for v in values:
            write(pack(len(v), crc32c(v)))
            write(v)

    def finish(self) -> None:
        self.f.close()

    def consume(self, n: int) -> int:
        total = 0
        with open(self.path, "rb", buffering=1 << 20) as f:
            read, unpack = f.read, FRAME.unpack
            for _ in range(n):
                length, crc = unpack(read(8))
                v = read(length)
                if crc32c(v) != crc:
                    raise ValueError("bad crc")
                total += length
        return total


class FloorPerCall(Floor):
    """The floor behind a thread-safe one-call-per-message API: the same frames, each
    message one function call under a lock (what any per-message ``send``/``recv`` pays)."""

    name = "python floor, one locked call per message"

    def open(self, folder: str) -> None:
        super().open(folder)
        self.lock = threading.Lock()

    def produce(self, values: list[bytes]) -> None:
        write, pack, lock = self.f.write, FRAME.pack, self.lock

        def put(v: bytes) -> None:
            with lock:
                write(pack(len(v), crc32c(v)))
                write(v)

        for v in values:
            put(v)

    def consume(self, n: int) -> int:
        total = 0
        with open(self.path, "rb", buffering=1 << 20) as f:
            read, unpack, lock = f.read, FRAME.unpack, self.lock

            def get() -> bytes:
                with lock:
                    length, crc = unpack(read(8))
                    v = read(length)
                if crc32c(v) != crc:
                    raise ValueError("bad crc")
                return v

            for _ in range(n):
                total += len(get())
        return total


class _Valued(Protocol):
    """A record of any of our APIs: the channel's ``Record``, the clients' consumer records."""

    @property
    def value(self) -> bytes | None: ...


def payload_bytes(records: Iterable[_Valued]) -> int:
    """The payload bytes of ``records`` (the bench never sends a record without a value)."""
    return sum(len(r.value or b"") for r in records)


class PerMessage(Backend):
    """A peer with one call per message each way: ``open`` sets ``put`` and ``get``."""

    put: Callable[[bytes], Any]
    get: Callable[[], int]  # takes the next message off the queue; returns its payload length

    def produce(self, values: list[bytes]) -> None:
        put = self.put
        for v in values:
            put(v)

    def consume(self, n: int) -> int:
        get, total = self.get, 0
        for i in range(n):
            total += get()
            if i % 100 == 99 and time.perf_counter() > self.deadline:
                break
        return total


class PersistQueueFile(PerMessage):
    name = "persist-queue Queue (file)"
    durability = "file per chunk, no checksums, fsync off"

    def open(self, folder: str) -> None:
        with needs("persist-queue"):
            import persistqueue

        q = persistqueue.Queue(os.path.join(folder, "q"), autosave=True)

        def get() -> int:
            n = len(q.get())
            q.task_done()
            return n

        self.put, self.get = q.put, get


class PersistQueueSQLiteAck(PerMessage):
    name = "persist-queue SQLiteAckQueue"
    durability = "SQLite commit per put"

    def open(self, folder: str) -> None:
        with needs("persist-queue"):
            import persistqueue

        q = persistqueue.SQLiteAckQueue(os.path.join(folder, "q"), multithreading=True)

        def get() -> int:
            item = q.get()
            q.ack(item)
            return len(item)

        self.put, self.get = q.put, get


class DiskcacheDeque(PerMessage):
    name = "diskcache Deque"
    durability = "SQLite + files, commit per op"

    def open(self, folder: str) -> None:
        with needs("diskcache"):
            import diskcache

        q = diskcache.Deque(directory=os.path.join(folder, "q"))
        self.put, self.get = q.append, lambda: len(q.popleft())


class QueuelibFifo(PerMessage):
    name = "queuelib FifoDiskQueue"
    durability = "no checksums, no crash recovery"

    def open(self, folder: str) -> None:
        with needs("queuelib"):
            from queuelib import FifoDiskQueue

        self.q = FifoDiskQueue(os.path.join(folder, "q"))

        def get() -> int:
            value = self.q.pop()
            if value is None:
                raise RuntimeError("queuelib's queue is empty")
            return len(value)

        self.put, self.get = self.q.push, get

    def close(self) -> None:
        self.q.close()


class LiteQueue(PerMessage):
    name = "litequeue"
    durability = "SQLite commit per op (str payloads)"

    def open(self, folder: str) -> None:
        with needs("litequeue"):
            import litequeue

        q = litequeue.LiteQueue(os.path.join(folder, "q.db"))

        def get() -> int:
            m = q.pop()
            q.done(m.message_id)
            return len(m.data)

        self.put, self.get = (lambda v: q.put(v.decode("latin-1"))), get


class SQLiteTable(Backend):
    name = "sqlite3 table, one transaction"
    durability = "SQLite commit per chunk"

    def open(self, folder: str) -> None:
        self.db = sqlite3.connect(os.path.join(folder, "t.db"))
        self.db.execute("create table q (id integer primary key, v blob)")

    def produce(self, values: list[bytes]) -> None:
        with self.db:
            self.db.executemany("insert into q (v) values (?)", ((v,) for v in values))

    def consume(self, n: int) -> int:
        return sum(len(v) for (v,) in self.db.execute("select v from q order by id limit ?", (n,)))

    def close(self) -> None:
        self.db.close()


# What our rows run with: fsync="never", as the targets ask and as the floor and the fastest
# peers run; background maintenance off so that a run measures the API, not zstd. Sealed
# segments are still fsynced (by the sealer), the active one trimmed on reopen.
BENCH_CONFIG: dict[str, Any] = {"fsync": "never", "maintenance_interval": 0}
NEVER = 'CRC per record, torn-tail recovery, fsync="never"'
DEFAULTS = "CRC per record, torn-tail recovery, defaults: fsync every 1 s and on flush, zstd sealed segments"


class Channel(Backend):
    """filechannel's FileChannel, one record at a time (send/recv) or in batches; with
    ``defaults`` opened as a user would, to show what the default settings cost."""

    ours = True

    def __init__(self, batched: bool, defaults: bool = False) -> None:
        self.batched = batched
        self.config = {} if defaults else BENCH_CONFIG
        self.durability = DEFAULTS if defaults else NEVER
        self.name = "filechannel send_many/recv_many" if batched else "filechannel send/recv"
        if defaults:
            self.name += " (defaults)"

    def open(self, folder: str) -> None:
        from filechannel import FileChannel

        self.ch = FileChannel(os.path.join(folder, "ch"), **self.config)
        self.sender = self.ch.sender()

    def produce(self, values: list[bytes]) -> None:
        if self.batched:
            self.sender.send_many(values)
            return
        send = self.sender.send
        for v in values:
            send(v)

    def finish(self) -> None:
        self.sender.flush()

    def consume(self, n: int) -> int:
        rx = self.ch.receiver("earliest")
        total = 0
        if self.batched:
            while n > 0:
                # About 128 KiB of records per batch: at 1 KiB, decoding batches that stay in
                # the CPU cache took about half the time per record of 2,000-record batches.
                batch = rx.recv_many(min(n, max(16, min(512, 131072 // self.size))), timeout=0)
                if not batch:
                    raise RuntimeError(f"{n} records missing")
                n -= len(batch)
                total += payload_bytes(batch)
            return total
        recv = rx.recv
        for _ in range(n):
            total += len(recv(timeout=0).value or b"")
        return total

    def close(self) -> None:
        self.ch.close()


def _poll_records(size: int) -> int:
    """Records per poll: 2,000, or 4 MiB of them (a poll holds all it returns in memory)."""
    return max(16, min(2000, (4 << 20) // size))


def _topic_root(folder: str, defaults: bool) -> str:
    """A root folder in ``folder`` with topic "t" of one partition: with ``defaults`` as a user
    creates it, else fsync as in BENCH_CONFIG and uncompressed.

    Topics have no maintenance setting (the clients run it in the background), so the topic
    is uncompressed instead: like the channel rows' maintenance off, a run measures the API,
    not zstd compressing the segments sealed meanwhile."""
    from filechannel.client import Admin

    root = os.path.join(folder, "root")
    settings: dict[str, Any] = {} if defaults else {"fsync": BENCH_CONFIG["fsync"], "compression": "none"}
    Admin(root).create_topic("t", partitions=1, **settings)
    return root


class KafkaLike(Backend):
    """The Kafka-like client; with ``defaults`` its topic is created as a user would."""

    name = "filechannel Producer/Consumer"
    durability = NEVER
    ours = True

    def __init__(self, defaults: bool = False) -> None:
        self.defaults = defaults
        if defaults:
            self.name += " (defaults)"
            self.durability = DEFAULTS

    producer: Producer

    def open(self, folder: str) -> None:
        from filechannel.client import Producer

        self.root = _topic_root(folder, self.defaults)
        self.producer = Producer(self.root)

    def produce(self, values: list[bytes]) -> None:
        send = self.producer.send
        for v in values:
            send("t", v)

    def finish(self) -> None:
        self.producer.flush()

    def consume(self, n: int) -> int:
        from filechannel.client import Consumer

        total = 0
        with Consumer("t", root=self.root, auto_offset_reset="earliest", enable_auto_commit=False) as c:
            while n > 0:
                for recs in c.poll(timeout_ms=1000, max_records=min(n, _poll_records(self.size))).values():
                    n -= len(recs)
                    total += payload_bytes(recs)
        return total

    def close(self) -> None:
        self.producer.close()


class AsyncKafkaLike(KafkaLike):
    """The async client on one asyncio event loop for the whole run, run in the calling thread
    chunk by chunk (``run_until_complete``), as an async application runs it and as the NATS
    peer is run. (Through an anyio blocking portal, a loop in another thread, each chunk
    cost a handoff between two threads: a third of the rate at 100 B.)"""

    name = "filechannel AsyncProducer/AsyncConsumer"
    async_producer: AsyncProducer

    def open(self, folder: str) -> None:
        import asyncio

        from filechannel.client import AsyncProducer

        self.root = _topic_root(folder, self.defaults)
        self.loop = asyncio.new_event_loop()
        self.async_producer = AsyncProducer(self.root)

    def produce(self, values: list[bytes]) -> None:
        async def run() -> None:
            send = self.async_producer.send
            for v in values:
                await send("t", v)

        self.loop.run_until_complete(run())

    def finish(self) -> None:
        self.loop.run_until_complete(self.async_producer.flush())

    def consume(self, n: int) -> int:
        from filechannel.client import AsyncConsumer

        async def run() -> int:
            left, total = n, 0
            async with AsyncConsumer("t", root=self.root, auto_offset_reset="earliest", enable_auto_commit=False) as c:
                while left > 0:
                    batch = await c.getmany(timeout_ms=1000, max_records=min(left, _poll_records(self.size)))
                    for recs in batch.values():
                        left -= len(recs)
                        total += payload_bytes(recs)
            return total

        return self.loop.run_until_complete(run())

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.async_producer.stop())
        finally:
            self.loop.close()


class AsyncGather(AsyncKafkaLike):
    """The async producer with a chunk's sends gathered (``asyncio.gather``), then each delivery
    awaited: batched async use without ``send_and_wait``. Consumed as AsyncKafkaLike."""

    name = "filechannel AsyncProducer, asyncio.gather of sends"

    def produce(self, values: list[bytes]) -> None:
        async def run() -> None:
            import asyncio

            send = self.async_producer.send
            for delivery in await asyncio.gather(*[send("t", v) for v in values]):
                await delivery

        self.loop.run_until_complete(run())


# -- servers users run instead: Redis Streams and NATS JetStream -------------------------------------

INSTALL_SERVERS = "apt-get install redis-server nats-server"


class Server:
    """A server process started in ``folder`` on 127.0.0.1 and a free port; ``stop()`` ends it.

    Raises :class:`NotInstalled` with the install command when the binary is not on PATH. A server that exits
    before it listens (another process took the free port first) is started again on
    another port, up to ``START_TRIES`` times; one that does not listen within ``ready_s``
    is stopped and the error names its log.
    """

    START_TRIES = 3

    def __init__(self, binary: str, folder: str, args: Callable[[int], list[str]], ready_s: float = 10.0) -> None:
        exe = shutil.which(binary)
        if exe is None:
            raise NotInstalled(f"{binary} is not installed: {INSTALL_SERVERS}")
        self.binary = binary
        self.log_path = os.path.join(folder, f"{binary}.log")
        for attempt in range(1, self.START_TRIES + 1):
            (self.port,) = free_ports(1)  # the server binds it a moment later
            self.log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
            self.proc = subprocess.Popen(
                [exe, *args(self.port)], cwd=folder, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
            )
            try:
                if self._listening(ready_s):
                    return
            except BaseException:
                self.stop()
                raise
            self.stop()
            if attempt == self.START_TRIES:
                with open(self.log_path, "rb") as f:
                    tail = f.read()[-500:].decode(errors="replace").strip()
                raise RuntimeError(f"{binary} exited with code {self.proc.returncode} before listening; its log: {tail}")

    def _listening(self, ready_s: float) -> bool:
        """True once the server accepts connections; False if it exited first; raises after ``ready_s``."""
        deadline = time.monotonic() + ready_s
        while True:
            if self.proc.poll() is not None:
                return False
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                if time.monotonic() > deadline:
                    what = f"{self.binary} did not listen on 127.0.0.1:{self.port}"
                    raise RuntimeError(f"{what} within {ready_s} s") from None
            with contextlib.suppress(subprocess.TimeoutExpired):  # returns at once if the server exits
                self.proc.wait(0.02)

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL after 10 s) and close its log. Idempotent."""
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            self.log.close()


REDIS_DURABILITY = "AOF, appendfsync everysec: acked in memory, fsync once a second (up to 1 s lost)"
NATS_DURABILITY = "file store: acked once written to the OS, fsync every 2 min (server default sync_interval)"


class RedisStreams(Backend):
    """Redis Streams: XADD one per call (a round trip each) or pipelined (CHUNK per round
    trip); consumed with XREADGROUP by one member of a consumer group, XACK per batch."""

    durability = REDIS_DURABILITY
    sizes = (100, 1024)  # the sizes; 64 KiB runs would hold 655 MB in the server's memory

    def __init__(self, pipelined: bool) -> None:
        self.pipelined = pipelined
        self.name = "Redis Streams XADD, pipelined" if pipelined else "Redis Streams XADD, one per call"

    def open(self, folder: str) -> None:
        with needs("redis (the Python client)"):
            import redis

        self.server = Server(
            "redis-server",
            folder,
            lambda port: [
                "--bind", "127.0.0.1", "--port", str(port), "--dir", folder, "--save", "",
                "--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no",
            ],
        )  # fmt: skip
        try:
            self.r = redis.Redis(host="127.0.0.1", port=self.server.port)
            self.r.xgroup_create("s", "g", id="0", mkstream=True)
        except BaseException:
            self.server.stop()
            raise

    def produce(self, values: list[bytes]) -> None:
        if self.pipelined:
            pipe = self.r.pipeline(transaction=False)
            for v in values:
                pipe.xadd("s", {"v": v})
            pipe.execute()
            return
        xadd = self.r.xadd
        for v in values:
            xadd("s", {"v": v})

    def consume(self, n: int) -> int:
        total = 0
        while n > 0 and time.perf_counter() < self.deadline:
            # [[stream, [(id, {field: value}), ...]]]; redis-py types it as any reply of any command
            got: Any = self.r.xreadgroup("g", "c", {"s": ">"}, count=min(n, 1000))
            if not got:
                raise RuntimeError(f"{n} records missing")
            entries = got[0][1]
            self.r.xack("s", "g", *[e[0] for e in entries])
            n -= len(entries)
            total += sum(len(e[1][b"v"]) for e in entries)
        return total

    def close(self) -> None:
        try:
            self.r.close()
        finally:
            self.server.stop()


class NatsJetStream(Backend):
    """NATS JetStream, file store: publish awaiting each ack, or with up to CHUNK acks in flight
    (publish_async); consumed by a durable pull consumer (fetch batches, ack the last of
    each: AckAll)."""

    durability = NATS_DURABILITY
    sizes = (100, 1024)

    def __init__(self, in_flight: bool) -> None:
        self.in_flight = in_flight
        self.name = "NATS JetStream publish, many in flight" if in_flight else "NATS JetStream publish, one at a time"

    def open(self, folder: str) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        self.server = Server(
            "nats-server", folder, lambda port: ["-a", "127.0.0.1", "-p", str(port), "-js", "-sd", os.path.join(folder, "js")]
        )
        try:
            self.loop.run_until_complete(self._connect())
        except BaseException:
            self.server.stop()
            self.loop.close()
            raise

    async def _connect(self) -> None:
        with needs("nats-py"):
            import nats
            from nats.js.api import StorageType

        self.nc = await nats.connect(f"nats://127.0.0.1:{self.server.port}", max_reconnect_attempts=0)
        self.js = self.nc.jetstream(publish_async_max_pending=CHUNK_IN_FLIGHT)
        # 8 MiB messages at most (64 KiB rows), as many as the run produces
        await self.js.add_stream(name="s", subjects=["s"], storage=StorageType.FILE, max_msg_size=8 << 20)

    def produce(self, values: list[bytes]) -> None:
        self.loop.run_until_complete(self._produce(values))

    async def _produce(self, values: list[bytes]) -> None:
        js = self.js
        if self.in_flight:
            for v in values:
                await js.publish_async("s", v)
            await js.publish_async_completed()
            return
        for v in values:
            await js.publish("s", v)

    def consume(self, n: int) -> int:
        return self.loop.run_until_complete(self._consume(n))

    async def _consume(self, n: int) -> int:
        from nats.js.api import AckPolicy, ConsumerConfig

        sub = await self.js.pull_subscribe("s", durable="c", config=ConsumerConfig(ack_policy=AckPolicy.ALL))
        total = 0
        while n > 0 and time.perf_counter() < self.deadline:
            msgs = await sub.fetch(min(n, 1000), timeout=5)
            await msgs[-1].ack()
            n -= len(msgs)
            total += sum(len(m.data) for m in msgs)
        return total

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.nc.close())
        finally:
            self.server.stop()
            self.loop.close()


CHUNK_IN_FLIGHT = 1000  # publishes awaiting their ack at most (the throughput runs' chunk)


BACKENDS: dict[str, Callable[[], Backend]] = {
    "floor": Floor,
    "floor-per-call": FloorPerCall,
    "queuelib": QueuelibFifo,
    "persist-queue": PersistQueueFile,
    "persist-queue-sqlite-ack": PersistQueueSQLiteAck,
    "diskcache": DiskcacheDeque,
    "litequeue": LiteQueue,
    "sqlite3": SQLiteTable,
    "redis-xadd": lambda: RedisStreams(pipelined=False),
    "redis-xadd-pipelined": lambda: RedisStreams(pipelined=True),
    "nats-publish": lambda: NatsJetStream(in_flight=False),
    "nats-publish-async": lambda: NatsJetStream(in_flight=True),
    "fc-send": lambda: Channel(batched=False),
    "fc-send-many": lambda: Channel(batched=True),
    "fc-send-defaults": lambda: Channel(batched=False, defaults=True),
    "fc-send-many-defaults": lambda: Channel(batched=True, defaults=True),
    "fc-producer": KafkaLike,
    "fc-producer-defaults": lambda: KafkaLike(defaults=True),
    "fc-async": AsyncKafkaLike,
    "fc-async-defaults": lambda: AsyncKafkaLike(defaults=True),
    "fc-async-gather": AsyncGather,
}
"""Everything in the produce/consume table by key: the floor first, ours last."""
