"""A class-data-sharing archive of Spark's JVM, made once per machine, for every Spark JVM the suite starts.

Each Spark JVM the tests start (the session's, the README's two, the standalone cluster's master,
worker, driver and executor) reads and verifies the same thousands of classes from Spark's jars
before it does any work. Java 13+ can record the classes a JVM loaded in a dynamic archive
(``-XX:ArchiveClassesAtExit``) that later JVMs map instead (``-XX:SharedArchiveFile``): a local
Spark session doing one query took 10.5 busy CPU-seconds with it instead of 18.3, 8.6 s instead of
15.8 s (``tests/spark`` alone: the JVMs' CPU 96 -> 76 s).

Invariants:

- The archive is made by a short local Spark job reading and writing a topic through our source
  and sink (``_TRAINING``), so the classes our queries load are in it too; it is written under a
  temporary name and renamed, under a lock (``fcntl``) shared by concurrent test runs: no JVM ever
  maps a half-written archive. The job's Spark runs from a linked copy of pyspark's jars kept beside
  the archive (``_make`` says why): one archive serves every checkout of the same pyspark.
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
import subprocess
import sys
import tempfile
from pathlib import Path

# Every JVM the tests start lives seconds: the C1 compiler alone and the serial collector spend less
# CPU on them than C2's compile threads and G1's workers, which on two CPUs took time from the tests
# beside them (17% less CPU for the Spark sink and Kafka-options tests, measured with /proc/stat
# around them). A user's JVMs keep Java's defaults.
BASE_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_USE = "-XX:SharedArchiveFile={} -Xlog:cds=off -Xlog:cds+dynamic=off"
_ROOT = Path(__file__).resolve().parents[1]
_WORKER_SITE = _ROOT / "tests" / "spark" / "worker_site"  # see tests/spark/conftest.py

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
"""


def cache_dir() -> Path:
    """Where the archives live: the checkouts' shared cache (``make``'s, ``$XDG_CACHE_HOME`` if set)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "filechannel" / "jvm"


def digest(java: str, jars: Path) -> str:
    """What the archive depends on: the JVM (its binary and module image), Spark's jars, the options."""
    java_home = Path(os.path.realpath(java)).parents[1]
    h = hashlib.sha256(f"{java_home} {BASE_OPTIONS}".encode())
    for path in [java_home / "lib" / "modules", *sorted(jars.iterdir())]:
        st = path.stat()
        h.update(f"{path.name} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def spark_archive() -> tuple[Path | None, str]:
    """The archive for this machine's Java and pyspark, made now if there is none; (None, why) if
    there cannot be one (no ``java``, no pyspark, or the job failed)."""
    java = shutil.which("java")
    if java is None:
        return None, "no `java` on the PATH"
    try:
        import pyspark
    except ImportError:
        return None, "pyspark is not installed"
    spark_home = Path(pyspark.__file__).parent
    archive = cache_dir() / f"spark-{digest(java, spark_home / 'jars')}.jsa"
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, whatever is raised
        if archive.exists():
            return archive, ""
        for other in archive.parent.iterdir():  # older archives and their jars, or what a killed run left
            if other.name != ".lock":
                shutil.rmtree(other) if other.is_dir() else other.unlink()
        why = _make(archive, spark_home)
        if why:
            return None, why
    return archive, ""


def _make(archive: Path, spark_home: Path) -> str:
    """Run the job with the archive written at its exit; '' once it is in place, else why not.

    A JVM maps an archive only while the jars it was made from are where they were, as they were
    (it checks their paths, sizes and times), though its own class path may name other copies of
    them. So the job's Spark runs from a copy of pyspark's ``bin`` and ``jars`` kept beside the
    archive (hard links: no bytes copied, same sizes and times), not from the checkout's venv,
    which a fresh clone, as CI's, has at another path and which goes with its checkout."""
    home = archive.with_suffix("")
    for part in ("bin", "jars"):
        shutil.copytree(spark_home / part, home / part, copy_function=_link_or_copy)
    partial = archive.with_name(f".{archive.name}.tmp")
    with tempfile.TemporaryDirectory(prefix="fc-jvm-archive-") as root:
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "JAVA_TOOL_OPTIONS": f"{BASE_OPTIONS} -XX:ArchiveClassesAtExit={partial} -Xlog:cds=off -Xlog:cds+dynamic=off",
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join([str(_ROOT), str(_WORKER_SITE), os.environ.get("PYTHONPATH", "")]),
        }
        try:
            proc = subprocess.run([sys.executable, "-c", _TRAINING, root], env=env, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return "the local Spark job that makes it ran for more than 600 s"
    if proc.returncode != 0 or not partial.exists():
        return f"the local Spark job that makes it failed (exit {proc.returncode}): {proc.stderr[-1500:]}"
    os.replace(partial, archive)
    return ""


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link, or where the cache is on another file system a copy with the same times."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def java_tool_options() -> tuple[str, str]:
    """The options for the suite's JVMs: ``BASE_OPTIONS`` and the Spark archive's, or ``BASE_OPTIONS``
    alone and why there is no archive."""
    archive, why = spark_archive()
    if archive is None:
        return BASE_OPTIONS, why
    return f"{BASE_OPTIONS} {_USE.format(archive)}", ""
