"""The example pipeline: page views through filechannel and Spark Structured Streaming.

1. Produces page-view events (JSON, keyed by user, event-time timestamps over one hour)
   into the topic ``pageviews`` (4 partitions) with the Kafka-like ``Producer``. The topic
   is tiered: a pass of the tiering daemon uploads its sealed segments to tier-2 (a local
   folder by default, ``--tier s3://...`` for S3) and deletes the local copies past a small
   local retention, so the oldest records exist only in tier-2.
2. A streaming query reads ``pageviews`` across both tiers with ``format("filechannel")``
   (Spark's executors read the uploaded offsets straight from tier-2, the local tail
   through the channel; the run prints how many rows came from each), parses the JSON,
   counts views per page in 5-minute windows with a 1-minute watermark, and writes each
   closed window to the topic ``pageview-counts`` through the filechannel sink (exactly once).
3. A second streaming query reads ``pageview-counts`` and writes it to Parquet.
4. Reads the Parquet back and prints a summary, checking every event was counted once.

The last event of each partition is a heartbeat an hour later than the rest: it moves the
watermark past the last window so that window is emitted too (the usual way to close
event-time windows at the end of a bounded run). Its window is dropped before Parquet.

    python examples/pipeline.py [--events N] [--root DIR] [--tier URL [--tier-option KEY=VALUE]...]

Runs on embedded defaults: a local folder (a temp dir unless ``--root``), a local-folder
tier-2 inside it, Spark in local mode. With ``--tier s3://bucket/prefix --tier-option
endpoint_url=http://...`` the same runs against S3; credentials come from the environment
(boto3's chain), never from the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from filechannel import TopicSettings
from filechannel.client import Admin, Producer
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.status import tier_status

console = Console()
PAGES = [f"/{p}" for p in ("home", "search", "cart", "checkout", "help", "about", "blog", "pricing", "docs", "login")]
PAGES += [f"/product/{i}" for i in range(30)]
HOUR_MS = 3_600_000
HEARTBEAT = "__heartbeat__"


def progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console)


# Small segments and a small local retention, so that a run of the default size leaves most
# of each partition in tier-2 only and the newest segments on local disk.
TIERED: TopicSettings = {"segment_bytes": 1 << 20, "local_retention_bytes": 256 << 10}
# The JVM's own log lines: errors only (Spark's WARN lines at start-up would interleave with
# our progress). pyspark still prints its two "default log level" lines and the JVM its
# "incubator modules" line before any configuration applies.
LOG4J2 = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def produce(root: str, n: int, start_ms: int, tier: str, tier_options: dict[str, str]) -> None:
    admin = Admin(root)
    settings: TopicSettings = {**TIERED, "tier": tier, "tier_options": tier_options or None}
    admin.create_topic("pageviews", partitions=4, exist_ok=True, **settings)
    admin.create_topic("pageview-counts", partitions=2, exist_ok=True)
    rng = random.Random(42)
    weights = [1 / (i + 1) for i in range(len(PAGES))]  # a few pages get most views
    pages = rng.choices(PAGES, weights, k=n)
    with Producer(root, linger_ms=5) as producer, progress() as bar:
        task = bar.add_task("producing page views", total=n)
        for i, page in enumerate(pages):
            user = f"user-{rng.randrange(5000)}"
            ts = start_ms + i * HOUR_MS // n
            event = {"user": user, "page": page, "referrer": rng.choice(PAGES), "duration_ms": rng.randrange(50, 30_000)}
            producer.send("pageviews", value=json.dumps(event).encode(), key=user.encode(), timestamp_ms=ts)
            if i % 10_000 == 0:
                bar.update(task, completed=i)
        heartbeat = json.dumps({"user": "", "page": HEARTBEAT, "referrer": "", "duration_ms": 0}).encode()
        for partition in range(4):  # the watermark is the minimum over partitions' tasks: tell them all
            producer.send("pageviews", value=heartbeat, partition=partition, timestamp_ms=start_ms + 2 * HOUR_MS)
        bar.update(task, completed=n)


def offload(root: str) -> None:
    """One pass of the tiering daemon: compress, upload, apply local retention; then the status."""
    t = time.monotonic()
    with TieringDaemon(root, progress=lambda line: None) as daemon:
        report = daemon.run(once=True)
    if report.failures:
        raise SystemExit("tiering failed:\n" + "\n".join(report.failures))
    table = Table(title=f"pageviews after one tiering pass ({time.monotonic() - t:.1f} s)")
    for col in ("partition", "local segments", "local bytes", "in tier-2", "tier-2 bytes"):
        table.add_column(col, justify="right")
    for st in tier_status(root):
        table.add_row(
            st.partition, str(st.local_segments), f"{st.local_bytes:,}", str(st.uploaded_segments), f"{st.tier_bytes:,}"
        )
    console.print(table)


def read_split(root: str) -> tuple[int, int, int, int]:
    """How Spark's source splits a read of ``pageviews`` from earliest: rows and tasks that
    executors read straight from tier-2, and rows and tasks read through the channel (the
    local tail). The plan of the streaming query cuts the same offsets into micro-batches."""
    from filechannel.spark.options import SourceOptions
    from filechannel.spark.source import FileChannelBatchReader
    from filechannel.spark.tier import TierRange

    opts = SourceOptions.parse({"root": root, "subscribe": "pageviews", "startingOffsets": "earliest"}, batch=True)
    tasks = FileChannelBatchReader(opts).partitions()
    tier = [t for t in tasks if isinstance(t, TierRange)]
    local = [t for t in tasks if not isinstance(t, TierRange)]
    return sum(t.end - t.start for t in tier), len(tier), sum(t.end - t.start for t in local), len(local)


@contextlib.contextmanager
def jvm_stderr_to(path: str) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while the JVM starts, so the JVM (which inherits it)
    writes its own console lines there, not between our output: "Using incubator modules"
    and pyspark's "Setting default log level" come before any log configuration applies.
    This process's stderr is restored after; if the start fails, the log's tail is shown."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    except BaseException:
        os.dup2(saved, 2)
        with open(path, errors="replace") as log:
            print(f"Spark failed to start; the end of its log ({path}):\n{log.read()[-4000:]}", file=sys.stderr)
        raise
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def spark_session(root: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers must import filechannel
    from pyspark.sql import SparkSession

    import filechannel.spark

    log4j2 = os.path.join(root, ".spark-log4j2.properties")
    with open(log4j2, "w") as f:
        f.write(LOG4J2)
    with jvm_stderr_to(os.path.join(root, ".spark.log")):
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("filechannel-pipeline")
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j2}")
            .config("spark.ui.showConsoleProgress", "false")  # our progress bars, not Spark's stage bars
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.local.dir", os.path.join(root, ".spark-local"))
            .config("spark.sql.warehouse.dir", os.path.join(root, ".spark-warehouse"))
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
    spark.sparkContext.setLogLevel("ERROR")
    filechannel.spark.register(spark)
    return spark


def run_query(query, what: str, total: int) -> None:
    """Wait for an availableNow query, showing rows processed."""
    with progress() as bar:
        task = bar.add_task(what, total=total)
        while query.isActive:
            query.awaitTermination(1)
            bar.update(task, completed=min(total, sum(p["numInputRows"] for p in query.recentProgress)))
        bar.update(task, completed=total)
    query.awaitTermination()  # raises if the query failed


def count_windows(spark, root: str, n: int) -> None:
    from pyspark.sql import functions as F

    schema = "user string, page string, referrer string, duration_ms int"
    views = (
        spark.readStream.format("filechannel")
        .option("root", root)
        .option("subscribe", "pageviews")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "100000")
        .load()
        .select(F.from_json(F.col("value").cast("string"), schema).alias("e"), "timestamp")
        .select("e.page", "timestamp")
    )
    counts = (
        views.withWatermark("timestamp", "1 minute")
        .groupBy(F.window("timestamp", "5 minutes"), "page")
        .count()
        .select(
            F.col("page").alias("key"),
            F.to_json(F.struct(F.col("window.start").alias("window_start"), "page", "count")).alias("value"),
        )
    )
    query = (
        counts.writeStream.format("filechannel")
        .option("root", root)
        .option("topic", "pageview-counts")
        .option("checkpointLocation", os.path.join(root, ".checkpoints", "counts"))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    run_query(query, "spark: windowed counts -> topic pageview-counts", n + 4)


def counts_to_parquet(spark, root: str, out: str) -> int:
    from pyspark.sql import functions as F

    total = Admin(root).describe_topic("pageview-counts")
    rows = sum(p.end_offset - p.first_offset for p in total.partitions)
    schema = "window_start timestamp, page string, count long"
    query = (
        spark.readStream.format("filechannel")
        .option("root", root)
        .option("subscribe", "pageview-counts")
        .option("startingOffsets", "earliest")
        .load()
        .select(F.from_json(F.col("value").cast("string"), schema).alias("c"))
        .select("c.*")
        .where(F.col("page") != HEARTBEAT)  # not earlier: Spark would push it below the watermark
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", os.path.join(root, ".checkpoints", "parquet"))
        .trigger(availableNow=True)
        .start()
    )
    run_query(query, "spark: topic pageview-counts -> parquet", rows)
    return rows


def summarize(spark, out: str, n: int) -> None:
    from pyspark.sql import functions as F

    df = spark.read.parquet(out)
    totals = df.groupBy("page").agg(F.sum("count").alias("views"), F.count("*").alias("windows")).orderBy(F.desc("views"))
    top = totals.limit(8).collect()
    counted = df.agg(F.sum("count")).first()[0] or 0
    windows = df.select("window_start").distinct().count()
    table = Table(title=f"Top pages ({windows} five-minute windows)")
    for col in ("page", "views", "windows with views"):
        table.add_column(col)
    for r in top:
        table.add_row(r.page, f"{r.views:,}", str(r.windows))
    console.print(table)
    status = "every event counted exactly once" if counted == n else f"MISMATCH: {counted:,} counted of {n:,}"
    console.print(f"{counted:,} page views in {df.count():,} window counts: {status}")
    if counted != n:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000, help="page views to produce (default 300000)")
    parser.add_argument("--root", help="filechannel root folder (default: a temp dir, deleted at the end)")
    parser.add_argument("--tier", help="tier-2 storage URL (default: file://ROOT/.tier-storage, a local folder)")
    parser.add_argument(
        "--tier-option", action="append", default=[], metavar="KEY=VALUE", help="a storage option, e.g. endpoint_url=http://..."
    )
    args = parser.parse_args()
    if args.events <= 0:
        parser.error("--events must be positive")
    options = dict(opt.split("=", 1) for opt in args.tier_option if "=" in opt)
    if len(options) != len(args.tier_option):
        parser.error("--tier-option takes KEY=VALUE")
    root = args.root or tempfile.mkdtemp(prefix="fc-pipeline-")
    tier = args.tier or "file://" + os.path.join(os.path.abspath(root), ".tier-storage")
    started = time.monotonic()
    spark = None
    try:
        console.print(f"[bold]filechannel pipeline[/bold]: {args.events:,} page views under {root}, tier-2 {tier}")
        t = time.monotonic()
        produce(root, args.events, start_ms=int(time.time() * 1000) - 3 * HOUR_MS, tier=tier, tier_options=options)
        console.print(f"produced in {time.monotonic() - t:.1f} s")
        offload(root)
        remote, remote_tasks, local, local_tasks = read_split(root)
        console.print(
            f"pageviews: Spark's executors read {remote:,} rows straight from tier-2 ({remote_tasks} tasks), "
            f"{local:,} rows through the channel's local disk ({local_tasks} tasks); starting Spark (local[2])"
        )
        spark = spark_session(root)
        t = time.monotonic()
        count_windows(spark, root, args.events)
        out = os.path.join(root, "pageview-counts.parquet")
        rows = counts_to_parquet(spark, root, out)
        console.print(
            f"streamed in {time.monotonic() - t:.1f} s ({rows:,} window counts); pageviews: "
            f"{remote:,} rows came from tier-2 and {local:,} from local disk"
        )
        summarize(spark, out, args.events)
    finally:
        if spark is not None:
            spark.stop()
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    console.print(f"done in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
