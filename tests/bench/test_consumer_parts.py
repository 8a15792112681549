"""The consumer's time split (filechannel/bench/consumer_parts.py), on a real topic: every part measured, and it says so."""

from filechannel.bench.consumer_parts import main, measure


def test_every_part_is_measured_on_real_records(capsys):
    ns = measure(records=5000, size=100, rounds=1)
    assert list(ns) == ["recv_many", "as client", "poll", "fill+take", "getmany"]
    assert all(value > 0 for value in ns.values())
    assert main(["--records", "3000", "--size", "64", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "3,000 records of 64 B" in out and "poll / recv_many" in out
