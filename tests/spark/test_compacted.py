"""The Spark source reading a compacted topic after its cleaner ran, and while it runs: offsets with holes."""

import json
import threading

from filechannel.client import Admin

from .helpers import make_topic, produce, read


def test_a_batch_reads_a_cleaned_topic_in_split_ranges_and_from_inside_a_hole(spark, tmp_path):
    make_topic(tmp_path, "c", cleanup_policy="compact", segment_bytes=4096)
    produce(tmp_path, "c", range(600))  # keys k0..k4, every key sent 120 times
    with Admin(tmp_path).open_partition("c", 0, maintenance_interval=0) as ch:
        ch.compact()  # (the producer's maintenance thread may have cleaned already: reads below check it)
        with ch.receiver() as rx:
            kept: list[tuple[int, bytes | None, bytes | None]] = []
            while batch := rx.recv_many(10_000, timeout=0.2):
                kept.extend((r.offset, r.key, r.value) for r in batch)
    assert len(kept) < 600
    rows = read(spark, tmp_path, "c", minPartitions="5").select("offset", "key", "value").collect()
    assert sorted((r.offset, bytes(r.key), bytes(r.value)) for r in rows) == kept
    hole = kept[0][0] + 1 if kept[1][0] > kept[0][0] + 1 else kept[0][0] - 1
    start = {"c": {"0": hole}}
    got = read(spark, tmp_path, "c", startingOffsets=json.dumps(start)).select("offset").collect()
    assert sorted(r.offset for r in got) == [o for o, _k, _v in kept if o >= hole]


def test_batches_read_a_topic_while_it_is_written_and_cleaned(spark, tmp_path):
    """A writer keeps sending and cleaning while Spark batches read: every row is the record sent
    at its offset (cleaning only removes records, never moves or changes one), offsets once each,
    the last record of each key read, and no task fails on a segment swapped under it."""
    make_topic(tmp_path, "c", cleanup_policy="compact", segment_bytes=4096)
    produce(tmp_path, "c", range(600))  # value i at offset i, key k<i mod 5>
    stop, errors, passes = threading.Event(), [], []

    def key(i: int) -> bytes:  # the writer's keys are others: the first 600's last records stay
        return b"k%d" % (i % 5 if i < 600 else 5 + i % 5)

    def churn() -> None:
        try:
            with Admin(tmp_path).open_partition("c", 0, maintenance_interval=0) as ch:
                n = 600
                while not stop.is_set():
                    with ch.sender() as tx:
                        for i in range(n, n + 100):
                            tx.send(str(i).encode(), key=key(i))
                    n += 100
                    passes.append(len(ch.compact()))
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        for _ in range(3):
            rows = read(spark, tmp_path, "c", minPartitions="4").select("offset", "key", "value").collect()
            got = [(r.offset, bytes(r.key), bytes(r.value)) for r in rows]
            offsets = [o for o, _k, _v in got]
            assert len(set(offsets)) == len(offsets) and set(range(595, 600)) <= set(offsets)
            assert all(v == str(o).encode() and k == key(o) for o, k, v in got)
    finally:
        stop.set()
        writer.join(60)
    assert not errors and sum(passes) > 0  # the cleaner swapped segments meanwhile
