"""GroupSync, the accumulator behind durable Producer futures: what each future reports."""

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from filechannel import FileChannel
from filechannel.client.durable import GroupSync
from filechannel.engine.record import encode_payload
from filechannel.errors import MessageTooLargeError

LIMIT = 64  # max_record_bytes of the channel under test

records = st.lists(
    st.tuples(
        st.binary(max_size=80),  # over LIMIT - 9 (the record prefix) is refused
        st.one_of(st.none(), st.binary(max_size=4)),  # key
        st.sampled_from([1000, 1000, 1001]),  # timestamps: runs with one timestamp, and breaks
        st.booleans(),  # a flush marker after this record
    ),
    max_size=60,
)


@settings(max_examples=40, deadline=None)
@given(records)
def test_each_future_reports_its_own_record_in_send_order(recs):
    with tempfile.TemporaryDirectory() as d:
        ch = FileChannel(d + "/c", fsync="never", max_record_bytes=LIMIT, maintenance_interval=0)
        sync = GroupSync(ch.sender(), "t", 0)
        futures, markers = [], []
        for value, key, ts, mark in recs:
            futures.append((value, key, ts, sync.add(value, key, None, ts)))
            if mark:
                markers.append(sync.marker())
        sync.close()
        assert all(m.result(timeout=10) is None for m in markers)
        kept = []
        for value, key, ts, future in futures:
            if len(encode_payload(value, key, None, ts)) > LIMIT:
                assert isinstance(future.exception(timeout=10), MessageTooLargeError)
                continue
            meta = future.result()
            assert (meta.topic, meta.partition, meta.timestamp) == ("t", 0, ts)
            kept.append((meta.offset, value, key))
        assert [k[0] for k in kept] == list(range(len(kept)))  # dense offsets, in send order
        with ch.receiver() as rx:
            got = rx.recv_many(1000, timeout=1)
        assert [(r.offset, r.value, r.key) for r in got] == kept
        ch.close()
