"""Run first by every Python process the test session's Spark starts (tests/spark/conftest.py puts
this folder on their PYTHONPATH): pyspark and py4j are imported from the installed packages.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on its Python processes'
path. Python cannot cache what it compiles from a zip, so each process compiled every pyspark
module it imported from source, the largest part of the CPU time of the short-lived processes
Spark starts (README "Spark" has the figures). The installed pyspark is the same release
(``SPARK_HOME`` is its folder), compiled once.
"""

import sys

sys.path[:] = [p for p in sys.path if not (p.endswith(".zip") and ("pyspark" in p or "py4j" in p))]
