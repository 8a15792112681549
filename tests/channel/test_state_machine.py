"""Hypothesis state machine: the channel against a list, through sends, flushes, rolls,
compression, garbage collection, reopening, receiving, seeking and acking."""

import shutil
import tempfile
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from filechannel import FileChannel, OffsetOutOfRangeError, Record

CONFIG: dict[str, Any] = dict(segment_bytes=4096, maintenance_interval=0, index_interval_bytes=256, compression_block_bytes=1024)
values = st.binary(max_size=300)
keys = st.none() | st.binary(max_size=8)
hdrs = st.none() | st.lists(st.tuples(st.sampled_from(["a", "b", "ü"]), st.binary(max_size=8)), max_size=2)


class ChannelMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="fc-sm-")
        self.ch = FileChannel(self.dir, **CONFIG)
        self.sender = self.ch.sender()
        self.model: list[Record] = []
        self.rx = self.ch.receiver()
        self.ack = self.ch.ack_receiver("sm")
        self.acked = 0
        self.first = 0

    def teardown(self):
        self.ch.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(value=values, key=keys, headers=hdrs, ts=st.integers(0, 2**40))
    def send(self, value, key, headers, ts):
        off = self.sender.send(value, key=key, headers=headers, timestamp=ts)
        assert off == len(self.model)
        self.model.append(Record(off, ts, key, value, headers or ()))

    @rule(batch=st.lists(values, max_size=40), ts=st.integers(0, 2**40))
    def send_many(self, batch, ts):
        base = len(self.model)
        assert self.sender.send_many(batch, timestamp=ts) == range(base, base + len(batch))
        self.model.extend(Record(base + i, ts, None, v) for i, v in enumerate(batch))

    @rule()
    def flush(self):
        self.sender.flush()

    @rule(n=st.integers(1, 300))
    def receive(self, n):
        self.sender.flush()
        pos = self.rx.position
        got = self.rx.recv_many(n, timeout=0)
        assert got == self.model[pos : pos + n]

    @rule(data=st.data())
    def seek(self, data):
        off = data.draw(st.integers(self.first, len(self.model) + 3))
        self.rx.seek(off)
        assert self.rx.position == off

    @rule(n=st.integers(1, 200))
    def ack_some(self, n):
        self.sender.flush()
        pos = self.ack.position
        got = self.ack.recv_many(n, timeout=0)
        assert got == self.model[pos : pos + n]
        if got:
            self.ack.ack(self.ack.position - self.acked)
            self.acked = self.ack.position

    @rule()
    def compress(self):
        self.sender.flush()
        self.ch.compress_sealed()

    @rule()
    def collect(self):
        self.sender.flush()
        self.ch.collect_garbage()
        first = self.ch.first_offset
        assert self.first <= first <= self.acked
        self.first = first
        if self.rx.position < first:
            self.rx.seek(first)

    @rule()
    def reopen(self):
        self.ch.close()
        self.ch = FileChannel(self.dir, **CONFIG)
        self.sender = self.ch.sender()
        self.rx = self.ch.receiver(max(self.first, 0))
        self.ack = self.ch.ack_receiver("sm")
        assert self.ack.position == self.acked

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def time_lookup(self, data):
        self.sender.flush()
        ts = data.draw(st.integers(0, 2**40))
        expected = next((r.offset for r in self.model[self.first :] if r.timestamp >= ts), None)
        assert self.ch.offset_for_time(ts) == expected

    @invariant()
    def everything_retained_reads_back(self):
        self.sender.flush()
        assert self.ch.end_offset == len(self.model)
        rx = self.ch.receiver(self.first)
        got = []
        while batch := rx.recv_many(1000, timeout=0):
            got.extend(batch)
        rx.close()
        assert got == self.model[self.first :]

    @precondition(lambda self: self.first > 0)
    @rule()
    def below_first_is_out_of_range(self):
        try:
            self.ch.receiver(self.first - 1)
        except OffsetOutOfRangeError:
            return
        raise AssertionError("reading below the first offset did not raise")


ChannelMachine.TestCase.settings = settings(stateful_step_count=30, deadline=None)
TestChannelMachine = ChannelMachine.TestCase
