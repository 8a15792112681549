"""The test session's Spark (tests/spark/conftest.py) as its tests rely on it."""

import pyspark


def test_its_python_workers_import_the_installed_pyspark_not_the_zip(spark):
    # worker_site/sitecustomize.py: a pyspark imported from Spark's zip is compiled again in every process
    files = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("pyspark").__file__).collect()
    assert files == [pyspark.__file__] and ".zip" not in files[0]
