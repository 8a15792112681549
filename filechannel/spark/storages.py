"""This Python process's tier-2 storage clients, shared by every task and every call it runs.

Spark reuses a Python worker for many tasks, and runs a query's driver-side source calls
(``initialOffset``, ``latestOffset``, ``partitions``...) in one process too; making a boto3
client is costly (it loads the service's model: about a quarter of a second of CPU), and a
query's driver opens each partition's channel several times. So each process makes one client
per storage URL and options, on first use, and keeps it: never closed, the process ends with
them. A client is thread-safe, and its credentials come from the process's environment, which
does not change (never from the plan: spark/tier.py).
"""

from __future__ import annotations

from typing import Any

from ..tiering.bindings import StorageClients
from ..tiering.storage import ChunkStorage

PROCESS_STORAGES = StorageClients()  # never closed (see the module)


def storage_for(url: str, options: dict[str, Any]) -> ChunkStorage:
    """This process's client of the storage at ``url`` with ``options``, made on first use and kept."""
    return PROCESS_STORAGES.get(url, options)
