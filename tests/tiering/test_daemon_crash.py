"""The tiering daemon in real processes: SIGKILLed at random moments of its passes (at least 30 kills),
and a daemon SIGSTOPped while another takes the root over with a newer epoch (fenced on resume)."""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

from filechannel.client.topics import TopicStore
from filechannel.engine.record import Record
from filechannel.root import ROOT_METADATA
from filechannel.tiering import open_storage
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.daemon_lock import LOCK_FILE
from filechannel.tiering.metadata import TierMetadata

from .. import children
from .conftest import wait_for
from .tier_helpers import local_bases, make_topic, produce, segment_objects, tier2_records

HELPERS = Path(__file__).with_name("tier_helpers.py")
KILLS = int(os.environ.get("FC_TIER_KILLS", "32"))


class Child:
    """``python tier_helpers.py daemon ROOT`` (forked from the fork server: tests/children.py), its
    stdout lines collected by a thread."""

    def __init__(self, root: Path) -> None:
        self.proc = children.start(HELPERS, "daemon", str(root), stderr=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with contextlib.suppress(ValueError):  # finish()'s communicate() closes stdout once the daemon exits
            for line in self.proc.stdout:
                self.lines.put(line.rstrip("\n"))

    def wait_line(self, prefix: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.proc.kill()
                raise AssertionError(f"the daemon never printed {prefix!r}; it printed {self.seen}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def finish(self) -> tuple[int, str]:
        try:
            _, err = self.proc.communicate(timeout=60, stdout=False)  # the reader thread has stdout
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # faulthandler (tier_helpers) prints its stacks, then it dies
            _, err = self.proc.communicate(timeout=10, stdout=False)
            raise AssertionError(f"the daemon did not exit within 60 s; it printed {self.seen}; stderr:\n{err}") from None
        self._reader.join(timeout=10)
        return self.proc.wait(), err


def coverage(root: Path) -> tuple[list[tuple[int, int]], list[int]]:
    """Uploaded ranges (from the metadata) and local segment bases, with no daemon running."""
    with TierMetadata(root / ROOT_METADATA) as metadata:
        remote = [(r.base_offset, r.end_offset) for r in metadata.segments("t/0")]
    return remote, local_bases(root)


def assert_nothing_lost(root: Path) -> None:
    """Every offset below the first local segment is in an uploaded segment, with no hole:
    no local segment was deleted before its upload was committed."""
    remote, local = coverage(root)
    expected = 0
    for base, end in remote:
        if base >= local[0]:
            break
        assert base == expected, f"hole in tier-2 at [{expected}, {base}): {remote}, local {local[:3]}"
        expected = end
    assert expected >= local[0], f"offsets [{expected}, {local[0]}) are neither local nor in tier-2"


def test_sigkill_at_random_moments_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(19)
    root = tmp_path / "root"
    url = f"file://{tmp_path}/tier"
    # slow uploads (about 25 ms a segment) so most kills land inside one
    make_topic(root, url, local_retention_bytes=0, tier_upload_bytes_per_s=160_000)
    sent: list[bytes] = []
    kills_mid_upload = 0
    for k in range(KILLS):
        batch = [b"%06d" % (len(sent) + i) + os.urandom(80) for i in range(60)]
        produce(root, batch)
        sent += batch
        child = Child(root)
        child.wait_line("started epoch")
        time.sleep(rng.uniform(0.0, 0.25))  # the random moment of the kill (not a synchronisation)
        child.proc.send_signal(signal.SIGKILL)
        code, _err = child.finish()
        assert code == -signal.SIGKILL, f"kill {k}: the daemon had already exited with {code}: {_err[-2000:]}"
        with TierMetadata(root / ROOT_METADATA) as metadata:
            kills_mid_upload += bool(metadata.segments("t/0", states=("uploading",)))
        assert_nothing_lost(root)
    assert kills_mid_upload >= 5  # many kills landed between begin_upload and finish_upload (18 to 24 of 32 seen)

    # a last daemon runs to the end: it cleans up what the killed epochs left and uploads the rest
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert report.failures == []
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url) as storage:
        assert metadata.segments("t/0", states=("uploading", "deleting")) == []
        uploaded = metadata.segments("t/0")
        bases = [r.base_offset for r in uploaded]
        assert len(bases) == len(set(bases))  # each segment uploaded exactly once
        assert [r.base_offset for r in uploaded[1:]] == [r.end_offset for r in uploaded[:-1]]  # contiguous
        assert uploaded[0].base_offset == 0 and uploaded[-1].end_offset == local_bases(root)[0]
        names = segment_objects(storage, "t/0/")
        assert names == {c.name for r in uploaded for c in r.chunks} | {r.manifest for r in uploaded}  # no orphan
        remote_records = tier2_records(storage, metadata, "t/0")
    with TopicStore(root).open_partition("t", 0, maintenance_interval=0) as ch:
        start = local_bases(root)[0]
        rx = ch.receiver(start)
        local_records: list[Record] = []
        while len(local_records) < len(sent) - start:
            local_records += rx.recv_many(1000, timeout=5)
    assert [r.value for r in remote_records + local_records] == sent  # nothing lost, nothing twice, in order
    assert [r.offset for r in remote_records + local_records] == list(range(len(sent)))


def stop_mid_upload(proc: children.Child, metadata: TierMetadata, db: Path) -> None:
    """SIGSTOP ``proc`` while an upload of its is under way and it is inside no write transaction
    of the metadata (stopped inside one, it would hold the database's write lock: every other
    daemon then waits, and fails after the busy timeout, as SQLite makes it). On a loaded machine
    the stop can land in one: then it runs a little longer and is stopped again."""
    deadline = time.monotonic() + 30
    while True:
        proc.send_signal(signal.SIGSTOP)
        probe = sqlite3.connect(db, timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")  # the write lock: free unless the stopped process holds it
            probe.execute("ROLLBACK")
            if metadata.segments("t/0", states=("uploading",)):
                return
        except sqlite3.OperationalError:
            pass
        finally:
            probe.close()
        assert time.monotonic() < deadline, "daemon A was never stopped mid-upload outside a metadata transaction"
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.02)


def test_paused_daemon_is_fenced_when_another_took_over(tmp_path: Path) -> None:
    root = tmp_path / "root"
    url = f"file://{tmp_path}/tier"
    # 4 KiB/s: after the first second's bytes, each 1 KiB chunk waits a quarter of a second
    make_topic(root, url, local_retention_bytes=0, tier_upload_bytes_per_s=4096)
    produce(root, [os.urandom(100) for _ in range(250)])
    a = Child(root)
    epoch_a = int(a.wait_line("started epoch").split()[-1])  # A created the root's metadata
    metadata = TierMetadata(root / ROOT_METADATA)
    try:
        wait_for(lambda: bool(metadata.segments("t/0", states=("uploading",))), 30, "daemon A to begin an upload")
        stop_mid_upload(a.proc, metadata, root / ROOT_METADATA)
        interrupted = metadata.segments("t/0", states=("uploading",))  # A cannot commit while stopped
        assert interrupted  # one segment, or several under way at once
        # A is stopped holding the root's lock: an operator removes the lock file (A looks dead) and starts B
        os.unlink(root / ".tier" / LOCK_FILE)
        with TieringDaemon(root) as b:
            assert b.epoch > epoch_a
            assert b.run(once=True).failures == []
            epoch_b = b.epoch
        a.proc.send_signal(signal.SIGCONT)
        code, err = a.finish()
    finally:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait()
        metadata.close()
    # A is fenced by whichever check it meets first on resuming: the bucket's epoch marks at its
    # next commit, or the index's epoch at its next metadata write (on a loaded machine, either)
    assert code != 0 and "FencedError" in err, err
    assert f"epoch {epoch_a} was overtaken by epoch {epoch_b}" in err or (
        f"uploader epoch {epoch_a} is fenced" in err and f"took over with epoch {epoch_b}" in err
    ), err
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url) as storage:
        uploaded = metadata.segments("t/0", states=("uploading", "uploaded", "deleting"))
        assert {r.state for r in uploaded} == {"uploaded"}
        assert [r.base_offset for r in uploaded[1:]] == [r.end_offset for r in uploaded[:-1]]
        # what A committed before it was stopped stays (a prefix); the rest, from the segments A was
        # uploading when stopped, is B's
        epochs = [r.epoch for r in uploaded]
        assert epochs == sorted(epochs) and set(epochs) <= {epoch_a, epoch_b}
        assert {r.epoch for r in uploaded if r.base_offset in {i.base_offset for i in interrupted}} == {epoch_b}
        # A wrote nothing that survives after B took over: every object is named by an uploaded row
        names = segment_objects(storage, "t/0/")
        assert names == {c.name for r in uploaded for c in r.chunks} | {r.manifest for r in uploaded}
