"""Damage never makes recovery delete intact records, nor readers misnumber them.

Index files are derived data: every byte of them is damaged in turn (flipped, zeroed,
cut, garbage appended), in the active segment and in a sealed one, and every record
must still come back at its offset with its value, and the index be rebuilt. A bad
frame followed by valid ones is damage, not a torn tail: nothing is cut, appends are
refused with an error that says how to repair, and `repair` cuts where the operator
says. Opening a channel to read takes no lock and writes nothing. A raw segment's header
is checked against its name and its CRC. Temp files of positions whose writer died are
removed on open.
"""

import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from filechannel import CorruptRecordError, FileChannel
from filechannel.engine import recovery_point
from filechannel.engine.record import encode_frame, encode_payload
from filechannel.engine.recovery_point import FILE_NAME, read_recovery_point, write_recovery_point
from filechannel.engine.segment import SEGMENT_HEADER_SIZE, find_valid_frame
from filechannel.errors import LogCorruptedError

CONFIG: dict[str, Any] = dict(maintenance_interval=0, compression="none")


def value(i):
    return b"rec-%04d-" % i + b"x" * 20


def frames(seg):
    """(position, length) of every whole frame of a raw segment file."""
    data = Path(seg).read_bytes()
    pos, out = SEGMENT_HEADER_SIZE, []
    while pos + 8 <= len(data):
        n = int.from_bytes(data[pos : pos + 4], "little")
        out.append((pos, n))
        pos += 8 + n
    return out


def seg_files(path, suffix=".seg"):
    return sorted(f for f in os.listdir(path) if f.endswith(suffix))


def snapshot(path):
    return {f: (Path(path) / f).read_bytes() for f in os.listdir(path) if os.path.isfile(os.path.join(path, f))}


def damages(data, entry_size):
    """Every damage to an index file's bytes: (label, damaged bytes)."""
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0xFF
        yield f"flip {i}", bytes(flipped)
    for i in range(0, len(data), entry_size):
        yield f"zero entry at {i}", data[:i] + bytes(entry_size) + data[i + entry_size :]
        yield f"zero from {i}", data[:i] + bytes(len(data) - i)
    for n in range(len(data)):
        yield f"truncate at {n}", data[:n]
    yield "garbage appended", data + b"\xff" * entry_size
    yield "garbage appended, odd length", data + b"\x13\x37\x42"
    if len(data) >= entry_size:  # an entry that looks like the next one but points into a frame
        a, b = struct.unpack_from("<II", data, len(data) - entry_size)
        yield "plausible entry appended", data + struct.pack("<II", a + 1, b + 3)


def read_at_every_offset(ch, offsets):
    for o in offsets:
        rx = ch.receiver(o)
        try:
            got = rx.recv_many(1, timeout=0)
        finally:
            rx.close()
        assert [(r.offset, r.value) for r in got] == [(o, value(o))], o


# -- item 1: index damage ------------------------------------------------------------------


@pytest.fixture(scope="module")
def active_template(tmp_path_factory):
    """A channel whose only segment holds 24 records and an index of a dozen entries, and
    the index files the writer makes after one more record (the expected rebuild)."""
    root = tmp_path_factory.mktemp("active")
    path = root / "ch"
    with FileChannel(path, index_interval_bytes=64, **CONFIG) as ch:
        s = ch.sender()
        for i in range(24):
            s.send(value(i), timestamp=1000 + i)
    after = root / "after"
    shutil.copytree(path, after)
    with FileChannel(after, index_interval_bytes=64, **CONFIG) as ch:
        ch.sender().send(value(24), timestamp=2000)
    stem = seg_files(path)[0][:20]
    expected = {s: (after / (stem + s)).read_bytes() for s in (".idx", ".tix")}
    assert len(expected[".idx"]) >= 8 * 8, "the index has several entries"
    return path, stem, expected


@pytest.mark.parametrize("suffix,entry", [(".idx", 8), (".tix", 12)])
def test_damage_to_any_byte_of_the_active_index_loses_nothing_and_is_rebuilt(tmp_path, active_template, suffix, entry):
    template, stem, expected = active_template
    data = (template / (stem + suffix)).read_bytes()
    for n, (label, damaged) in enumerate(damages(data, entry)):
        path = tmp_path / f"c{n}"
        shutil.copytree(template, path)
        (path / (stem + suffix)).write_bytes(damaged)
        with FileChannel(path, index_interval_bytes=64, **CONFIG) as ch:
            read_at_every_offset(ch, range(24))
            if suffix == ".tix":
                assert [ch.offset_for_time(1000 + i) for i in range(24)] == list(range(24)), label
            assert ch.sender().send(value(24), timestamp=2000) == 24, label
        for s, want in expected.items():
            assert (path / (stem + s)).read_bytes() == want, f"{label}: {s} rebuilt"
        with FileChannel(path, index_interval_bytes=64, **CONFIG) as ch:
            got = ch.receiver().recv_many(100, timeout=0)
            assert [(r.offset, r.value) for r in got] == [(i, value(i)) for i in range(25)], label
        shutil.rmtree(path)


@pytest.fixture(scope="module")
def sealed_template(tmp_path_factory):
    """A channel of three raw segments (two sealed), indexes of several entries each."""
    root = tmp_path_factory.mktemp("sealed")
    path = root / "ch"
    with FileChannel(path, segment_bytes=4096, index_interval_bytes=512, **CONFIG) as ch:
        s = ch.sender()
        for i in range(200):
            s.send(value(i), timestamp=1000 + i)
    segs = seg_files(path)
    assert len(segs) == 3
    bases = [int(f[:20]) for f in segs]
    pristine = {s: (path / (segs[0][:20] + s)).read_bytes() for s in (".idx", ".tix")}
    return path, segs[0][:20], range(bases[0], bases[1]), pristine


@pytest.mark.parametrize("suffix,entry", [(".idx", 8), (".tix", 12)])
def test_damage_to_any_byte_of_a_sealed_index_loses_nothing_and_is_rebuilt(tmp_path, sealed_template, suffix, entry):
    template, stem, offsets, pristine = sealed_template
    data = pristine[suffix]
    cases = [*damages(data, entry), ("missing", None)]
    for n, (label, damaged) in enumerate(cases):
        path = tmp_path / f"c{n}"
        shutil.copytree(template, path)
        if damaged is None:
            os.unlink(path / (stem + suffix))
        else:
            (path / (stem + suffix)).write_bytes(damaged)
        with FileChannel(path, segment_bytes=4096, index_interval_bytes=512, **CONFIG) as ch:
            read_at_every_offset(ch, offsets)
            assert [ch.offset_for_time(1000 + i) for i in offsets] == list(offsets), label
            for s, want in pristine.items():
                assert (path / (stem + s)).read_bytes() == want, f"{label}: {s} rebuilt"
        shutil.rmtree(path)


def test_a_sealed_index_made_with_another_interval_is_checked_entry_by_entry(tmp_path, sealed_template):
    template, stem, offsets, pristine = sealed_template
    path = tmp_path / "ch"
    shutil.copytree(template, path)
    with FileChannel(path, segment_bytes=4096, index_interval_bytes=4096, **CONFIG) as ch:
        read_at_every_offset(ch, offsets)
    assert {s: (path / (stem + s)).read_bytes() for s in pristine} == pristine, "good files are kept as they are"
    idx = bytearray(pristine[".idx"])
    idx[8 * 3] ^= 0x01  # the offset of the fourth entry
    (path / (stem + ".idx")).write_bytes(bytes(idx))
    with FileChannel(path, segment_bytes=4096, index_interval_bytes=4096, **CONFIG) as ch:
        read_at_every_offset(ch, offsets)
        assert [ch.offset_for_time(1000 + i) for i in offsets] == list(offsets)
    assert (path / (stem + ".idx")).read_bytes() != bytes(idx), "a damaged one is rebuilt"


# -- item 2: damage in the middle is not a torn tail ---------------------------------------


def fill(path, n, **extra):
    with FileChannel(path, fsync="always", **{**CONFIG, **extra}) as ch:
        s = ch.sender()
        for i in range(n):
            s.send(value(i))


@pytest.mark.parametrize("at", [0, 1, 3, 4, 7, 12])  # bytes of the length, of the CRC, of the record
def test_a_bad_frame_in_the_middle_of_the_active_segment_is_kept_and_blocks_appends_until_repair(tmp_path, at):
    path = tmp_path / "ch"
    fill(path, 100)
    seg = path / seg_files(path)[-1]
    pos = frames(seg)[50][0]
    data = bytearray(seg.read_bytes())
    data[pos + at] ^= 0x5A
    seg.write_bytes(bytes(data))
    with FileChannel(path, **CONFIG) as ch:
        assert [r.offset for r in ch.receiver().recv_many(1000, timeout=0)] == list(range(50))
        s = ch.sender()
        with pytest.raises(LogCorruptedError) as info:
            s.send(b"next")
        message = str(info.value)
        assert seg.name in message and f"byte {pos}" in message and "offset 50" in message
        assert f"filechannel repair {path} --after 49" in message
        with pytest.raises(LogCorruptedError):  # and again: no offset was handed out
            s.send(b"next")
        assert seg.read_bytes() == bytes(data), "not a byte cut"
        ch.repair(49)
        assert s.send(b"next") == 50
    assert seg.stat().st_size == pos + 8 + 9 + 4
    with FileChannel(path, **CONFIG) as ch:
        got = ch.receiver().recv_many(1000, timeout=0)
        assert [(r.offset, r.value) for r in got] == [(i, value(i)) for i in range(50)] + [(50, b"next")]
        assert ch.check() == 51


def test_a_torn_tail_is_still_trimmed(tmp_path):
    path = tmp_path / "ch"
    fill(path, 100)
    seg = path / seg_files(path)[-1]
    pos, n = frames(seg)[-1]
    with open(seg, "r+b") as f:  # the last frame garbled and cut short, nothing after it
        f.seek(pos + 5)
        f.write(b"\x00\x01\x02")
        f.truncate(pos + n)
    with FileChannel(path, **CONFIG) as ch:
        assert ch.sender().send(b"next") == 99
    assert seg.stat().st_size == pos + 8 + 9 + 4


def restart_machine(path, monkeypatch):
    """The next open sees a restart of the machine: a point of another boot, below every segment."""
    with monkeypatch.context() as m:
        m.setattr(recovery_point, "boot_id", lambda: b"\x01" * 16)
        write_recovery_point(os.path.join(path, FILE_NAME), 0)


@pytest.mark.parametrize("point", ["deleted", "unreadable", "other boot"])
def test_after_a_restart_a_bad_frame_in_a_sealed_segment_deletes_nothing(tmp_path, monkeypatch, point):
    path = tmp_path / "ch"
    fill(path, 300, segment_bytes=4096)
    segs = seg_files(path)
    assert len(segs) >= 4
    victim = path / segs[1]
    base, next_base = int(segs[1][:20]), int(segs[2][:20])
    pos = frames(victim)[30][0]
    data = bytearray(victim.read_bytes())
    data[pos + 5] ^= 0x01
    victim.write_bytes(bytes(data))
    point_file = path / FILE_NAME
    if point == "deleted":
        point_file.unlink()
    elif point == "unreadable":
        point_file.write_bytes(b"\x00" * 7)
    else:
        restart_machine(path, monkeypatch)
    before = {f: b for f, b in snapshot(path).items() if f[:20].isdigit()}
    with FileChannel(path, **CONFIG) as ch:
        with pytest.raises(LogCorruptedError, match=f"{segs[1]}.*byte {pos}.*offset {base + 30}.*--after {base + 29}"):
            ch.sender().send(b"next")
        assert {f: b for f, b in snapshot(path).items() if f[:20].isdigit()} == before, "no segment deleted or cut"
        got = ch.receiver().recv_many(10_000, timeout=0)
        assert [(r.offset, r.value) for r in got] == [(i, value(i)) for i in range(base + 30)]
        later = ch.receiver(next_base).recv_many(10_000, timeout=0)
        assert [(r.offset, r.value) for r in later] == [(i, value(i)) for i in range(next_base, 300)]
        ch.repair(base + 29)
        assert ch.sender().send(b"next") == base + 30
    assert seg_files(path)[-1] == segs[1]
    point = read_recovery_point(str(point_file))
    assert point is not None and point.this_boot


def test_repair_refuses_an_offset_past_the_damage_and_one_inside_a_compressed_segment(tmp_path):
    path = tmp_path / "ch"
    fill(path, 300, segment_bytes=4096)
    segs = seg_files(path)
    with FileChannel(path, segment_bytes=4096, maintenance_interval=0) as ch:
        ch.compress_sealed()
        z_end = int(segs[1][:20])
        with pytest.raises(CorruptRecordError, match="inside the compressed segment"):
            ch.repair(z_end - 5)
    seg = path / seg_files(path)[-1]
    last_base = int(seg.name[:20])
    pos = frames(seg)[3][0]
    data = bytearray(seg.read_bytes())
    data[pos + 4] ^= 0x01
    seg.write_bytes(bytes(data))
    with FileChannel(path, **CONFIG) as ch:
        with pytest.raises(Exception, match=f"choose an offset below {last_base + 3}"):
            ch.repair(last_base + 10)
        ch.repair(z_end - 1)  # at a compressed segment's end: the later segments go
        s = ch.sender()
        assert s.send(b"next") == z_end
        s.flush()
        assert [r.offset for r in ch.receiver().recv_many(10_000, timeout=0)] == list(range(z_end + 1))


def test_repair_of_a_live_channel_writes_what_its_sender_buffered_then_cuts_and_the_sender_goes_on(tmp_path):
    path = tmp_path / "ch"
    with FileChannel(path, segment_bytes=4096, **CONFIG) as ch:
        s = ch.sender()
        for i in range(150):  # two segments; the last records still buffered, writer.lock held
            s.send(value(i))
        ch.repair(119)
        assert s.send(b"next") == 120
        s.flush()
        got = ch.receiver().recv_many(1000, timeout=0)
        assert [(r.offset, r.value) for r in got] == [(i, value(i)) for i in range(120)] + [(120, b"next")]
        assert ch.check() == 121


# -- item 3: opening to read takes no lock and writes nothing ------------------------------

HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_reader_does_not_wait_for_a_writer_holding_the_lock_in_another_process(tmp_path):
    path = tmp_path / "ch"
    fill(path, 10)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path / "writer.lock")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == b"locked\n"
        result: dict[str, object] = {}

        def read():
            with FileChannel(path, **CONFIG) as ch:
                result["records"] = [r.offset for r in ch.receiver().recv_many(100, timeout=0)]
                result["end"] = ch.end_offset
                result["check"] = ch.check()

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(timeout=60)  # a guard against a hang, not a timing: it must not wait at all
        assert not reader.is_alive(), "opening to read waited for writer.lock"
        assert result == {"records": list(range(10)), "end": 10, "check": 10}
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_opening_a_torn_channel_to_read_changes_no_byte_and_a_sender_trims_it(tmp_path):
    path = tmp_path / "ch"
    fill(path, 20)
    seg = path / seg_files(path)[-1]
    size = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\x20\x00\x00\x00\x01\x02")  # the start of a frame a killed writer never finished
    before = snapshot(path)
    with FileChannel(path, **CONFIG) as ch:
        assert [r.offset for r in ch.receiver().recv_many(100, timeout=0)] == list(range(20))
        assert ch.check() == 20
        assert ch.end_offset == 20
    assert snapshot(path) == before, "opening, reading and checking changed nothing"
    with FileChannel(path, **CONFIG) as ch:
        assert ch.sender().send(b"next") == 20
    assert seg.stat().st_size == size + 8 + 9 + 4


# -- item 5: raw headers are checked -------------------------------------------------------


def test_a_damaged_raw_header_is_refused_naming_the_file_and_never_renumbers_records(tmp_path, caplog):
    template = tmp_path / "template"
    fill(template, 300, segment_bytes=4096)
    segs = seg_files(template)
    victim = segs[1]
    for at in range(SEGMENT_HEADER_SIZE):
        path = tmp_path / f"h{at}"
        shutil.copytree(template, path)
        data = bytearray((path / victim).read_bytes())
        data[at] ^= 0x10
        (path / victim).write_bytes(bytes(data))
        with FileChannel(path, segment_bytes=4096, maintenance_interval=0) as ch:
            got = ch.receiver().recv_many(10_000, timeout=0)
            assert [(r.offset, r.value) for r in got] == [(i, value(i)) for i in range(300)], at
            with pytest.raises(CorruptRecordError, match=victim):
                ch.check()
            caplog.clear()
            with caplog.at_level(logging.ERROR, logger="filechannel"):
                done = ch.compress_sealed()
            assert int(victim[:20]) not in done and (path / victim).exists(), at
            assert victim in caplog.text
            got = ch.receiver().recv_many(10_000, timeout=0)
            assert [(r.offset, r.value) for r in got] == [(i, value(i)) for i in range(300)], at
        shutil.rmtree(path)


def test_a_damaged_header_of_the_active_segment_blocks_appends_naming_the_file(tmp_path):
    path = tmp_path / "ch"
    fill(path, 10)
    seg = path / seg_files(path)[-1]
    data = bytearray(seg.read_bytes())
    data[17] ^= 0x01  # the base offset
    seg.write_bytes(bytes(data))
    with FileChannel(path, **CONFIG) as ch, pytest.raises(LogCorruptedError, match=seg.name):
        ch.sender().send(b"next")
    assert seg.read_bytes() == bytes(data)


def test_headers_written_before_the_header_crc_stay_readable(tmp_path):
    path = tmp_path / "ch"
    fill(path, 300, segment_bytes=4096)
    for f in seg_files(path):
        with open(path / f, "r+b") as fh:  # the reserved field as older versions wrote it
            fh.seek(12)
            fh.write(bytes(4))
    with FileChannel(path, segment_bytes=4096, maintenance_interval=0) as ch:
        assert ch.sender().send(b"next") == 300
        assert ch.compress_sealed()
        assert ch.check() == 301
        assert [r.offset for r in ch.receiver().recv_many(10_000, timeout=0)] == list(range(301))


# -- item 6: temp files of positions -------------------------------------------------------

TEMP_WRITER = """
import os, sys, threading
path = sys.argv[1] + ".%d.%d.tmp" % (os.getpid(), threading.get_ident())
with open(path, "wb") as f:
    f.write(b"FCHP")
print(path, flush=True)
sys.stdin.read()
"""


def test_temp_files_of_positions_left_by_a_killed_process_are_removed_on_open(tmp_path):
    path = tmp_path / "ch"
    with FileChannel(path, **CONFIG) as ch:
        ch.sender().send(b"x")
        ch.positions.set("ack.w", 1)
    target = str(path / "positions" / "ack.w.pos")
    killed = subprocess.Popen([sys.executable, "-c", TEMP_WRITER, target], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    alive = subprocess.Popen([sys.executable, "-c", TEMP_WRITER, target], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert killed.stdout is not None and alive.stdout is not None
    try:
        dead_tmp = killed.stdout.readline().decode().strip()
        live_tmp = alive.stdout.readline().decode().strip()
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        legacy = f"{target}.{killed.pid}.tmp"  # as positions were written before
        Path(legacy).write_bytes(b"FCHP")
        with FileChannel(path, **CONFIG) as ch:
            assert not os.path.exists(dead_tmp) and not os.path.exists(legacy)
            assert os.path.exists(live_tmp), "a live writer's temp file is left alone"
            assert ch.positions.get("ack.w") == 1
            ch.positions.set("ack.w", 2)
            assert ch.positions.get("ack.w") == 2
    finally:
        for proc in (killed, alive):
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)
    with FileChannel(path, **CONFIG):
        assert not os.path.exists(live_tmp), "removed once its process is gone"


# -- the resync scan -----------------------------------------------------------------------


def resync(tmp_path, data, start=0):
    f = tmp_path / "seg"
    f.write_bytes(data)
    fd = os.open(f, os.O_RDONLY)
    try:
        return find_valid_frame(fd, str(f), start)
    finally:
        os.close(fd)


def test_the_resync_scan_finds_the_first_valid_frame_after_damage_and_nothing_in_a_torn_tail(tmp_path):
    frame = encode_frame(encode_payload(b"payload", b"key", [("h", b"v")], 1234))
    plain = encode_frame(encode_payload(b"x" * 100, None, None, 5))
    assert resync(tmp_path, frame) == 0
    assert resync(tmp_path, bytes(1000) + frame) == 1000  # a run of zeros, as a lost block leaves
    garbage = bytes(range(256)) * 8
    assert resync(tmp_path, garbage + plain + frame) == len(garbage)
    assert resync(tmp_path, plain[:-1]) is None  # a torn frame: nothing valid after it
    assert resync(tmp_path, bytes(5000)) is None
    bad = bytearray(plain)
    bad[20] ^= 1
    assert resync(tmp_path, bytes(bad) + bytes(3)) is None
    assert resync(tmp_path, bytes(bad) + frame, start=1) == len(bad)
    # across the 1 MiB read chunks: a frame that starts a few bytes before a chunk's end
    for lead in (1 << 20) - 20, (1 << 20) - 3, (1 << 20) + 1:
        assert resync(tmp_path, bytes(lead) + frame) == lead, lead
    # a frame whose record does not decode (an unknown attribute bit) is not a frame a writer made
    undecodable = encode_frame(b"\x08" + bytes(8))
    assert resync(tmp_path, undecodable) is None
    # a tombstone (attribute bit 2, no value) is a valid frame: damage before one is damage, not a torn tail
    tombstone = encode_frame(encode_payload(None, b"key", None, 7))
    assert resync(tmp_path, bytes(bad) + tombstone, start=1) == len(bad)
