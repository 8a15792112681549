"""Torn tails: the last frame cut or garbled at every byte position is trimmed on reopen;
corruption inside a sealed segment is never skipped."""

import itertools
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from filechannel import CorruptRecordError, FileChannel
from filechannel.engine.segment import SEGMENT_HEADER_SIZE

N = 20
CONFIG: dict[str, Any] = dict(maintenance_interval=0, compression="none")


def write(path, n=N, **extra):
    with FileChannel(path, **CONFIG, **extra) as ch:
        s = ch.sender()
        for i in range(n):
            s.send(b"value-%02d" % i + b"#" * (i % 7), key=b"k" if i % 2 else None)


def last_segment(path):
    return os.path.join(path, sorted(f for f in os.listdir(path) if f.endswith(".seg"))[-1])


def frame_start_of_last(seg):
    data = Path(seg).read_bytes()
    pos, starts = SEGMENT_HEADER_SIZE, []
    while pos < len(data):
        starts.append(pos)
        pos += 8 + int.from_bytes(data[pos : pos + 4], "little")
    return starts[-1], len(data)


def reopen_and_read(path):
    with FileChannel(path, **CONFIG) as ch:
        rx = ch.receiver()
        recs = rx.recv_many(1000, timeout=0)
        offset = ch.sender().send(b"after")
        ch.sender().flush()
        return recs, offset


def test_cut_anywhere_in_the_last_frame_is_trimmed(tmp_path, caplog):
    template = tmp_path / "template"
    write(template)
    seg = last_segment(template)
    start, end = frame_start_of_last(seg)
    data = Path(seg).read_bytes()
    for cut in range(start + 1, end):
        path = tmp_path / f"cut{cut}"
        os.makedirs(path)
        with open(os.path.join(path, os.path.basename(seg)), "wb") as f:
            f.write(data[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="filechannel"):
            recs, offset = reopen_and_read(path)
        assert [r.offset for r in recs] == list(range(N - 1)), cut
        assert offset == N - 1
        assert any(f"trimmed a torn tail of {cut - start} bytes at byte {start}" in m for m in caplog.messages), cut


def test_a_garbled_byte_anywhere_in_the_last_frame_is_trimmed(tmp_path):
    template = tmp_path / "template"
    write(template)
    seg = last_segment(template)
    start, end = frame_start_of_last(seg)
    data = Path(seg).read_bytes()
    for at in range(start, end):
        path = tmp_path / f"flip{at}"
        os.makedirs(path)
        garbled = bytearray(data)
        garbled[at] ^= 0x5A
        with open(os.path.join(path, os.path.basename(seg)), "wb") as f:
            f.write(garbled)
        recs, offset = reopen_and_read(path)
        assert [r.offset for r in recs] == list(range(N - 1)), at
        assert recs[-1].value.startswith(b"value-%02d" % (N - 2))
        assert offset == N - 1


@pytest.mark.parametrize("compressed", [False, True])
def test_corruption_in_a_sealed_segment_is_never_skipped(tmp_path, compressed):
    path = tmp_path / "ch"
    with FileChannel(path, segment_bytes=4096, maintenance_interval=0) as ch:
        s = ch.sender()
        for i in range(300):
            s.send(b"payload-%04d" % i + b"." * 30)
        s.flush()
        if compressed:
            ch.compress_sealed()
    first = sorted(f for f in os.listdir(path) if f.startswith("0000") and f.endswith((".seg", ".seg.z")))[0]
    victim = os.path.join(path, first)
    data = bytearray(Path(victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(victim).write_bytes(bytes(data))
    with FileChannel(path, segment_bytes=4096, maintenance_interval=0) as ch:
        rx = ch.receiver()
        got = []
        with pytest.raises(CorruptRecordError) as info:
            while batch := rx.recv_many(1000, timeout=0):
                got.extend(batch)
        assert first in str(info.value)
        # The records before the damage came through (the call that reached it returned
        # them), and the damage is not skipped: the next read raises again.
        assert [r.value for r in got] == [b"payload-%04d" % i + b"." * 30 for i in range(len(got))]
        if not compressed:
            assert got
        with pytest.raises(CorruptRecordError, match=first):
            rx.recv_many(1000, timeout=0)
        with pytest.raises(CorruptRecordError, match=first):
            ch.check()


@pytest.mark.parametrize("value_size", [100, 5000, 300_000])  # frames within one chunk, and one larger
def test_a_frame_that_lands_in_pieces_is_read_whole_once_complete(tmp_path, value_size):
    # A reader that meets part of a frame (a writer in another process mid-write) reads
    # nothing of it, then the whole frame once the rest is there, whatever the cut: inside
    # a header, inside a value, after a smaller frame, and read again with nothing new
    # (the reader reads into one buffer it keeps, and such a read overwrites it too).
    scratch = tmp_path / "scratch"
    values = [b"small", b"a" * value_size, b"tiny", b"b" * value_size]
    with FileChannel(scratch, **CONFIG) as ch:
        ch.sender().send_many(values)
    frames = Path(last_segment(scratch)).read_bytes()[SEGMENT_HEADER_SIZE:]
    ends = list(itertools.accumulate(8 + 9 + len(v) for v in values))  # frame header, record prefix, value
    assert ends[-1] == len(frames)
    path = tmp_path / "ch"
    write(path, n=3)
    with FileChannel(path, **CONFIG) as ch:
        rx = ch.receiver()
        assert len(rx.recv_many(1000, timeout=0)) == 3
        seg = last_segment(path)
        cuts = sorted({1, 7, ends[0] - 1, ends[0] + 3, ends[0] + 60, ends[1] - 1, ends[1] + 20, ends[2] + 90, len(frames) - 1})
        got, start = [], 0
        for cut in [*cuts, len(frames)]:
            with open(seg, "ab") as f:
                f.write(frames[start:cut])
            start = cut
            got += rx.recv_many(1000, timeout=0)
            got += rx.recv_many(1000, timeout=0)  # nothing new: the same partial frame is read again
            assert [r.value for r in got] == [v for v, end in zip(values, ends, strict=True) if end <= cut], cut
        assert [r.offset for r in got] == [3, 4, 5, 6]
