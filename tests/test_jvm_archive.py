"""The suite's Spark JVMs map their classes from the class archive (tests/jvm_archive.py)."""

import fcntl
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from filechannel.bench.seaweed import wait_for

from . import jvm_archive


def test_the_suites_jvms_keep_no_perf_data_file_in_tmp():
    """Every JVM the tests start takes BASE_OPTIONS (tests/conftest.py), and so makes no
    /tmp/hsperfdata_<user> folder, which the JVM does not remove."""
    env = {**os.environ, "JAVA_TOOL_OPTIONS": jvm_archive.BASE_OPTIONS}
    proc = subprocess.run(["java", "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\bUsePerfData\s+= false\b", proc.stdout), proc.stdout[-2000:]


@pytest.mark.spark
def test_a_spark_jvm_loads_spark_from_the_archive_and_spark_submits_launcher_says_nothing(tmp_path):
    import pyspark

    archive, why = jvm_archive.SparkArchive.of_this_machine()
    assert archive is not None, why
    assert re.search(
        r"-XX:SharedArchiveFile=\S+/lib/server/classes\.jsa:\S+/filechannel/jvm/spark-[0-9a-f]{16}\.jsa", archive.options
    )
    # the first run on a machine makes it while the tests run (conftest.py): it is in place within minutes
    wait_for(archive.path.exists, 600, "the class archive")
    options = archive.options
    logs = tmp_path / "logs"
    logs.mkdir()
    # spark-submit's launcher JVM (another class path: it cannot map the archive) and Spark's own;
    # where each loaded each class from goes to a file per JVM, not to the output spark-submit parses
    proc = subprocess.run(
        [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "--version"],
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "JAVA_TOOL_OPTIONS": f"{options} -Xlog:class+load=info:file={logs}/%p.log",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = "".join(log.read_text() for log in logs.iterdir())
    assert "org.apache.spark.deploy.SparkSubmit source: shared objects file (top)" in loaded, loaded[-2000:]
    assert "cds" not in proc.stderr.replace(options, ""), proc.stderr  # no warning from the launcher's JVM


@pytest.fixture
def fake_jdk(tmp_path: Path) -> str:
    """A ``java`` whose JVM is files only: what the archive's name is made of."""
    (tmp_path / "jdk" / "bin").mkdir(parents=True)
    (tmp_path / "jdk" / "lib").mkdir()
    (tmp_path / "jdk" / "bin" / "java").write_bytes(b"")
    (tmp_path / "jdk" / "lib" / "modules").write_bytes(b"17")
    return str(tmp_path / "jdk" / "bin" / "java")


def test_the_archive_is_named_by_the_jvm_and_jars_it_holds_classes_of(tmp_path, fake_jdk):
    """A jar or the JVM changed (a new pyspark, a new Java) names another archive: the old one is never mapped again."""
    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / "a.jar").write_bytes(b"one")
    names = [jvm_archive.digest(fake_jdk, tmp_path / "jars")]
    (tmp_path / "jars" / "a.jar").write_bytes(b"two!")  # another size: two writes can share an mtime
    names.append(jvm_archive.digest(fake_jdk, tmp_path / "jars"))
    (tmp_path / "jdk" / "lib" / "modules").write_bytes(b"21.0")  # another size too
    names.append(jvm_archive.digest(fake_jdk, tmp_path / "jars"))
    assert len(set(names)) == 3
    assert jvm_archive.digest(fake_jdk, tmp_path / "jars") == names[-1]


def test_an_archive_that_cannot_be_made_says_why_and_leaves_the_lock_free(tmp_path, fake_jdk, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "spark" / "jars").mkdir(parents=True)  # no bin/: no Spark to run the job with
    archive = jvm_archive.SparkArchive(fake_jdk, tmp_path / "spark")
    archive.start()
    assert "could not be started" in archive.finish()
    assert not archive.path.exists()
    with open(jvm_archive.cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: the next run makes it
