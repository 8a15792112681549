"""Spark integration: ``format("filechannel")`` as a PySpark Python Data Source.

>>> import filechannel.spark
>>> filechannel.spark.register(spark)
>>> df = spark.readStream.format("filechannel").option("root", "/data/fc").option("subscribe", "events").load()

Needs the ``spark`` extra (pyspark 4, pyarrow). Spark's Python workers must import
``filechannel``: install it in the interpreter ``PYSPARK_PYTHON`` names.
"""

from __future__ import annotations

import importlib.util
from typing import Any

try:
    import pyspark.sql.datasource  # noqa: F401  (pyspark 4's Python Data Source API)

    if importlib.util.find_spec("pyarrow") is None:  # imported where batches are made (see schema.py)
        raise ImportError("No module named 'pyarrow'")
except ImportError as exc:  # one message that says what to do, not pyspark's missing module deep inside
    raise ImportError(
        f"filechannel.spark needs pyspark >= 4 and pyarrow ({exc}): install them with pip install 'filechannel[spark]'"
    ) from exc

from .datasource import FileChannelDataSource
from .errors import DataLossError, SinkError
from .schema import SCHEMA
from .tier import uploaded_end_offsets


def register(spark: Any) -> None:
    """Make ``format("filechannel")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(FileChannelDataSource)


__all__ = ["SCHEMA", "DataLossError", "FileChannelDataSource", "SinkError", "register", "uploaded_end_offsets"]
