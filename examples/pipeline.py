"""The example pipeline: page views through filechannel and Spark Structured Streaming.

1. Produces page-view events (JSON, keyed by user, event-time timestamps over one hour)
   into the topic ``pageviews`` (4 partitions) with the Kafka-like ``Producer``.
2. A streaming query reads ``pageviews`` with ``format("filechannel")``, parses the JSON,
   counts views per page in 5-minute windows with a 1-minute watermark, and writes each
   closed window to the topic ``pageview-counts`` through the filechannel sink (exactly once).
3. A second streaming query reads ``pageview-counts`` and writes it to Parquet.
4. Reads the Parquet back and prints a summary, checking every event was counted once.

The last event of each partition is a heartbeat an hour later than the rest: it moves the
watermark past the last window so that window is emitted too (the usual way to close
event-time windows at the end of a bounded run). Its window is dropped before Parquet.

    python examples/pipeline.py [--events N] [--root DIR]

Runs on embedded defaults: a local folder (a temp dir unless ``--root``), Spark in local mode.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from filechannel.client import Admin, Producer

console = Console()
PAGES = [f"/{p}" for p in ("home", "search", "cart", "checkout", "help", "about", "blog", "pricing", "docs", "login")]
PAGES += [f"/product/{i}" for i in range(30)]
HOUR_MS = 3_600_000
HEARTBEAT = "__heartbeat__"


def progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console)


def produce(root: str, n: int, start_ms: int) -> None:
    admin = Admin(root)
    admin.create_topic("pageviews", partitions=4, exist_ok=True)
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


def spark_session(root: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers must import filechannel
    from pyspark.sql import SparkSession

    import filechannel.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("filechannel-pipeline")
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
    args = parser.parse_args()
    if args.events <= 0:
        parser.error("--events must be positive")
    root = args.root or tempfile.mkdtemp(prefix="fc-pipeline-")
    started = time.monotonic()
    spark = None
    try:
        console.print(f"[bold]filechannel pipeline[/bold]: {args.events:,} page views under {root}")
        t = time.monotonic()
        produce(root, args.events, start_ms=int(time.time() * 1000) - 3 * HOUR_MS)
        console.print(f"produced in {time.monotonic() - t:.1f} s; starting Spark (local[2])")
        spark = spark_session(root)
        t = time.monotonic()
        count_windows(spark, root, args.events)
        out = os.path.join(root, "pageview-counts.parquet")
        rows = counts_to_parquet(spark, root, out)
        console.print(f"streamed in {time.monotonic() - t:.1f} s ({rows:,} window counts)")
        summarize(spark, out, args.events)
    finally:
        if spark is not None:
            spark.stop()
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    console.print(f"done in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
