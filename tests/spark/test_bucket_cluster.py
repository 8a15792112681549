"""A Spark standalone cluster whose worker cannot see the roots streams them from the bucket alone (issue 37).

The test starts a master and a worker from pyspark's own ``spark-class``, the worker in a
private mount namespace (``unshare --mount``, as root) where the roots' folder is an empty
tmpfs, and a driver in a subprocess (one SparkContext per process: this process may hold the
session's local one) running an ``availableNow`` stream with ``option("tier")`` against the
session's SeaweedFS. The three are always stopped: each is the leader of its own process
group (executors and Python workers included), killed with SIGKILL at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pyspark
import pytest

from filechannel.bench.seaweed import SeaweedServer, wait_for

from .. import jvm_archive
from ..tiering.test_origins import edge_root, produce, upload_all, value

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.s3]

SPARK_CLASS = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")

# The driver: checks that an executor sees an empty folder where the roots are, then runs the stream.
DRIVER = r"""
import json, os, sys
from pyspark.sql import SparkSession
import filechannel.spark

master, url, options, out, checkpoint, roots = sys.argv[1:]
spark = (
    SparkSession.builder.master(master).appName("filechannel-cluster-test")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.executor.memory", "512m").config("spark.cores.max", "1")
    .config("spark.sql.shuffle.partitions", "1")
    .config("spark.pyspark.python", sys.executable)
    .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    .config("spark.executorEnv.AWS_ACCESS_KEY_ID", os.environ["AWS_ACCESS_KEY_ID"])
    .config("spark.executorEnv.AWS_SECRET_ACCESS_KEY", os.environ["AWS_SECRET_ACCESS_KEY"])
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
filechannel.spark.register(spark)
seen = spark.sparkContext.parallelize([0], 1).map(lambda _: sorted(os.listdir(roots))).collect()
print("executor sees in the roots' folder:", json.dumps(seen[0]), flush=True)
query = (
    spark.readStream.format("filechannel").option("tier", url).option("tierOptions", options)
    .option("origins", "edge-*").option("subscribe", "clicks").option("startingOffsets", "earliest").load()
    .select("origin", "topic", "partition", "offset", "value")
    .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
    .trigger(availableNow=True).start()
)
query.awaitTermination()
spark.stop()
"""


@contextlib.contextmanager
def started(argv: list[str], log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` running as the leader of a new process group, its output in ``log``; the whole
    group stopped on exit, whatever happened: SIGTERM (the JVMs' shutdown hooks remove their
    temporary files), then SIGKILL for what is left after 30 s."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what is left of the group (the leader's children too)
        proc.wait()


def tails(*logs: Path) -> str:
    """The last lines of each log, for a failure message."""
    return "\n".join(f"--- {log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]) for log in logs)


def waited(condition: Callable[[], bool], what: str, *logs: Path) -> None:
    """``wait_for`` (120 s), failing with the last lines of ``logs``."""
    try:
        wait_for(condition, 120, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{tails(*logs)}") from None


def logged(log: Path, pattern: str, what: str) -> str:
    """The first group of ``pattern``'s first match in ``log``, once the process has written it."""
    waited(lambda: re.search(pattern, log.read_text(errors="replace")) is not None, what, log)
    found = re.search(pattern, log.read_text(errors="replace"))  # a log only grows: still there
    assert found is not None
    return found.group(1)


def alive_workers(webui_port: int) -> int:
    """The master's count of live workers; 0 while its web UI is not up, or is up but still serves
    its HTML page at /json/ (it did once, starting under load)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=5) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except (OSError, ValueError):  # ValueError: json's JSONDecodeError
        return 0


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
def test_a_cluster_whose_worker_cannot_see_the_roots_streams_every_origin_from_the_bucket(
    seaweed: SeaweedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)  # the edge daemons' (and the driver's, below)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    url, options = f"s3://{seaweed.new_bucket()}/fc", {"endpoint_url": seaweed.endpoint, "region_name": "us-east-1"}
    roots = tmp_path / "roots"
    for origin, count in (("edge-1", 300), ("edge-2", 200)):
        root = edge_root(roots, origin, url, options)
        produce(root, origin, count)
        upload_all(root)

    (tmp_path / "tmp").mkdir()  # every temporary file of the cluster's processes, gone with tmp_path
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "TMPDIR": str(tmp_path / "tmp"),
        "SPARK_LOCAL_DIRS": str(tmp_path / "tmp"),
        "JDK_JAVA_OPTIONS": f"-Djava.io.tmpdir={tmp_path / 'tmp'}",
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # its REST server's port is a fixed 6066
    }
    env.pop("SPARK_HOME", None)  # spark-class finds pyspark's own
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
    # Port 0: the master and its web UI bind ports of their own choosing and log them; a free port probed
    # beforehand can be taken before the JVM binds it, and Spark then binds the next one, where nothing looks.
    master_argv = [
        SPARK_CLASS,
        "org.apache.spark.deploy.master.Master",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--webui-port",
        "0",
    ]
    with started(master_argv, master_log, env):
        master = logged(master_log, r"Starting Spark master at (spark://\S+)", "the master's address")
        master_ui = int(logged(master_log, r"Successfully started service 'MasterUI' on port (\d+)", "the master's web UI"))
        # The worker once the master serves: one started beside a master still starting retries its
        # registration every 5-15 s, then every 30-90 s (Spark's Worker).
        hide = f"mount -t tmpfs -o size=1m filechannel-test-empty {roots}"
        worker = f'{hide} && exec "$0" org.apache.spark.deploy.worker.Worker {master} --host 127.0.0.1 --webui-port 0 '
        worker += f"--cores 1 --memory 1g --work-dir {tmp_path / 'worker'}"
        with started(["unshare", "--mount", "--propagation", "private", "sh", "-c", worker, SPARK_CLASS], worker_log, env):
            waited(lambda: alive_workers(master_ui) >= 1, "a worker registered with the master", master_log, worker_log)
            out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
            # The checkout under test for the driver and (spark.executorEnv.PYTHONPATH) the executors.
            driver_env = {**env, "PYTHONPATH": jvm_archive.checkout_python_path()}
            argv = [sys.executable, "-c", DRIVER, master, url, json.dumps(options), str(out), str(checkpoint), str(roots)]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=driver_env)
    assert proc.returncode == 0, f"driver failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}\n{tails(master_log, worker_log)}"
    assert "executor sees in the roots' folder: []" in proc.stdout  # the roots are there, on this side only
    assert sorted(os.listdir(roots)) == ["edge-1", "edge-2"]
    import pyarrow.dataset as ds  # here, not at the top: it imports pandas, a second of each worker's collection

    got = sorted(
        (r["origin"], r["topic"], r["partition"], r["offset"], r["value"]) for r in ds.dataset(out).to_table().to_pylist()
    )
    want = sorted((o, "clicks", i % 2, i // 2, value(o, i)) for o, n in (("edge-1", 300), ("edge-2", 200)) for i in range(n))
    assert got == want
    logs = [tmp_path / "worker.log", *(tmp_path / "worker").rglob("std*")]  # the worker's, and its executors'
    assert logs[1:] and all(seaweed.secret_key not in p.read_text() for p in logs)
    assert seaweed.secret_key not in proc.stdout + proc.stderr
