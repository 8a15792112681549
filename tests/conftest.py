"""Shared test settings: hypothesis profiles (CI runs more examples); the JVMs' options and class
archive; the session's SeaweedFS server; a port nobody listens on."""

import gc
import os
import socket
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from filechannel.bench.seaweed import SeaweedServer, running_seaweed

from . import jvm_archive, session_s3, warm_bytecode

settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# CI (a fresh clone, so no example database: new examples every run) runs twice a developer's
# examples. Three times (120) cost 32 CPU-seconds more than the developer's 40 in a run, a third of
# it in two state machines (test_transaction_states.py, test_state_machine.py).
settings.register_profile("ci", max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# The options of every JVM the tests start, unless the user set them (tests/jvm_archive.py says why).
_JVM_OPTIONS_ARE_OURS = "JAVA_TOOL_OPTIONS" not in os.environ
os.environ.setdefault("JAVA_TOOL_OPTIONS", jvm_archive.BASE_OPTIONS)


_SPARK_ARCHIVE: jvm_archive.SparkArchive | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Spark's JVMs map the class archive (made in the background if this machine has none). In the
    process that runs the tests, or hands them out to pytest-xdist's workers, which inherit its environment."""
    global _SPARK_ARCHIVE
    if _JVM_OPTIONS_ARE_OURS and not hasattr(config, "workerinput"):
        _SPARK_ARCHIVE, why = jvm_archive.SparkArchive.of_this_machine()
        if _SPARK_ARCHIVE is None:
            config.issue_config_time_warning(pytest.PytestWarning(f"Spark's JVMs start without a class archive: {why}"), 2)
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = _SPARK_ARCHIVE.options
            _SPARK_ARCHIVE.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's S3 server stopped; the archive's job, if this run started one, done and its archive
    in place (or why not, said)."""
    if _SESSION_S3 is not None:
        _SESSION_S3.stop()
    if _SPARK_ARCHIVE is not None and (why := _SPARK_ARCHIVE.finish()):
        print(f"\nSpark's class archive was not made: {why}", file=sys.stderr)


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedServer]:
    """The session's SeaweedFS server: the tier-2 tests' S3 and the README's. Under pytest-xdist, the
    one the controller started for every worker (tests/session_s3.py); else started on first use."""
    shared = session_s3.attached()
    if shared is not None:
        yield shared
        return
    with running_seaweed() as server:
        yield server


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (``--dist loadgroup``) every test of the session's Spark (those that take
    the ``spark`` fixture) runs on one worker, which starts the one local Spark session
    (tests/spark/conftest.py) instead of one per worker; likewise every HDFS test, for the one
    HDFS (tests/tiering/conftest.py). Tests marked ``spark`` that start Spark processes of their
    own (the README's block, the standalone cluster) run on any worker.

    The longest work is handed out first: the Spark group (a third of the suite's time, on one
    worker), then the HDFS group and the tests marked ``slow``, then the rest in file order.
    Handed out last, the bench's smoke run (a minute and a half) once ran alone at the end.

    ``tryfirst``: pytest-xdist reads the ``xdist_group`` marks in a hook of its own (it names each
    test ``nodeid@group``), which must run after this one."""

    def rank(item: pytest.Item) -> int:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
            return 0
        if item.get_closest_marker("hdfs"):
            item.add_marker(pytest.mark.xdist_group("hdfs"))
            return 1
        return 1 if item.get_closest_marker("slow") else 2

    items[:] = sorted(items, key=rank)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (the test modules, the package and the libraries they import, the
    items) lives until the run ends: frozen, it is left out of every later collection of the
    oldest generation, which each worker's collector runs some twenty times a run (measured with
    ``gc.callbacks``: the four workers' passes took 16.7 CPU-seconds in all, 12.2 with this)."""
    gc.collect()  # garbage is collected, not frozen
    gc.freeze()


@pytest.fixture
def unused_port() -> Iterator[int]:
    """A port on 127.0.0.1 that nothing listens on (connections to it are refused), held for the
    test: a socket bound to it and never listening, so that no other process can take it (a port
    found free and let go was once taken by another worker's S3 server within the test, whose
    "unreachable" storage then answered "no such bucket")."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


_SESSION_S3: SeaweedServer | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist, before the workers start, the controller compiles the test modules and
    the package once (tests/warm_bytecode.py) and starts the run's S3 server (tests/session_s3.py)."""
    global _SESSION_S3
    if session.config.pluginmanager.hasplugin("dsession"):  # (xdist's controller: its workers have none)
        with warm_bytecode.warming(session.config):
            _SESSION_S3 = session_s3.start_for_workers()
