"""Errors of the Spark integration, with the partition and offsets in the message."""

from __future__ import annotations

from ..errors import FileChannelError, OffsetOutOfRangeError


class DataLossError(OffsetOutOfRangeError):
    """Records a query needs are gone (retention, garbage collection, a truncated log)."""


def data_loss(topic: str, partition: int, wanted: int, available: int, missing_tail: bool = False) -> DataLossError:
    if missing_tail:
        return DataLossError(
            f"{topic}[{partition}]: offset {wanted} should exist but the partition ends at {available}; "
            "was the topic deleted and recreated? Restart the query with a new checkpoint"
        )
    return DataLossError(
        f"{topic}[{partition}]: offset {wanted} is no longer there, the first offset is {available} "
        "(retention or garbage collection deleted it). Records were lost to this query; set "
        'option("failOnDataLoss", "false") to go on from the first offset instead'
    )


class SinkError(FileChannelError):
    """The sink cannot write what it was given."""
