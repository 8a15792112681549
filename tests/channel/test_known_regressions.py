"""Cases known from the Go implementation's history."""

import os
import shutil
from typing import Any

import pytest

from filechannel import FileChannel, Record
from filechannel.engine.cursor import READ_CHUNK
from filechannel.engine.segment import SEGMENT_HEADER_SIZE

CONFIG: dict[str, Any] = dict(maintenance_interval=0)


def read_all(ch, start="earliest"):
    rx = ch.receiver(start)
    out = []
    while batch := rx.recv_many(10_000, timeout=0):
        out.extend(batch)
    return out


def test_frames_straddling_4096_byte_boundaries_and_a_tail_torn_exactly_there(tmp_path):
    # 1000-byte values: frames of 1017 bytes cross every 4 KiB (and read-chunk) boundary.
    path = tmp_path / "ch"
    values = [bytes([i % 251]) * 1000 for i in range(600)]
    with FileChannel(path, compression="none", **CONFIG) as ch:
        ch.sender().send_many(values)
    seg = path / "00000000000000000000.seg"
    size = seg.stat().st_size
    assert size > 2 * READ_CHUNK
    with FileChannel(path, compression="none", **CONFIG) as ch:
        assert [r.value for r in read_all(ch)] == values
        for off in (3, 4, 5, 257, 258, 599):
            assert ch.receiver(off).recv().value == values[off]
    # Tear the file exactly at a 4096-byte boundary inside a frame.
    boundary = (size // 4096) * 4096
    frame = 8 + 9 + 1000
    assert (boundary - SEGMENT_HEADER_SIZE) % frame != 0
    os.truncate(seg, boundary)
    whole = (boundary - SEGMENT_HEADER_SIZE) // frame
    with FileChannel(path, compression="none", **CONFIG) as ch:
        got = read_all(ch)
        assert [r.value for r in got] == values[:whole]
        assert ch.sender().send(b"next") == whole


def make_sealed(path, n=400):
    with FileChannel(path, segment_bytes=4096, compression="none", **CONFIG) as ch:
        s = ch.sender()
        for i in range(n):
            s.send(b"rec-%04d" % i + b"-" * 40)
    return sorted(f for f in os.listdir(path) if f.endswith(".seg"))


def test_a_compression_interrupted_halfway_is_rolled_back_or_finished(tmp_path):
    path = tmp_path / "ch"
    sealed = make_sealed(path)
    expected = [b"rec-%04d" % i + b"-" * 40 for i in range(400)]
    # 1. A dead compressor left its temp file: rolled back.
    scratch = tmp_path / "scratch"
    shutil.copytree(path, scratch)
    with FileChannel(scratch, segment_bytes=4096, **CONFIG) as ch:
        ch.compress_sealed()
    z0 = (scratch / (sealed[0] + ".z")).read_bytes()
    (path / (sealed[0] + ".z.tmp")).write_bytes(z0[: len(z0) // 2])
    # 2. Renamed but the raw files not yet deleted: finished.
    (path / (sealed[1] + ".z")).write_bytes((scratch / (sealed[1] + ".z")).read_bytes())
    # 3. A truncated .seg.z beside its raw segment: rolled back.
    z2 = (scratch / (sealed[2] + ".z")).read_bytes()
    (path / (sealed[2] + ".z")).write_bytes(z2[: len(z2) - 10])
    with FileChannel(path, segment_bytes=4096, **CONFIG) as ch:
        files = set(os.listdir(path))
        assert not [f for f in files if f.endswith(".tmp")]
        assert sealed[0] in files and sealed[0] + ".z" not in files
        assert sealed[1] not in files and sealed[1] + ".z" in files
        assert sealed[1][:20] + ".idx" not in files
        assert sealed[2] in files and sealed[2] + ".z" not in files
        assert [r.value for r in read_all(ch)] == expected
        assert ch.check() == 400


def test_double_close_everywhere(tmp_path):
    ch = FileChannel(tmp_path / "ch", **CONFIG)
    s = ch.sender()
    rx = ch.receiver()
    ack = ch.ack_receiver("a")
    s.send(b"x")
    for obj in (s, rx, ack, s, rx, ack):
        obj.close()
    ch.close()
    ch.close()
    with FileChannel(tmp_path / "ch", **CONFIG) as again:
        assert [r.value for r in read_all(again)] == [b"x"]


@pytest.mark.parametrize("compressed", [False, True])
def test_a_reader_holding_a_segment_that_gc_deletes(tmp_path, compressed):
    from filechannel import OffsetOutOfRangeError

    path = tmp_path / "ch"
    n = 3000
    with FileChannel(path, segment_bytes=4096, **CONFIG) as ch:
        s = ch.sender()
        for i in range(n):
            s.send(b"rec-%04d" % i + b"-" * 40)
        s.flush()
        if compressed:
            ch.compress_sealed()
        reader = ch.receiver()
        assert reader.recv().offset == 0  # its cursor now holds a segment past its first batch
        acker = ch.ack_receiver("fast")
        while acker.recv_many(1000, timeout=0):
            pass
        acker.ack(n)
        deleted = ch.collect_garbage()
        assert deleted[0] == 0 and len(deleted) > 10
        assert min(int(f.split(".")[0]) for f in os.listdir(path) if f[0].isdigit()) > deleted[-1]
        # It reads the segment it holds to its end through its open file, then is told.
        got: list[int] = []
        with pytest.raises(OffsetOutOfRangeError, match="below the first retained offset"):
            while True:
                got.extend(r.offset for r in reader.recv_many(100, timeout=0))
        assert got == list(range(1, len(got) + 1))
        assert len(got) + 1 in deleted[1:]  # stopped exactly at the end of a deleted segment
        # Seeking to the first retained offset continues normally.
        reader.seek(ch.first_offset)
        assert reader.recv().offset == ch.first_offset


@pytest.mark.parametrize("size", [40_000, 65_536, 100_000])
def test_records_of_one_size_are_read_about_once_not_a_third_again(tmp_path, monkeypatch, size):
    # A chunk read ending inside a frame reads that frame again with the next chunk. With
    # 256 KiB chunks, 64 KiB records were read a third again (three records and the head of a
    # fourth a chunk); chunks of whole frames read each record's bytes once.
    from filechannel.engine import cursor

    values = [os.urandom(size) for _ in range(60)]
    read = []
    real = cursor._RawSource.read

    def counted(self, position, n):
        data, start = real(self, position, n)
        read.append(len(data))
        return data, start

    monkeypatch.setattr(cursor._RawSource, "read", counted)
    with FileChannel(tmp_path / "ch", compression="none", **CONFIG) as ch:
        ch.sender().send_many(values)
        ch.sender().flush()
        for batch in (1, 7, 100):  # recv_many of one, a few and many records
            rx = ch.receiver("earliest")
            read.clear()
            got: list[Record] = []
            while len(got) < len(values):
                got += rx.recv_many(batch, timeout=0)
            assert [r.value for r in got] == values
            frames = sum(len(v) + 17 for v in values)
            # Once each, plus the first chunk's partial frame (its length is unknown until read).
            assert sum(read) <= frames + size + 17, (batch, sum(read) / frames)
