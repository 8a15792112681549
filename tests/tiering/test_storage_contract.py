"""One contract suite for every chunk storage binding: a local folder, S3 on SeaweedFS (boto3),
fsspec's local and memory filesystems, and s3fs on SeaweedFS (fsspec over a real network protocol)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import fsspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from filechannel.errors import (
    ConfigError,
    FileChannelError,
    InvalidNameError,
    ObjectNotFoundError,
    StorageFullError,
    TierError,
)
from filechannel.tiering import ChunkStorage, ObjectInfo, open_storage
from filechannel.tiering.s3_storage import MIN_PART, plan_concat
from filechannel.tiering.storage import redact_url

MiB = 1 << 20
REMOTE = {"s3", "s3fs"}
BINDINGS = [
    pytest.param("local", id="local"),
    pytest.param("s3", id="s3", marks=pytest.mark.s3),
    pytest.param("fsspec-local", id="fsspec-local"),
    pytest.param("fsspec-memory", id="fsspec-memory"),
    pytest.param("s3fs", id="s3fs", marks=pytest.mark.s3),
]

Factory = Callable[..., ChunkStorage]


@pytest.fixture(params=BINDINGS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_storage(kind: str, request: pytest.FixtureRequest, tmp_path) -> Iterator[Factory]:
    """Open storages of this binding on one fresh root (a folder, a bucket, a memory path); closed at the end.

    Options given are for the boto3 binding only (multipart sizes); the others take none.
    """
    opened: list[ChunkStorage] = []
    memory_root = f"/fc-{uuid.uuid4().hex}"

    def make(**s3_options: object) -> ChunkStorage:
        if kind == "local":
            storage = open_storage(f"file://{tmp_path}/objects")
        elif kind == "fsspec-local":
            storage = open_storage(f"file://{tmp_path}/objects", backend="fsspec")
        elif kind == "fsspec-memory":
            storage = open_storage(f"memory://{memory_root}")
        else:
            server = request.getfixturevalue("seaweed")
            bucket = request.getfixturevalue("bucket")
            if kind == "s3":
                storage = open_storage(
                    f"s3://{bucket}/chunks", endpoint_url=server.endpoint, **server.credentials(), **s3_options
                )
            else:
                storage = open_storage(
                    f"s3://{bucket}/chunks",
                    backend="fsspec",
                    endpoint_url=server.endpoint,
                    key=server.access_key,
                    secret=server.secret_key,
                    client_kwargs={"region_name": "us-east-1"},
                    config_kwargs={"s3": {"addressing_style": "path"}},
                )
        opened.append(storage)
        return storage

    yield make
    for storage in opened:
        storage.close()
    memory = fsspec.filesystem("memory")
    if memory.exists(memory_root):
        memory.rm(memory_root, recursive=True)


@pytest.fixture
def storage(make_storage: Factory) -> ChunkStorage:
    return make_storage()


def test_write_then_read_whole(storage: ChunkStorage) -> None:
    data = os.urandom(10_000)
    storage.write("t/0/00000000000000000000.E0000000001.chunk", data)
    assert storage.read("t/0/00000000000000000000.E0000000001.chunk", 0, len(data)) == data
    assert storage.info("t/0/00000000000000000000.E0000000001.chunk") == ObjectInfo(
        "t/0/00000000000000000000.E0000000001.chunk", len(data)
    )
    assert storage.exists("t/0/00000000000000000000.E0000000001.chunk")
    storage.write("from-view", memoryview(data)[100:200])  # any bytes-like object, written as its bytes
    assert storage.read("from-view", 0, 1000) == data[100:200]


def test_ranges_inside_across_and_past_the_end(storage: ChunkStorage) -> None:
    data = os.urandom(1000)
    storage.write("obj", data)
    assert storage.read("obj", 0, 1) == data[:1]
    assert storage.read("obj", 123, 456) == data[123:579]
    assert storage.read("obj", 999, 1) == data[999:]
    assert storage.read("obj", 900, 500) == data[900:]  # crosses the end: short
    assert storage.read("obj", 0, 10**12) == data  # far past the end: never allocated
    assert storage.read("obj", 1000, 10) == b""  # starts at the end
    assert storage.read("obj", 5000, 10) == b""  # starts past the end
    assert storage.read("obj", 10, 0) == b""
    assert storage.read("obj", 5000, 0) == b""


def test_empty_object(storage: ChunkStorage) -> None:
    storage.write("empty", b"")
    assert storage.exists("empty")
    assert storage.info("empty") == ObjectInfo("empty", 0)
    assert storage.read("empty", 0, 10) == b""
    assert storage.read("empty", 0, 0) == b""
    assert storage.list() == [ObjectInfo("empty", 0)]


def test_missing_object(storage: ChunkStorage) -> None:
    assert not storage.exists("no/such")
    for call in (lambda: storage.read("no/such", 0, 10), lambda: storage.read("no/such", 0, 0), lambda: storage.info("no/such")):
        with pytest.raises(ObjectNotFoundError) as info:
            call()
        assert "'no/such'" in str(info.value)
        assert storage.url in str(info.value)
        assert isinstance(info.value, TierError) and isinstance(info.value, FileNotFoundError)
    storage.delete("no/such")  # missing is success
    storage.write("here", b"x")
    storage.delete("here")
    storage.delete("here")
    assert not storage.exists("here")
    with pytest.raises(ObjectNotFoundError):
        storage.read("here", 0, 1)
    assert storage.list() == []


def test_list_with_prefixes(storage: ChunkStorage) -> None:
    names = ["t/1/a", "t/0/b", "t/0/a", "t/10/x", "u/a", "t0", "t/0/sub/deep=1"]
    for i, name in enumerate(names):
        storage.write(name, b"x" * i)
    every = sorted(names)
    assert storage.list() == [ObjectInfo(n, names.index(n)) for n in every]
    assert [o.name for o in storage.list("t/")] == ["t/0/a", "t/0/b", "t/0/sub/deep=1", "t/1/a", "t/10/x"]
    assert [o.name for o in storage.list("t/0/")] == ["t/0/a", "t/0/b", "t/0/sub/deep=1"]
    assert [o.name for o in storage.list("t/1")] == ["t/1/a", "t/10/x"]  # a string prefix, not a folder
    assert [o.name for o in storage.list("t")] == ["t/0/a", "t/0/b", "t/0/sub/deep=1", "t/1/a", "t/10/x", "t0"]
    assert [o.name for o in storage.list("t/0/a")] == ["t/0/a"]
    assert storage.list("nothing/") == []
    assert storage.list("t/2") == []


def test_overwrite_replaces_the_whole_object(storage: ChunkStorage) -> None:
    storage.write("obj", b"a" * 5000)
    storage.write("obj", b"b" * 10)
    assert storage.read("obj", 0, 10_000) == b"b" * 10
    assert storage.info("obj").length == 10
    assert storage.list() == [ObjectInfo("obj", 10)]


BAD_NAMES = ["", "/a", "a/", "a//b", "..", "../a", "a/../b", "a/./b", ".", "a b", "a\x00b", "é", "a~b", "a" * 1025, 5, None]


def test_invalid_arguments_are_refused_before_any_io(make_storage: Factory) -> None:
    storage = make_storage()
    storage.close()  # any I/O would now raise "closed": the checks below must come first
    for name in BAD_NAMES:
        for call in (
            partial(storage.write, name, b"x"),
            partial(storage.read, name, 0, 1),
            partial(storage.info, name),
            partial(storage.exists, name),
            partial(storage.delete, name),
            partial(storage.concat, name, ["ok"]),
            partial(storage.concat, "ok", ["ok", name]),
        ):
            with pytest.raises(InvalidNameError) as info:
                call()
            assert repr(name) in str(info.value)
    for prefix in ["/", "/a", "a//", "../", 3]:
        with pytest.raises(InvalidNameError):
            storage.list(prefix)
    for offset, length in [(-1, 1), (0, -1), (1.5, 1), (0, None), (True, 1)]:
        with pytest.raises(ConfigError):
            storage.read("ok", offset, length)
    with pytest.raises(ConfigError):
        storage.write("ok", "text")
    with pytest.raises(ConfigError):
        storage.concat("ok", [])
    with pytest.raises(TierError, match="closed"):
        storage.read("ok", 0, 1)


def test_concat_per_capability(storage: ChunkStorage, kind: str) -> None:
    if not storage.supports_concat:
        assert kind == "fsspec-memory" or kind == "s3fs"
        with pytest.raises(TierError, match="supports_concat"):
            storage.concat("target", ["a"])
        return
    # On S3: a copied part (6 MiB), then small pieces merged and topped up from the next source into a
    # 5 MiB uploaded part, then the rest as the last part.
    sources = {"c/big1": os.urandom(6 * MiB), "c/small1": os.urandom(100_000), "c/small2": b"", "c/small3": b"tiny"}
    sources["c/big2"] = os.urandom(6 * MiB)
    for name, data in sources.items():
        storage.write(name, data)
    order = ["c/big1", "c/small1", "c/small2", "c/small3", "c/big2"]
    storage.concat("c/all", order)
    whole = b"".join(sources[n] for n in order)
    assert storage.info("c/all").length == len(whole)
    assert storage.read("c/all", 0, len(whole)) == whole
    assert all(storage.read(n, 0, len(d) + 1) == d for n, d in sources.items())  # the sources stay
    storage.concat("c/small-only", ["c/small1", "c/small3", "c/small1"])
    assert storage.read("c/small-only", 0, 10**9) == sources["c/small1"] + b"tiny" + sources["c/small1"]
    with pytest.raises(ObjectNotFoundError, match="'c/missing'"):
        storage.concat("c/never", ["c/small1", "c/missing"])
    assert not storage.exists("c/never")


def test_append_and_truncate_per_capability(storage: ChunkStorage) -> None:
    storage.write("obj", b"abc")
    if storage.supports_append:
        storage.append("obj", b"def")
        storage.append("obj", memoryview(b"ghi"))
        assert storage.read("obj", 0, 100) == b"abcdefghi"
        with pytest.raises(ObjectNotFoundError):
            storage.append("missing", b"x")
    else:
        with pytest.raises(TierError, match="supports_append"):
            storage.append("obj", b"def")
    if storage.supports_truncate:
        storage.truncate("obj", 2)
        assert storage.read("obj", 0, 100) == b"ab"
        storage.truncate("obj", 0)
        assert storage.info("obj").length == 0
        with pytest.raises(ConfigError):
            storage.truncate("obj", 1)  # never extends
        with pytest.raises(ObjectNotFoundError):
            storage.truncate("missing", 0)
    else:
        with pytest.raises(TierError, match="supports_truncate"):
            storage.truncate("obj", 1)


def test_large_object(make_storage: Factory, kind: str, request: pytest.FixtureRequest) -> None:
    storage = make_storage(multipart_threshold=5 * MiB, part_size=5 * MiB) if kind == "s3" else make_storage()
    data = os.urandom(12 * MiB + 3)
    storage.write("big", data)
    assert storage.info("big").length == len(data)
    assert storage.read("big", 0, len(data)) == data
    assert storage.read("big", 5 * MiB - 10, 20) == data[5 * MiB - 10 : 5 * MiB + 10]  # across a part boundary
    if kind == "s3":  # it went through multipart upload: S3's ETag of a 3-part upload ends in "-3"
        client = request.getfixturevalue("seaweed").client()
        try:
            etag = client.head_object(Bucket=request.getfixturevalue("bucket"), Key="chunks/big")["ETag"]
        finally:
            client.close()
        assert etag.strip('"').endswith("-3")


def test_random_ranged_reads_match_the_written_bytes(storage: ChunkStorage, kind: str) -> None:
    @settings(max_examples=8 if kind in REMOTE else 40, deadline=None)
    @given(data=st.binary(max_size=3000), ranges=st.lists(st.tuples(st.integers(0, 3500), st.integers(0, 3500)), max_size=6))
    def check(data: bytes, ranges: list[tuple[int, int]]) -> None:
        storage.write("h/obj", data)
        for offset, length in ranges:
            assert storage.read("h/obj", offset, length) == data[offset : offset + length]

    check()


def test_one_storage_shared_by_threads(storage: ChunkStorage) -> None:
    payloads = {f"th/{t}/{i}": os.urandom(1000 + 97 * i + t) for t in range(4) for i in range(6)}

    def work(thread: int) -> None:
        mine = {n: d for n, d in payloads.items() if n.startswith(f"th/{thread}/")}
        for name, data in mine.items():
            storage.write(name, data)
        for name, data in mine.items():
            assert storage.read(name, 10, len(data)) == data[10:]

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))  # re-raises a thread's failure here
    assert storage.list("th/") == [ObjectInfo(n, len(payloads[n])) for n in sorted(payloads)]


def test_operations_are_logged_at_debug_without_the_data(storage: ChunkStorage, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="filechannel")
    storage.write("log/obj", b"payload-bytes")
    storage.read("log/obj", 0, 7)
    with pytest.raises(ObjectNotFoundError):
        storage.info("log/missing")
    lines = [r.getMessage() for r in caplog.records if r.name == "filechannel"]
    assert any(line.startswith(f"tier write {storage.url} 'log/obj' (13 bytes)") for line in lines), lines
    assert any(line.startswith(f"tier read {storage.url} 'log/obj' (7 bytes)") for line in lines), lines
    assert any(line.startswith(f"tier info {storage.url} 'log/missing' failed") for line in lines), lines
    assert "payload-bytes" not in caplog.text


def test_urls_are_shown_without_credentials() -> None:
    assert redact_url("ftp://user:pw@host:21/path") == "ftp://host:21/path"
    assert redact_url("abfs://container/path?sas=token") == "abfs://container/path?..."
    assert redact_url("s3://bucket/prefix") == "s3://bucket/prefix"
    storage = open_storage("memory://user:pw@fc-redact/p")
    with storage:
        assert "pw" not in repr(storage) and "pw" not in storage.url


# -- binding-specific behaviour ------------------------------------------------------------------------


@given(sizes=st.lists(st.integers(0, 40), max_size=12), min_part=st.integers(1, 12))
@example(sizes=[31, 1], min_part=2)  # a ceil-sized step left a 1-byte copied part before the last
def test_concat_plan_keeps_s3_part_rules(sizes: list[int], min_part: int) -> None:
    parts = plan_concat(sizes, min_part=min_part, max_part=3 * min_part)
    pieces = [p for part in parts for p in part.pieces]
    covered = [(i, b) for p in pieces for i, b in ((p.source, b) for b in range(p.start, p.end))]
    assert covered == [(i, b) for i, size in enumerate(sizes) for b in range(size)]  # every byte once, in order
    assert all(min_part <= part.length <= 3 * min_part for part in parts[:-1])
    assert all(len(part.pieces) == 1 and sizes[part.pieces[0].source] >= min_part for part in parts if part.copy)
    assert all(part.length <= min_part for part in parts if not part.copy)  # a data part never holds more


def test_concat_plan_copies_big_sources_and_merges_small_ones() -> None:
    parts = plan_concat([6 * MiB, 100, 0, 4, 6 * MiB])
    assert [(p.copy, p.length) for p in parts] == [(True, 6 * MiB), (False, MIN_PART), (False, 6 * MiB + 104 - MIN_PART)]


def test_local_listing_skips_temporary_and_foreign_files(make_storage: Factory, kind: str, tmp_path) -> None:
    if kind not in ("local", "fsspec-local"):
        return
    storage = make_storage()
    storage.write("d/obj", b"x")
    (tmp_path / "objects" / "d" / "obj~0123.tmp").write_bytes(b"partial")  # what a crash mid-write leaves
    (tmp_path / "objects" / "d" / "not a name").write_bytes(b"foreign")
    assert storage.list() == [ObjectInfo("d/obj", 1)]
    with pytest.raises(TierError, match=r"share a name|folder") as info:
        storage.write("d", b"x")  # a folder of objects has that name
    assert isinstance(info.value, FileChannelError)
    assert sorted(os.listdir(tmp_path / "objects")) == ["d"]  # no temporary file left behind


_FULL_CHILD = """
import resource, signal, sys
from filechannel.tiering import open_storage
from filechannel.errors import StorageFullError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
storage = open_storage(sys.argv[1])
try:
    storage.write("big/obj", b"x" * 5000)
except StorageFullError as exc:
    print("StorageFullError", exc)
"""


def test_local_write_past_the_size_limit_is_storage_full(tmp_path) -> None:
    # EFBIG from RLIMIT_FSIZE takes the path of a full disk (ENOSPC), in a real second process.
    out = subprocess.run([sys.executable, "-c", _FULL_CHILD, f"file://{tmp_path}/objects"], capture_output=True, timeout=60)
    text = out.stdout.decode()
    assert text.startswith("StorageFullError"), text + out.stderr.decode()
    assert "'big/obj'" in text and "free some space" in text
    assert os.listdir(tmp_path / "objects" / "big") == []  # the temporary file was removed
    assert issubclass(StorageFullError, TierError)


_DENIED_CHILD = """
import os, sys
from filechannel.tiering import open_storage
from filechannel.errors import AccessDeniedError
storage = open_storage(sys.argv[1])
if os.getuid() == 0:
    os.setuid(65534)  # nobody: the folder is root's, mode 0700
else:
    os.chmod(sys.argv[1].removeprefix("file://"), 0)  # an ordinary user locks the folder from itself
for call in (lambda: storage.read("obj", 0, 1), lambda: storage.exists("obj"), storage.list):
    try:
        call()
    except AccessDeniedError as exc:
        print("AccessDeniedError", exc)
"""


def test_local_permission_denied_is_access_denied(tmp_path) -> None:
    root = tmp_path / "objects"
    open_storage(f"file://{root}").write("obj", b"x")
    os.chmod(root, 0o700)
    try:
        out = subprocess.run([sys.executable, "-c", _DENIED_CHILD, f"file://{root}"], capture_output=True, timeout=60)
    finally:
        os.chmod(root, 0o700)
    lines = out.stdout.decode().splitlines()
    assert len(lines) == 3 and all(line.startswith("AccessDeniedError") for line in lines), [*lines, out.stderr.decode()]
    assert "'obj'" in lines[0] and "'obj'" in lines[1] and "permissions" in lines[2]
