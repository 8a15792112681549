"""A channel opened with read_only=True (what `filechannel check` does) changes no file, however damaged."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from filechannel import ConfigError, CorruptRecordError, FileChannel


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and mtime."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def damaged_channel(path: Path) -> None:
    """Sealed segments, an ack position, then what dead processes and a flipped byte leave behind."""
    with FileChannel(path, segment_bytes=4096, index_interval_bytes=256, maintenance_interval=0, fsync="always") as ch:
        tx = ch.sender()
        for i in range(300):
            tx.send(b"record %04d" % i)
        tx.flush()
        rx = ch.ack_receiver("worker")
        rx.recv_many(10, timeout=5)
        rx.ack(10)
    segments = sorted(path.glob("*.seg"))
    active, sealed = segments[-1], segments[0]
    data = bytearray(active.read_bytes())
    data[32 + 2 * 30] ^= 0xFF  # a byte inside the second frame of the active segment: damage, valid frames follow
    active.write_bytes(bytes(data))
    with open(active, "ab") as f:
        f.write(b"\x40\x00\x00\x00torn")  # and a torn frame at its end
    idx = sealed.with_suffix(".idx")
    idx.write_bytes(b"\xff" * 8 + idx.read_bytes()[8:])  # an index entry that disagrees with the frames
    (path / (sealed.name + ".z.tmp")).write_bytes(b"half a compression")
    (path / "positions" / "ack.worker.pos.999999.1.tmp").write_bytes(b"a dead writer's temp file")


def test_opening_read_only_checking_and_reading_change_no_file(tmp_path):
    path = tmp_path / "ch"
    damaged_channel(path)
    before = snapshot(path)
    with FileChannel(path, read_only=True) as ch:
        with pytest.raises(CorruptRecordError, match="byte"):
            ch.check()
        rx = ch.receiver("earliest")
        got = []
        with pytest.raises(CorruptRecordError):
            while batch := rx.recv_many(100, timeout=0.2):
                got.extend(batch)
        assert [r.value for r in got[:5]] == [b"record %04d" % i for i in range(5)]
        assert ch.offset_for_time(0) == 0
        for refused in (ch.sender, lambda: ch.ack_receiver("worker"), ch.compress_sealed, ch.collect_garbage):
            with pytest.raises(ConfigError, match="read_only"):
                refused()
    assert snapshot(path) == before


def test_the_check_command_changes_no_file(tmp_path):
    root = tmp_path / "root"
    (root / "t").mkdir(parents=True)
    (root / "t" / "topic.json").write_text('{"partitions": 1, "config": {}}')
    damaged_channel(root / "t" / "0")
    before = snapshot(root)
    script = Path(sys.executable).parent / "filechannel"
    proc = subprocess.run([str(script), "--root", str(root), "check"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "byte" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert snapshot(root) == before


def test_a_missing_folder_is_not_created_read_only(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        FileChannel(tmp_path / "nothing", read_only=True)
    assert not os.path.exists(tmp_path / "nothing")


_READER = """
import sys
from filechannel import FileChannel
from filechannel.client.topics import TopicStore
with FileChannel(sys.argv[1], read_only=True) as ch:
    with ch.receiver("earliest") as rx:
        values = [r.value for r in rx.recv_many(100, timeout=5)]
    print(len(values), ch.first_offset, ch.end_offset, ch.check())
with TopicStore(sys.argv[2]).open_partition("t", 0, read_only=True) as ch:
    with ch.receiver("earliest") as rx:
        print(len(rx.recv_many(100, timeout=5)))
"""


def test_a_read_only_mount_is_read_whole(tmp_path):
    """A channel and a root's partition on a read-only mount (an executor's view of a root):
    opened read-only, they open no file for writing (not even the lock files), and read every
    record. The mount is a real read-only bind mount in a mount namespace of its own."""
    from filechannel.client import Admin, Producer

    ch_path, root = tmp_path / "data" / "ch", tmp_path / "data" / "root"
    with FileChannel(ch_path) as ch, ch.sender() as tx:
        for i in range(40):
            tx.send(b"v%d" % i)
    os.unlink(ch_path / "writer.lock")  # a folder copied without its lock files reads the same
    Admin(root).create_topic("t", 1)
    with Producer(root=root) as producer:
        for i in range(30):
            producer.send("t", b"r%d" % i)
    ro = tmp_path / "ro"
    ro.mkdir()
    script = f'mount --bind -o ro {tmp_path / "data"} {ro} && exec {sys.executable} -c "$0" {ro / "ch"} {ro / "root"}'
    unshare = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([*unshare, "sh", "-c", script, _READER], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["40", "0", "40", "40", "30"]
