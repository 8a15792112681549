"""The source's schema (Spark's Kafka source, column for column) and records as Arrow batches.

``read()`` yields Arrow record batches: pyspark 4 passes them to the JVM as they are, which
is several times faster than yielding tuples. Their schema must equal, type for type, the
Arrow form of the declared schema (pyspark checks), so it is derived with pyspark's own
``to_arrow_schema``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..record import Record

HEADER_TYPE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("headers", ArrayType(HEADER_TYPE)),
    ]
)

ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
_HEADERS_ARROW = ARROW_SCHEMA.field("headers").type
_TIMESTAMP_ARROW = ARROW_SCHEMA.field("timestamp").type


def records_to_batch(topic: str, partition: int, records: Sequence[Record]) -> pa.RecordBatch:
    """One Arrow batch of consecutive ``records`` of one partition (column by column)."""
    n = len(records)
    offsets, timestamps, keys, values, headers = zip(*records, strict=True)
    ts = pa.array(timestamps, pa.int64())
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        pc.multiply(ts, 1000).cast(_TIMESTAMP_ARROW),
        _headers_column(headers),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _headers_column(headers: Sequence[Sequence[tuple[str, bytes]]]) -> pa.Array:
    """Null for a record without headers (most of them: a cheap all-null column then)."""
    if not any(headers):
        return pa.nulls(len(headers), _HEADERS_ARROW)
    return pa.array(
        [[{"key": k, "value": v} for k, v in h] if h else None for h in headers],
        _HEADERS_ARROW,
    )
