"""Tiered topics made from the command line, as a user types them (issue 36): storage options
stored with the topic (``-c tier_options=JSON``, ``--tier-option KEY=VALUE``), the tier URL
checked and the bucket reached once before the topic exists, one ``error:`` line otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from filechannel.client import Admin
from filechannel.errors import ConfigError
from filechannel.tiering import open_storage

from ..cli_helpers import fc_text as fc
from .tier_helpers import produce


def topic_config(root: Path, name: str = "t") -> dict:
    return json.loads((root / name / "topic.json").read_text())["config"]


def failed(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed (asserted: nothing but it on stderr)."""
    assert proc.returncode != 0 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: ")
    return line


@pytest.mark.s3
def test_an_s3_topic_with_its_endpoint_is_made_and_tiered_from_the_cli(tmp_path: Path, seaweed, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    bucket = seaweed.new_bucket()
    root = tmp_path / "root"
    options = json.dumps({"endpoint_url": seaweed.endpoint})
    made = fc(*("topics", "create", "a", "--root", str(root), "-c", f"tier=s3://{bucket}/fc", "-c", f"tier_options={options}"))
    assert "created topic a" in made.stdout
    assert topic_config(root, "a")["tier_options"] == {"endpoint_url": seaweed.endpoint}
    fc(
        *("topics", "create", "t", "--root", str(root), "-c", f"tier=s3://{bucket}/fc2"),
        *("--tier-option", f"endpoint_url={seaweed.endpoint}", "--tier-option", "region_name=us-east-1"),
        *("-c", "segment_bytes=4096", "-c", "compression=none"),
    )
    assert topic_config(root)["tier_options"] == {"endpoint_url": seaweed.endpoint, "region_name": "us-east-1"}
    # Stored: the daemon reaches the endpoint with nothing else in its environment.
    produce(root, [b"record %04d" % i for i in range(400)])
    run = fc("tier", "run", "--root", str(root), "--once")
    assert "uploaded offsets" in run.stdout
    # The probe leaves nothing behind in the bucket.
    listed = seaweed.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    assert not [o["Key"] for o in listed if ".probe." in o["Key"]]


@pytest.mark.s3
def test_a_missing_bucket_or_unreachable_endpoint_makes_no_topic(tmp_path: Path, seaweed, unused_port, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    root = tmp_path / "root"
    args = ("topics", "create", "t", "--root", str(root))
    line = failed(
        fc(*args, "-c", "tier=s3://no-such-bucket-here/fc", "--tier-option", f"endpoint_url={seaweed.endpoint}", check=False)
    )
    assert "no-such-bucket-here" in line
    down = f"http://127.0.0.1:{unused_port}"
    line = failed(
        fc(
            *args,
            "-c",
            "tier=s3://bkt/fc",
            "--tier-option",
            f"endpoint_url={down}",
            "--tier-option",
            "max_attempts=1",
            check=False,
        )
    )
    assert "127.0.0.1" in line
    assert not (root / "t").exists()
    # --skip-tier-check: made without a request (say, the storage is not up yet).
    fc(*args, "-c", "tier=s3://bkt/fc", "--tier-option", f"endpoint_url={down}", "--skip-tier-check")
    assert topic_config(root)["tier"] == "s3://bkt/fc"


@pytest.mark.parametrize(
    "tier, says",
    [
        ("s3://", "s3://bucket"),
        ("://x", "has no scheme"),
        ("file://relative/path", "file:///absolute/path"),
        ("nosuchscheme://x/y", "nosuchscheme"),
    ],
)
def test_a_tier_url_naming_no_storage_is_refused_when_the_topic_is_made(tmp_path: Path, tier: str, says: str) -> None:
    root = tmp_path / "root"
    line = failed(fc("topics", "create", "t", "--root", str(root), "-c", f"tier={tier}", check=False))
    assert says in line
    assert not (root / "t").exists()
    with pytest.raises(ConfigError, match=says.replace(".", r"\.")):
        Admin(root).create_topic("t", tier=tier)  # the library checks it too


def test_bad_storage_options_are_one_line(tmp_path: Path) -> None:
    root = tmp_path / "root"
    args = ("topics", "create", "t", "--root", str(root), "-c", f"tier=file://{tmp_path}/tier")
    assert "not valid JSON" in failed(fc(*args, "-c", "tier_options={endpoint_url:", check=False))
    assert "takes no options" in failed(fc(*args, "--tier-option", "endpoint_url=http://x", check=False))
    assert "is not KEY=VALUE" in fc(*args, "--tier-option", "novalue", check=False).stderr
    line = failed(fc(*args[:-1], "tier=s3://bkt/p", "--tier-option", "aws_secret_access_key=x", check=False))
    assert "x" not in line.split("aws_secret_access_key")[-1]  # the value is never echoed
    assert not (root / "t").exists()
    with pytest.raises(ConfigError, match="together, or neither"):
        open_storage("s3://bkt/p", aws_secret_access_key="x")  # not botocore's TypeError at the first request


def test_without_the_s3_extra_an_s3_topic_is_refused_in_one_line(tmp_path: Path) -> None:
    """boto3 and its botocore missing (as without ``pip install 'filechannel[s3]'``): one ConfigError
    naming the missing library and the extra."""
    code = (
        "import sys; sys.modules['boto3'] = sys.modules['botocore'] = None\n"  # their imports now raise ImportError
        "from filechannel.client import Admin\n"
        "from filechannel.errors import ConfigError\n"
        "try:\n"
        f"    Admin({str(tmp_path / 'root')!r}).create_topic('t', tier='s3://bkt/p')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "needs botocore, which is not installed" in proc.stdout and "pip install 'filechannel[s3]'" in proc.stdout
    assert not (tmp_path / "root" / "t").exists()


@pytest.mark.s3
def test_an_endpoint_from_the_environment_is_the_one_errors_name(tmp_path: Path, seaweed, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed.endpoint)
    line = failed(
        fc("topics", "create", "t", "--root", str(tmp_path / "root"), "-c", "tier=s3://no-such-bucket-x/p", check=False)
    )
    assert seaweed.endpoint in line and "AWS" not in line.replace("AWS_", "")
