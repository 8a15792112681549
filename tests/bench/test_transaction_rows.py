"""The transactions bench rows run end to end with tiny counts and say what they measured; no
time or ratio is asserted."""

import pytest

from filechannel.bench.measure import QUICK_SECONDS
from filechannel.bench.transactions import PER_TRANSACTION, _consume_transform_produce, _transactional, workloads


@pytest.mark.bench
def test_transactional_rows_count_committed_records():
    for per_txn in (1, 100):
        (row,) = _transactional(100, per_txn, 0.05)
        assert row["workload"] == f"transactional produce, {per_txn} per transaction"
        assert row["n"] >= per_txn and row["n"] % per_txn == 0 and row["ours"] and row["durability"] == "fsync on commit"


@pytest.mark.bench
def test_the_loop_row_processes_every_record():
    (row,) = _consume_transform_produce(100, 1200)
    assert row["n"] == 1200 and row["msgs_per_s"] > 0


def test_the_harness_gets_every_size_and_transaction_length_with_its_references():
    names = [(name, args[:2]) for name, _, args in workloads(quick=True)]
    for size in (100, 1024):
        assert {a[1] for n, a in names if n == "transactional produce" and a[0] == size} == set(PER_TRANSACTION)
        assert ("transactional produce (one fsync per message)", (size, QUICK_SECONDS)) in names
    assert not [n for n, _, _ in workloads(quick=True, references=False) if "fsync per message" in n or "futures" in n]
