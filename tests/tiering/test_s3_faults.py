"""The S3 binding under faults, against the real SeaweedFS: bodies cut mid-way, 503 answers, an endpoint
that stays down or is slow, bad credentials, a missing bucket, bad URLs, and the server killed and
restarted in the middle of a read. Faults are injected by a TCP proxy on 127.0.0.1 (see conftest)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from functools import partial

import pytest
from botocore.exceptions import ClientError

from filechannel.errors import (
    AccessDeniedError,
    ConfigError,
    ObjectNotFoundError,
    StorageFullError,
    StorageUnavailableError,
    TierError,
)
from filechannel.tiering import open_storage
from filechannel.tiering.s3_storage import S3Storage

MiB = 1 << 20


def s3(server, bucket: str, endpoint: str | None = None, **options: object) -> S3Storage:
    """A storage on ``bucket`` of ``server``, optionally through another endpoint (the proxy)."""
    storage = open_storage(f"s3://{bucket}/p", endpoint_url=endpoint or server.endpoint, **server.credentials(), **options)
    assert isinstance(storage, S3Storage)
    return storage


@pytest.mark.s3
def test_a_body_cut_mid_way_is_resumed_from_the_byte_reached(seaweed, bucket, fault_proxy, caplog) -> None:
    data = os.urandom(3 * MiB)
    with s3(seaweed, bucket) as direct:
        direct.write("obj", data)
    fault_proxy.reset_after(700_000, connections=2)  # two cuts, each mid-body
    caplog.set_level(logging.DEBUG, logger="filechannel")
    with s3(seaweed, bucket, fault_proxy.endpoint, max_attempts=3) as storage:
        assert storage.read("obj", 100, len(data) - 200) == data[100:-100]
    assert fault_proxy.resets_done == 2
    resumed = [r.getMessage() for r in caplog.records if "resuming" in r.getMessage()]
    assert len(resumed) == 2, resumed


@pytest.mark.s3
def test_an_object_replaced_during_a_resumed_read_is_never_stitched(seaweed, bucket, fault_proxy) -> None:
    old, new = os.urandom(3 * MiB), os.urandom(3 * MiB)
    with s3(seaweed, bucket) as direct:
        direct.write("obj", old)
        fault_proxy.hold_after(500_000, reset_on_release=True)
        with s3(seaweed, bucket, fault_proxy.endpoint, max_attempts=3) as storage:
            result: list[object] = []
            reader = threading.Thread(target=lambda: result.append(_outcome(storage.read, "obj", 0, len(old))))
            reader.start()
            try:
                assert fault_proxy.held.wait(30)
                direct.write("obj", new)  # replaced while the reader holds half of the old bytes
            finally:
                fault_proxy.release()
                reader.join(60)
    assert isinstance(result[0], TierError) and "replaced" in str(result[0]), result[0]


def _outcome(fn: Callable[..., object], *args: object) -> object:
    """``fn(*args)``, or the exception it raised (for calls made on another thread)."""
    try:
        return fn(*args)
    except Exception as exc:
        return exc


@pytest.mark.s3
def test_a_failed_multipart_upload_is_aborted(seaweed, bucket, fault_proxy) -> None:
    data = os.urandom(12 * MiB)
    fault_proxy.reset_requests_containing(b"partNumber=2")  # the second part never gets an answer
    options = {"multipart_threshold": 5 * MiB, "part_size": 5 * MiB, "max_concurrency": 1, "max_attempts": 2}
    with s3(seaweed, bucket, fault_proxy.endpoint, **options) as storage:
        with pytest.raises(StorageUnavailableError, match="'big'"):
            storage.write("big", data)
        assert fault_proxy.resets_done == 2  # botocore tried the part twice
        assert not storage.exists("big")
    client = seaweed.client()
    try:
        assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # aborted, nothing left
    finally:
        client.close()


@pytest.mark.s3
def test_503_answers_are_retried(seaweed, bucket, fault_proxy) -> None:
    data = os.urandom(100_000)
    fault_proxy.answer_503(2)
    with s3(seaweed, bucket, fault_proxy.endpoint, max_attempts=4) as storage:
        storage.write("obj", data)
    assert fault_proxy.answered_503 == 2
    fault_proxy.answer_503(1)  # faults meet new connections: a new client for the read
    with s3(seaweed, bucket, fault_proxy.endpoint, max_attempts=4) as storage:
        assert storage.read("obj", 10, 1000) == data[10:1010]
    assert fault_proxy.answered_503 == 3


@pytest.mark.s3
def test_503_that_never_ends_is_storage_unavailable(seaweed, bucket, fault_proxy) -> None:
    fault_proxy.answer_503(1000)
    with s3(seaweed, bucket, fault_proxy.endpoint, max_attempts=2) as storage, pytest.raises(StorageUnavailableError) as info:
        storage.read("obj", 0, 10)
    assert "'obj'" in str(info.value) and "retry later" in str(info.value)
    assert fault_proxy.answered_503 == 2  # botocore tried max_attempts times


@pytest.mark.s3
def test_an_endpoint_that_stays_down_is_storage_unavailable(seaweed, bucket, proxy_factory, unused_port) -> None:
    options = {"max_attempts": 2, "connect_timeout": 1, "read_timeout": 0.5}
    with s3(seaweed, bucket, f"http://127.0.0.1:{unused_port}", **options) as storage:  # connections refused
        for call in (partial(storage.read, "obj", 0, 10), partial(storage.exists, "obj"), storage.list):
            with pytest.raises(StorageUnavailableError) as info:
                call()
            assert storage.url in str(info.value) and "retry later" in str(info.value)
    resetting = proxy_factory(seaweed.s3_port)
    resetting.reset_after(0, connections=1000)  # accepts, then resets before any answer
    with s3(seaweed, bucket, resetting.endpoint, **options) as storage, pytest.raises(StorageUnavailableError):
        storage.info("obj")
    slow = proxy_factory(seaweed.s3_port)
    slow.delay(30)  # far past read_timeout
    with s3(seaweed, bucket, slow.endpoint, **options) as storage, pytest.raises(StorageUnavailableError):
        storage.info("obj")


def test_s3fs_on_an_endpoint_that_is_down_is_storage_unavailable(unused_port: int) -> None:
    storage = open_storage(
        "s3://bucket/p",
        backend="fsspec",
        endpoint_url=f"http://127.0.0.1:{unused_port}",
        key="k",
        secret="s3cr3t-value",
        client_kwargs={"region_name": "us-east-1"},
        config_kwargs={"retries": {"total_max_attempts": 1}, "connect_timeout": 1},
    )
    with storage:
        for call in (
            partial(storage.read, "x", 0, 1),
            partial(storage.write, "x", b"a"),
            storage.list,
            partial(storage.exists, "x"),
        ):
            with pytest.raises(StorageUnavailableError) as info:
                call()
            assert "retry later" in str(info.value) and "s3cr3t-value" not in str(info.value)
        assert "s3cr3t-value" not in repr(storage) and "s3cr3t-value" not in str(vars(storage))


@pytest.mark.s3
def test_bad_credentials_are_access_denied_and_never_shown(seaweed, bucket, caplog) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, botocore's included
    wrong_secret = "wrong-" + seaweed.secret_key[6:]
    attempts = [
        {"aws_access_key_id": seaweed.access_key, "aws_secret_access_key": wrong_secret},
        {"aws_access_key_id": "fcnosuchkey", "aws_secret_access_key": wrong_secret},
    ]
    # A client with the right keys made first and used after: clients share botocore's model files
    # (s3_storage._model_loader), never their credentials.
    with open_storage(f"s3://{bucket}/p", endpoint_url=seaweed.endpoint, max_attempts=1, **seaweed.credentials()) as good:
        good.write("kept", b"ok")
        for credentials in attempts:
            storage = open_storage(f"s3://{bucket}/p", endpoint_url=seaweed.endpoint, max_attempts=1, **credentials)
            with storage:
                for call in (partial(storage.read, "obj", 0, 1), partial(storage.write, "obj", b"x"), storage.list):
                    with pytest.raises(AccessDeniedError) as info:
                        call()
                    assert isinstance(info.value, PermissionError)
                    assert "check the credentials" in str(info.value) and bucket in str(info.value)
                    for shown in (str(info.value), str(info.value.__cause__), repr(storage), str(vars(storage))):
                        assert wrong_secret not in shown and seaweed.secret_key not in shown
        assert good.read("kept", 0, 2) == b"ok"
    assert caplog.records  # the client did log
    assert wrong_secret not in caplog.text and seaweed.secret_key not in caplog.text


@pytest.mark.s3
def test_a_missing_bucket_is_one_clear_error(seaweed) -> None:
    # No write here: SeaweedFS creates a bucket on a put by an admin identity (AWS answers NoSuchBucket,
    # which the read below meets and translates the same way).
    with s3(seaweed, "fc-no-such-bucket-here") as storage:
        for call in (
            lambda: storage.read("obj", 0, 1),
            lambda: storage.info("obj"),
            lambda: storage.exists("obj"),
            storage.list,
        ):
            with pytest.raises(TierError, match="bucket 'fc-no-such-bucket-here' does not exist") as info:
                call()
            assert not isinstance(info.value, ObjectNotFoundError)
            assert "'obj'" in str(info.value) or "list" in str(info.value)
        with pytest.raises(TierError, match="does not exist"):
            storage.delete("obj")  # a missing object is success, a missing bucket is not


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("EntityTooLarge", 400, StorageFullError),
        ("QuotaExceeded", 403, StorageFullError),
        ("InsufficientStorage", 507, StorageFullError),
        ("SlowDown", 503, StorageUnavailableError),
        ("InternalError", 500, StorageUnavailableError),
        ("ExpiredToken", 400, AccessDeniedError),
        ("NoSuchUpload", 404, ObjectNotFoundError),
        ("MalformedXML", 400, TierError),
    ],
)
def test_error_codes_a_test_server_cannot_produce_are_translated(code: str, status: int, expected: type) -> None:
    # What SeaweedFS answers is tested above; quotas and throttling it does not produce, so the table is
    # checked with the error botocore would raise (a ClientError is plain data, not a mock of the client).
    storage = open_storage("s3://bucket/p", endpoint_url="http://127.0.0.1:9", aws_access_key_id="k", aws_secret_access_key="s")
    with storage:
        response = {"Error": {"Code": code, "Message": "from the server"}, "ResponseMetadata": {"HTTPStatusCode": status}}
        # botocore's stubs want every ResponseMetadata key; what the storage translates reads only these.
        error = storage._translate_error(ClientError(response, "PutObject"), "write", "seg/1")  # type: ignore[arg-type]
    assert type(error) is expected
    assert "write 'seg/1'" in str(error) and "'p/seg/1'" in str(error) and code in str(error)


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("s3://", {}),
        ("s3://B_ad/prefix", {}),
        ("s3://ab/prefix", {}),
        ("s3://bucket/pre fix", {}),
        ("s3://bucket/p?versionId=1", {}),
        ("s3://AKIAXXX:TopSecret123@bucket/p", {}),
        ("s3://bucket/p", {"endpoint": "http://x"}),
        ("s3://bucket/p", {"part_size": MiB}),
        ("s3://bucket/p", {"max_attempts": 0}),
        ("s3://bucket/p", {"read_timeout": -1}),
        ("s3://bucket/p", {"backend": "boto"}),
        ("bucket/p", {}),
        ("file://relative/path", {}),
        ("file:///tmp/x", {"fsync": False}),
        ("nosuchprotocol://x/y", {}),
    ],
)
def test_a_bad_url_or_option_is_a_config_error(url: str, options: dict) -> None:
    with pytest.raises(ConfigError) as info:
        open_storage(url, **options)
    assert "TopSecret123" not in str(info.value)


@pytest.mark.s3
def test_the_server_killed_and_restarted_mid_read(private_seaweed, proxy_factory) -> None:
    server = private_seaweed
    bucket = server.new_bucket()
    # Larger than the socket buffers between the server and the proxy, so the kill cuts the body.
    data = os.urandom(32 * MiB)
    with s3(server, bucket) as direct:
        direct.write("obj", data)
    proxy = proxy_factory(server.s3_port)
    proxy.hold_after(1_000_000)
    with s3(server, bucket, proxy.endpoint, max_attempts=2, connect_timeout=2, read_timeout=10) as storage:
        result: list[object] = []
        reader = threading.Thread(target=lambda: result.append(_outcome(storage.read, "obj", 0, len(data))))
        reader.start()
        try:
            assert proxy.held.wait(30), "the read never reached the proxy's hold point"
            server.kill()  # mid-body: the server dies with the response half sent
            server.start()
            server.wait_until_serving(bucket, "p/obj")
        finally:
            proxy.release()  # the reader now meets the broken body and resumes against the new server
            reader.join(60)
        assert not reader.is_alive()
        assert result[0] == data, result[0] if isinstance(result[0], Exception) else "wrong bytes"
        assert proxy.connections >= 2  # it did reconnect

        server.kill()  # down: the read fails clearly...
        with pytest.raises(StorageUnavailableError):
            storage.read("obj", 0, 10)
        server.start()  # ...and the same read, retried after the restart, succeeds
        server.wait_until_serving(bucket, "p/obj")
        assert storage.read("obj", 5, 100) == data[5:105]
