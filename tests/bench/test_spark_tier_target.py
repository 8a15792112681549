"""The report's target for Spark over tier-2 against raw ranged GETs in Spark (issue 37), from rows as
bench/spark_source.py makes them (a row per input-partition count, the ratio in ``vs_raw_get``)."""

from __future__ import annotations

from filechannel.bench.measure import Row
from filechannel.bench.report import targets
from filechannel.bench.spark_source import TIER_WORKLOAD


def tier_row(parts: int, vs_raw: float | None, source: str = "tiered") -> Row:
    extra = {"input_partitions": parts, "source": source, "records_in_tier2": 999}
    if vs_raw is not None:
        extra["vs_raw_get"] = vs_raw
    return Row(TIER_WORKLOAD, f"{source}, {parts} input partitions", "none", 100, 1000, 1000.0, 0.1, ours=True, extra=extra)


def test_one_target_per_input_partition_count_met_at_0_8x():
    rows = [tier_row(1, 0.85), tier_row(2, 0.79), tier_row(2, None, source="local"), tier_row(4, None, source="raw")]
    got = [t for t in targets(rows, {}) if t["target"].startswith("Spark over tier-2")]
    assert [(t["measured"], t["met"], t["goal"]) for t in got] == [(0.85, True, ">= 0.8x"), (0.79, False, ">= 0.8x")]
    assert got[0]["target"].endswith("1 input partition(s)") and got[1]["target"].endswith("2 input partition(s)")
