"""One contract suite for every chunk storage binding: a local folder, S3 on SeaweedFS (boto3),
fsspec's local and memory filesystems, s3fs on SeaweedFS, and a real HDFS (Hadoop 2.7.3) through
hdfs-native and WebHDFS: fsspec over real network protocols."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

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
    StorageUnavailableError,
    TierError,
)
from filechannel.tiering import ChunkStorage, ObjectInfo, open_storage
from filechannel.tiering.fsspec_storage import FsspecStorage
from filechannel.tiering.s3_storage import MIN_PART, plan_concat
from filechannel.tiering.storage import redact_url

MiB = 1 << 20
REMOTE = {"s3", "s3fs", "hdfs", "webhdfs"}
BINDINGS = [
    pytest.param("local", id="local"),
    pytest.param("s3", id="s3", marks=pytest.mark.s3),
    pytest.param("fsspec-local", id="fsspec-local"),
    pytest.param("fsspec-memory", id="fsspec-memory"),
    pytest.param("s3fs", id="s3fs", marks=pytest.mark.s3),
    pytest.param("hdfs", id="hdfs", marks=pytest.mark.hdfs),
    pytest.param("webhdfs", id="webhdfs", marks=pytest.mark.hdfs),
]

Factory = Callable[..., ChunkStorage]


@pytest.fixture(params=BINDINGS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_storage(kind: str, request: pytest.FixtureRequest, tmp_path) -> Iterator[Factory]:
    """Open storages of this binding on one fresh root (a folder, a bucket, a memory or HDFS path); closed at the end.

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
        elif kind in ("hdfs", "webhdfs"):
            storage = open_storage(f"{request.getfixturevalue(kind + '_url')}{memory_root}")
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


ATOMIC_CREATE = {
    "local": True,
    "s3": True,
    "fsspec-local": True,
    "fsspec-memory": False,
    "s3fs": True,
    "hdfs": True,
    "webhdfs": False,
}


def test_create_new_creates_then_refuses(storage: ChunkStorage, kind: str) -> None:
    assert storage.atomic_create is ATOMIC_CREATE[kind]  # the fallback (check then write) says so
    data = os.urandom(300_000)
    assert storage.create_new("claims/owner", data) is True
    assert storage.read("claims/owner", 0, len(data) + 1) == data  # whole
    assert storage.info("claims/owner").length == len(data)
    assert storage.create_new("claims/owner", b"someone else") is False
    assert storage.read("claims/owner", 0, len(data) + 1) == data  # unchanged
    storage.write("claims/written", b"by write")
    assert storage.create_new("claims/written", b"x") is False  # whoever made it
    assert storage.read("claims/written", 0, 100) == b"by write"
    assert storage.create_new("claims/empty", b"") is True and storage.create_new("claims/empty", b"x") is False
    assert storage.read("claims/empty", 0, 10) == b""
    storage.delete("claims/owner")
    assert storage.create_new("claims/owner", memoryview(b"again")[1:]) is True  # free again after a delete
    assert storage.read("claims/owner", 0, 100) == b"gain"


def test_create_new_racing_threads_have_one_winner(make_storage: Factory) -> None:
    """8 threads, each with its own storage (its own client or file handles), race on one name per round."""
    storages = [make_storage() for _ in range(8)]
    for round_ in range(3):
        name = f"race/epoch-{round_}"
        barrier = threading.Barrier(len(storages))

        def claim(index: int, name: str = name, barrier: threading.Barrier = barrier) -> bool:
            barrier.wait(timeout=60)
            return storages[index].create_new(name, f"thread {index} ".encode() * 1000)

        with ThreadPoolExecutor(len(storages)) as pool:
            results = list(pool.map(claim, range(len(storages))))
        assert results.count(True) == 1, results
        winner = results.index(True)
        expected = f"thread {winner} ".encode() * 1000
        assert storages[0].read(name, 0, 10**6) == expected  # the winner's bytes, whole
    assert [o.name for o in storages[0].list("race/")] == ["race/epoch-0", "race/epoch-1", "race/epoch-2"]


def test_modified_ms_is_reported(storage: ChunkStorage) -> None:
    before = time.time()
    storage.write("m/written", b"x" * 100)
    assert storage.create_new("m/created", b"y")
    after = time.time()
    infos = [storage.info("m/written"), storage.info("m/created"), *storage.list("m/")]
    for info in infos:
        assert info.modified_ms is not None, info  # every binding here reports it
        assert isinstance(info.modified_ms, int)
        # S3 says whole seconds (rounded down): a few seconds of slack either side.
        assert before * 1000 - 3000 <= info.modified_ms <= after * 1000 + 3000, (info, before, after)
    assert ObjectInfo("m/created", 1, 5) == ObjectInfo("m/created", 1)  # not part of equality


def test_listing_after_create_new_is_sorted_and_skips_temporary_files(storage: ChunkStorage, kind: str, tmp_path) -> None:
    names = ["n/b", "n/a/2", "n/c", "n/a/1", "n/a=0"]
    for name in names:
        assert storage.create_new(name, name.encode())
    assert not storage.create_new("n/c", b"refused")
    assert storage.list("n/") == [ObjectInfo(n, len(n)) for n in sorted(names)]
    assert [o.name for o in storage.list()] == sorted(names)
    if kind in ("local", "fsspec-local"):  # no temporary file is left beside the objects
        left = [f for _, _, files in os.walk(tmp_path / "objects") for f in files]
        assert sorted(left) == ["1", "2", "a=0", "b", "c"]
    if kind == "hdfs":  # nor in HDFS, where they are renamed into place too
        assert isinstance(storage, FsspecStorage)
        left = [p.rpartition("/")[2] for p in storage._fs.find(storage._root)]
        assert sorted(left) == ["1", "2", "a=0", "b", "c"]


BAD_NAMES: list[Any] = [
    "",
    "/a",
    "a/",
    "a//b",
    "..",
    "../a",
    "a/../b",
    "a/./b",
    ".",
    "a b",
    "a\x00b",
    "é",
    "a~b",
    "a" * 1025,
    5,
    None,
]


def test_invalid_arguments_are_refused_before_any_io(make_storage: Factory) -> None:
    storage = make_storage()
    storage.close()  # any I/O would now raise "closed": the checks below must come first
    for name in BAD_NAMES:
        for call in (
            partial(storage.write, name, b"x"),
            partial(storage.create_new, name, b"x"),
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
            storage.list(prefix)  # type: ignore[arg-type]
    for offset, length in [(-1, 1), (0, -1), (1.5, 1), (0, None), (True, 1)]:
        with pytest.raises(ConfigError):
            storage.read("ok", offset, length)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        storage.write("ok", "text")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        storage.create_new("ok", "text")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        storage.concat("ok", [])
    with pytest.raises(TierError, match="closed"):
        storage.read("ok", 0, 1)


def test_concat_per_capability(storage: ChunkStorage, kind: str) -> None:
    if not storage.supports_concat:
        assert kind in ("fsspec-memory", "s3fs", "webhdfs")
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
    assert storage.create_new("log/new", b"payload-bytes") and not storage.create_new("log/new", b"payload-bytes")
    lines = [r.getMessage() for r in caplog.records if r.name == "filechannel"]
    assert any(line.startswith(f"tier create_new {storage.url} 'log/new' (13 bytes): created in") for line in lines), lines
    assert any(line.startswith(f"tier create_new {storage.url} 'log/new' (13 bytes): exists, nothing written") for line in lines)
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


_CREATE_CHILD = """
import sys
from filechannel.tiering import open_storage
url, backend, who = sys.argv[1], sys.argv[2], sys.argv[3]
storage = open_storage(url, backend="fsspec") if backend == "fsspec" else open_storage(url)
print("ready", flush=True)
sys.stdin.readline()  # every child is ready: go
for round_ in range(3):
    print(round_, storage.create_new(f"race/epoch-{round_}", f"{who} ".encode() * 10_000), flush=True)
"""


@pytest.mark.parametrize("backend", ["local", "fsspec"])
def test_local_create_new_racing_processes_have_one_winner(tmp_path, backend: str) -> None:
    url = f"file://{tmp_path}/objects"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CREATE_CHILD, url, backend, f"child-{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stderr is not None
            assert child.stdout.readline() == "ready\n", child.stderr.read()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [child.communicate(timeout=60) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert all(child.returncode == 0 for child in children), [err for _, err in outputs]
    results = [dict(line.split() for line in out.splitlines()) for out, _ in outputs]
    storage = open_storage(url)
    for round_ in range(3):
        won = [i for i, r in enumerate(results) if r[str(round_)] == "True"]
        assert len(won) == 1, results
        assert storage.read(f"race/epoch-{round_}", 0, 10**6) == f"child-{won[0]} ".encode() * 10_000
    left = [f for _, _, files in os.walk(tmp_path / "objects") for f in files]
    assert sorted(left) == ["epoch-0", "epoch-1", "epoch-2"]  # no temporary file left behind


def test_local_create_new_on_a_folder_name_is_refused(make_storage: Factory, kind: str) -> None:
    if kind not in ("local", "fsspec-local"):
        return  # S3 (and fsspec's memory filesystem) let an object and a "folder" share a name
    storage = make_storage()
    storage.write("d/obj", b"x")
    with pytest.raises(TierError, match=r"share a name|folder"):
        storage.create_new("d", b"x")  # a folder of objects has that name: an error, not "exists"
    with pytest.raises(TierError, match=r"share a name|folder|exists"):
        storage.create_new("d/obj/below", b"x")  # an object is in the way of the folder
    assert storage.list() == [ObjectInfo("d/obj", 1)]


def _s3_error(code: str, status: int) -> Exception:
    import botocore.exceptions

    # botocore's stubs want every ResponseMetadata key; what the storage translates reads only these.
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},  # type: ignore[typeddict-item]
        "PutObject",
    )


def test_s3_create_new_maps_412_and_retries_409() -> None:
    """No server: botocore's Stubber answers, for the answers SeaweedFS does not give (409 is AWS's)."""
    from botocore.stub import Stubber

    storage = open_storage(
        "s3://fc-stub/p", endpoint_url="http://127.0.0.1:9", aws_access_key_id="k", aws_secret_access_key="s", max_attempts=3
    )
    with storage, Stubber(storage._client) as stub:  # type: ignore[attr-defined]
        wanted = {"Bucket": "fc-stub", "Key": "p/claim", "Body": b"me", "IfNoneMatch": "*"}
        stub.add_client_error("put_object", "ConditionalRequestConflict", http_status_code=409, expected_params=wanted)
        stub.add_response("put_object", {}, wanted)
        assert storage.create_new("claim", b"me") is True  # the 409 was tried again
        stub.add_client_error("put_object", "PreconditionFailed", http_status_code=412, expected_params=wanted)
        assert storage.create_new("claim", b"me") is False
        for _ in range(3):
            stub.add_client_error("put_object", "ConditionalRequestConflict", http_status_code=409)
        with pytest.raises(StorageUnavailableError, match=r"'claim'.*conflicting"):
            storage.create_new("claim", b"me")  # still conflicting after max_attempts tries
        stub.assert_no_pending_responses()


def test_s3fs_create_new_maps_412_and_retries_409(monkeypatch) -> None:
    """s3fs raises FileExistsError for a 412 naming its condition (AWS), an OSError caused by it otherwise (SeaweedFS)."""
    storage = open_storage("s3://fc-stub/p", backend="fsspec", key="k", secret="s", endpoint_url="http://127.0.0.1:9")
    assert storage.atomic_create is True
    calls: list[dict[str, object]] = []
    answers: list[Exception | None] = []

    def pipe_file(path: str, value: bytes, **kwargs: object) -> None:
        calls.append({"path": path, **kwargs})
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    def caused_by(exc: Exception) -> OSError:
        err = OSError(5, str(exc))
        err.__cause__ = exc
        return err

    monkeypatch.setattr(storage._fs, "pipe_file", pipe_file)  # type: ignore[attr-defined]
    with storage:
        answers[:] = [caused_by(_s3_error("ConditionalRequestConflict", 409)), None]
        assert storage.create_new("claim", b"me") is True
        assert calls == [{"path": "fc-stub/p/claim", "mode": "create"}] * 2
        answers[:] = [FileExistsError("claim")]
        assert storage.create_new("claim", b"me") is False
        answers[:] = [caused_by(_s3_error("PreconditionFailed", 412))]
        assert storage.create_new("claim", b"me") is False
        answers[:] = [caused_by(_s3_error("ConditionalRequestConflict", 409)) for _ in range(5)]
        with pytest.raises(StorageUnavailableError, match=r"'claim'.*conflicting"):
            storage.create_new("claim", b"me")  # still conflicting after 5 tries
        assert answers == []
        answers[:] = [caused_by(_s3_error("AccessDenied", 403))]
        with pytest.raises(TierError, match="'claim'"):
            storage.create_new("claim", b"me")
