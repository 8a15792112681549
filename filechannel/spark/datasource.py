"""The data source Spark sees as ``format("filechannel")``."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from .errors import SinkError
from .options import SourceOptions
from .schema import schema as source_schema
from .sink import FileChannelStreamWriter, FileChannelWriter, SinkSpec
from .source import FileChannelBatchReader, FileChannelStreamReader


class FileChannelDataSource(DataSource):
    """Reads topics as Spark's Kafka source does (same options, same schema); writes them too."""

    @classmethod
    def name(cls) -> str:
        return "filechannel"

    def schema(self) -> StructType:
        # Spark asks for the schema at load(): checking the options here makes a bad option
        # fail there, before any query starts. pyspark does not say here whether the query is a
        # batch or a stream, so what only one of them refuses fails when it is planned (a batch's
        # first action, a stream's start()), before any row is read. Writes never ask.
        opts = SourceOptions.parse(self.options, batch=None)
        return source_schema(opts.include_headers, include_origin=opts.tier is not None)

    def reader(self, schema: StructType) -> DataSourceReader:
        return FileChannelBatchReader(SourceOptions.parse(self.options, batch=True))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FileChannelStreamReader(SourceOptions.parse(self.options, batch=False))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise SinkError('a topic is append-only: write with .mode("append")')
        return FileChannelWriter(SinkSpec.parse(self.options, schema, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return FileChannelStreamWriter(SinkSpec.parse(self.options, schema, streaming=True))
