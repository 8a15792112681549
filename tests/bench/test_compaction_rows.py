"""The compaction bench rows run end to end on a few MiB and say what they measured; no time or
ratio is asserted."""

import pytest

from filechannel.bench.compaction import SIZES, SUPERSEDED, _clean, _copy, workloads


@pytest.mark.bench
@pytest.mark.parametrize("superseded", SUPERSEDED)
def test_the_cleaner_row_counts_the_records_and_bytes_it_cleaned(superseded):
    (row,) = _clean(100, superseded, 512 * 1024)
    assert row["workload"] == f"cleaner, {round(superseded * 100)}% superseded" and row["ours"]
    assert row["n"] > 0 and row["extra"]["passes_bytes"] >= row["extra"]["sealed_bytes"] > 0
    assert 0 < row["extra"]["bytes_after"] <= row["extra"]["sealed_bytes"]
    if superseded == 0.9:  # (with 10%, the later records of the sealed keys are still in the active segment)
        assert row["extra"]["bytes_after"] < row["extra"]["sealed_bytes"] / 2
    assert row["extra"]["python_peak_mb"] > 0 and row["peak_rss_mb"] > 0


@pytest.mark.bench
def test_the_reference_row_reads_and_writes_the_same_sealed_bytes():
    (row,) = _copy(1024, 1024 * 1024)
    assert row["workload"] == "raw read+write of the same bytes" and row["n"] > 0 and not row["ours"]


def test_the_harness_gets_both_sizes_and_both_shares_with_their_reference():
    plan = [(name, args[:2]) for name, _, args in workloads(quick=True)]
    for size in SIZES:
        assert {a[1] for n, a in plan if n == "compaction cleaner" and a[0] == size} == set(SUPERSEDED)
        assert [a for n, a in plan if n == "compaction raw read+write" and a[0] == size] == [(size, 512 * 1024)]
