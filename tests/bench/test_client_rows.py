"""The Kafka-like client's bench rows run end to end with tiny counts: each backend reads back
every record it produced, the 1- and 8-thread Producer.send rows count sends, and the gather
row's target names the gather of no-op coroutines measured beside it. No time or ratio is asserted."""

import pytest

from filechannel.bench.measure import Row, throughput
from filechannel.bench.peers import BACKENDS
from filechannel.bench.report import client_targets
from filechannel.bench.workloads import _gather_ceiling, _threads


@pytest.mark.bench
@pytest.mark.parametrize("key", ["fc-producer", "fc-async", "fc-async-gather"])
def test_client_rows_produce_and_consume_everything(key):
    rows = throughput(key, 100, 2500, 2.0)
    assert [r.workload for r in rows] == ["produce", "consume"]
    for r in rows:
        assert r.error is None and r.backend == BACKENDS[key]().name and r.ours
        assert r.n == 2500 and r.msgs_per_s > 0


@pytest.mark.bench
@pytest.mark.parametrize("threads", [1, 8])
def test_producer_thread_rows_count_sends(threads):
    (row,) = _threads(100, threads, 0.2, "producer")
    assert row["backend"] == "filechannel Producer.send" and row["workload"] == f"send from {threads} thread(s)"
    assert row["n"] > 0 and row["ours"]


@pytest.mark.bench
def test_client_targets_are_measured_from_the_rows():
    rows = []
    for key in ("fc-send", "fc-send-many", "fc-producer", "queuelib"):
        rows += throughput(key, 100, 2000, 1.0)
    goals = {t["target"]: t for t in client_targets(rows)}
    for name in ("Producer.send vs Sender.send, 100 B", "Producer.send vs queuelib, 100 B", "Consumer.poll vs recv_many, 100 B"):
        assert goals[name]["measured"] is not None and goals[name]["met"] in (True, False), goals[name]
    assert goals["AsyncProducer.send vs Producer.send, 100 B"]["measured"] is None  # its row was not run


@pytest.mark.bench
def test_the_gather_row_is_shown_against_gathering_coroutines_that_do_nothing():
    ceiling, futures = (Row(**r) for r in _gather_ceiling(2000))
    assert ceiling.backend == "asyncio.gather of no-op coroutines (reference)"
    assert futures.backend == "asyncio.gather of done futures (reference)"
    for row in (ceiling, futures):
        assert row.n == 2000 and row.msgs_per_s > 0 and not row.ours
    rows = throughput("fc-producer", 100, 2000, 1.0) + throughput("fc-async-gather", 100, 2000, 1.0) + [ceiling, futures]
    goals = {t["target"]: t for t in client_targets(rows)}
    goal = goals["AsyncProducer, asyncio.gather of sends vs Producer.send, 100 B"]
    assert goal["measured"] is not None
    assert goal["note"].startswith(
        f"asyncio.gather of no-op coroutines: {ceiling.msgs_per_s:,.0f}/s in this run; the gather of sends is "
    )
    assert goal["note"].endswith(f"; of done futures (no Task): {futures.msgs_per_s:,.0f}/s")
    assert goals["AsyncProducer, asyncio.gather of sends vs Producer.send, 1024 B"]["note"] == (
        f"asyncio.gather of no-op coroutines: {ceiling.msgs_per_s:,.0f}/s in this run; "
        f"of done futures (no Task): {futures.msgs_per_s:,.0f}/s"
    )  # no 1 KiB row here
