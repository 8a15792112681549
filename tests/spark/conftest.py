"""One real local Spark session (local[2]) for the whole test session, stopped at the end."""

import os
import shutil
import sys
import tempfile

import pytest

from filechannel.engine.failpoints import ENV as FAILPOINTS_ENV

WORKER_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_site")


@pytest.fixture(scope="session")
def spark_dirs():
    base = tempfile.mkdtemp(prefix="fc-spark-")
    dirs = {name: os.path.join(base, name) for name in ("local", "warehouse", "failpoints")}
    for d in dirs.values():
        os.makedirs(d)
    yield dirs
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def spark(spark_dirs):
    # The JVM and its Python workers inherit this environment: workers must run this
    # interpreter (it has filechannel installed), see the failpoint folder and import pyspark
    # as installed, not from the zip Spark puts first on their path (worker_site/sitecustomize.py).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ[FAILPOINTS_ENV] = spark_dirs["failpoints"]
    saved_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [WORKER_SITE, saved_path]))
    from pyspark.sql import SparkSession

    import filechannel.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("filechannel-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", spark_dirs["local"])
        .config("spark.sql.warehouse.dir", spark_dirs["warehouse"])
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    filechannel.spark.register(session)
    yield session
    session.stop()
    os.environ.pop(FAILPOINTS_ENV, None)
    if saved_path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved_path


@pytest.fixture
def failpoint(spark_dirs):
    """Arm a failpoint: the next Python process of Spark to reach it dies there."""
    armed = []

    def arm(name):
        path = os.path.join(spark_dirs["failpoints"], name)
        open(path, "w").close()
        armed.append(path)
        return path

    yield arm
    for path in armed:
        if os.path.exists(path):
            os.unlink(path)
