"""Read and write tqbroker streams from Apache Spark: the PySpark data source ``tqbroker``
(PySpark 4.2+'s Python Data Source API; ``pip install tqbroker[spark]``).

    from tqbroker.spark import TqbrokerDataSource
    spark.dataSource.register(TqbrokerDataSource)
    df = (spark.read.format("tqbroker")
          .option("tqbroker.url", "http://broker:15672").option("subscribe", "orders")
          .load())

It works as Spark's Kafka connector does: the same schema (``key``, ``value``, ``topic``,
``partition``, ``offset``, ``timestamp``, ``timestampType``, and ``headers`` with
``includeHeaders=true``), the same option names and offset JSON, a sink taking ``value`` and
optionally ``key``, ``headers``, ``partition`` and ``topic``. Executors fetch from and write to
the broker's HTTP API in bulk (columnar bodies wrapped as Arrow arrays). See ``docs/spark.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ._arrow_read import read_ddl
from ._client import BrokerError
from ._offsets import DataLossError
from ._options import OptionError, lower_keys, sink_options, source_options
from ._session import loopback_builder
from ._sink import BatchWriter, StreamWriter, sink_columns, stream_sink_id
from ._source import BatchReader, StreamReader, TopicRange, check_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "BrokerError",
    "DataLossError",
    "OptionError",
    "TopicRange",
    "TqbrokerDataSource",
    "loopback_builder",
    "register",
]


class TqbrokerDataSource(DataSource):
    """``format("tqbroker")``: tqbroker topics (partitioned streams or stream queues) as a
    Spark source and sink, batch and streaming."""

    @classmethod
    def name(cls) -> str:
        return "tqbroker"

    def schema(self) -> str:
        raw = lower_keys(self.options).get("includeheaders", "false").strip().lower()
        if raw not in ("true", "false"):
            raise OptionError(f"option 'includeHeaders' must be 'true' or 'false' (got {raw!r})")
        return read_ddl(raw == "true")

    def reader(self, schema: StructType) -> DataSourceReader:
        options = source_options(self.options, streaming=False)
        check_schema(schema, options.include_headers)
        return BatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = source_options(self.options, streaming=True)
        check_schema(schema, options.include_headers)
        return StreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError(
                "save mode 'overwrite' is not allowed for tqbroker: streams are append-only; "
                "use .mode('append')"
            )
        options = sink_options(self.options)
        return BatchWriter(options, sink_columns(schema, options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Output mode "complete" (overwrite=True) appends every result row each trigger, as
        # Kafka's sink does.
        options = sink_options(self.options)
        columns = sink_columns(schema, options)
        return StreamWriter(options, columns, stream_sink_id(options))


TqBrokerDataSource = TqbrokerDataSource  # the spelling of the design notes


def register(spark: SparkSession) -> None:
    """Make ``format("tqbroker")`` available in ``spark`` (the same as
    ``spark.dataSource.register(TqbrokerDataSource)``)."""
    spark.dataSource.register(TqbrokerDataSource)
