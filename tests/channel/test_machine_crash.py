"""Sealed segments are fsynced in the background; after a machine crash the recovery
point tells which of them to check.

A machine crash cannot happen inside a test, so these tests simulate its two effects
(a mock of the one part that cannot be real here): the recovery point names another boot
of the machine, and pages that never reached the disk are gone from the files.
"""

import logging
import os
import threading

import pytest

from filechannel import CorruptRecordError, FileChannel, recovery_point
from filechannel.recovery_point import FILE_NAME, read_recovery_point, write_recovery_point

CONFIG = dict(maintenance_interval=0, compression="none", segment_bytes=4096, index_interval_bytes=256)
VALUE = b"v" * 90
FRAME = 8 + 9 + len(VALUE) + 5  # [len][crc], [attrs][timestamp], value + "%05d"


def fill(path, n, **extra):
    with FileChannel(path, **{**CONFIG, **extra}) as ch:
        s = ch.sender()
        for i in range(n):
            s.send(VALUE + b"%05d" % i)


def segments(path):
    return sorted(f for f in os.listdir(path) if f.endswith(".seg"))


def restart_machine(path, monkeypatch, offset=None):
    """What the next open sees after the machine restarted: a recovery point of another boot."""
    point = read_recovery_point(os.path.join(path, FILE_NAME))
    with monkeypatch.context() as m:
        m.setattr(recovery_point, "boot_id", lambda: b"\x01" * 16)
        write_recovery_point(os.path.join(path, FILE_NAME), point.offset if offset is None else offset)


def read_all(path):
    with FileChannel(path, **CONFIG) as ch:
        return [(r.offset, r.value) for r in ch.receiver().recv_many(100_000, timeout=0)]


def test_rolls_fsync_in_the_background_and_close_leaves_the_recovery_point_at_the_active_segment(tmp_path, monkeypatch):
    path = tmp_path / "ch"
    fsyncs = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(threading.current_thread().name), real(fd))[1])
    fill(path, 400, fsync="never")
    assert len(segments(path)) > 5
    sealer = [name for name in fsyncs if name == "filechannel-sealer"]
    assert sealer, "the sealer thread fsynced the sealed segments"
    assert "MainThread" not in fsyncs[1:], "no fsync on the append path but the first segment's folder entry"
    active_base = int(segments(path)[-1].split(".")[0])
    assert read_recovery_point(os.path.join(path, FILE_NAME)).offset == active_base
    assert [o for o, _ in read_all(path)] == list(range(400))


def test_after_a_restart_a_torn_sealed_segment_cuts_the_log_there(tmp_path, monkeypatch, caplog):
    path = tmp_path / "ch"
    fill(path, 400)
    segs = segments(path)
    torn = os.path.join(path, segs[2])  # pretend the last pages of the third segment never reached the disk
    torn_base = int(segs[2].split(".")[0])
    size = os.path.getsize(torn)
    with open(torn, "r+b") as f:
        f.seek(size - 700)
        f.write(bytes(700))
    restart_machine(path, monkeypatch, offset=int(segs[1].split(".")[0]))
    with caplog.at_level(logging.WARNING, logger="filechannel"):
        got = read_all(path)
    assert "was torn by a crash of the machine" in caplog.text
    offsets = [o for o, _ in got]
    assert offsets == list(range(len(offsets))) and torn_base < len(offsets) < int(segs[3].split(".")[0])
    assert all(v == VALUE + b"%05d" % o for o, v in got), "every record kept is the one written"
    assert segments(path)[-1] == segs[2], "the later segments are gone"
    with FileChannel(path, **CONFIG) as ch:  # the log goes on from the cut
        assert ch.sender().send(b"next") == len(offsets)
    assert read_all(path)[-1] == (len(offsets), b"next")
    assert read_recovery_point(os.path.join(path, FILE_NAME)).this_boot


def test_after_a_restart_segments_below_the_recovery_point_are_not_scanned(tmp_path, monkeypatch):
    path = tmp_path / "ch"
    fill(path, 400)
    segs = segments(path)
    first = os.path.join(path, segs[0])
    with open(first, "r+b") as f:  # damage below the point is not the recovery's business: reads report it
        f.seek(100)
        f.write(b"\xff" * 8)
    restart_machine(path, monkeypatch, offset=int(segs[1].split(".")[0]))
    with FileChannel(path, **CONFIG) as ch:
        assert segments(path) == segs
        with pytest.raises(CorruptRecordError):
            ch.receiver().recv_many(10, timeout=0)


def test_after_a_restart_a_stale_sealed_index_is_rebuilt(tmp_path, monkeypatch):
    path = tmp_path / "ch"
    fill(path, 400)
    segs = segments(path)
    idx = os.path.join(path, segs[1].replace(".seg", ".idx"))
    with open(idx, "r+b") as f:  # index pages that never reached the disk
        f.truncate(os.path.getsize(idx) // 2)
    restart_machine(path, monkeypatch, offset=0)
    before = os.path.getsize(idx)
    with FileChannel(path, **CONFIG) as ch:
        base = int(segs[1].split(".")[0])
        assert os.path.getsize(idx) > before
        rx = ch.receiver(base + 20)
        assert rx.recv().value == VALUE + b"%05d" % (base + 20)


def test_after_a_restart_the_active_segment_is_checked_from_its_first_frame(tmp_path, monkeypatch):
    path = tmp_path / "ch"
    fill(path, 30, segment_bytes=1 << 20)
    seg = os.path.join(path, segments(path)[-1])
    with open(seg, "r+b") as f:  # a lost page in the middle, before the last index entry
        f.seek(32 + 5 * FRAME)
        f.write(bytes(FRAME))
    restart_machine(path, monkeypatch, offset=0)
    assert [o for o, _ in read_all(path)] == list(range(5))
