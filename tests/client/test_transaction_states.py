"""Hypothesis state machine: a transactional producer against a model, through begin, sends to
two partitions, offsets, commits, aborts, calls out of order and a newer producer of its id.
The partitions hold exactly the records of the committed transactions, in order, and the
group's committed offset is the last committed transaction's."""

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from filechannel.client import Admin, Consumer, Producer, TopicPartition
from filechannel.errors import IllegalStateError, ProducerFencedError

TP = TopicPartition("src", 0)


class TransactionMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="fc-txn-sm-")
        Admin(self.root).create_topic("t", partitions=2)
        self.producer = Producer(self.root, transactional_id="sm")
        self.producer.init_transactions()
        self.open = False
        self.fenced = False
        self.pending: list[tuple[int, bytes]] = []
        self.pending_offset: int | None = None
        self.committed: list[list[bytes]] = [[], []]
        self.offset: int | None = None

    def teardown(self):
        self.producer.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def _expect(self, call, allowed):
        """Run ``call``; it must succeed iff ``allowed``, else raise the error the state calls for."""
        try:
            call()
        except ProducerFencedError:
            assert self.fenced
            return False
        except IllegalStateError:
            assert not allowed and not self.fenced
            return False
        assert allowed and not self.fenced
        return True

    @rule()
    def begin(self):
        if self._expect(self.producer.begin_transaction, not self.open):
            self.open = True

    @rule(partition=st.integers(0, 1), value=st.binary(max_size=20))
    def send(self, partition, value):
        if self._expect(lambda: self.producer.send("t", value, partition=partition), self.open):
            self.pending.append((partition, value))

    @rule(offset=st.integers(0, 1000))
    def send_offsets(self, offset):
        if self._expect(lambda: self.producer.send_offsets_to_transaction({TP: offset}, "g"), self.open):
            self.pending_offset = offset

    @rule()
    def commit(self):
        if self._expect(self.producer.commit_transaction, self.open):
            for partition, value in self.pending:
                self.committed[partition].append(value)
            if self.pending_offset is not None:
                self.offset = self.pending_offset
            self._closed()

    @rule()
    def abort(self):
        if self._expect(self.producer.abort_transaction, self.open):
            self._closed()

    @rule()
    def fence(self):
        """A newer producer of the id: this one is fenced; the newer one goes on in its place."""
        Producer(self.root, transactional_id="sm").init_transactions()
        if not self.fenced:
            self.fenced = True
            return
        self.producer.close()
        self.producer = Producer(self.root, transactional_id="sm")
        self.producer.init_transactions()
        self.fenced = False
        self._closed()

    def _closed(self):
        self.open = False
        self.pending = []
        self.pending_offset = None

    @invariant()
    def partitions_hold_the_committed_transactions(self):
        with Consumer("t", root=self.root, auto_offset_reset="earliest") as c:
            got: list[list[bytes]] = [[], []]
            while batch := c.poll(timeout_ms=0):
                for tp, records in batch.items():
                    got[tp.partition].extend(r.value for r in records)
        assert got == self.committed
        with Consumer(root=self.root, group_id="g", enable_auto_commit=False) as c:
            assert c.committed(TP) == self.offset


TransactionMachine.TestCase.settings = settings(stateful_step_count=15, deadline=None)
TestTransactionMachine = TransactionMachine.TestCase
