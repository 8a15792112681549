"""Tier-2 commands given something wrong, run through the console script's entry point (tests/cli_helpers.py): one
``error:`` line, exit 2 for a bad value, 1 for an operation that failed, never a traceback, and
nothing made when nothing could be done. Also: a deleted tiered topic stays deleted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from filechannel.client.topics import Admin

from ..cli_helpers import fc_text
from .tier_helpers import make_topic, produce

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def fc(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return fc_text(*args, check=False, input=stdin)


def one_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The one ``error:`` line of a failed command (after its progress lines), checked."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def uploaded_topic(tmp_path: Path) -> tuple[Path, Path]:
    """A root whose topic t has segments in tier-2 (tmp_path/tier), claimed by a daemon pass."""
    root, tier = tmp_path / "root", tmp_path / "tier"
    make_topic(root, f"file://{tier}")
    produce(root, [os.urandom(100) for _ in range(150)])
    proc = fc("tier", "run", "--root", str(root), "--once")
    assert proc.returncode == 0 and "uploaded offsets" in proc.stdout, proc.stderr
    return root, tier


def test_rebuild_from_an_unreachable_or_unknown_storage_is_one_line(tmp_path: Path) -> None:
    line = one_error(fc("tier", "rebuild", "--root", str(tmp_path / "new"), "--tier", "ftp://nosuchhost.invalid/y"), 1)
    assert "cannot reach ftp://nosuchhost.invalid/y" in line
    line = one_error(fc("tier", "rebuild", "--root", str(tmp_path / "new"), "--tier", "nosuch/path"), 2)
    assert "has no scheme" in line
    assert not (tmp_path / "new").exists()


def test_rebuild_from_a_prefix_holding_nothing_of_ours_makes_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    line = one_error(fc("tier", "rebuild", "--root", str(tmp_path / "new"), "--tier", f"file://{tmp_path}/empty"), 1)
    assert "nothing to rebuild from" in line and "check the URL" in line
    assert not (tmp_path / "new").exists()


def test_rebuild_refuses_a_damaged_topic_description(tmp_path: Path) -> None:
    _, tier = uploaded_topic(tmp_path)
    description = tier / "t" / "topic.json"
    good = description.read_bytes()
    for damage in (b"{not json", json.dumps({"name": "t", "partitions": 1, "config": {"segment_bytes": "x"}}).encode()):
        description.write_bytes(damage)
        line = one_error(fc("tier", "rebuild", "--root", str(tmp_path / "new"), "--tier", f"file://{tier}"), 1)
        assert line.startswith("error: t/topic.json is damaged (") and "nothing rebuilt" in line
        assert not (tmp_path / "new").exists()
    description.write_bytes(good)
    proc = fc("tier", "rebuild", "--root", str(tmp_path / "new"), "--tier", f"file://{tier}")
    assert proc.returncode == 0, proc.stderr
    assert Admin(tmp_path / "new").describe_topic("t").config["segment_bytes"] == 4096  # its own settings


def test_import_of_a_missing_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    line = one_error(fc("tier", "import", str(tmp_path / "nosuch.export"), "--root", str(tmp_path / "root")), 1)
    assert line == f"error: there is no export file {str(tmp_path / 'nosuch.export')!r}"


def test_config_of_an_unknown_setting_names_the_known_ones(tmp_path: Path) -> None:
    root = tmp_path / "root"
    line = one_error(fc("config", "--root", str(root), "nosuch.setting=1"), 2)
    assert "unknown root setting 'nosuch.setting'" in line and "known: auto.create.topics.enable" in line
    line = one_error(fc("config", "--root", str(root), "auto.create.topic.enable=false"), 2)
    assert "did you mean auto.create.topics.enable?" in line
    line = one_error(fc("config", "--root", str(root), "auto.create.topics.enable=1"), 2)
    assert "takes true or false" in line
    assert not root.exists()  # nothing stored, no root made
    proc = fc("config", "--root", str(root), "auto.create.topics.enable=false")
    assert (proc.returncode, proc.stdout) == (0, "auto.create.topics.enable=false\n")


# -- a deleted tiered topic stays deleted ---------------------------------------------------------


def test_a_deleted_topic_is_marked_in_tier2_and_never_rebuilt(tmp_path: Path) -> None:
    root, tier = uploaded_topic(tmp_path)
    assert fc("topics", "delete", "t", "--root", str(root), "--yes").returncode == 0
    assert (tier / ".deleted" / "t").is_file()  # marked at once: the storage was reachable
    # the root is lost before any daemon purged the topic: a rebuild must not bring it back
    proc = fc("tier", "rebuild", "--root", str(tmp_path / "new"), "--tier", f"file://{tier}")
    assert proc.returncode == 0, proc.stderr
    assert "topic t: deleted from its root (marked .deleted/t), not rebuilt" in proc.stderr
    assert Admin(tmp_path / "new").list_topics() == []


def test_a_topic_deleted_while_its_storage_is_away_is_purged_when_it_is_back(tmp_path: Path) -> None:
    root, tier = uploaded_topic(tmp_path)
    Admin(root).create_topic("other", 1, tier=f"file://{tmp_path}/tier-other")  # another tiered topic, served all along
    tier.rename(tmp_path / "tier.away")
    tier.write_bytes(b"not a folder")  # the storage cannot be reached
    assert fc("topics", "delete", "t", "--root", str(root), "--yes").returncode == 0
    for _ in range(2):  # every pass: the purge waits, and the pass does not fail for it
        proc = fc("tier", "run", "--root", str(root), "--once")
        assert proc.returncode == 0, proc.stderr
        assert "t (deleted): its purge from tier-2 waits for the storage, tried again next pass" in proc.stdout
    line = one_error(fc("topics", "create", "t", "--root", str(root), "-c", f"tier=file://{tmp_path}/tier-new"), 1)
    assert "has not purged its tier-2 copies yet" in line  # the name stays reserved meanwhile

    tier.unlink()
    (tmp_path / "tier.away").rename(tier)  # the storage is back
    proc = fc("tier", "run", "--root", str(root), "--once")
    assert proc.returncode == 0 and "t: deleted topic purged from tier-2" in proc.stdout, proc.stderr
    left = {str(p.relative_to(tier)) for p in tier.rglob("*") if p.is_file()}
    assert {name.partition("/")[0] for name in left} == {".claim.json", ".epochs"}  # its objects and marks gone, no other
    assert not os.listdir(root / ".tier" / "deleted")
    assert fc("topics", "create", "t", "--root", str(root), "-c", f"tier=file://{tier}").returncode == 0


@pytest.mark.s3
def test_on_s3_records_move_with_roll_and_a_deleted_topic_stays_deleted(tmp_path: Path, seaweed, monkeypatch) -> None:
    """On a real S3 server (SeaweedFS): a quiet topic's records move with `tier run --roll`, its
    deletion is marked in the bucket at once, and a rebuild from the bucket skips it."""
    for name, value in (("AWS_ACCESS_KEY_ID", seaweed.access_key), ("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)):
        monkeypatch.setenv(name, value)  # this process's Admin
        monkeypatch.setitem(ENV, name, value)  # the commands'
    bucket, root = seaweed.new_bucket(), tmp_path / "root"
    tier = ("-c", f"tier=s3://{bucket}/fc", "--tier-option", f"endpoint_url={seaweed.endpoint}")
    options = json.dumps({"endpoint_url": seaweed.endpoint})
    for topic in ("kept", "gone"):
        assert fc("topics", "create", topic, "--root", str(root), *tier).returncode == 0
        assert fc("produce", topic, "--root", str(root), stdin="a\nb\nc\n").returncode == 0
    run = fc("tier", "run", "--root", str(root), "--once", "--roll")
    assert run.returncode == 0 and run.stdout.count("sealed the idle active segment, offsets [0, 3)") == 2, run.stderr
    assert fc("topics", "delete", "gone", "--root", str(root), "--yes").returncode == 0
    keys = {o["Key"] for o in seaweed.client().list_objects_v2(Bucket=bucket, Prefix="fc/").get("Contents", [])}
    assert "fc/.deleted/gone" in keys and any(k.startswith("fc/gone/") for k in keys)  # marked, not purged yet
    rebuilt = fc("tier", "rebuild", "--root", str(tmp_path / "new"), "--tier", f"s3://{bucket}/fc", "--tier-options", options)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "topic gone: deleted from its root (marked .deleted/gone), not rebuilt" in rebuilt.stderr
    assert Admin(tmp_path / "new").list_topics() == ["kept"]
    assert fc("consume", "kept", "--root", str(tmp_path / "new"), "--from-beginning", "--no-follow").stdout == "a\nb\nc\n"
