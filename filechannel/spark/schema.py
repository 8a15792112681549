"""The source's schema (Spark's Kafka source's, ``headers`` only with includeHeaders, ``origin`` only
for a query of a tier URL, option ``tier``) and records as Arrow batches.

``read()`` yields Arrow record batches: pyspark 4 passes them to the JVM as they are, which
is several times faster than yielding tuples. Their schema must equal, type for type, the
Arrow form of the declared schema (pyspark checks), so it is derived with pyspark's own
``to_arrow_schema``.

pyarrow is imported where batches are built, not with the module: Spark starts a Python
process to create the data source, to plan a read and to run each streaming query's
source, and none of them builds a batch (pyarrow and its compute module were most of what
importing ``filechannel.spark`` cost there).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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

from ..engine.columns import RecordColumns
from ..engine.record import Record

if TYPE_CHECKING:
    import pyarrow as pa

HEADER_TYPE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])

_COLUMNS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]
# The headers column exists only with option includeHeaders=true, as in Kafka's source. The
# origin column (the root that uploaded the record: its origin's name, "" for the default
# origin) only in a query of a tier URL (option tier), last, so a root's query keeps Kafka's schema.
_HEADERS = StructField("headers", ArrayType(HEADER_TYPE))
_ORIGIN = StructField("origin", StringType())
SCHEMA = StructType(_COLUMNS)
SCHEMA_WITH_HEADERS = StructType([*_COLUMNS, _HEADERS])
CREATE_TIME = 0  # Kafka's TimestampType.CREATE_TIME: the producer's timestamp (or the send time)


def schema(include_headers: bool, include_origin: bool = False) -> StructType:
    return StructType([*_COLUMNS, *([_HEADERS] if include_headers else []), *([_ORIGIN] if include_origin else [])])


@functools.cache
def arrow_schema(include_headers: bool, include_origin: bool = False) -> pa.Schema:
    """The exact Arrow schema pyspark derives from ``schema(include_headers, include_origin)``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema(include_headers, include_origin), timezone="UTC")


class BatchBuilder:
    """Gathers records of one partition column by column; ``build()`` makes one Arrow batch.

    Records go in a few hundred at a time and only their fields are kept: pyarrow's fixed
    cost per batch wants batches of thousands of rows, but thousands of live ``Record``
    objects fall out of the CPU cache. ``origin``: the value of the ``origin`` column (a query of
    a tier URL), or None for no such column.
    """

    def __init__(self, topic: str, partition: int, include_headers: bool = False, origin: str | None = None) -> None:
        self.topic, self.partition = topic, partition
        self.include_headers = include_headers
        self.origin = origin
        # Records decoded straight into the batch's columns (``columns.decode_columns``): the
        # other way to fill it than add() (never both in one batch; no headers).
        self.decoded = RecordColumns()
        self._clear()

    def _clear(self) -> None:
        self._added_bytes = 0  # of the keys and values of the records add() took
        self._offsets: list[int] = []
        self._timestamps: list[int] = []
        self._keys: list[bytes | None] = []
        self._values: list[bytes] = []
        self._headers: list[Sequence[tuple[str, bytes]]] = []

    def __len__(self) -> int:
        return len(self._offsets) + len(self.decoded)

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values in the batch so far: what its binary columns will hold."""
        return self._added_bytes + self.decoded.nbytes

    def add(self, records: Sequence[Record]) -> None:
        if not records:
            return
        assert not len(self.decoded), "a batch of records and decoded columns"
        offsets, timestamps, keys, values, headers = zip(*records, strict=True)
        self._added_bytes += sum(map(len, filter(None, keys))) + sum(map(len, filter(None, values)))  # None: absent
        self._offsets += offsets
        self._timestamps += timestamps
        self._keys += keys
        self._values += values
        self._headers += headers

    def build(self) -> pa.RecordBatch:
        """The batch of every record added since the last build."""
        import pyarrow as pa
        import pyarrow.compute as pc

        arrow = arrow_schema(self.include_headers, self.origin is not None)
        n = len(self)
        if len(self.decoded):
            assert not self.include_headers and not self._offsets, "decoded columns hold no headers, nor records added"
            # wrapped, not copied: the buffers are taken over, never written again
            offsets_b, ts_b, key_ends, keys_b, key_valid, value_ends, values_b, value_valid = map(
                pa.py_buffer, self.decoded.take()
            )
            keys = pa.Array.from_buffers(pa.binary(), n, [key_valid, key_ends, keys_b])
            values = pa.Array.from_buffers(pa.binary(), n, [value_valid, value_ends, values_b])
            offsets = pa.Array.from_buffers(pa.int64(), n, [None, offsets_b])
            ts = pa.Array.from_buffers(pa.int64(), n, [None, ts_b])
        else:
            keys, values = pa.array(self._keys, pa.binary()), pa.array(self._values, pa.binary())
            offsets, ts = pa.array(self._offsets, pa.int64()), pa.array(self._timestamps, pa.int64())
        columns: list[pa.Array[Any]] = [
            keys,
            values,
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            offsets,
            pc.multiply(ts, 1000).cast(arrow.field("timestamp").type),
            pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n),
        ]
        if self.include_headers:
            columns.append(_headers_column(self._headers))
        if self.origin is not None:
            columns.append(pa.repeat(pa.scalar(self.origin, pa.string()), n))
        self._clear()
        return pa.RecordBatch.from_arrays(columns, schema=arrow)


def records_to_batch(topic: str, partition: int, records: Sequence[Record], include_headers: bool = False) -> pa.RecordBatch:
    """One Arrow batch of ``records`` of one partition."""
    builder = BatchBuilder(topic, partition, include_headers)
    builder.add(records)
    return builder.build()


def _headers_column(headers: Sequence[Sequence[tuple[str, bytes]]]) -> pa.Array[Any]:
    """Null for a record without headers (most of them: a cheap all-null column then)."""
    import pyarrow as pa

    headers_type = arrow_schema(True).field("headers").type
    column: pa.Array[Any]  # (pyarrow-stubs give these calls Any for a DataType not of a particular kind)
    if not any(headers):
        column = pa.nulls(len(headers), headers_type)
    else:
        column = pa.array([[{"key": k, "value": v} for k, v in h] if h else None for h in headers], headers_type)
    return column
