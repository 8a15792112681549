"""One SeaweedFS server for a whole pytest-xdist run: the controller starts it, every worker uses it.

Each worker used to start a server of its own for the ``seaweed`` fixture, and four servers
idled through the run beside the tests (0.011 CPU-seconds a second each, about 5 CPU-seconds
in a run of 450 s, plus 0.45 to start). Tests that kill or restart a server take one of their
own (``private_seaweed``); the session's serves buckets named at random, one or more per test.

Invariants:

- The controller starts it before the workers start (``pytest_sessionstart``) and stops it
  when the run ends (``pytest_unconfigure``); it dies with the controller's main thread anyway
  (``die_with_parent``). A worker reaches it through ``ENV``, which holds its folder and ports;
  the access key stays in the server's own ``s3.json``, as for a server of the worker's own.
- A worker never starts, kills or stops it (``Attached`` refuses). Without ``ENV`` (no xdist,
  or the controller could not start one) the fixture starts a server of the worker's own.
"""

from __future__ import annotations

import json
import os
from typing import NoReturn

from filechannel.bench.seaweed import SeaweedServer

ENV = "FC_TEST_SESSION_S3"


def start_for_workers() -> SeaweedServer | None:
    """Start the run's server and publish it in ``ENV`` (the workers inherit it); None if it would not start."""
    server = SeaweedServer()
    try:
        server.start()
    except Exception:  # boto3 or weed missing, or no start: each worker tries (and reports) on its own
        server.stop()
        return None
    os.environ[ENV] = json.dumps({"dir": server.dir, "ports": server.ports})
    return server


class Attached(SeaweedServer):
    """The controller's server as a worker uses it: its endpoint, key and buckets, never its process."""

    def __init__(self, folder: str, ports: dict[str, int]) -> None:  # (not SeaweedServer's: no new folder or key)
        self.dir, self.ports, self.proc = folder, ports, None
        with open(os.path.join(folder, "s3.json")) as f:
            (credentials,) = json.load(f)["identities"][0]["credentials"]
        self.access_key, self.secret_key = credentials["accessKey"], credentials["secretKey"]

    def start(self) -> NoReturn:
        raise RuntimeError("the session's S3 server is the run's: a test that restarts one takes private_seaweed")

    kill = start

    def stop(self) -> None:
        """Nothing: the controller stops it."""


def attached() -> Attached | None:
    """The controller's server, if it started one for this run."""
    described = os.environ.get(ENV)
    if described is None:
        return None
    shared = json.loads(described)
    return Attached(shared["dir"], shared["ports"])
