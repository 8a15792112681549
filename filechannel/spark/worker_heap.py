"""A reused Spark Python worker's long-lived heap, frozen so the collection after each task skips it.

pyspark's daemon runs task after task in one forked Python worker when
``spark.python.worker.reuse`` is on (the default: the worker then has ``SPARK_REUSE_WORKER`` in
its environment), and calls ``gc.collect()`` after each task. A full collection walks every
object the collector tracks: pyspark's, pyarrow's, a boto3 client's service model, ours, about
a hundred thousand objects and tens of milliseconds of CPU each time, more than a small task's
own work (DESIGN "Spark" has the figures). What a worker keeps for its life (modules, this
process's storage clients, spark/storages.py) never becomes garbage, so ``gc.freeze()`` moves it
out of the collector's sight and the collection after a task walks what that task made.

Invariants: nothing is frozen outside a reused worker (a driver, a user's process); in one,
the heap is frozen at the start of its first task and again at the start of the first task
after its long-lived state grew: a module imported (a task imports pyarrow when it first
builds a batch) or a storage client made (``gc.collect()`` first, so what is frozen is what
is alive). Never once per task: the objects of the task starting at that moment are frozen
with the rest, and if they die in a reference cycle they stay until the worker ends, so what
is held that way is bounded by the modules and storages a worker ever loads, not by the
number of its tasks.
"""

from __future__ import annotations

import gc
import os
import sys
import threading

from .storages import PROCESS_STORAGES

_lock = threading.Lock()
_frozen_with: tuple[int, int] | None = None  # (modules, storage clients) at the last freeze


def settle() -> None:
    """At the start of a task: freeze the heap if this reused worker's long-lived state grew
    since the last freeze (see the module); otherwise, and outside a reused worker, nothing."""
    global _frozen_with
    if not os.environ.get("SPARK_REUSE_WORKER"):
        return
    state = (len(sys.modules), len(PROCESS_STORAGES.opened()))
    with _lock:
        if _frozen_with == state:
            return
        gc.collect()
        gc.freeze()
        _frozen_with = state
