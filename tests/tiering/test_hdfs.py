"""Tier-2 on a real HDFS (Hadoop 2.7.3's NameNode and DataNode, tests/tiering/hdfs_cluster.py) through
``hdfs://`` (hdfs-native) and ``webhdfs://`` (fsspec's REST client): a topic's whole round trip, and
hdfs-native's panics translated into our errors. The chunk storage contract runs on both too
(test_storage_contract.py, bindings ``hdfs`` and ``webhdfs``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from filechannel.errors import TierError
from filechannel.root import ROOT_METADATA
from filechannel.tiering import open_storage
from filechannel.tiering.daemon import TieringDaemon
from filechannel.tiering.metadata import TierMetadata

from ..cli_helpers import fc_text as fc
from .test_rebuild import read_all
from .tier_helpers import local_bases, make_topic, produce, segment_objects

pytestmark = pytest.mark.hdfs


@pytest.mark.parametrize("client", ["hdfs", "webhdfs"])
def test_topic_round_trip_over_hdfs(client: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Upload, local retention, a consumer across both tiers, fsck --deep and a rebuild of a lost root, all on HDFS."""
    root, new_root = tmp_path / "root", tmp_path / "new"
    url = f"{request.getfixturevalue(client + '_url')}/fc-{uuid.uuid4().hex}"
    make_topic(root, url, local_retention_bytes=0)
    sent = [b"%06d-" % i + os.urandom(90) for i in range(300)]
    produce(root, sent)
    before = local_bases(root)
    assert len(before) > 3
    with TieringDaemon(root) as daemon:
        report = daemon.run(once=True)
    assert report.failures == []
    assert report.uploaded == len(before) - 1  # every sealed segment
    assert local_bases(root) == [before[-1]]  # the local copies of the uploaded ones are gone
    with TierMetadata(root / ROOT_METADATA) as metadata, open_storage(url) as storage:
        assert [r.base_offset for r in metadata.segments("t/0")] == before[:-1]
        assert segment_objects(storage, "t/0/")  # the chunks are in HDFS, under the topic's folder

    assert read_all(root, "t", 0) == list(enumerate(sent))  # every record once, in order, from HDFS then the local tail

    deep = fc("tier", "fsck", "--root", str(root), "--deep")
    assert deep.stderr == "" and "0 finding(s)" in deep.stdout

    rebuilt = fc("tier", "rebuild", "--root", str(new_root), "--tier", url, "--tier-options", json.dumps({}))
    assert rebuilt.returncode == 0
    assert read_all(new_root, "t", 0) == list(enumerate(sent[: before[-1]]))  # every uploaded record, from HDFS alone


def test_reads_past_the_end_are_empty_without_a_panic(hdfs_url: str, capfd: pytest.CaptureFixture[str]) -> None:
    """hdfs-native's reader panics on a seek past the end; our reads are clamped to the file's length first."""
    with open_storage(f"{hdfs_url}/fc-{uuid.uuid4().hex}") as storage:
        storage.write("obj", b"0123456789")
        assert storage.read("obj", 10, 5) == b""
        assert storage.read("obj", 11, 5) == b""
        assert storage.read("obj", 8, 5) == b"89"
    assert "panicked" not in capfd.readouterr().err  # the Rust panic hook writes to fd 2 when a panic happens


def test_a_panic_of_the_client_library_is_a_tier_error(hdfs_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any panic of hdfs-native (a BaseException) in any operation becomes our TierError; ^C still passes."""
    storage = open_storage(f"{hdfs_url}/fc-{uuid.uuid4().hex}")
    fs = storage._fs  # type: ignore[attr-defined]
    storage.write("obj", b"0123456789")

    def panicking_info(path: str, **kwargs: object) -> dict[str, object]:
        fs.open(path, "rb").seek(100)  # the real binding, seeking past the end: it panics
        raise AssertionError("hdfs-native no longer panics on a seek past the end")

    with storage:
        monkeypatch.setattr(fs, "info", panicking_info)
        with pytest.raises(TierError, match=r"info 'obj' in hdfs://.*client library failed \(Cannot seek beyond") as info:
            storage.info("obj")
        assert info.value.__cause__ is not None
        assert type(info.value.__cause__.__cause__).__name__ == "PanicException"

        def interrupted(path: str, **kwargs: object) -> dict[str, object]:
            raise KeyboardInterrupt

        monkeypatch.setattr(fs, "info", interrupted)
        with pytest.raises(KeyboardInterrupt):
            storage.exists("obj")


_PYARROW_HDFS_CHILD = """
import fsspec
fsspec.register_implementation("hdfs", "fsspec.implementations.arrow.HadoopFileSystem", clobber=True)
from filechannel.errors import ConfigError
from filechannel.tiering import open_storage
try:
    open_storage("hdfs://127.0.0.1:9/fc")
except ConfigError as exc:
    print("ConfigError", exc)
"""


def test_hdfs_through_pyarrow_without_libhdfs_says_what_to_install() -> None:
    """Without hdfs-native, fsspec's hdfs:// is pyarrow's, which needs libhdfs and a JVM: one line saying what to install."""
    out = subprocess.run([sys.executable, "-c", _PYARROW_HDFS_CHILD], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("ConfigError cannot open hdfs://127.0.0.1:9/fc: "), out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("install its client: pip install 'filechannel[hdfs]'"), out.stdout
