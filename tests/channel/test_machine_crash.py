"""Sealed segments are fsynced in the background; after a machine crash the recovery
point tells which of them to check.

A machine crash cannot happen inside a test, so these tests simulate its two effects
(a mock of the one part that cannot be real here): the recovery point names another boot
of the machine, and pages that never reached the disk are gone from the files.
"""

import logging
import os
import threading
from typing import Any

import pytest

from filechannel import CorruptRecordError, FileChannel
from filechannel.engine import recovery_point
from filechannel.engine.recovery_point import FILE_NAME, read_recovery_point, write_recovery_point
from filechannel.errors import LogCorruptedError

CONFIG: dict[str, Any] = dict(maintenance_interval=0, compression="none", segment_bytes=4096, index_interval_bytes=256)
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
    assert point is not None
    with monkeypatch.context() as m:
        m.setattr(recovery_point, "boot_id", lambda: b"\x01" * 16)
        write_recovery_point(os.path.join(path, FILE_NAME), point.offset if offset is None else offset)


def read_all(path):
    with FileChannel(path, **CONFIG) as ch:
        return [(r.offset, r.value) for r in ch.receiver().recv_many(100_000, timeout=0)]


def test_rolls_fsync_in_the_background_and_close_leaves_the_recovery_point_at_the_active_segment(tmp_path, monkeypatch):
    path = tmp_path / "ch"
    fsyncs: list[str] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(threading.current_thread().name), real(fd))[1])
    fill(path, 400, fsync="never")
    assert len(segments(path)) > 5
    sealer = [name for name in fsyncs if name == "filechannel-sealer"]
    assert sealer, "the sealer thread fsynced the sealed segments"
    assert "MainThread" not in fsyncs[1:], "no fsync on the append path but the first segment's folder entry"
    active_base = int(segments(path)[-1].split(".")[0])
    point = read_recovery_point(os.path.join(path, FILE_NAME))
    assert point is not None and point.offset == active_base
    assert [o for o, _ in read_all(path)] == list(range(400))


def test_after_a_restart_a_torn_sealed_segment_with_records_after_it_is_kept_and_blocks_appends(tmp_path, monkeypatch):
    # The third segment's last pages never reached the disk, but later segments' did: the
    # lost records are a hole in the middle of the log, not a torn tail. Cutting there
    # would delete every intact later record (it did): nothing is cut, appends are refused.
    path = tmp_path / "ch"
    fill(path, 400)
    segs = segments(path)
    torn = os.path.join(path, segs[2])
    torn_base, next_base = int(segs[2].split(".")[0]), int(segs[3].split(".")[0])
    size = os.path.getsize(torn)
    with open(torn, "r+b") as f:
        f.seek(size - 700)
        f.write(bytes(700))
    restart_machine(path, monkeypatch, offset=int(segs[1].split(".")[0]))
    before = {f: (path / f).read_bytes() for f in segs}
    with FileChannel(path, **CONFIG) as ch:
        with pytest.raises(LogCorruptedError, match=f"{segs[2]}.*ends early.*filechannel repair"):
            ch.sender().send(b"next")
        assert {f: (path / f).read_bytes() for f in segs} == before, "not a byte cut"
        rx = ch.receiver(next_base)  # every record after the hole is still there
        got = rx.recv_many(100_000, timeout=0)
        assert [r.offset for r in got] == list(range(next_base, 400))
        assert all(r.value == VALUE + b"%05d" % r.offset for r in got)
        kept = torn_base + (size - 700 - 32) // FRAME
        ch.repair(kept - 1)  # the operator gives up the hole and what follows it
        assert ch.sender().send(b"next") == kept
    assert segments(path)[-1] == segs[2]
    assert read_all(path)[-1] == (kept, b"next")
    point = read_recovery_point(os.path.join(path, FILE_NAME))
    assert point is not None and point.this_boot


def test_after_a_restart_a_torn_sealed_segment_with_no_record_after_it_is_the_torn_tail(tmp_path, monkeypatch, caplog):
    path = tmp_path / "ch"
    fill(path, 400)
    segs = segments(path)
    torn = os.path.join(path, segs[-2])  # the last sealed segment lost its last pages...
    torn_base = int(segs[-2].split(".")[0])
    size = os.path.getsize(torn)
    with open(torn, "r+b") as f:
        f.seek(size - 700)
        f.write(bytes(700))
    active = os.path.join(path, segs[-1])
    with open(active, "r+b") as f:  # ...and the active segment's frames never got there at all
        f.truncate(32)
        f.write(bytes(600))
    restart_machine(path, monkeypatch, offset=int(segs[1].split(".")[0]))
    with caplog.at_level(logging.WARNING, logger="filechannel"), FileChannel(path, **CONFIG) as ch:
        next_offset = ch.sender().send(b"next")
    assert "was torn by a crash of the machine" in caplog.text
    got = read_all(path)
    assert [o for o, _ in got] == list(range(len(got)))
    assert torn_base < next_offset < int(segs[-1].split(".")[0])
    assert got[-1] == (next_offset, b"next")
    assert all(v == VALUE + b"%05d" % o for o, v in got[:-1]), "every record kept is the one written"
    assert segments(path)[-1] == segs[-2], "the later segment, which held no record, is gone"


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
        assert os.path.getsize(idx) == before, "opening to read writes nothing"
        ch.sender().flush()
        ch.sender().send(b"x")  # a writer checks the log after a restart
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
