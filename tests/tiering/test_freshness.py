"""Freshness: with ``tier_after_ms`` and a daemon running, records reach tier-2 without another send,
from an idle writer and from a slow one whose segment never fills (the daemon seals it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filechannel.client.topics import TopicStore
from filechannel.root import ROOT_METADATA
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.metadata import TierMetadata

from .conftest import wait_for
from .tier_helpers import make_topic, produce


@contextmanager
def running_daemon(root: Path) -> Iterator[TieringDaemon]:
    """A daemon passing every 50 ms on a thread, stopped and joined at the end."""
    daemon = TieringDaemon(root, interval=0.05)
    daemon.start()
    worker = threading.Thread(target=daemon.run, name="test-daemon")
    worker.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        worker.join(60)
        daemon.close()
    assert not worker.is_alive()


def uploaded_end(metadata: TierMetadata) -> int:
    bounds = metadata.bounds("t/0")
    return 0 if bounds is None else bounds[1]


def test_records_of_an_idle_writer_reach_tier2_without_another_send(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_topic(root, f"file://{tmp_path}/tier", segment_bytes=1 << 20, tier_after_ms=200)  # never filled here
    with running_daemon(root), TierMetadata(root / ROOT_METADATA) as metadata:
        produce(root, [b"r%d" % i for i in range(5)])
        wait_for(lambda: uploaded_end(metadata) == 5, 60, "the 5 records uploaded")
        produce(root, [b"r%d" % i for i in range(5, 8)])
        wait_for(lambda: uploaded_end(metadata) == 8, 60, "the next 3 uploaded too")


def test_a_slow_writer_whose_segment_never_fills_is_sealed_and_uploaded_as_it_goes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_topic(root, f"file://{tmp_path}/tier", segment_bytes=1 << 20, tier_after_ms=200)
    stop = threading.Event()
    sent: list[int] = []

    def slow_writer() -> None:  # one record every 20 ms: its segment is always freshly written
        with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch, ch.sender() as tx:
            while not stop.is_set():
                tx.send(b"x")
                tx.flush()
                sent.append(1)
                stop.wait(0.02)

    writer = threading.Thread(target=slow_writer, name="slow-writer")
    with running_daemon(root), TierMetadata(root / ROOT_METADATA) as metadata:
        writer.start()
        try:
            wait_for(lambda: uploaded_end(metadata) >= 10, 60, "records of the slow writer uploaded while it writes")
            wait_for(lambda: len(metadata.segments("t/0")) >= 2, 60, "a second segment sealed and uploaded")
            assert writer.is_alive()
        finally:
            stop.set()
            writer.join(30)
        total = len(sent)
        wait_for(lambda: uploaded_end(metadata) == total, 60, "every record uploaded once the writer stopped")
