"""Errors of the Spark integration, with the partition and offsets in the message.

The classes live in :mod:`filechannel.errors` (so ``from filechannel import SinkError``
works without pyspark installed); they are re-exported here.
"""

from __future__ import annotations

from ..errors import DataLossError, SinkError

__all__ = ["DataLossError", "SinkError", "data_loss"]


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
