"""A real HDFS on 127.0.0.1 for the tests: Hadoop 2.7.3's NameNode and DataNode, one JVM each.

Facts behind it (measured): ../shared/notes/hdfs.md. No package installs a Hadoop server, but PyPI's
source package of pyspark 2.4.8 ships Hadoop 2.7.3's jars in ``deps/jars``; :func:`hadoop_jars` fetches
it once with pip and keeps only those jars in a cache outside the repository
(``$XDG_CACHE_HOME/filechannel/hadoop-2.7.3/jars``, ``~/.cache`` by default). The cache is written
whole or not at all: extracted into a temporary folder beside it, then renamed, under a file lock, so a
killed fetch leaves no half cache (the next fetch removes its temporary folder) and two test sessions
fetch once.

:class:`HdfsCluster` runs the two daemons in their own temp folder (configuration, metadata, blocks,
logs), every port free and given explicitly on 127.0.0.1; :meth:`HdfsCluster.stop` sends SIGTERM, then
SIGKILL after a few seconds, and removes the folder. WebHDFS is on where Jersey 1 is installed (Debian's
``libjersey1-core-java libjersey1-server-java libjersey1-servlet-java``, which .ci/run installs): the
NameNode's REST server needs it, and the jars ship Jersey 2 only, which is then left off the classpath.
Without Jersey 1 WebHDFS is off (the NameNode would stop at start) and :func:`webhdfs_missing_reason`
says why. Each JVM dies with the thread that started it (``PR_SET_PDEATHSIG``) and keeps no perf data
file in /tmp (``-XX:-UsePerfData``), so a killed test session leaves nothing running or behind.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import TYPE_CHECKING
from xml.sax.saxutils import escape

from filechannel.bench.seaweed import die_with_parent, free_ports

HADOOP_VERSION = "2.7.3"
_PYSPARK_SDIST = "pyspark==2.4.8"  # its deps/jars are Hadoop 2.7.3's, servers included
_JARS_IN_SDIST = "pyspark-2.4.8/deps/jars/"
_PIP_SOURCE_ONLY = ("--no-deps", "--no-binary", ":all:", "--no-build-isolation")
_NAMENODE = "org.apache.hadoop.hdfs.server.namenode.NameNode"
_DATANODE = "org.apache.hadoop.hdfs.server.datanode.DataNode"
# HttpServer2 looks its web apps up on the classpath: empty folders of these names are enough.
_WEBAPPS = ("hdfs", "datanode", "secondary", "journal")
# Debian's Jersey 1 (and the JAX-RS 1 API it needs), for WebHDFS; Jersey 2 and its injector would shadow it.
_JERSEY1 = tuple(f"/usr/share/java/{jar}.jar" for jar in ("jersey1-core", "jersey1-server", "jersey1-servlet", "jsr311-api"))
_JERSEY2 = ("jersey-", "javax.ws.rs-api-", "hk2-", "javax.inject-2.", "aopalliance-repackaged-")
_JVM = ("java", "-XX:-UsePerfData", "-Djava.net.preferIPv4Stack=true")
_PORTS = ("rpc", "namenode.http", "datanode.data", "datanode.http", "datanode.ipc")
_START_TIMEOUT = 180  # two JVMs on 2 shared CPUs: seconds, not a measure of anything
_STOP_GRACE = 10


def java_missing_reason() -> str | None:
    """Why the HDFS tests cannot run here (no ``java`` on the PATH), or None if they can."""
    if shutil.which("java") is None:
        return "HDFS tests need Java (a JRE with `java` on the PATH) to run Hadoop's NameNode and DataNode"
    return None


def webhdfs_missing_reason() -> str | None:
    """Why the cluster runs without WebHDFS (Jersey 1 missing), or None if it has it."""
    missing = [jar for jar in _JERSEY1 if not os.path.exists(jar)]
    if missing:
        return (
            f"WebHDFS needs Jersey 1 on the NameNode's classpath ({', '.join(missing)} missing): "
            "apt-get install libjersey1-core-java libjersey1-server-java libjersey1-servlet-java"
        )
    return None


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "filechannel", f"hadoop-{HADOOP_VERSION}")


def hadoop_jars() -> str:
    """The folder of Hadoop's jars, fetched into the cache on first use (see the module docstring)."""
    root = cache_dir()
    jars = os.path.join(root, "jars")
    if os.path.isdir(jars):
        return jars
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be fetching: wait for it, then use its cache
        if not os.path.isdir(jars):
            _fetch_jars(root, jars)
    return jars


def _fetch_jars(root: str, jars: str) -> None:
    for stale in glob.glob(os.path.join(root, "fetch-*")):  # a killed fetch's (we hold the lock: nobody else's)
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=root) as work:
        # The sdist's setup.py fails under build isolation; pip only reads its metadata here.
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", *_PIP_SOURCE_ONLY, "-d", work, _PYSPARK_SDIST],
            check=True,
            timeout=1800,
        )
        (sdist,) = (os.path.join(work, f) for f in os.listdir(work) if f.endswith(".tar.gz"))
        staged = os.path.join(work, "jars")
        os.mkdir(staged)
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar:
                if member.isfile() and member.name.startswith(_JARS_IN_SDIST) and member.name.endswith(".jar"):
                    member.name = member.name.removeprefix(_JARS_IN_SDIST)
                    tar.extract(member, staged, filter="data")
        if not any(f.startswith("hadoop-hdfs-") for f in os.listdir(staged)):
            raise RuntimeError(f"{_PYSPARK_SDIST}'s source package has no hadoop-hdfs jar in {_JARS_IN_SDIST}")
        os.rename(staged, jars)  # whole or not at all


def _site_xml(properties: dict[str, str]) -> str:
    rows = "".join(f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n" for k, v in properties.items())
    return f'<?xml version="1.0"?>\n<configuration>\n{rows}</configuration>\n'


class HdfsCluster:
    """One NameNode and one DataNode (replication 1, permissions off) in a temp folder of their own."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="fc-hdfs-")
        self.ports: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._classpath = ""
        self.webhdfs = webhdfs_missing_reason() is None

    @property
    def rpc_port(self) -> int:
        return self.ports["rpc"]

    @property
    def url(self) -> str:
        """The ``hdfs://`` URL of the file system's root (the NameNode's RPC address)."""
        return f"hdfs://127.0.0.1:{self.rpc_port}"

    @property
    def webhdfs_url(self) -> str:
        """The ``webhdfs://`` URL of the file system's root (the NameNode's HTTP address), if :attr:`webhdfs`."""
        return f"webhdfs://127.0.0.1:{self.ports['namenode.http']}"

    def start(self) -> None:
        """Format the name folder, start both daemons and wait until a file can be written."""
        self._classpath = self._prepare_classpath()
        for _attempt in range(3):  # another process may take a port between our probe and the bind
            self.ports = dict(zip(_PORTS, free_ports(len(_PORTS)), strict=True))
            self._write_config()
            self._java("format", "-Xmx256m", _NAMENODE, "-format", "-force", "-nonInteractive", wait=True)
            self._java("namenode", "-Xmx512m", _NAMENODE)
            self._java("datanode", "-Xmx512m", _DATANODE)
            if self._wait_ready():
                return
            self._terminate()
        raise AssertionError(f"HDFS did not start; its logs:\n{self.log_tail()}")

    def _prepare_classpath(self) -> str:
        jars = hadoop_jars()
        for name in _WEBAPPS:
            os.makedirs(os.path.join(self.dir, "webapps", "webapps", name), exist_ok=True)
        conf = os.path.join(self.dir, "conf")
        os.makedirs(conf, exist_ok=True)
        with open(os.path.join(conf, "log4j.properties"), "w") as f:  # Hadoop's own logs, to each daemon's log file
            f.write(
                "log4j.rootLogger=INFO,console\nlog4j.appender.console=org.apache.log4j.ConsoleAppender\n"
                "log4j.appender.console.target=System.err\nlog4j.appender.console.layout=org.apache.log4j.PatternLayout\n"
                "log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n\n"
            )
        if not self.webhdfs:
            return f"{conf}:{os.path.join(self.dir, 'webapps')}:{jars}/*"
        kept = sorted(os.path.join(jars, jar) for jar in os.listdir(jars) if not jar.startswith(_JERSEY2))
        return ":".join([conf, os.path.join(self.dir, "webapps"), *_JERSEY1, *kept])

    def _write_config(self) -> None:
        host = "127.0.0.1"
        core = {
            "fs.defaultFS": self.url,
            "hadoop.security.authentication": "simple",
            "hadoop.tmp.dir": os.path.join(self.dir, "tmp"),
        }
        hdfs = {
            "dfs.namenode.name.dir": os.path.join(self.dir, "name"),
            "dfs.datanode.data.dir": os.path.join(self.dir, "data"),
            "dfs.namenode.rpc-address": f"{host}:{self.ports['rpc']}",
            "dfs.namenode.http-address": f"{host}:{self.ports['namenode.http']}",
            "dfs.datanode.address": f"{host}:{self.ports['datanode.data']}",
            "dfs.datanode.http.address": f"{host}:{self.ports['datanode.http']}",
            "dfs.datanode.ipc.address": f"{host}:{self.ports['datanode.ipc']}",
            "dfs.datanode.hostname": host,
            "dfs.replication": "1",
            "dfs.permissions.enabled": "false",
            "dfs.webhdfs.enabled": "true" if self.webhdfs else "false",  # on by default in 2.7.3
            "dfs.namenode.datanode.registration.ip-hostname-check": "false",
            "dfs.namenode.safemode.extension": "0",
        }
        conf = os.path.join(self.dir, "conf")
        for name, properties in (("core-site.xml", core), ("hdfs-site.xml", hdfs)):
            with open(os.path.join(conf, name), "w") as f:
                f.write(_site_xml(properties))

    def _java(self, name: str, heap: str, main: str, *args: str, wait: bool = False) -> None:
        jvm_tmp = os.path.join(self.dir, "jvm-tmp")  # Jetty's work folders, which would go to /tmp and stay
        os.makedirs(jvm_tmp, exist_ok=True)
        with open(os.path.join(self.dir, f"{name}.log"), "ab") as log:
            proc = subprocess.Popen(
                [*_JVM, f"-Djava.io.tmpdir={jvm_tmp}", heap, "-cp", self._classpath, main, *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        if not wait:
            self._procs[name] = proc
            return
        if proc.wait(timeout=_START_TIMEOUT) != 0:
            raise AssertionError(f"formatting the NameNode failed ({proc.returncode}):\n{self.log_tail()}")

    def _wait_ready(self) -> bool:
        """True once a file can be written and read (the DataNode registered, safe mode off)."""
        from hdfs_native import Client

        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if any(proc.poll() is not None for proc in self._procs.values()):
                return False
            try:
                client = Client(self.url)
                with client.create("/.ready", _overwrite()) as f:
                    f.write(b"ready")
                with client.read("/.ready") as f:
                    if f.read() == b"ready":
                        client.delete("/.ready", False)
                        return True
            except Exception:
                pass
            time.sleep(0.2)
        return False

    def log_tail(self) -> str:
        tails = []
        for name in ("format", "namenode", "datanode"):
            try:
                with open(os.path.join(self.dir, f"{name}.log"), "rb") as f:
                    tails.append(f"--- {name}\n" + f.read()[-3000:].decode(errors="replace"))
            except OSError:
                pass
        return "\n".join(tails) or "(no log)"

    def _terminate(self) -> None:
        """SIGTERM every daemon, then SIGKILL the ones still running after a grace period."""
        procs, self._procs = list(self._procs.values()), {}
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def stop(self) -> None:
        """Stop both daemons and remove the folder (the file system's data with it)."""
        try:
            self._terminate()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


if TYPE_CHECKING:
    from hdfs_native import WriteOptions


def _overwrite() -> WriteOptions:
    from hdfs_native import WriteOptions

    options = WriteOptions()
    options.overwrite = True
    return options
