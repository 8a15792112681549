"""The freshness row (bench/freshness.py) is made, without error, with its percentiles (no figure is asserted)."""

import pytest

from filechannel.bench.freshness import TIER_AFTER_MS, run_freshness
from filechannel.bench.measure import Row

pytestmark = [pytest.mark.bench, pytest.mark.slow, pytest.mark.s3]


def test_the_freshness_row_measures_every_record_sent():
    [row] = [Row(**r) for r in run_freshness(quick=True)]
    assert row.error is None and row.n > 10 and row.workload.endswith(f"tier_after_ms={TIER_AFTER_MS}")
    assert 0 < row.extra["p50_ms"] <= row.extra["p99_ms"] <= row.extra["max_ms"]
