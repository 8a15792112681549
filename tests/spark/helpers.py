"""Small helpers shared by the Spark tests."""

from filechannel.client import Admin, Producer


def make_topic(root, topic, partitions=1, n=0, **config):
    Admin(root).create_topic(topic, partitions=partitions, **config)
    if n:
        produce(root, topic, range(n))


def produce(root, topic, numbers, partition=None):
    """Records whose value is the decimal number, key k<number mod 5>."""
    with Producer(root) as p:
        for i in numbers:
            p.send(topic, value=str(i).encode(), key=None if partition is not None else b"k%d" % (i % 5), partition=partition)


def read(spark, root, topic, **options):
    reader = spark.read.format("filechannel").option("root", str(root)).option("subscribe", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def stream(spark, root, topic, **options):
    reader = spark.readStream.format("filechannel").option("root", str(root)).option("subscribe", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def available_now_to_parquet(df, out, checkpoint):
    """Run the streaming ``df`` once with ``availableNow`` into parquet files at ``out``, its
    checkpoint at ``checkpoint`` (a later call with the same two resumes where it stopped)."""
    q = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
