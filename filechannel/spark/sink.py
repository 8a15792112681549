"""The ``filechannel`` sink: tasks stage their rows, the driver's commit appends them.

Tasks never append to a topic. Each writes its rows to a staging file (Arrow IPC) under
``ROOT/.staging/`` and returns its path; only the driver's ``commit`` appends the staged
rows of the tasks that succeeded, so a retried task or an aborted job appends nothing twice.

Streaming writes are exactly once: every record the sink appends for micro-batch ``B``
carries the header ``fc.sink.batch = "<sink id>:<B>"``, and the sink's state file
``ROOT/.sinks/<sink id>.json`` records, before appending, the end offset of every partition
(``pending``) and, after, the last batch done. A replayed batch that is already done is
skipped; a batch whose commit died half-way is finished: the records of that batch already
in each partition (counted by their header past the recorded end offsets) are skipped and
only the rest appended. The sink id is derived from the query's checkpoint (its location and Spark's query id in it), so a
new query (a new checkpoint, or the same path deleted and created again) starts afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, DataType, IntegerType, StringType, StructType

from ..client.partitioner import murmur2
from ..client.topics import TopicStore
from ..engine import failpoints
from ..engine.files import read_if_exists, unlink_if_exists, write_atomically
from ..engine.names import validate_name
from ..errors import ConfigError, UnknownTopicError, os_errors, storage_error
from . import worker_heap
from .errors import SinkError
from .options import REFUSED_KAFKA_SINK, SINK_OPTIONS, lower_keys, refuse_kafka_options, require_root

if TYPE_CHECKING:
    import pyarrow as pa

STAGING_DIR = ".staging"
SINKS_DIR = ".sinks"
BATCH_HEADER = "fc.sink.batch"
_TEXT = (BinaryType(), StringType())


@dataclass
class StagedFile(WriterCommitMessage):
    path: str | None  # None when the task had no rows
    rows: int


@dataclass
class SinkSpec:
    """The sink's options and the columns it was given, checked on the driver."""

    root: str
    topic: str | None
    anchor: str | None  # streaming: what identifies the query (see sink_id)
    columns: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType, *, streaming: bool) -> SinkSpec:
        opts = lower_keys(options)
        unknown = sorted(k for k in set(opts) - SINK_OPTIONS if not k.startswith("kafka."))
        if unknown:
            raise ConfigError(f"unknown sink option(s) {', '.join(unknown)}; the sink takes root, topic, sinkId")
        refuse_kafka_options(opts, REFUSED_KAFKA_SINK)
        types = {f.name.lower(): f.dataType for f in schema.fields}
        allowed: dict[str, tuple[DataType, ...]] = {
            "value": _TEXT,
            "key": _TEXT,
            "topic": (StringType(),),
            "partition": (IntegerType(),),
            "headers": tuple(ArrayType(_header(t), c) for t in _TEXT for c in (True, False)),
        }
        if "value" not in types:
            raise SinkError(f"the sink needs a 'value' column (binary or string); got {', '.join(types) or 'none'}")
        for name, dtype in types.items():
            if name not in allowed:
                raise SinkError(f"column {name!r} cannot be written; the sink takes value, key, headers, partition, topic")
            if not any(_same_type(dtype, a) for a in allowed[name]):
                raise SinkError(
                    f"column {name!r} has type {dtype.simpleString()}, "
                    f"expected {' or '.join(a.simpleString() for a in allowed[name][:2])}"
                )
        topic = opts.get("topic")
        if topic is not None:
            validate_name(topic, "topic")
        elif "topic" not in types:
            raise SinkError('say where to write: option("topic", ...) or a "topic" column')
        anchor = None
        if streaming:
            if opts.get("sinkid"):
                anchor = "sinkId=" + validate_name(opts["sinkid"], "sinkId")
            elif opts.get("checkpointlocation"):
                anchor = opts["checkpointlocation"]
            else:
                raise ConfigError('a streaming write needs a checkpointLocation (or option "sinkId") for exactly-once')
        return cls(require_root(opts), topic, anchor, [f.name for f in schema.fields])

    def sink_id(self) -> str:
        """Who appends: the query's checkpoint, told apart from an earlier one at the same path.

        Spark writes a fresh query id into ``<checkpoint>/metadata`` when it creates a
        checkpoint, so deleting a checkpoint to start over starts a new sink too.
        """
        anchor = self.anchor or ""
        if not anchor.startswith("sinkId="):
            local = anchor[len("file:") :] if anchor.startswith("file:") else anchor
            data = read_if_exists(os.path.join(local, "metadata"), "checkpoint metadata")
            if data:
                anchor += "#" + str(json.loads(data.splitlines()[0]).get("id", ""))
        return hashlib.sha256(anchor.encode()).hexdigest()[:16]


def _header(value_type: DataType) -> StructType:
    from pyspark.sql.types import StructField

    return StructType([StructField("key", StringType()), StructField("value", value_type)])


def _same_type(a: DataType, b: DataType) -> bool:
    """Equal up to nullability (what a DataFrame column's type carries varies)."""
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return _same_type(a.elementType, b.elementType)
    if isinstance(a, StructType) and isinstance(b, StructType):
        return [f.name for f in a.fields] == [f.name for f in b.fields] and all(
            _same_type(x.dataType, y.dataType) for x, y in zip(a.fields, b.fields, strict=True)
        )
    return type(a) is type(b)


@contextmanager
def staging_errors(action: str, path: str) -> Iterator[None]:
    """Re-raise pyarrow's and the OS's errors on staging file ``path`` as filechannel errors naming it."""
    import pyarrow as pa  # (here, not with the module: see schema.py)

    try:
        yield
    except OSError as exc:  # pyarrow's ArrowIOError is an OSError too
        raise storage_error(exc, f"{action} staging file", path) from exc
    except pa.ArrowException as exc:
        raise SinkError(
            f"cannot {action} staging file {path!r}: {exc}. It is not a whole Arrow IPC file (damaged or "
            "truncated): the job's rows were not appended; run the job again"
        ) from exc


def stage(spec: SinkSpec, batches: Iterator[pa.RecordBatch]) -> StagedFile:
    """In a task: write this task's rows to a staging file; nothing reaches the topic yet."""
    import pyarrow.ipc

    worker_heap.settle()

    folder = os.path.join(spec.root, STAGING_DIR)
    with os_errors("create folder", folder):
        os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{uuid.uuid4().hex}.arrow")
    rows = 0
    writer: pa.ipc.RecordBatchFileWriter | None = None
    try:
        with staging_errors("write", path):
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if writer is None:
                    writer = pyarrow.ipc.new_file(path, batch.schema)
                writer.write_batch(batch)
                rows += batch.num_rows
            if writer is None:
                return StagedFile(None, 0)
            open_writer = writer
            writer = None  # closed below, or not: never closed again by the handler
            open_writer.close()
    except BaseException:
        if writer is not None:
            writer.close()
        unlink_if_exists(path)
        raise
    return StagedFile(path, rows)


def _as_bytes(column: pa.Array[Any]) -> list[Any]:
    import pyarrow as pa

    return (
        column.cast(pa.binary()).to_pylist()
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        else column.to_pylist()
    )


class Router:
    """Which partition of which topic each row goes to: given, by key hash, or round-robin.

    The topic is the sink's topic option if set (it overrides a topic column, as in Kafka's
    sink), else the row's topic column.

    Round-robin starts at partition 0 for every commit, so a replayed batch lands the same way.
    """

    def __init__(self, store: TopicStore, topic: str | None) -> None:
        self.store = store
        self.topic = topic
        self._counts: dict[str, int] = {}
        self._next: dict[str, int] = {}

    def partitions(self, topic: str) -> int:
        n = self._counts.get(topic)
        if n is None:
            try:
                n = self.store.partitions(topic)
            except UnknownTopicError:
                if not self.store.auto_create_allowed():  # the root's setting, as the Producer follows it
                    raise SinkError(
                        f"topic {topic!r} does not exist under {self.store.root!r} and the root's "
                        "auto.create.topics.enable is false: create it first (filechannel topics create)"
                    ) from None
                self.store.ensure(topic, 1, {})  # one made meanwhile by anyone is the one to use
                n = self.store.partitions(topic)
            self._counts[topic] = n
        return n

    def route(self, topic: str | None, partition: int | None, key: bytes | None) -> tuple[str, int]:
        topic = self.topic or topic  # the topic option overrides a topic column, as in Kafka's sink
        if topic is None:
            raise SinkError("a row has a null topic and the sink has no topic option")
        n = self.partitions(topic)
        if partition is not None:
            if not 0 <= partition < n:
                raise SinkError(f"a row asks for partition {partition} of {topic!r}, which has partitions 0 to {n - 1}")
            return topic, partition
        if key is not None:
            return topic, (murmur2(key) & 0x7FFFFFFF) % n
        p = self._next.get(topic, 0)
        self._next[topic] = p + 1
        return topic, p % n


StagedRow = tuple["bytes | None", "bytes | None", list[tuple[str, bytes]]]  # (value, key, headers) to append


def staged_rows(spec: SinkSpec, messages: list[Any], router: Router) -> dict[tuple[str, int], list[StagedRow]]:
    """The staged rows of the successful tasks, grouped by (topic, partition), in order."""
    import pyarrow as pa
    import pyarrow.ipc

    out: dict[tuple[str, int], list[StagedRow]] = {}
    for msg in messages:
        if not isinstance(msg, StagedFile) or msg.path is None:
            continue
        with staging_errors("read", msg.path), pa.memory_map(msg.path) as source:
            table = pyarrow.ipc.open_file(source).read_all()
        names = {n.lower(): n for n in table.column_names}
        n = table.num_rows

        def col(name: str, names: dict[str, str] = names, table: pa.Table = table, n: int = n) -> pa.Array[Any]:
            return table.column(names[name]).combine_chunks() if name in names else pa.nulls(n)

        values, keys = _as_bytes(col("value")), _as_bytes(col("key"))
        topics, parts, headers = col("topic").to_pylist(), col("partition").to_pylist(), col("headers").to_pylist()
        for value, key, topic, part, hdrs in zip(values, keys, topics, parts, headers, strict=True):
            h = [(e["key"], e["value"].encode() if isinstance(e["value"], str) else e["value"]) for e in hdrs] if hdrs else []
            out.setdefault(router.route(topic, part, key), []).append((value, key, h))
    return out


def discard(messages: list[Any]) -> None:
    for msg in messages:
        if isinstance(msg, StagedFile) and msg.path:
            unlink_if_exists(msg.path)


class SinkState:
    """``ROOT/.sinks/<id>.json``: the last batch done, and the batch being appended."""

    def __init__(self, root: str, sink_id: str) -> None:
        folder = os.path.join(root, SINKS_DIR)
        with os_errors("create folder", folder):
            os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"{sink_id}.json")
        data = read_if_exists(self.path, "sink state")
        try:
            state = json.loads(data) if data else {}
            self.done: int = int(state.get("done", -1))
            self.pending: dict[str, Any] | None = state.get("pending")
        except (ValueError, TypeError, AttributeError) as exc:
            raise SinkError(
                f"sink state {self.path!r} is corrupt ({exc}); restore it, or delete it and restart the query with "
                "a new checkpoint (batches may then be appended twice)"
            ) from None

    def save(self) -> None:
        write_atomically(self.path, json.dumps({"done": self.done, "pending": self.pending}).encode())


def append(spec: SinkSpec, messages: list[Any], batch_id: int | None) -> int:
    """On the driver: append the staged rows (once per batch id when streaming); return rows added."""
    store = TopicStore(spec.root)
    try:
        sink_id = spec.sink_id() if batch_id is not None else None
        state = SinkState(spec.root, sink_id) if sink_id is not None else None
        if state is not None and batch_id is not None and state.done >= batch_id:
            return 0  # a replay of a batch already appended
        rows = staged_rows(spec, messages, Router(store, spec.topic))
        marker = f"{sink_id}:{batch_id}".encode() if state is not None else None
        starts: dict[str, int] = {}
        if state is not None:
            if state.pending and state.pending.get("batch") == batch_id:
                starts = state.pending["starts"]
            else:
                starts = {f"{t}/{p}": _end_offset(store, t, p) for t, p in rows}
                state.pending = {"batch": batch_id, "starts": starts}
                state.save()
        failpoints.hit("sink-before-append")
        added = 0
        for (topic, p), records in rows.items():
            with store.open_partition(topic, p) as ch:
                skip = _already_there(ch, starts.get(f"{topic}/{p}"), marker) if marker else 0
                sender = ch.sender()
                extra = [(BATCH_HEADER, marker)] if marker else []
                for i, (value, key, headers) in enumerate(records[skip:]):
                    sender.send(value, key=key, headers=headers + extra if extra else headers or None)
                    if i == len(records) // 2:
                        sender.flush()
                        failpoints.hit("sink-mid-append")
                sender.flush()
                added += len(records) - skip
        if state is not None and batch_id is not None:
            state.done, state.pending = batch_id, None
            state.save()
        failpoints.hit("sink-after-append")
        return added
    finally:
        discard(messages)


def _end_offset(store: TopicStore, topic: str, partition: int) -> int:
    with store.open_partition(topic, partition, maintenance_interval=0) as ch:
        return ch.end_offset


def _already_there(ch: Any, start: int | None, marker: bytes) -> int:
    """How many records carrying ``marker`` are in the channel past ``start``."""
    if start is None:
        return 0
    rx = ch.receiver(max(start, ch.first_offset))
    count = 0
    while batch := rx.recv_many(10_000, timeout=0, max_bytes=1 << 20):  # 10,000 records of 1 MB: 10 GB
        count += sum(1 for r in batch if (BATCH_HEADER, marker) in r.headers)
    return count


class FileChannelWriter(DataSourceArrowWriter):
    """``df.write.format("filechannel")``."""

    def __init__(self, spec: SinkSpec) -> None:
        self.spec = spec

    # pyspark's DataSourceArrowWriter.write takes RecordBatches where its base's takes Rows
    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:  # type: ignore[override]
        return stage(self.spec, iterator)

    def commit(self, messages: list[Any]) -> None:
        append(self.spec, messages, None)

    def abort(self, messages: list[Any]) -> None:
        discard(messages)


class FileChannelStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("filechannel")``: exactly once per micro-batch."""

    def __init__(self, spec: SinkSpec) -> None:
        self.spec = spec

    # pyspark's DataSourceStreamArrowWriter.write takes RecordBatches where its base's takes Rows
    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:  # type: ignore[override]
        return stage(self.spec, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        append(self.spec, messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        discard(messages)
