"""The wake-up that receivers wait on (filechannel/engine/wakeup.py), under events from other writers."""

import threading
import time
from pathlib import Path

from filechannel.engine.wakeup import Wakeup


def test_folders_added_while_events_arrive_never_deadlock(tmp_path: Path) -> None:
    """watchdog calls our handler holding its observer's lock, and the handler takes the
    wake-up's lock: a wake-up that called into watchdog holding its own lock deadlocked with
    it. Seen as a group member of three partitions hung for ever in ``observer.schedule``
    (tests/client/test_groups.py, 2026-11-29), its observer's thread waiting in ``bump``."""
    written = tmp_path / "written"
    written.mkdir()
    wakeup = Wakeup(str(written))
    stop = threading.Event()

    def write() -> None:  # another process's flushes, as inotify reports them
        n = 0
        while not stop.is_set():
            (written / f"{n % 8:020d}.seg").write_bytes(b"x")
            n += 1

    def add_folders() -> None:
        for i in range(200):
            folder = tmp_path / f"partition-{i}"
            folder.mkdir()
            wakeup.add_folder(str(folder))

    writer = threading.Thread(target=write, daemon=True)
    adder = threading.Thread(target=add_folders, daemon=True)
    try:
        assert not wakeup.wait(wakeup.seq, 0)  # starts the observer, watching `written`
        writer.start()
        deadline = time.monotonic() + 10
        seen = wakeup.seq
        while wakeup.seq == seen and time.monotonic() < deadline:
            wakeup.wait(seen, 0.1)
        assert wakeup.seq != seen, "no event from the writer reached the wake-up"
        adder.start()
        adder.join(60)
        assert not adder.is_alive(), "add_folder never returned: deadlocked with watchdog's thread"
    finally:
        stop.set()
        writer.join(10)
        if not adder.is_alive():
            wakeup.close()
