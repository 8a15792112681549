"""Compacted channels (cleanup_policy="compact"): the cleaner's rules, offsets with holes for every
reader, the version-2 segment format, and the swap's crash safety under SIGKILL."""

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from filechannel import ConfigError, CorruptRecordError, FileChannel, InvalidRecordError, Record
from filechannel.engine import cleaner, failpoints
from filechannel.engine.clock import now_ms
from filechannel.engine.compressed import Z_VERSION_RUNS, CompressedSegment, check_block, decode_table, write_cleaned
from filechannel.engine.record import encode_frame, encode_payload
from filechannel.engine.segment import SegmentHeader

DAY_MS = 86_400_000
CONFIG: dict[str, Any] = dict(
    cleanup_policy="compact",
    segment_bytes=4096,
    maintenance_interval=0,
    index_interval_bytes=256,
    compression_block_bytes=1024,
    delete_retention_ms=DAY_MS,
)


def read_all(ch: FileChannel, start: int | str = "earliest") -> list[Record]:
    with ch.receiver(start) as rx:
        out: list[Record] = []
        while batch := rx.recv_many(1000, timeout=0):  # everything was written before: no wait at the end
            out.extend(batch)
        return out


def send_keyed(ch: FileChannel, pairs: list[tuple[bytes, bytes | None]], timestamp: int | None = None) -> list[int]:
    with ch.sender() as s:
        return [s.send(v, key=k, timestamp=timestamp) for k, v in pairs]


def compacted(ch: FileChannel, records: list[Record]) -> list[Record]:
    """``records`` as a whole compaction leaves them: the last of each key among those in sealed
    segments, and the active segment's as they are."""
    active = ch._log.local_segments()[-1].base_offset
    last = {r.key: r for r in records if r.offset < active}
    return sorted(last.values()) + [r for r in records if r.offset >= active]


def roll(ch: FileChannel) -> list[Record]:
    """Seal the active segment: records of a key of their own fill it; return them."""
    sent = []
    with ch.sender() as s:
        first = ch._log.local_segments()[-1].base_offset
        while ch._log.local_segments()[-1].base_offset == first:
            ts = now_ms()
            sent.append(Record(s.send(b"-" * 500, key=b"filler", timestamp=ts), ts, b"filler", b"-" * 500))
            s.flush()
    return sent


def test_a_send_without_a_key_is_refused_and_nothing_is_written(tmp_path):
    with FileChannel(tmp_path / "c", **CONFIG) as ch, ch.sender() as s:
        for send in (lambda: s.send(b"v"), lambda: s.send_many([b"a", b"b"]), lambda: s.appender.append_stamped(b"v")):
            with pytest.raises(InvalidRecordError, match="needs a key"):
                send()
        assert s.send(b"v", key=b"k") == 0
        s.flush()
        assert [r.value for r in read_all(ch)] == [b"v"]


def test_compaction_settings_are_checked_and_a_compacted_channel_has_no_tier(tmp_path):
    cases: list[tuple[dict[str, Any], str]] = [
        (dict(cleanup_policy="squash"), "cleanup_policy must be one of"),
        (dict(min_cleanable_dirty_ratio=1.5), "min_cleanable_dirty_ratio"),
        (dict(delete_retention_ms=-1), "delete_retention_ms"),
        (dict(max_compaction_lag_ms=-2), "max_compaction_lag_ms"),
        (dict(cleaner_dedupe_buffer_bytes=10), "cleaner_dedupe_buffer_bytes"),
        (dict(cleanup_policy="compact", tier=f"file://{tmp_path}/t2"), "compaction of tier-2 history is not done"),
    ]
    for bad, message in cases:
        with pytest.raises(ConfigError, match=message):
            FileChannel(tmp_path / "c", **bad)


def test_the_last_record_of_each_key_is_kept_with_its_offset_timestamp_and_headers(tmp_path):
    with FileChannel(tmp_path / "c", **CONFIG) as ch:
        with ch.sender() as s:
            for i in range(300):
                s.send(b"v%d" % i, key=b"k%d" % (i % 10), headers=[("h", b"%d" % i)], timestamp=1000 + i)
        roll(ch)
        before = read_all(ch)
        assert ch.compact()
        after = read_all(ch)
        assert after == compacted(ch, before)  # only the last of each key, as they were
        assert [r.offset for r in after] == sorted({r.offset for r in after})
        assert ch.check() == len(after)
        assert ch.end_offset == before[-1].offset + 1
        assert ch.compact() == []  # nothing left to clean


def test_a_seek_into_a_hole_lands_on_the_next_record_and_time_search_skips_holes(tmp_path):
    with FileChannel(tmp_path / "c", **CONFIG) as ch:
        send_keyed(ch, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1"), (b"b", b"2")], timestamp=5000)
        roll(ch)
        ch.compact()
        kept = [r.offset for r in read_all(ch)]
        assert kept[:3] == [2, 3, 4]
        for start, first in [(0, 2), (1, 2), (2, 2), (3, 3)]:
            assert read_all(ch, start)[0].offset == first
        assert ch.offset_for_time(0) == 2
        with ch.ack_receiver("g") as ack:
            got = ack.recv_many(3, timeout=1)
            assert [r.offset for r in got] == [2, 3, 4]
            ack.ack(3)
        with ch.ack_receiver("g") as ack:
            assert ack.recv(timeout=1).offset == kept[3]


def test_tombstones_are_kept_until_delete_retention_ms_then_removed(tmp_path):
    with FileChannel(tmp_path / "c", **CONFIG) as ch:
        send_keyed(ch, [(b"a", b"1"), (b"b", b"1")])
        send_keyed(ch, [(b"a", None)], timestamp=now_ms() - 1000)
        roll(ch)
        ch.compact()
        assert [(r.key, r.value) for r in read_all(ch)][:2] == [(b"b", b"1"), (b"a", None)]  # a fresh tombstone stays
        ch._log.config = ch.config = ch.config.__class__(**{**ch.config.as_dict(), "delete_retention_ms": 500})
        roll(ch)
        ch.compact()
        assert (b"a", None) not in [(r.key, r.value) for r in read_all(ch)]
        assert b"a" not in {r.key for r in read_all(ch)}  # and the value it deleted does not come back


def test_a_small_key_map_cleans_in_several_passes(tmp_path):
    small = dict(CONFIG, cleaner_dedupe_buffer_bytes=cleaner.KEY_ENTRY_BYTES * 40)
    with FileChannel(tmp_path / "c", **small) as ch:
        for part in range(4):  # 4 segments of 30 keys each, every key sent again in the next segment
            send_keyed(ch, [(b"k%d" % (i + part * 15), b"%d" % part) for i in range(30)])
            roll(ch)
        before = read_all(ch)
        passes = 0
        while cleaner.clean(ch._log, force=True):
            passes += 1
        assert passes >= 2
        assert read_all(ch) == compacted(ch, before)


def test_a_segment_with_more_keys_than_the_map_holds_is_refused_with_the_setting_to_raise(tmp_path):
    small = dict(CONFIG, cleaner_dedupe_buffer_bytes=cleaner.KEY_ENTRY_BYTES * 8)
    with FileChannel(tmp_path / "c", **small) as ch:
        send_keyed(ch, [(b"k%d" % i, b"v") for i in range(20)])
        roll(ch)
        with pytest.raises(ConfigError, match="cleaner_dedupe_buffer_bytes"):
            ch.compact()
        assert len(read_all(ch)) > 20  # nothing removed


def test_the_dirty_ratio_and_the_lags_decide_when_the_background_pass_cleans(tmp_path):
    with FileChannel(tmp_path / "c", **dict(CONFIG, min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=None)) as ch:
        send_keyed(ch, [(b"a", b"%d" % i) for i in range(50)])
        roll(ch)
        assert cleaner.clean(ch._log)  # everything dirty: ratio 1
        send_keyed(ch, [(b"a", b"x")])
        roll(ch)
        assert cleaner.clean(ch._log) == []  # mostly clean now, below 0.99
        ch._log.config = ch._log.config.__class__(**{**ch._log.config.as_dict(), "max_compaction_lag_ms": 0})
        assert cleaner.clean(ch._log)  # the dirty segment waited past max_compaction_lag_ms
        send_keyed(ch, [(b"a", b"y")])
        roll(ch)
        ch._log.config = ch._log.config.__class__(**{**ch._log.config.as_dict(), "min_compaction_lag_ms": DAY_MS})
        assert cleaner.clean(ch._log, force=True) == []  # its records are younger than the lag


def test_a_cleaned_segment_is_version_2_and_a_damaged_run_table_is_found(tmp_path):
    with FileChannel(tmp_path / "c", **CONFIG) as ch:
        send_keyed(ch, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2")])
        roll(ch)
        ch.compact()
        path = ch._log.local_segments()[0].path
        seg = CompressedSegment.open(path)
        info = seg.info
        seg.close()
        assert info.version == Z_VERSION_RUNS and info.base_offset == 0
        assert [(r.first_offset, r.count) for r in info.runs][:2] == [(1, 2), (10, 1)]  # b, a; a filler
        with open(path, "rb") as f:
            data = bytearray(f.read())
        data[60 + 40 + 8] ^= 0xFF  # a run's raw position
        with pytest.raises(CorruptRecordError, match="CRC-32C"):
            decode_table(bytes(data), path)


def test_compression_none_still_writes_cleaned_segments_and_raw_segments_are_swapped_out(tmp_path):
    with FileChannel(tmp_path / "c", **dict(CONFIG, compression="none")) as ch:
        send_keyed(ch, [(b"a", b"1"), (b"a", b"2")])
        roll(ch)
        assert ch.compress_sealed() == []
        ch.compact()
        names = sorted(os.listdir(ch.path))
        assert "00000000000000000000.seg.z" in names and "00000000000000000000.seg" not in names
        assert "00000000000000000000.idx" not in names
        assert read_all(ch)[0].value == b"2"


class CompactionMachine(RuleBasedStateMachine):
    """Keyed sends, tombstones (fresh, or past delete_retention_ms), rolls, compactions, compression
    and reopening, against a model: every key's last record is read unless it is an expired
    tombstone, every record read is the one sent at its offset, offsets increase, and a record
    once removed never comes back."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="fc-compact-sm-")
        self.ch = FileChannel(self.dir, **CONFIG)
        self.model: list[Record] = []
        self.removed: set[int] = set()

    def teardown(self) -> None:
        self.ch.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(key=st.sampled_from([b"a", b"b", b"c", b"d"]), value=st.binary(max_size=400), old=st.booleans())
    def send(self, key: bytes, value: bytes, old: bool) -> None:
        ts = now_ms() - (2 * DAY_MS if old else 0)
        with self.ch.sender() as s:
            off = s.send(value, key=key, timestamp=ts)
        assert off == len(self.model)
        self.model.append(Record(off, ts, key, value))

    @rule(key=st.sampled_from([b"a", b"b", b"c", b"d"]), old=st.booleans())
    def tombstone(self, key: bytes, old: bool) -> None:
        ts = now_ms() - (2 * DAY_MS if old else 0)
        with self.ch.sender() as s:
            off = s.send(None, key=key, timestamp=ts)
        self.model.append(Record(off, ts, key, None))

    @rule()
    def roll(self) -> None:
        self.model.extend(roll(self.ch))

    @rule()
    def compact(self) -> None:
        self.ch.compact()
        sealed_end = self.ch._log.local_segments()[-1].base_offset
        read = [r for r in read_all(self.ch) if r.offset < sealed_end]
        assert len({r.key for r in read}) == len(read)  # one record per key in the sealed segments

    @rule()
    def compress(self) -> None:
        self.ch.compress_sealed()

    @rule()
    def reopen(self) -> None:
        self.ch.close()
        self.ch = FileChannel(self.dir, **CONFIG)

    @invariant()
    def reads_match_the_model(self) -> None:
        read = read_all(self.ch)
        offsets = [r.offset for r in read]
        assert offsets == sorted(set(offsets))
        for r in read:
            want = self.model[r.offset]
            assert (r.key, r.value, r.timestamp) == (want.key, want.value, want.timestamp)
        present = set(offsets)
        assert not present & self.removed
        self.removed |= {o for o in range(len(self.model)) if o not in present}
        horizon = now_ms() - DAY_MS
        last = {r.key: r for r in self.model}
        for key, r in last.items():
            if r.value is not None or r.timestamp >= horizon:
                assert r.offset in present, (key, r)


TestCompactionMachine = CompactionMachine.TestCase
TestCompactionMachine.settings = settings(max_examples=20, stateful_step_count=20, deadline=None)


CHILD = textwrap.dedent(
    """
    import sys
    from filechannel import FileChannel
    ch = FileChannel(sys.argv[1], cleanup_policy="compact", segment_bytes=4096, maintenance_interval=0)
    ch.compact()
    """
)


@pytest.mark.crash
@pytest.mark.parametrize("point", ["cleaner-written", "cleaner-renamed"])
def test_sigkill_at_each_step_of_the_swap_leaves_the_old_or_the_new_segment(tmp_path, point):
    path = tmp_path / "c"
    with FileChannel(path, **CONFIG) as ch:
        for i in range(200):
            send_keyed(ch, [(b"k%d" % (i % 9), b"v%d" % i)])
        roll(ch)
        before = read_all(ch)
    points = tmp_path / "points"
    points.mkdir()
    (points / point).write_bytes(b"stop")  # the child stops itself there; we SIGKILL it
    env = {**os.environ, failpoints.ENV: str(points)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], env=env)
    _pid, status = os.waitpid(child.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), status
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    left = sorted(os.listdir(path))
    assert any(n.endswith(".tmp") for n in left) == (point == "cleaner-written")
    with FileChannel(path, **CONFIG) as ch:  # opening finishes or rolls back the swap
        names = sorted(os.listdir(ch.path))
        assert not any(n.endswith(".tmp") for n in names)
        bases = [n.split(".")[0] for n in names if ".seg" in n]
        assert len(bases) == len(set(bases))  # one file per segment: never both
        after = read_all(ch)
        assert set(compacted(ch, before)) <= set(after) <= set(before)  # no kept record lost, none resurrected
        if point == "cleaner-written":
            assert after == before  # the old segment
        else:
            assert len(after) < len(before)  # the new one
        assert ch.check() == len(after)
        ch.compact()
        assert read_all(ch) == compacted(ch, before)


STORM_CHILD = textwrap.dedent(
    """
    import sys
    from filechannel import FileChannel
    ch = FileChannel(sys.argv[1], cleanup_policy="compact", segment_bytes=4096, maintenance_interval=0)
    with ch.sender() as s:
        print("open", flush=True)
        while True:
            for _ in range(50):
                off = ch.end_offset
                assert s.send(b"%d" % off, key=b"k%d" % (off % 7)) == off
                s.flush()
            ch.compact()
    """
)


@pytest.mark.crash
def test_a_sigkill_storm_during_cleaning_loses_no_kept_record_and_resurrects_none(tmp_path):
    """A writer sending records whose value is their offset (key: offset mod 7) and compacting,
    killed at random moments; after each kill the next open recovers, and then every key's last
    record is there, every record is the one sent at its offset, and no offset once removed is back."""
    path = tmp_path / "c"
    rng = random.Random(39)
    removed: set[int] = set()
    for _ in range(8):
        child = subprocess.Popen([sys.executable, "-c", STORM_CHILD, str(path)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        try:
            assert child.stdout.readline() == "open\n"  # the kill's moment counts from here:
            time.sleep(rng.uniform(0.1, 1.0))  # an interpreter starting beside a busy suite may take longer than that
        finally:
            child.kill()
            child.wait()
            child.stdout.close()
        with FileChannel(path, **CONFIG) as ch:
            records = read_all(ch)
            end = ch.end_offset
            assert ch.check() == len(records)
        offsets = [r.offset for r in records]
        assert offsets == sorted(set(offsets)) and all(r.value == b"%d" % r.offset for r in records)
        present = set(offsets)
        assert not present & removed
        assert {o for o in range(max(0, end - 7), end)} <= present  # every key's last record
        removed |= set(range(end)) - present
    assert removed  # the kills came while segments were cleaned


@settings(max_examples=150, deadline=None)
@given(
    kept=st.lists(st.tuples(st.integers(0, 3), st.binary(max_size=300)), max_size=60),
    tail=st.integers(0, 5),
    block_bytes=st.sampled_from([1, 200, 1024, 1 << 20]),
    probes=st.lists(st.integers(0, 400), max_size=10),
)
def test_a_cleaned_segment_reads_back_every_kept_record_at_its_offset(tmp_path_factory, kept, tail, block_bytes, probes):
    """write_cleaned with any holes (gaps of 0-3 offsets before each record, and 0-5 after the
    last) and block size: the table decodes to what was written and passes its checks, every
    block's runs check, the records read back in order at their offsets, and a read of any
    offset starts on the run holding it, or past a hole at the next record kept."""
    base = 100
    frames, offset = [], base
    for gap, value in kept:
        offset += gap
        frames.append((offset, offset * 10, encode_frame(encode_payload(value, b"k", None, offset * 10))))
        offset += 1
    end = offset + tail
    header = SegmentHeader(7, base, 123)
    out = str(tmp_path_factory.mktemp("v2") / "seg.z")
    written = write_cleaned(out, header, end, frames, level=1, block_bytes=block_bytes)
    seg = CompressedSegment.open(out)
    try:
        info = seg.info
        assert info == written and info.version == Z_VERSION_RUNS and (info.base_offset, info.end_offset) == (base, end)
        records: list[Record] = []
        for i in range(len(info.blocks)):
            _got, bad = check_block(seg.read_block(i), info, i, out, records)
            assert bad is None
    finally:
        seg.close()
    assert [(r.offset, r.timestamp, r.value) for r in records] == [
        (o, ts, v) for (o, ts, _f), (_g, v) in zip(frames, kept, strict=True)
    ]
    offsets = {o for o, _ts, _f in frames}
    for probe in probes:
        target = base + probe
        first, _raw = info.start_for(target)
        if target in offsets:  # the start of its run: a dense read from there reaches it
            assert first <= target and set(range(first, target + 1)) <= offsets
        else:  # in a hole: the next record kept, or the end
            assert first == min((o for o in offsets if o > target), default=end)
