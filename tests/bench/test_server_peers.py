"""The Redis Streams and NATS JetStream rows: each server started in a temp folder on
127.0.0.1, always stopped; a row naming the install command when the binary is absent.

Runs both ways, never skipped: the absent case with PATH on an empty folder (skipped rows
saying how to install the server); the present case against the installed servers, or, where
they are not installed, checking that the rows say how to install them. No time or ratio is asserted.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from filechannel.bench.measure import throughput
from filechannel.bench.optional import NotInstalled
from filechannel.bench.peers import BACKENDS, INSTALL_SERVERS, NatsJetStream, RedisStreams

ROOT = Path(__file__).resolve().parents[2]
SERVER_ROWS = {"redis-xadd": "redis-server", "redis-xadd-pipelined": "redis-server"}
SERVER_ROWS |= {"nats-publish": "nats-server", "nats-publish-async": "nats-server"}


def _gone(pid: int, within: float = 15.0) -> bool:
    """True once redis-server ``pid`` no longer runs (gone, a zombie, or the pid reused by
    another program), waiting up to ``within`` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().split(") ", 1)[1][0]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if state == "Z" or b"redis-server" not in f.read():
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def _refused(port: int, within: float = 0.0) -> bool:
    """True once a connection to ``port`` is refused, trying for up to ``within`` s (a child
    redis forked for its AOF rewrite keeps the listening socket until it finishes)."""
    deadline = time.monotonic() + within
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@pytest.mark.bench
@pytest.mark.parametrize("key", sorted(SERVER_ROWS))
def test_absent_server_gives_rows_naming_the_install_command(key, tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    rows = throughput(key, 100, 10, 2.0)
    assert [r.workload for r in rows] == ["produce", "consume"]
    for r in rows:
        assert r.backend == BACKENDS[key]().name and r.skipped
        assert f"{SERVER_ROWS[key]} is not installed: {INSTALL_SERVERS}" in (r.error or "")


@pytest.mark.bench
@pytest.mark.parametrize("key", sorted(SERVER_ROWS))
def test_server_row_produces_consumes_and_stops_its_server(key, tmp_path):
    """The whole backend cycle against the real server: every record read back, and the
    server process ended and its port closed after ``close()``."""
    backend = BACKENDS[key]()
    backend.size = 100
    folder = tmp_path / "run"
    folder.mkdir()
    if shutil.which(SERVER_ROWS[key]) is None:  # not installed here: the row must say how to install it
        with pytest.raises(NotInstalled, match=INSTALL_SERVERS):
            backend.open(str(folder))
        return
    backend.open(str(folder))
    try:
        values = [bytes([i % 256]) * 100 for i in range(2500)]
        for i in range(0, len(values), 1000):
            backend.produce(values[i : i + 1000])
        backend.finish()
        assert backend.consume(len(values)) == 100 * len(values)
    finally:
        backend.close()
    assert isinstance(backend, RedisStreams | NatsJetStream)  # the rows that start a server
    assert backend.server.proc.returncode is not None
    assert _refused(backend.server.port, within=15)


@pytest.mark.bench
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_server_stops_when_the_bench_process_is_interrupted_or_killed(how, tmp_path):
    """A bench process stopped by Ctrl-C (its finally stops the server) or killed at its
    time cap (the server dies with it: PR_SET_PDEATHSIG) leaves no server running."""
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises, even when started from a background job\n"
        "from filechannel.bench.peers import BACKENDS\n"
        "b = BACKENDS['redis-xadd']()\n"
        "b.open(sys.argv[1])\n"
        "try:\n"
        "    print(b.server.proc.pid, b.server.port, flush=True)\n"
        "    while True:\n"
        "        time.sleep(0.05)\n"
        "finally:\n"
        "    b.close()\n"
    )
    # Not a blocking read of stdin: a SIGINT that lands after the interpreter last checked
    # for signals and before the read() call began left KeyboardInterrupt pending until the
    # read returned, which it never did (twice in full test runs, 30 s and 90 s timeouts).
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline()
        if shutil.which("redis-server") is None:  # not installed: the process fails, naming the install command
            assert proc.wait(30) != 0 and INSTALL_SERVERS in proc.stderr.read()
            return
        assert line, proc.stderr.read()[-2000:]  # the script failed before the server listened: why
        pid, port = map(int, line.split())
        assert not _refused(port)
        proc.send_signal(how)
        proc.wait(60)  # Server.stop gives redis 10 s after SIGTERM, then kills it
        assert _gone(pid), f"redis-server {pid} still running after the bench process got {how!r}"
        assert _refused(port, within=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.bench
def test_a_server_that_exits_before_listening_is_retried_then_reported_with_its_log(tmp_path):
    from filechannel.bench.peers import Server

    if shutil.which("redis-server") is None:  # not installed: the install command instead
        with pytest.raises(NotInstalled, match=INSTALL_SERVERS):
            Server("redis-server", str(tmp_path), lambda port: [])
        return
    with pytest.raises(RuntimeError, match=r"(?s)redis-server exited with code \d+ before listening; its log: .*not-a-port"):
        Server("redis-server", str(tmp_path), lambda port: ["--port", "not-a-port"])
    assert Server.START_TRIES == 3
