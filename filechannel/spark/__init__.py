"""Spark integration: ``format("filechannel")`` as a PySpark Python Data Source.

>>> import filechannel.spark
>>> filechannel.spark.register(spark)
>>> df = spark.readStream.format("filechannel").option("root", "/data/fc").option("subscribe", "events").load()

Needs the ``spark`` extra (pyspark 4, pyarrow). Spark's Python workers must import
``filechannel``: install it in the interpreter ``PYSPARK_PYTHON`` names.
"""

from __future__ import annotations

from typing import Any

from .datasource import FileChannelDataSource
from .errors import DataLossError, SinkError
from .schema import SCHEMA
from .tier import uploaded_end_offsets


def register(spark: Any) -> None:
    """Make ``format("filechannel")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(FileChannelDataSource)


__all__ = ["SCHEMA", "DataLossError", "FileChannelDataSource", "SinkError", "register", "uploaded_end_offsets"]
