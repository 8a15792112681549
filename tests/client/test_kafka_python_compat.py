"""kafka-python's producer and consumer surface, as a user coming from it writes it.

Each test ports what kafka-python documents (its README, docstrings and the brokerless
tests of its own suite: test_partitioner.py, test_consumer.py, kafka/future.py's
semantics) with one change: ``root=`` instead of ``bootstrap_servers``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filechannel import ConfigError
from filechannel.client import (
    Admin,
    Consumer,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    Producer,
    RangePartitionAssignor,
    RecordMetadata,
    RoundRobinPartitionAssignor,
    TopicPartition,
)
from filechannel.client.futures import RecordFuture
from filechannel.client.partitioner import murmur2
from filechannel.client.records import KAFKA_PYTHON_RECORDS
from filechannel.engine import record
from filechannel.errors import CommitFailedError, FileChannelError, MessageTooLargeError, NoOffsetForPartitionError, Timeout

TP0 = TopicPartition("t", 0)

# kafka-python 2.2's KafkaProducer.DEFAULT_CONFIG, with its default values (kafka_client,
# selector and partitioner are classes there; any value is accepted for ignored names).
KAFKA_PYTHON_PRODUCER_CONFIG: dict[str, Any] = {
    "bootstrap_servers": "localhost",
    "client_id": None,
    "key_serializer": None,
    "value_serializer": None,
    "enable_idempotence": False,
    "transactional_id": None,
    "transaction_timeout_ms": 60000,
    "delivery_timeout_ms": 120000,
    "acks": 1,
    "bootstrap_topics_filter": set(),
    "compression_type": None,
    "retries": float("inf"),
    "batch_size": 16384,
    "linger_ms": 0,
    "partitioner": None,
    "connections_max_idle_ms": 9 * 60 * 1000,
    "max_block_ms": 60000,
    "max_request_size": 1048576,
    "allow_auto_create_topics": True,
    "metadata_max_age_ms": 300000,
    "retry_backoff_ms": 100,
    "request_timeout_ms": 30000,
    "receive_buffer_bytes": None,
    "send_buffer_bytes": None,
    "socket_options": [(6, 1, 1)],
    "sock_chunk_bytes": 4096,
    "sock_chunk_buffer_count": 1000,
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 30000,
    "max_in_flight_requests_per_connection": 5,
    "security_protocol": "PLAINTEXT",
    "ssl_context": None,
    "ssl_check_hostname": True,
    "ssl_cafile": None,
    "ssl_certfile": None,
    "ssl_keyfile": None,
    "ssl_crlfile": None,
    "ssl_password": None,
    "ssl_ciphers": None,
    "api_version": None,
    "api_version_auto_timeout_ms": 2000,
    "metric_reporters": [],
    "metrics_enabled": True,
    "metrics_num_samples": 2,
    "metrics_sample_window_ms": 30000,
    "selector": object,
    "sasl_mechanism": None,
    "sasl_plain_username": None,
    "sasl_plain_password": None,
    "sasl_kerberos_name": None,
    "sasl_kerberos_service_name": "kafka",
    "sasl_kerberos_domain_name": None,
    "sasl_oauth_token_provider": None,
    "socks5_proxy": None,
    "kafka_client": object,
}

# kafka-python 2.2's KafkaConsumer.DEFAULT_CONFIG (heartbeat below our session timeout, as there).
KAFKA_PYTHON_CONSUMER_CONFIG: dict[str, Any] = {
    "bootstrap_servers": "localhost",
    "client_id": "kafka-python-2.2.15",
    "group_id": None,
    "key_deserializer": None,
    "value_deserializer": None,
    "enable_incremental_fetch_sessions": True,
    "fetch_max_wait_ms": 500,
    "fetch_min_bytes": 1,
    "fetch_max_bytes": 52428800,
    "max_partition_fetch_bytes": 1 * 1024 * 1024,
    "request_timeout_ms": 305000,
    "retry_backoff_ms": 100,
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 30000,
    "max_in_flight_requests_per_connection": 5,
    "auto_offset_reset": "latest",
    "enable_auto_commit": True,
    "auto_commit_interval_ms": 5000,
    "default_offset_commit_callback": lambda offsets, response: True,
    "check_crcs": True,
    "isolation_level": "read_uncommitted",
    "allow_auto_create_topics": True,
    "metadata_max_age_ms": 5 * 60 * 1000,
    "partition_assignment_strategy": (RangePartitionAssignor, RoundRobinPartitionAssignor),
    "max_poll_records": 500,
    "max_poll_interval_ms": 300000,
    "session_timeout_ms": 10000,
    "heartbeat_interval_ms": 3000,
    "receive_buffer_bytes": None,
    "send_buffer_bytes": None,
    "socket_options": [(6, 1, 1)],
    "sock_chunk_bytes": 4096,
    "sock_chunk_buffer_count": 1000,
    "consumer_timeout_ms": float("inf"),
    "security_protocol": "PLAINTEXT",
    "ssl_context": None,
    "ssl_check_hostname": True,
    "ssl_cafile": None,
    "ssl_certfile": None,
    "ssl_keyfile": None,
    "ssl_crlfile": None,
    "ssl_password": None,
    "ssl_ciphers": None,
    "api_version": None,
    "api_version_auto_timeout_ms": 2000,
    "connections_max_idle_ms": 9 * 60 * 1000,
    "metric_reporters": [],
    "metrics_enabled": True,
    "metrics_num_samples": 2,
    "metrics_sample_window_ms": 30000,
    "metric_group_prefix": "consumer",
    "selector": object,
    "exclude_internal_topics": True,
    "sasl_mechanism": None,
    "sasl_plain_username": None,
    "sasl_plain_password": None,
    "sasl_kerberos_name": None,
    "sasl_kerberos_service_name": "kafka",
    "sasl_kerberos_domain_name": None,
    "sasl_oauth_token_provider": None,
    "socks5_proxy": None,
    "kafka_client": object,
}


@pytest.fixture
def root(tmp_path):
    Admin(tmp_path).create_topic("t", 2)
    with Producer(tmp_path) as p:
        for i in range(5):
            p.send("t", b"v%d" % i, partition=0, timestamp_ms=1000 + i)
    return tmp_path


def _poll_until(consumer: Consumer, count: int, deadline_s: float = 10.0) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + deadline_s
    while len(got) < count and time.monotonic() < deadline:
        got += [r for recs in consumer.poll(timeout_ms=100).values() for r in recs]
    return got


# -- configuration names ----------------------------------------------------------------------


def test_every_kafka_python_producer_setting_is_accepted(tmp_path):
    with Producer(tmp_path, **KAFKA_PYTHON_PRODUCER_CONFIG) as p:
        meta = p.send("new", b"x").get(timeout=10)
    assert (meta.topic, meta.offset) == ("new", 0)


def test_every_kafka_python_consumer_setting_is_accepted(root):
    with Consumer("t", root=root, **{**KAFKA_PYTHON_CONSUMER_CONFIG, "auto_offset_reset": "earliest"}) as c:
        assert len(_poll_until(c, 5)) == 5


def test_a_name_kafka_python_does_not_know_is_a_config_error_naming_the_closest(tmp_path):
    with pytest.raises(ConfigError, match="no setting 'lingr_ms'; did you mean 'linger_ms'"):
        Producer(tmp_path, lingr_ms=5)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="no setting 'sesion_timeout_ms'; did you mean 'session_timeout_ms'"):
        Consumer(root=tmp_path, sesion_timeout_ms=5)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"acks": 2}, "acks"),
        ({"compression_type": "brotli"}, "compression_type"),
        ({"max_request_size": 0}, "max_request_size"),
        ({"transactional_id": "tx-1", "transaction_timeout_ms": 0}, "transaction_timeout_ms"),
    ],
)
def test_producer_settings_with_a_meaning_are_checked(tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Producer(tmp_path, **kwargs)


def test_consumer_isolation_level_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="isolation_level"):
        Consumer(root=tmp_path, isolation_level="read_everything")


def test_acks_all_makes_each_future_complete_after_an_fsync(tmp_path, monkeypatch):
    Admin(tmp_path).create_topic("t", fsync="never")
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    with Producer(tmp_path, acks=1) as p:
        p.send("t", b"a").get(timeout=10)
        assert synced == []  # acks=1 keeps the topic's policy: never
        p.send("t", b"b", timestamp_ms=0)
    with Producer(tmp_path, acks="all") as p:
        before = len(synced)
        meta = p.send("t", b"c").get(timeout=10)
        assert len(synced) > before and meta.offset == 2


def test_compression_type_sets_the_compression_of_a_topic_the_producer_creates(tmp_path):
    with Producer(tmp_path, compression_type="gzip") as p:
        p.send("zipped", b"x")
    with Producer(tmp_path, compression_type=None) as p:
        p.send("plain", b"x")
    admin = Admin(tmp_path)
    assert admin.describe_topic("zipped").config["compression"] == "zstd"
    assert admin.describe_topic("plain").config["compression"] == "none"


def test_max_request_size_refuses_larger_records_in_their_future(tmp_path):
    with Producer(tmp_path, max_request_size=100) as p:
        assert p.send("t", b"x" * 50).get(timeout=10).offset == 0
        big = p.send("t", b"x" * 200)  # kafka-python: a future failed with MessageSizeTooLargeError
        assert big.failed() and isinstance(big.exception(), MessageTooLargeError)
        with pytest.raises(MessageTooLargeError):
            big.get()


def test_allow_auto_create_topics_false_refuses_a_missing_topic(tmp_path):
    from filechannel.errors import UnknownTopicError

    with Producer(tmp_path, allow_auto_create_topics=False) as p, pytest.raises(UnknownTopicError):
        p.send("missing", b"x")


# -- the producer's futures and RecordMetadata --------------------------------------------------


@pytest.mark.parametrize("fsync", ["never", "always"])
def test_send_future_is_kafka_pythons_future_record_metadata(tmp_path, fsync):
    Admin(tmp_path).create_topic("t", fsync=fsync)
    calls: list[tuple] = []
    with Producer(tmp_path) as p:
        future = p.send("t", b"abc", key=b"k", headers=[("h\u00e9", b"vv")])
        chained = future.add_callback(lambda tag, meta: calls.append((tag, meta.offset)), "ok").add_errback(
            lambda tag, exc: calls.append((tag, exc)), "err"
        )
        assert chained is future
        meta = future.get(timeout=10)
        p.flush()
    assert future.is_done and future.succeeded() and not future.failed()
    assert future.value == meta and future.exception() is None
    assert calls == [("ok", 0)]
    assert isinstance(future, concurrent.futures.Future)
    assert isinstance(meta, RecordMetadata)
    assert meta.topic_partition == TopicPartition("t", 0) == (meta.topic, meta.partition)
    assert (meta.offset, meta.checksum) == (0, None)
    # serialized sizes as kafka-python counts them: UTF-8 header names plus values
    assert (meta.serialized_key_size, meta.serialized_value_size, meta.serialized_header_size) == (1, 3, 3 + 2)


@pytest.mark.parametrize("fsync", ["never", "always"])
def test_a_record_without_key_or_headers_has_sizes_minus_one(tmp_path, fsync):
    Admin(tmp_path).create_topic("t", fsync=fsync)
    with Producer(tmp_path) as p:
        metas = [p.send("t", b"xy", timestamp_ms=7) for _ in range(3)]
        p.flush()
        got = [f.get(timeout=10) for f in metas]
    assert [(m.serialized_key_size, m.serialized_value_size, m.serialized_header_size) for m in got] == [(-1, 2, -1)] * 3


@pytest.mark.parametrize("fsync", ["never", "always"])
def test_a_too_large_record_fails_its_future_and_calls_the_errback(tmp_path, fsync):
    Admin(tmp_path).create_topic("t", fsync=fsync, max_record_bytes=1024)
    errors: list[BaseException] = []
    with Producer(tmp_path) as p:
        future = p.send("t", b"x" * 2000).add_errback(errors.append)
        p.flush()
        with pytest.raises(MessageTooLargeError, match="1024"):
            future.get(timeout=10)
    assert future.failed() and not future.succeeded() and future.value is None
    assert len(errors) == 1 and isinstance(errors[0], MessageTooLargeError)


def test_a_record_of_the_wrong_type_raises_from_send_as_kafka_python(tmp_path):
    from filechannel.errors import RecordTypeError

    with Producer(tmp_path) as p, pytest.raises(RecordTypeError, match="value_serializer"):
        p.send("t", "not bytes")


def test_get_times_out_with_a_timeout_error():
    future = RecordFuture[RecordMetadata](threading.Condition())
    with pytest.raises(Timeout) as info:
        future.get(timeout=0.01)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, FileChannelError)
    assert not future.is_done and not future.succeeded() and not future.failed()


def test_record_futures_still_work_with_concurrent_futures_and_asyncio(tmp_path):
    Admin(tmp_path).create_topic("t", fsync="always")
    with Producer(tmp_path) as p:
        futures = [p.send("t", b"%d" % i) for i in range(20)]
        done, not_done = concurrent.futures.wait(futures, timeout=10)
        assert len(done) == 20 and not not_done
        meta = asyncio.run(_wrapped(p.send("t", b"last")))
    assert meta.offset == 20


async def _wrapped(future: concurrent.futures.Future) -> RecordMetadata:
    return await asyncio.wrap_future(future)


def test_partitioner_with_kafka_python_2_signature(tmp_path):
    Admin(tmp_path).create_topic("t", 4)
    seen: list[tuple] = []

    def last_available(key_bytes, all_partitions, available_partitions):
        seen.append((key_bytes, list(all_partitions), list(available_partitions)))
        return available_partitions[-1]

    class KafkaStyle:  # kafka-python's DefaultPartitioner is a callable class of this shape
        def __call__(self, key, all_partitions, available):
            idx = murmur2(key) & 0x7FFFFFFF
            return all_partitions[idx % len(all_partitions)]

    with Producer(tmp_path, partitioner=last_available) as p:
        assert p.send("t", b"x", key=b"k").get(timeout=10).partition == 3
    assert seen == [(b"k", [0, 1, 2, 3], [0, 1, 2, 3])]
    with Producer(tmp_path, partitioner=KafkaStyle()) as p, Producer(tmp_path) as default:
        for key in (b"", b"a", b"abc", b"123456789"):
            assert p.send("t", b"x", key=key).get().partition == default.send("t", b"x", key=key).get().partition


def test_partitions_for_metrics_and_close_timeout(tmp_path):
    Admin(tmp_path).create_topic("t", 3)
    p = Producer(tmp_path)
    assert p.partitions_for("t") == {0, 1, 2}
    p.send("t", b"x")
    metrics = p.metrics()
    assert isinstance(metrics, dict) and metrics["producer-metrics"]["record-send-total"] == 1.0
    p.close(timeout=5)
    p.close(timeout=5)


# -- ConsumerRecord ------------------------------------------------------------------------------


def test_consumer_record_has_every_kafka_python_field(tmp_path):
    with Producer(tmp_path) as p:
        p.send("t", b"abc", key=b"key", headers=[("n\u00e9", b"v")], timestamp_ms=42)
        p.send("t", b"", timestamp_ms=43)
    deserializers: list[dict[str, Any]] = [{}, {"value_deserializer": bytes.decode, "key_deserializer": bytes.decode}]
    for kwargs in deserializers:
        with Consumer("t", root=tmp_path, auto_offset_reset="earliest", **kwargs) as c:
            first, second = _poll_until(c, 2)
        assert first.topic == "t" and first.partition == 0 and first.offset == 0 and first.timestamp == 42
        assert (first.timestamp_type, first.leader_epoch, first.checksum) == (0, -1, None)
        assert (first.serialized_key_size, first.serialized_value_size, first.serialized_header_size) == (3, 3, 3 + 1)
        assert first.headers == [("n\u00e9", b"v")] and type(first.headers) is list  # kafka-python: a list
        assert second.headers == [] and type(second.headers) is list
        assert (second.serialized_key_size, second.serialized_value_size, second.serialized_header_size) == (-1, 0, -1)
    assert first.key == "key" and first.value == "abc"  # deserialized; the sizes are of the stored bytes


# kafka-python's kafka/consumer/fetcher.py: namedtuple("ConsumerRecord", [...]), in this order.
KAFKA_PYTHON_CONSUMER_RECORD_FIELDS = (
    "topic", "partition", "leader_epoch", "offset", "timestamp", "timestamp_type",
    "key", "value", "headers", "checksum", "serialized_key_size", "serialized_value_size", "serialized_header_size",
)  # fmt: skip


def test_consumer_record_is_kafka_pythons_namedtuple_positionally(tmp_path):
    assert ConsumerRecord._fields == KAFKA_PYTHON_CONSUMER_RECORD_FIELDS
    # Built as kafka-python's fetcher builds it, read as its users read it (by index and by unpacking).
    built = ConsumerRecord("t", 0, -1, 5, 42, 0, b"k", b"v", [("h", b"1")], None, 1, 1, 2)
    assert (built.offset, built.leader_epoch, built[3], built[8]) == (5, -1, 5, [("h", b"1")])
    with Producer(tmp_path) as p:
        p.send("t", b"v", key=b"k", headers=[("h", b"1")], timestamp_ms=42)
    with Consumer("t", root=tmp_path, auto_offset_reset="earliest") as c:
        (got,) = _poll_until(c, 1)
    topic, partition, leader_epoch, offset, timestamp, timestamp_type, key, value, headers, *rest = got
    assert (topic, partition, leader_epoch, offset, timestamp, timestamp_type) == ("t", 0, -1, 0, 42, 0)
    assert (key, value, headers, rest) == (b"k", b"v", [("h", b"1")], [None, 1, 1, 2])
    assert got == built._replace(offset=0)


def test_records_without_headers_get_a_new_list_each_and_stay_out_of_the_cycle_collector(tmp_path):
    # kafka-python gives [] (a new list per record); here it is left untracked, as the record
    # is (a tracked list per record made every record tracked: a poll loop ran 3 times slower).
    with Producer(tmp_path) as p:
        for i in range(3):
            p.send("t", b"v%d" % i)
    with Consumer("t", root=tmp_path, auto_offset_reset="earliest") as c:
        got = _poll_until(c, 3)
    assert [r.headers for r in got] == [[], [], []]
    assert len({id(r.headers) for r in got}) == 3
    if record._codec is not None:
        assert not any(gc.is_tracked(r) or gc.is_tracked(r.headers) for r in got)
    got[0].headers.append(("added", b"1"))  # a user's list to change, as kafka-python's
    assert got[1].headers == []


records_as_decoded = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=2**63 - 1),
        st.integers(min_value=0, max_value=2**63 - 1),
        st.none() | st.binary(max_size=8),
        st.binary(max_size=8),
        st.just(()) | st.lists(st.tuples(st.text(max_size=4), st.binary(max_size=4)), min_size=1, max_size=3),
    ),
    max_size=5,
)


@pytest.mark.skipif(record._codec is None, reason="the C extension is not built")
@settings(max_examples=60)
@given(records_as_decoded)
def test_c_and_python_consumer_records_agree(records):
    assert record._codec is not None
    shape = KAFKA_PYTHON_RECORDS
    template = ("t", 1, *shape.template[2:])
    c = record._codec.shaped(ConsumerRecord, template, records, shape.slots, shape.size_slots, list)
    assert c == record.shaped_py(ConsumerRecord, template, records, shape.slots, shape.size_slots, list)
    assert all(type(r) is ConsumerRecord and len(r) == len(ConsumerRecord._fields) for r in c)
    assert all(type(r.headers) is list for r in c)
    if len(c) > 1:  # a new list per record, never one shared (kafka-python's are the user's to change)
        assert c[0].headers is not c[1].headers


# -- commits with metadata ---------------------------------------------------------------------


def test_offset_and_metadata_three_and_two_field_forms_and_committed_metadata(root):
    assert OffsetAndMetadata(5, "m", 7) == (5, "m", 7) and OffsetAndMetadata(5, "m").leader_epoch == -1
    with Consumer(root=root, group_id="g", enable_auto_commit=False) as c:
        c.assign([TP0, TopicPartition("t", 1)])
        c.commit({TP0: OffsetAndMetadata(3, "checkpoint-a", -1), TopicPartition("t", 1): OffsetAndMetadata(0, "b")})
        assert c.committed(TP0) == 3
        assert c.committed(TP0, metadata=True) == OffsetAndMetadata(3, "checkpoint-a", -1)
        committed = c.committed(TopicPartition("t", 1), metadata=True)
        assert committed is not None and committed.metadata == "b"
    with Consumer(root=root, group_id="g", enable_auto_commit=False) as again:  # stored with the offsets, not in memory
        again.assign([TP0])
        assert again.committed(TP0, metadata=True) == OffsetAndMetadata(3, "checkpoint-a", -1)
        assert again.position(TP0) == 3
        again.commit({TP0: 4})  # a commit without metadata clears it, as Kafka's
        assert again.committed(TP0, metadata=True) == OffsetAndMetadata(4, "", -1)
        committed = again.committed(TopicPartition("t", 1), metadata=True)
        assert committed is not None and committed.metadata == "b"
    with Consumer(root=root) as no_group:
        assert no_group.committed(TP0, metadata=True) is None


def test_commit_metadata_must_be_text(root):
    with Consumer(root=root, group_id="g") as c:
        c.assign([TP0])
        with pytest.raises(ConfigError, match="metadata must be a str"):
            c.commit({TP0: OffsetAndMetadata(1, b"bytes")})  # type: ignore[arg-type]
        assert c.committed(TP0) is None


def test_commit_async_calls_back_with_offsets_and_response(root):
    calls: list[tuple] = []
    default_calls: list[tuple] = []
    with Consumer(root=root, group_id="g", default_offset_commit_callback=lambda o, r: default_calls.append((o, r))) as c:
        c.assign([TP0])
        future = c.commit_async({TP0: 2}, callback=lambda offsets, response: calls.append((offsets, response)))
        assert future.done() and future.exception() is None
        assert calls == [({TP0: OffsetAndMetadata(2, "", -1)}, None)]
        c.seek(TP0, 4)
        c.commit_async()
        assert default_calls == [({TP0: OffsetAndMetadata(4, "", -1)}, None)]
        assert c.committed(TP0) == 4
    with Consumer("t", root=root, group_id="g2", enable_auto_commit=False) as member:
        failed = member.commit_async({TopicPartition("t", 9): 1}, callback=lambda o, r: calls.append((o, r)))
        assert isinstance(failed.exception(), CommitFailedError)
        assert isinstance(calls[-1][1], CommitFailedError)


# -- iteration, the missing methods, timeout_ms -----------------------------------------------------


def test_next_and_iteration_end_with_consumer_timeout_ms_and_start_again(root):
    with Consumer("t", root=root, auto_offset_reset="earliest", consumer_timeout_ms=200) as c:
        assert next(c).value == b"v0"
        assert [r.value for r in c] == [b"v1", b"v2", b"v3", b"v4"]  # ends after 200 ms without a record
        with pytest.raises(StopIteration):
            next(c)
        with Producer(root) as p:
            p.send("t", b"later", partition=1)
        assert next(c).value == b"later"
        assert c.position(TP0) == 5


def test_next_waits_without_consumer_timeout(root):
    with Consumer(root=root) as c:
        c.assign([TP0])
        c.seek_to_end()
        sent = threading.Event()

        def produce() -> None:
            with Producer(root) as p:
                p.send("t", b"awaited", partition=0)
            sent.set()

        thread = threading.Thread(target=produce)
        thread.start()
        try:
            assert next(c).value == b"awaited"
        finally:
            thread.join()
        assert sent.is_set()


def test_topics_partitions_highwater_subscription_unsubscribe_metrics(root):
    Admin(root).create_topic("other", 3)
    with Consumer(root=root, auto_offset_reset="earliest") as c:
        assert c.subscription() is None
        assert c.topics() == {"t", "other"}
        assert c.partitions_for_topic("other") == {0, 1, 2} and c.partitions_for_topic("missing") is None
        c.subscribe(["t"])
        assert c.subscription() == {"t"}
        assert c.highwater(TP0) == 5 and c.highwater(TopicPartition("t", 1)) == 0
        metrics = c.metrics()
        assert metrics["consumer-fetch-manager-metrics"]["records-lag-max"] == 5.0
        c.unsubscribe()
        assert c.subscription() is None and c.assignment() == set()
        c.assign([TP0])  # after unsubscribe, assign is allowed
        assert c.assignment() == {TP0}


def test_timeout_ms_is_accepted_where_kafka_python_takes_it(root):
    with Consumer(root=root, group_id="g", auto_offset_reset="earliest") as c:
        c.assign([TP0])
        assert c.position(TP0, timeout_ms=1000) == 0
        assert c.beginning_offsets([TP0], timeout_ms=1000) == {TP0: 0}
        assert c.end_offsets([TP0], timeout_ms=1000) == {TP0: 5}
        assert c.offsets_for_times({TP0: 1002}, timeout_ms=1000) == {TP0: OffsetAndTimestamp(2, 1002)}
        c.commit({TP0: 1}, timeout_ms=1000)
        assert c.committed(TP0, timeout_ms=1000) == 1
        with pytest.raises(ConfigError, match="timeout_ms"):
            c.position(TP0, timeout_ms=-1)
        c.close(timeout_ms=1000)


def test_poll_without_updating_offsets_returns_the_same_records_again(root):
    with Consumer(root=root, auto_offset_reset="earliest") as c:
        c.assign([TP0])
        peeked = c.poll(timeout_ms=1000, update_offsets=False)
        assert [r.offset for r in peeked[TP0]] == [0, 1, 2, 3, 4] and c.position(TP0) == 0
        assert c.poll(timeout_ms=1000) == peeked
        assert c.position(TP0) == 5


def test_offsets_for_times_with_a_negative_timestamp_is_a_value_error(root):
    with Consumer(root=root) as c, pytest.raises(ValueError, match="timestamp"):
        c.offsets_for_times({TP0: -5})


# -- patterns and topics created later -------------------------------------------------------------


class Listener:
    def __init__(self) -> None:
        self.assigned: list[set[TopicPartition]] = []
        self.revoked: list[set[TopicPartition]] = []

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.revoked.append(set(revoked))

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.assigned.append(set(assigned))


def test_subscribe_pattern_matches_at_the_start_as_re_match(tmp_path):
    for name in ("logs", "logs-a", "mylogs", "logs.b"):
        Admin(tmp_path).create_topic(name)
    with Consumer(root=tmp_path) as c:
        c.subscribe(pattern="logs")
        assert c.subscription() == {"logs", "logs-a", "logs.b"}


@pytest.mark.parametrize("group_id", [None, "g"])
def test_a_topic_created_later_that_matches_is_read_and_the_listener_told(tmp_path, group_id):
    Admin(tmp_path).create_topic("logs-a")
    listener = Listener()
    with Consumer(root=tmp_path, group_id=group_id, auto_offset_reset="earliest", metadata_max_age_ms=50) as c:
        c.subscribe(pattern=r"logs-", listener=listener)
        _poll_until(c, 0)
        assert c.assignment() == {TopicPartition("logs-a", 0)}
        Admin(tmp_path).create_topic("logs-b", 2)
        Admin(tmp_path).create_topic("other")
        with Producer(tmp_path) as p:
            p.send("logs-b", b"new", partition=1)
            p.send("other", b"not for us")
        got = _poll_until(c, 1)
        assert [(r.topic, r.partition, r.value) for r in got] == [("logs-b", 1, b"new")]
        assert c.assignment() == {TopicPartition("logs-a", 0), TopicPartition("logs-b", 0), TopicPartition("logs-b", 1)}
        assert {TopicPartition("logs-b", 0), TopicPartition("logs-b", 1)} <= set().union(*listener.assigned)


# -- positions past the end ------------------------------------------------------------------------


@pytest.mark.parametrize("reset, expected", [("earliest", [0, 1, 2, 3, 4, 5]), ("latest", [5])])
def test_a_position_past_the_end_is_reset_by_auto_offset_reset(root, reset, expected):
    with Consumer(root=root, auto_offset_reset=reset) as c:
        c.assign([TP0])
        c.seek(TP0, 1000)
        assert c.poll(timeout_ms=0) == {}  # Kafka's fetch answers "out of range" and the position resets
        with Producer(root) as p:
            p.send("t", b"v5", partition=0)
        got = _poll_until(c, len(expected))
        assert [r.offset for r in got] == expected


def test_a_position_past_the_end_with_reset_none_raises(root):
    with Consumer(root=root, auto_offset_reset="none") as c:
        c.assign([TP0])
        c.seek(TP0, 1000)
        with pytest.raises(NoOffsetForPartitionError):
            c.poll(timeout_ms=0)
        c.seek(TP0, 4)
        assert [r.offset for r in c.poll(timeout_ms=0)[TP0]] == [4]


def test_a_committed_offset_past_the_end_is_reset_by_auto_offset_reset(root):
    with Consumer(root=root, group_id="g", enable_auto_commit=False) as c:
        c.assign([TP0])
        c.commit({TP0: 5})
    # What a log that lost its tail leaves: the committed offset is beyond the partition's end.
    (root / ".groups" / "g" / "offsets.json").write_text('{"t/0": 100}')
    with Consumer(root=root, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.assign([TP0])
        assert c.committed(TP0) == 100
        assert c.position(TP0) == 0
        assert [r.offset for r in _poll_until(c, 5)] == [0, 1, 2, 3, 4]


# -- tombstones ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fsync", ["never", "always"])
def test_a_tombstone_is_read_back_with_value_none_distinct_from_empty(tmp_path, fsync):
    Admin(tmp_path).create_topic("t", fsync=fsync)
    with Producer(tmp_path) as p:
        tomb = p.send("t", value=None, key=b"user-1").get(timeout=10)
        empty = p.send("t", value=b"", key=b"user-2").get(timeout=10)
        p.send("t", value=None, headers=[("h", b"1")]).get(timeout=10)
        p.flush()
    assert (tomb.serialized_value_size, empty.serialized_value_size) == (-1, 0)
    deserializers: list[dict[str, Any]] = [{}, {"value_deserializer": bytes.decode}]
    for kwargs in deserializers:
        with Consumer("t", root=tmp_path, auto_offset_reset="earliest", **kwargs) as c:  # a fresh open: read from the files
            got = _poll_until(c, 3)
        assert [(r.key, r.value) for r in got[:2]] == [(b"user-1", None), (b"user-2", b"" if not kwargs else "")]
        assert got[2].value is None and list(got[2].headers) == [("h", b"1")]
        assert [r.serialized_value_size for r in got] == [-1, 0, -1]


def test_a_tombstone_with_bytes_after_its_fields_is_corrupt():
    from filechannel.errors import CorruptRecordError

    payload = record.encode_payload(None, b"k", None, 5)
    assert record.decode_payload(payload, 7) == (7, 5, b"k", None, ())
    with pytest.raises(CorruptRecordError, match=r"offset 7.*no value, yet 2 bytes follow"):
        record.decode_payload(payload + b"xx", 7)
