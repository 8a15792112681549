"""The Spark source reading a compacted topic after its cleaner ran: offsets with holes."""

import json

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
