"""A class-data-sharing archive of Spark's JVM, made once per machine, for every Spark JVM the suite starts.

Each Spark JVM the tests start (the session's, the README's two, the standalone cluster's master,
worker, driver and executor) reads and verifies the same thousands of classes from Spark's jars
before it does any work. Java 13+ can record the classes a JVM loaded in a dynamic archive
(``-XX:ArchiveClassesAtExit``) that later JVMs map instead (``-XX:SharedArchiveFile``): a local
Spark session doing one query took 10.5 busy CPU-seconds with it instead of 18.3, 8.6 s instead of
15.8 s (``tests/spark`` alone: the JVMs' CPU 96 -> 76 s).

Invariants:

- The archive is made by a short local Spark job reading and writing a topic through our source
  and sink (``_TRAINING``), so the classes our queries load are in it too, in the background of the
  first test run that lacks it; it is written under a temporary name and renamed once whole, under
  a lock (``fcntl``) shared by concurrent test runs: no JVM ever maps a half-written archive. The
  JVMs of that run started before the rename run on Java's own archive, as without ours. The
  job's Spark runs from a linked copy of pyspark's jars kept beside the archive
  (``SparkArchive.start`` says why): one archive serves every checkout of the same pyspark.
- Its name carries a digest of what it depends on (the ``java`` binary and its module image,
  pyspark's jars, the JVM options): a new Java or pyspark makes a new one, which removes the others
  (archive and jars, or what a killed run left).
  The JVM checks the class path and the jars' sizes and times itself too, and ignores an archive
  that does not match; so does a JVM with another class path (spark-submit's launcher, Hadoop's),
  whose warning about it is turned off (``-Xlog:cds=off``).
- Only when the JVMs' options are the suite's own (``BASE_OPTIONS``): a user's
  ``JAVA_TOOL_OPTIONS`` is left as it is. If the job fails, the suite runs without an archive and
  says why.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

# Every JVM the tests start lives seconds: the C1 compiler alone and the serial collector spend less
# CPU on them than C2's compile threads and G1's workers, which on two CPUs took time from the tests
# beside them (17% less CPU for the Spark sink and Kafka-options tests, measured with /proc/stat
# around them). No perf-data file either: a JVM that keeps one makes /tmp/hsperfdata_<user>, which
# outlived the run. A user's JVMs keep Java's defaults.
BASE_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # the warnings of a JVM that cannot use an archive
_ROOT = Path(__file__).resolve().parents[1]
_WORKER_SITE = _ROOT / "tests" / "spark" / "worker_site"  # see tests/spark/conftest.py


def checkout_python_path() -> str:
    """``PYTHONPATH`` for a process that starts Spark from this checkout (and for the Python processes
    its Spark starts): the checkout, then ``tests/spark/worker_site`` (pyspark imported as installed,
    not compiled again from Spark's zip in each process), then the path this process inherited."""
    return os.pathsep.join([str(_ROOT), str(_WORKER_SITE), os.environ.get("PYTHONPATH", "")])


# A local Spark job in a fresh interpreter: a batch read, then a stream from our source into our sink.
_TRAINING = """
import os, sys
from pyspark.sql import SparkSession
import filechannel.spark
from filechannel.client import Admin, Producer

root = sys.argv[1]
admin = Admin(root)
admin.create_topic("t", partitions=2)
admin.create_topic("u")
with Producer(root) as producer:
    for i in range(100):
        producer.send("t", b"%d" % i)
spark = (
    SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2").config("spark.local.dir", os.path.join(root, "local"))
    .getOrCreate()
)
filechannel.spark.register(spark)
assert spark.read.format("filechannel").option("root", root).option("subscribe", "t").load().count() == 100
query = (
    spark.readStream.format("filechannel").option("root", root).option("subscribe", "t")
    .option("startingOffsets", "earliest").load().select("key", "value")
    .writeStream.format("filechannel").option("root", root).option("topic", "u")
    .option("checkpointLocation", os.path.join(root, "checkpoint")).trigger(availableNow=True).start()
)
query.awaitTermination()
jvm = spark.sparkContext._gateway.proc  # spark-submit, exec'ed into the JVM: it writes the archive as it exits,
spark.stop()
jvm.stdin.close()  # which it does when its stdin closes
jvm.wait(timeout=300)
os.replace(sys.argv[2], sys.argv[3])  # the archive, whole, in place for the JVMs started from now on
"""


def cache_dir() -> Path:
    """Where the archives live: the checkouts' shared cache (``make``'s, ``$XDG_CACHE_HOME`` if set)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "filechannel" / "jvm"


def _java_home(java: str) -> Path:
    return Path(os.path.realpath(java)).parents[1]


def digest(java: str, jars: Path) -> str:
    """What the archive depends on: the JVM (its binary and module image), Spark's jars, the options."""
    java_home = _java_home(java)
    h = hashlib.sha256(f"{java_home} {BASE_OPTIONS}".encode())
    for path in [java_home / "lib" / "modules", *sorted(jars.iterdir())]:
        st = path.stat()
        h.update(f"{path.name} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


class SparkArchive:
    """This machine's archive for Spark's JVMs, and its making when there is none yet.

    ``options`` name it whether or not it exists yet: a JVM started before it is in place runs
    with Java's own archive alone (named first, as the base the dynamic archive was made on top of),
    one started after maps both. ``start()`` makes it in the background when it is missing, while
    the tests run (the first run on a machine pays the job's CPU, not its minute of waiting): the
    job renames it into place once whole. ``finish()`` waits for the job and cleans up after it."""

    def __init__(self, java: str, spark_home: Path) -> None:
        self.spark_home = spark_home
        self.path = cache_dir() / f"spark-{digest(java, spark_home / 'jars')}.jsa"
        java_base = _java_home(java) / "lib" / "server" / "classes.jsa"
        files = f"{java_base}:{self.path}" if java_base.exists() else str(self.path)
        self.options = f"{BASE_OPTIONS} -XX:SharedArchiveFile={files} {_QUIET}"
        self._lock: IO[str] | None = None
        self._job: subprocess.Popen[bytes] | None = None
        self._root: tempfile.TemporaryDirectory[str] | None = None
        self._why = ""  # why start() could not start the job

    @classmethod
    def of_this_machine(cls) -> tuple[SparkArchive | None, str]:
        """The archive for this machine's ``java`` and pyspark; (None, why) without either."""
        java = shutil.which("java")
        if java is None:
            return None, "no `java` on the PATH"
        try:
            import pyspark
        except ImportError:
            return None, "pyspark is not installed"
        return cls(java, Path(pyspark.__file__).parent), ""

    @property
    def _partial(self) -> Path:
        return self.path.with_name(f".{self.path.name}.tmp")

    def start(self) -> None:
        """Start making the archive if it is missing and no other test run is making it.

        A JVM maps an archive only while the jars it was made from are where they were, as they
        were (it checks their paths, sizes and times), though its own class path may name other
        copies of them. So the job's Spark runs from a copy of pyspark's ``bin`` and ``jars`` kept
        beside the archive (hard links: no bytes copied, same sizes and times), not from the
        checkout's venv, which a fresh clone, as CI's, has at another path and which goes with it."""
        if self.path.exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(self.path.parent / ".lock", "w")  # noqa: SIM115 (held until finish() closes it)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another run is making it: this one's later JVMs may find it made
            lock.close()
            return
        self._lock = lock
        if self.path.exists():  # made while this run looked
            return
        try:
            self._start_job()
        except OSError as e:
            self._why = f"it could not be started: {e}"

    def _start_job(self) -> None:
        for other in self.path.parent.iterdir():  # older archives and their jars, or what a killed run left
            if other.name != ".lock":
                shutil.rmtree(other) if other.is_dir() else other.unlink()
        home = self.path.with_suffix("")
        for part in ("bin", "jars"):
            shutil.copytree(self.spark_home / part, home / part, copy_function=_link_or_copy)
        self._root = tempfile.TemporaryDirectory(prefix="fc-jvm-archive-")
        err = Path(self._root.name) / "job.err"  # a file, not a pipe: nobody reads Spark's logs until finish()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "JAVA_TOOL_OPTIONS": f"{BASE_OPTIONS} -XX:ArchiveClassesAtExit={self._partial} {_QUIET}",
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": checkout_python_path(),
        }
        with err.open("w") as log:  # the job has its own descriptor of it
            self._job = subprocess.Popen(
                [sys.executable, "-c", _TRAINING, str(Path(self._root.name) / "topics"), str(self._partial), str(self.path)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,  # a Ctrl-C of the tests is not the job's: finish() ends it
            )

    def finish(self, timeout: float = 600) -> str:
        """Wait for the job started by ``start()``; '' if the archive is in place, else why not (the
        job failed, or ran past ``timeout`` and was killed)."""
        try:
            if self._why:
                return self._why
            if self._job is not None:
                try:
                    self._job.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(self._job.pid, signal.SIGKILL)
                    self._job.wait()
                    return f"the local Spark job that makes it ran for more than {timeout:.0f} s"
                if self._job.returncode != 0:
                    err = (Path(self._root.name) / "job.err").read_text(errors="replace") if self._root else ""
                    return f"the local Spark job that makes it failed (exit {self._job.returncode}): {err[-1500:]}"
            return "" if self.path.exists() else "another test run is making it"
        finally:
            if self._lock is not None:  # this run made it, or tried: nothing of the try is left
                self._partial.unlink(missing_ok=True)
                if self._root is not None:
                    self._root.cleanup()
                self._lock.close()  # the lock with it


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link, or where the cache is on another file system a copy with the same times."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
