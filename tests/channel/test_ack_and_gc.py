"""Ack receivers, durable positions, garbage collection and retention."""

import os
import time
from typing import Any

import pytest

from filechannel import AckError, FileChannel, InvalidNameError, OffsetOutOfRangeError
from filechannel.engine.names import parse_segment_file
from filechannel.engine.position import PositionStore

SMALL: dict[str, Any] = dict(segment_bytes=4096, maintenance_interval=0, compression="none")


def data_files(path):
    return sorted(f for f in os.listdir(path) if (p := parse_segment_file(f)) and p[1] in (".seg", ".seg.z"))


def fill(ch, n=400, size=40):
    s = ch.sender()
    for i in range(n):
        s.send(b"%06d" % i + b"." * size)
    s.flush()


def test_ack_receiver_resumes_at_first_unacknowledged_after_restart(tmp_path):
    with FileChannel(tmp_path, **SMALL) as ch:
        fill(ch, 50)
        rx = ch.ack_receiver("worker")
        got = [rx.recv() for _ in range(10)]
        rx.ack(7)
        assert rx.acked == 7 and [r.offset for r in got] == list(range(10))
    with FileChannel(tmp_path, **SMALL) as ch:
        rx = ch.ack_receiver("worker")
        assert rx.recv().offset == 7


def test_acking_more_than_delivered_is_an_error(tmp_path):
    with FileChannel(tmp_path, **SMALL) as ch:
        fill(ch, 5)
        rx = ch.ack_receiver("w")
        rx.recv()
        rx.recv()
        with pytest.raises(AckError, match="only 2"):
            rx.ack(3)
        rx.ack(2)
        with pytest.raises(AckError):
            rx.ack()


def test_ack_receiver_names_are_validated(tmp_path):
    with FileChannel(tmp_path, **SMALL) as ch:
        for bad in ["..", "a/b", "", "x" * 300, "sp ace", "."]:
            with pytest.raises(InvalidNameError):
                ch.ack_receiver(bad)


def test_gc_deletes_only_segments_every_ack_receiver_is_past(tmp_path):
    with FileChannel(tmp_path, **SMALL) as ch:
        fill(ch)
        before = data_files(tmp_path)
        fast, slow = ch.ack_receiver("fast"), ch.ack_receiver("slow")
        for _ in range(300):
            fast.recv()
        fast.ack(300)
        for _ in range(100):
            slow.recv()
        slow.ack(100)
        deleted = ch.collect_garbage()
        assert deleted and all(b2 <= 100 for b2 in deleted)
        first = ch.first_offset
        assert 0 < first <= 100
        assert data_files(tmp_path) == [f for f in before if (p := parse_segment_file(f)) and p[0] >= first]
        # Both still read everything they have not acknowledged.
        assert slow.recv().offset == 100
        assert fast.recv().offset == 300


def test_without_durable_readers_nothing_is_collected(tmp_path):
    with FileChannel(tmp_path, **SMALL) as ch:
        fill(ch)
        assert ch.collect_garbage() == []
        assert ch.first_offset == 0


def test_retention_bytes_deletes_the_oldest_and_readers_below_get_out_of_range(tmp_path):
    with FileChannel(tmp_path, retention_bytes=8192, **SMALL) as ch:
        fill(ch, 1000)
        rx = ch.receiver(0)
        deleted = ch.collect_garbage()
        assert deleted
        total = sum(os.path.getsize(tmp_path / f) for f in data_files(tmp_path))
        assert total <= 8192 + 4096
        with pytest.raises(OffsetOutOfRangeError, match="below the first retained offset"):
            ch.receiver(0)
        with pytest.raises(OffsetOutOfRangeError):
            ch.receiver("earliest").seek(0)
        assert ch.receiver("earliest").recv().offset == ch.first_offset
        # A receiver that opened before still reads through its open segment, then is told.
        assert rx.recv().offset == 0
        with pytest.raises(OffsetOutOfRangeError):
            while True:
                rx.recv(timeout=0)


def test_retention_ms_deletes_segments_whose_newest_record_is_old(tmp_path):
    now = int(time.time() * 1000)
    with FileChannel(tmp_path, retention_ms=60_000, **SMALL) as ch:
        s = ch.sender()
        for _i in range(300):
            s.send(b"o" * 40, timestamp=now - 3_600_000)
        for _i in range(300):
            s.send(b"n" * 40, timestamp=now)
        s.flush()
        ch.collect_garbage()
        first = ch.first_offset
        assert 200 < first <= 300
        assert all((r.value or b"").startswith(b"n") for r in ch.receiver().recv_many(1000, timeout=0)[300 - first :])


def test_gc_never_deletes_the_active_segment(tmp_path):
    with FileChannel(tmp_path, **SMALL) as ch:
        fill(ch, 30)
        rx = ch.ack_receiver("all")
        rx.recv_many(30)
        rx.ack(30)
        ch.collect_garbage()
        assert data_files(tmp_path)
        assert ch.sender().send(b"more") == 30


def test_background_gc_follows_acks(tmp_path):
    with FileChannel(tmp_path, segment_bytes=4096, maintenance_interval=0.02) as ch:
        fill(ch, 400)
        rx = ch.ack_receiver("bg")
        while rx.recv_many(1000, timeout=0):
            pass
        rx.ack(400)
        deadline = time.monotonic() + 20
        while ch.first_offset == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ch.first_offset > 0


def test_position_store_round_trip_and_corruption(tmp_path):
    store = PositionStore(str(tmp_path))
    assert store.get("a") is None and store.minimum() is None
    store.set("a", 10)
    store.set("b", 3)
    assert store.get("a") == 10 and store.names() == ["a", "b"] and store.minimum() == 3
    store.delete("b")
    assert store.names() == ["a"]
    with open(tmp_path / "positions" / "a.pos", "r+b") as f:
        f.seek(5)
        f.write(b"\xff")
    from filechannel import CorruptRecordError

    with pytest.raises(CorruptRecordError, match=r"a\.pos"):
        store.get("a")
    with pytest.raises(InvalidNameError):
        store.set("../x", 1)


@pytest.mark.parametrize("bad", [-1, 2**63, True, 1.0, "3", None])
def test_a_bad_durable_position_is_refused_with_our_error_and_nothing_is_written(tmp_path, bad):
    from filechannel.engine.position import PositionStore
    from filechannel.errors import ConfigError

    store = PositionStore(str(tmp_path))
    store.set("ack.r", 5)
    with pytest.raises(ConfigError, match="position"):
        store.set("ack.r", bad)
    assert store.get("ack.r") == 5
