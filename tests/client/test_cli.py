"""The filechannel command, run through the console script's entry point (tests/cli_helpers.py), and
as the installed console script in a subprocess where the environment or the process matters."""

import json
import os
import re
import subprocess
from typing import Any

import pytest

from ..cli_helpers import SCRIPT, fc


def test_topics_produce_consume_groups_check(tmp_path):
    fc(tmp_path, "topics", "create", "orders", "--partitions", "2", "--config", "retention_ms=3600000")
    assert fc(tmp_path, "topics", "list").stdout.decode().split() == ["orders"]
    fc(tmp_path, "produce", "orders", "--key-separator", ":", input=b"a:1\nb:2\nc:3\nd:4\n")
    described = fc(tmp_path, "topics", "describe", "orders").stdout.decode()
    assert "retention_ms=3600000" in described
    lines = fc(tmp_path, "consume", "orders", "--from-beginning", "--no-follow", "--format", "json").stdout.decode().splitlines()
    records = [json.loads(line) for line in lines]
    assert sorted((r["key"], r["value"]) for r in records) == [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]
    first = fc(tmp_path, "consume", "orders", "--group", "g", "--from-beginning", "--max", "3").stdout.decode().split()
    rest = fc(tmp_path, "consume", "orders", "--group", "g", "--from-beginning", "--no-follow").stdout.decode().split()
    assert len(first) == 3 and sorted(first + rest) == ["1", "2", "3", "4"]
    assert fc(tmp_path, "groups", "list").stdout.decode().split() == ["g"]
    described = fc(tmp_path, "groups", "describe", "g").stdout.decode()
    assert "orders" in described and "lag" in described
    checked = fc(tmp_path, "check")
    assert "every CRC matches" in checked.stdout.decode()
    from_offset = fc(tmp_path, "consume", "orders", "--from", "latest", "--no-follow").stdout
    assert from_offset == b""
    fc(tmp_path, "topics", "delete", "orders", "--yes")
    assert fc(tmp_path, "topics", "list").stdout == b""


def test_consume_from_an_iso_time(tmp_path):
    fc(tmp_path, "produce", "t", input=b"old\n")
    out = fc(tmp_path, "consume", "t", "--from", "2000-01-01T00:00:00", "--no-follow").stdout.decode().split()
    assert out == ["old"]
    assert fc(tmp_path, "consume", "t", "--from", "2999-01-01T00:00:00", "--no-follow").stdout == b""


def test_check_names_the_first_corrupt_record(tmp_path):
    fc(tmp_path, "topics", "create", "t", "--config", "segment_bytes=4096", "--config", "compression=none")
    fc(tmp_path, "produce", "t", input=b"".join(b"record-%04d-%s\n" % (i, b"x" * 40) for i in range(300)))
    seg = sorted((tmp_path / "t" / "0").glob("*.seg"))[0]
    data = bytearray(seg.read_bytes())
    data[200] ^= 0xFF
    seg.write_bytes(bytes(data))
    proc = fc(tmp_path, "check", check=False)
    assert proc.returncode == 1
    assert seg.name in proc.stderr.decode() and "Traceback" not in proc.stderr.decode()


@pytest.mark.parametrize(
    "args,message",
    [
        (["topics", "create", "bad name"], "not allowed"),
        (["consume", "missing"], "does not exist"),
        (["consume", "t", "--from", "yesterday"], "--from"),
        (["topics", "create", "x", "--config", "nonsense=1"], "unknown topic setting"),
        (["topics", "delete"], "Missing argument"),  # (topics describe without a name describes every topic)
    ],
)
def test_bad_input_is_one_clear_line_and_a_nonzero_exit(tmp_path, args, message):
    fc(tmp_path, "produce", "t", input=b"x\n")
    proc = fc(tmp_path, *args, check=False)
    assert proc.returncode != 0
    err = proc.stderr.decode()
    assert message in err and "Traceback" not in err


def test_help_on_every_command(tmp_path):
    for args in (
        ["--help"],
        ["topics", "--help"],
        ["topics", "create", "--help"],
        ["produce", "--help"],
        ["consume", "--help"],
        ["groups", "describe", "--help"],
        ["check", "--help"],
    ):
        assert "Usage" in fc(tmp_path, *args).stdout.decode()


def test_missing_root_is_explained(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FILECHANNEL_ROOT"}
    proc = subprocess.run([str(SCRIPT), "topics", "list"], capture_output=True, env=env, timeout=60)
    assert proc.returncode != 0 and "FILECHANNEL_ROOT" in proc.stderr.decode()


def test_bench_help_lists_the_harness_options_and_a_bad_one_is_one_line(tmp_path):
    """The package's harness (filechannel.bench), never a `bench` of the working directory:
    a decoy one there would fail the command if it ran."""
    decoy = tmp_path / "bench"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise SystemExit('the decoy bench of the working directory ran')\n")
    (decoy / "__main__.py").write_text("raise SystemExit('the decoy bench of the working directory ran')\n")
    env = {**os.environ, "FILECHANNEL_ROOT": str(tmp_path / "root")}
    run: dict[str, Any] = {"capture_output": True, "text": True, "env": env, "timeout": 60, "cwd": tmp_path}
    shown = subprocess.run([str(SCRIPT), "bench", "--help"], **run)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("Usage: filechannel bench [OPTIONS]")
    for option in ("--quick", "--out DIR", "--work DIR", "--only PATTERNS", "--spark", "--help"):
        assert option in shown.stdout, option
    bad = subprocess.run([str(SCRIPT), "bench", "--quik"], **run)
    assert (bad.returncode, bad.stdout) == (2, "")
    [line] = bad.stderr.splitlines()
    assert line == "error: No such option '--quik'. Did you mean '--quick'? (see: filechannel bench --help)"
    listed = subprocess.run([str(SCRIPT), "--help"], **run).stdout
    assert re.search(r"^  bench +Benchmark filechannel against its peers\.$", listed, re.M), listed
