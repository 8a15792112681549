"""Long commands show counts and rates: a bar on stderr when it is a terminal (a pseudo-terminal
here), one summary line when it is not; run as a user runs them (``python -m filechannel``)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from filechannel.client.topics import Admin
from filechannel.tiering.layout import MANIFEST_SUFFIX

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TERM": "xterm", "COLUMNS": "160"}
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def on_a_terminal(*args: str, stdin: Path, stdout: Path) -> str:
    """Run the command with stderr a pseudo-terminal (stdin and stdout files); what the terminal
    showed, escape sequences removed. Fails on a non-zero exit."""
    master, slave = pty.openpty()
    try:
        with stdin.open("rb") as src, stdout.open("wb") as dst:
            proc = subprocess.Popen([sys.executable, "-m", "filechannel", *args], stdin=src, stdout=dst, stderr=slave, env=ENV)
        os.close(slave)
        shown = bytearray()
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            shown += data
        assert proc.wait(timeout=120) == 0, shown.decode(errors="replace")
    finally:
        os.close(master)
    return ANSI.sub(b"", bytes(shown)).decode()


def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "filechannel", *args], input=stdin.decode(), capture_output=True, text=True, env=ENV, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc


RATE = r"in \d+\.\d s \([\d,]+ {unit}/s(, [\d.,]+ MB/s)?\)"


def test_produce_from_a_file_shows_a_bar_on_a_terminal_and_one_line_elsewhere(tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"record-{i}\n" for i in range(5000)))
    shown = on_a_terminal(
        "produce", "t", "--root", str(tmp_path / "r"), "-f", str(lines), stdin=Path(os.devnull), stdout=tmp_path / "o"
    )
    assert "sending to t" in shown and "5,000 records" in shown and "records/s" in shown  # the bar's last frame
    assert re.search(r"sent 5000 record\(s\) to t " + RATE.format(unit="records"), shown)
    piped = run("produce", "t", "--root", str(tmp_path / "r"), "-f", str(lines))
    assert re.fullmatch(r"sent 5000 record\(s\) to t " + RATE.format(unit="records") + "\n", piped.stderr), piped.stderr


def test_consume_into_a_file_shows_a_bar_and_writes_every_record(tmp_path: Path) -> None:
    root = str(tmp_path / "r")
    run("produce", "t", "--root", root, stdin=b"".join(b"v%d\n" % i for i in range(3000)))
    out = tmp_path / "out.txt"
    shown = on_a_terminal("consume", "t", "--root", root, "--from-beginning", "--no-follow", stdin=Path(os.devnull), stdout=out)
    assert "consuming" in shown and "3,000 records" in shown and "records/s" in shown
    assert "Processed a total of 3000 messages" in shown
    assert out.read_text().splitlines() == [f"v{i}" for i in range(3000)]
    piped = run("consume", "t", "--root", root, "--from-beginning", "--no-follow")
    assert piped.stderr == "Processed a total of 3000 messages\n"  # Kafka's line, and no bar, into a pipe


def test_tier_rebuild_export_and_import_count_with_rates(tmp_path: Path) -> None:
    root, tier = tmp_path / "r", tmp_path / "tier"
    Admin(root).create_topic("t", 1, tier=f"file://{tier}", segment_bytes=4096)
    run("produce", "t", "--root", str(root), stdin=b"".join(b"value-%d\n" % i for i in range(3000)))
    run("tier", "run", "--root", str(root), "--once")
    manifests = sum(1 for p in tier.rglob(f"*{MANIFEST_SUFFIX}"))
    assert manifests > 1

    rebuilt = run("tier", "rebuild", "--root", str(tmp_path / "r2"), "--tier", f"file://{tier}")
    assert "reading manifests:" not in rebuilt.stderr  # no frozen "0/N" line into a pipe
    summary = re.search(r"read (\d+) manifest\(s\) " + RATE.format(unit="manifests"), rebuilt.stderr)
    assert summary and int(summary.group(1)) == manifests, rebuilt.stderr
    shown = on_a_terminal(
        "tier",
        "rebuild",
        "--root",
        str(tmp_path / "r3"),
        "--tier",
        f"file://{tier}",
        stdin=Path(os.devnull),
        stdout=tmp_path / "o",
    )
    assert "reading manifests" in shown and f"{summary.group(1)}/{summary.group(1)} manifests" in shown and "manifests/s" in shown

    exported = run("tier", "export", "--root", str(root), "-o", str(tmp_path / "t.export"))
    assert re.search(r"exported \d+ segment\(s\).* " + RATE.format(unit="segments"), exported.stdout), exported.stdout
    os.unlink(root / ".tier" / "metadata.db")
    imported = run("tier", "import", str(tmp_path / "t.export"), "--root", str(root))
    assert re.search(r"imported \d+ segment\(s\), epoch \d+ " + RATE.format(unit="segments"), imported.stdout), imported.stdout


def test_check_shows_bytes_per_second_on_a_terminal(tmp_path: Path) -> None:
    root = str(tmp_path / "r")
    run("produce", "t", "--root", root, stdin=b"".join(b"v%d\n" % i for i in range(2000)))
    shown = on_a_terminal("check", "--root", root, stdin=Path(os.devnull), stdout=tmp_path / "o")
    assert re.search(r"t\[0\].*[\d.]+ [kMG]?B/s", shown), shown
    assert (tmp_path / "o").read_text() == "ok: 2,000 records in 1 topic(s), every CRC matches\n"
