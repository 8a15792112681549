"""The command line as a user in a terminal or a pipeline meets it (issue 23), each through the
console script's entry point (tests/cli_helpers.py); pipes, signals and other processes through the
installed console script in a real subprocess."""

import base64
import json
import os
import re
import subprocess
import time
from importlib import metadata

import pytest

from filechannel.client import Admin, Consumer, Producer, TopicPartition
from filechannel.client.group import read_group
from filechannel.errors import UnknownTopicError

from ..cli_helpers import SCRIPT, fc


def _env(root):
    return {**os.environ, "FILECHANNEL_ROOT": str(root)}


def _closed_stdout(root, *args):
    """Run ``filechannel ARGS`` with a stdout whose reader is already gone; its exit code and stderr."""
    proc = subprocess.Popen([str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(root))
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    try:
        err = proc.stderr.read().decode()
        return proc.wait(timeout=60), err
    finally:
        proc.stderr.close()


# -- a closed pipe ----------------------------------------------------------------------------


def test_a_closed_stdout_ends_every_command_with_exit_0_and_nothing_on_stderr(tmp_path):
    fc(tmp_path, "topics", "create", "t", "--partitions", "2")
    fc(tmp_path, "produce", "t", input=b"".join(b"line %d\n" % i for i in range(2000)))
    for args in (
        ["topics", "list"],
        ["topics", "describe", "t"],
        ["consume", "t", "--from-beginning", "--no-follow"],
        ["consume", "t", "--from-beginning", "--no-follow", "--format", "json"],
        ["check"],
    ):
        code, err = _closed_stdout(tmp_path, *args)
        assert (code, err) == (0, ""), (args, code, err)


def test_consume_follow_into_head_ends_when_head_exits_and_commits_only_what_was_written(tmp_path):
    fc(tmp_path, "produce", "t", input=b"a\nb\nc\n")
    script = f"'{SCRIPT}' consume t --group g --from-beginning | head -1; echo \"status=${{PIPESTATUS[0]}}\" >&2"
    # --follow waits for records that never come: it must notice that head is gone, not wait for ever
    proc = subprocess.run(["bash", "-c", script], capture_output=True, env=_env(tmp_path), timeout=60)
    assert proc.stdout == b"a\n"
    assert proc.stderr.decode() == "status=0\n"
    rest = fc(tmp_path, "consume", "t", "--group", "g", "--from-beginning", "--no-follow").stdout.decode().split()
    # what reached the pipe before head closed it is committed, nothing after: the rest comes again
    assert 1 <= 3 - len(rest) <= 3 and rest == ["a", "b", "c"][3 - len(rest) :]


# -- errors, --version, --root ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args,stdin,message",
    [
        (["consume", "t", "--max", "0"], b"", "--max"),
        (["consume", "t", "--format", "xml"], b"", "'xml' is not one of"),
        (["consume", "t", "--from", "yesterday"], b"", "'yesterday' is not earliest"),
        (["consume", "t", "--no-such-option"], b"", "No such option"),
        (["--no-such-option", "topics", "list"], b"", "No such option"),
        (["topics", "lst"], b"", "No such command"),
        (["topics"], b"", "missing the command: one of alter, create, delete, describe, list"),
        (["groups"], b"", "give a command (list, describe, reset-offsets, delete, delete-offsets) or one of --list"),
        ([], b"", "missing the command: one of"),
        (["produce", "t", "-k", ":"], b"a:1\nno separator\n", "line 2 has no key separator ':'; the 1 line(s)"),
        (["produce", "t", "--property", "parse.key=true"], b"no tab\n", "line 1 has no key separator"),
    ],
)
def test_every_option_error_is_one_line_on_stderr_and_a_nonzero_exit(tmp_path, args, stdin, message):
    fc(tmp_path, "produce", "t", input=b"x\n")
    proc = fc(tmp_path, *args, input=stdin, check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and proc.stdout == b""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_records_before_a_line_without_separator_are_sent(tmp_path):
    fc(tmp_path, "produce", "t", "-k", ":", input=b"a:1\nb:2\nbroken\nc:3\n", check=False)
    assert fc(tmp_path, "consume", "t", "--from-beginning", "--no-follow").stdout == b"1\n2\n"


def test_version_says_whether_the_c_extensions_are_loaded(tmp_path):
    import filechannel

    native = {True: "yes", False: "no"}
    loaded = filechannel.native_extensions()  # this process imports the same build as the script
    proc = fc(tmp_path, "--version")
    assert proc.stdout.decode() == (
        f"filechannel {metadata.version('filechannel')} "
        f"(native codec: {native[loaded['codec']]}, readahead: {native[loaded['readahead']]})\n"
    )
    assert filechannel.__version__ == metadata.version("filechannel")


def test_root_after_the_subcommand(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    fc(a, "topics", "create", "only-in-b", "--root", str(b))
    assert not a.exists() and fc(tmp_path, "topics", "list", "--root", str(b)).stdout == b"only-in-b\n"
    # after the subcommand it wins over the one before it and over FILECHANNEL_ROOT
    fc(a, "topics", "create", "only-in-a")
    assert fc(tmp_path, "--root", str(a), "topics", "list", "--root", str(b)).stdout == b"only-in-b\n"
    fc(tmp_path, "produce", "only-in-b", "--root", str(b), input=b"v\n")
    assert fc(a, "consume", "only-in-b", "--root", str(b), "--from-beginning", "--no-follow").stdout == b"v\n"
    assert "1 records" in fc(a, "check", "--root", str(b)).stdout.decode()


def test_check_writes_no_blank_line_and_no_bars_into_a_file(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = fc(tmp_path / "empty", "check")
    assert proc.stderr == b"" and proc.stdout == b"ok: 0 records in 0 topic(s), every CRC matches\n"
    fc(tmp_path / "one", "produce", "t", input=b"x\n")
    proc = fc(tmp_path / "one", "check")
    assert proc.stderr == b"" and proc.stdout == b"ok: 1 records in 1 topic(s), every CRC matches\n"


# -- no silent side effects --------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["topics", "list"],
        ["topics", "describe", "t"],
        ["topics", "delete", "t", "--yes"],
        ["groups", "list"],
        ["groups", "describe", "g"],
        ["groups", "delete", "g"],
        ["consume", "t", "--no-follow"],
        ["consume", "t", "--group", "g", "--no-follow"],
        ["check"],
        ["config"],
    ],
)
def test_a_reader_of_a_root_that_does_not_exist_says_so_and_creates_nothing(tmp_path, args):
    root = tmp_path / "typo"
    proc = fc(root, *args, check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and err.count("\n") == 1
    assert f"the root folder '{root}' does not exist" in err
    assert not root.exists()


def test_produce_creates_a_missing_topic_only_as_the_root_allows_and_says_so(tmp_path):
    proc = fc(tmp_path, "produce", "new", input=b"v\n")
    assert "note: created topic new (1 partition, default settings)" in proc.stderr.decode()
    assert "auto.create.topics.enable is true (the default" in proc.stderr.decode()
    assert "created topic" not in fc(tmp_path, "produce", "new", input=b"w\n").stderr.decode()  # only the first time
    assert fc(tmp_path, "config").stdout == b"auto.create.topics.enable=true\n"
    assert fc(tmp_path, "config", "auto.create.topics.enable=false").stdout == b"auto.create.topics.enable=false\n"
    refused = fc(tmp_path, "produce", "typo", input=b"v\n", check=False)
    assert refused.returncode == 1 and refused.stderr.decode().count("\n") == 1
    assert "auto.create.topics.enable is false" in refused.stderr.decode()
    assert fc(tmp_path, "topics", "list").stdout == b"new\n"
    # the library's Producer follows the root's setting too, as a Kafka client follows its broker's
    with pytest.raises(UnknownTopicError), Producer(str(tmp_path)) as producer:
        producer.send("typo", b"v")
    assert Admin(str(tmp_path)).list_topics() == ["new"]
    bad = fc(tmp_path, "config", "auto.create.topics.enable=maybe", check=False)
    assert bad.returncode == 2 and "auto.create.topics.enable takes true or false" in bad.stderr.decode()


def test_produce_to_partition_1_of_a_missing_topic_creates_nothing(tmp_path):
    proc = fc(tmp_path, "produce", "t", "--partition", "1", input=b"v\n", check=False)
    assert proc.returncode == 1 and "would have no partition 1" in proc.stderr.decode()
    assert not (tmp_path / "t").exists()


def test_topics_delete_without_a_terminal_needs_yes(tmp_path):
    fc(tmp_path, "produce", "t", input=b"v\n")
    proc = fc(tmp_path, "topics", "delete", "t", input=b"y\n", check=False)
    assert proc.returncode == 2 and "pass --yes" in proc.stderr.decode()
    assert fc(tmp_path, "topics", "list").stdout == b"t\n"
    missing = fc(tmp_path, "topics", "delete", "other", "--yes", check=False)
    assert missing.returncode == 1 and "does not exist" in missing.stderr.decode()
    fc(tmp_path, "topics", "delete", "t", "--yes")
    assert fc(tmp_path, "topics", "list").stdout == b""


def test_topics_create_if_not_exists(tmp_path):
    fc(tmp_path, "topics", "create", "t", "--partitions", "3")
    again = fc(tmp_path, "topics", "create", "t", check=False)
    assert again.returncode == 1 and "already exists" in again.stderr.decode()
    kept = fc(tmp_path, "topics", "create", "t", "--if-not-exists")
    assert kept.stdout.decode() == "topic t already exists with 3 partition(s); left as it is\n"
    assert "created topic u" in fc(tmp_path, "topics", "create", "u", "--if-not-exists").stdout.decode()


# -- groups describe: live members only --------------------------------------------------------


def test_groups_describe_shows_live_members_and_says_when_an_owner_is_gone(tmp_path):
    fc(tmp_path, "produce", "t", input=b"first\n")
    member = subprocess.Popen(
        [str(SCRIPT), "consume", "t", "--group", "g", "--from-beginning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=_env(tmp_path),
    )
    assert member.stdout is not None
    try:
        assert member.stdout.readline() == b"first\n"  # it has joined and owns the partition
        alive = fc(tmp_path, "groups", "describe", "g").stdout.decode()
        assert f"pid {member.pid}, topics t" in alive and "1 live member(s)" in alive and "gone" not in alive
        member.kill()
        member.wait(timeout=60)
    finally:
        if member.poll() is None:
            member.kill()
            member.wait(timeout=60)
        member.stdout.close()
    dead = fc(tmp_path, "groups", "describe", "g").stdout.decode()
    assert "0 live member(s)" in dead and "member " not in dead
    assert f"t[0]: its owner (pid {member.pid}) is gone; a live member's next poll takes it over\n" in dead


# -- damage a user can act on -----------------------------------------------------------------


def _flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _damaged_topic(root):
    """Topic t, 300 records in raw segments of 59; a byte flipped in segments 0 and 2."""
    fc(root, "topics", "create", "t", "--config", "segment_bytes=4096", "--config", "compression=none")
    fc(root, "produce", "t", input=b"".join(b"record-%04d-%s\n" % (i, b"x" * 40) for i in range(300)))
    segs = sorted((root / "t" / "0").glob("*.seg"))
    assert [int(s.name[:20]) for s in segs[:4]] == [0, 59, 118, 177]
    _flip(segs[0], 200)  # in the frame of offset 2
    _flip(segs[2], 200)  # offset 120
    return segs


def test_check_lists_every_damaged_range_and_the_first_readable_offset_after_it(tmp_path):
    segs = _damaged_topic(tmp_path)
    proc = fc(tmp_path, "check", check=False)
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 1 and proc.stdout == b"" and len(lines) == 3, lines
    assert lines[0].startswith("damaged: t[0] offsets 2 to 58 cannot be read; first readable offset after them: 59: ")
    assert f"{segs[0]}' has an invalid frame at byte 170 (offset 2" in lines[0]
    assert lines[1].startswith("damaged: t[0] offsets 120 to 176 cannot be read; first readable offset after them: 177: ")
    assert f"{segs[2]}' has an invalid frame at byte 170 (offset 120" in lines[1]
    assert lines[2].startswith("error: 2 damaged range(s), listed above; 186 records can be read.")
    # what check says can be read, can: from 59 up to the next damage
    read = fc(tmp_path, "consume", "t", "--partition", "0", "--from", "59", "--no-follow", check=False).stdout.split()
    assert read == [b"record-%04d-%s" % (i, b"x" * 40) for i in range(59, 120)]


def test_check_goes_on_past_a_bad_compressed_block(tmp_path):
    fc(
        tmp_path,
        "topics",
        "create",
        "z",
        *("--config", "segment_bytes=16384", "--config", "compression=zstd", "--config", "compression_block_bytes=1024"),
    )
    fc(tmp_path, "produce", "z", input=b"".join(b"%05d %s\n" % (i, os.urandom(30).hex().encode()) for i in range(1000)))
    partition = tmp_path / "z" / "0"
    with Admin(str(tmp_path)).open_partition("z", 0) as ch:  # compresses the sealed segments now
        ch.compress_sealed()
    compressed = sorted(partition.glob("*.seg.z"))
    assert compressed, sorted(p.name for p in partition.iterdir())
    _flip(compressed[0], compressed[0].stat().st_size // 3)
    proc = fc(tmp_path, "check", check=False)
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 1 and lines[-1].startswith("error: 1 damaged range(s)"), lines
    assert lines[0].startswith("damaged: z[0] offsets ") and "block" in lines[0] and compressed[0].name in lines[0]
    damaged = re.match(r"damaged: z\[0\] offsets (\d+) to (\d+) .* after them: (\d+)", lines[0])
    assert damaged is not None, lines[0]
    first, last, after = (int(w) for w in damaged.groups())
    assert first <= last < after
    assert fc(tmp_path, "consume", "z", "--partition", "0", "--from", str(after), "--max", "1").stdout.startswith(
        b"%05d " % after
    )


def test_consume_at_damage_says_which_offset_to_seek_to(tmp_path):
    _damaged_topic(tmp_path)
    proc = fc(tmp_path, "consume", "t", "--from-beginning", "--no-follow", check=False)
    err = proc.stderr.decode()
    assert (
        proc.returncode == 1
        and err.count("\n") == 1
        and proc.stdout.split() == [b"record-0000-" + b"x" * 40, b"record-0001-" + b"x" * 40]
    )
    assert "the first readable offset after it in t[0] is 59 (offsets 2 to 58 are lost)" in err
    assert "`filechannel consume t --partition 0 --from 59`" in err
    grouped = fc(tmp_path, "consume", "t", "--group", "g", "--from-beginning", "--no-follow", check=False).stderr.decode()
    assert "`filechannel groups reset-offsets g --topic t:0 --to-offset 59 --execute`" in grouped
    fc(tmp_path, "groups", "reset-offsets", "g", "--topic", "t:0", "--to-offset", "59", "--execute")
    after = fc(tmp_path, "consume", "t", "--group", "g", "--no-follow", check=False)
    assert after.stdout.split()[0] == b"record-0059-" + b"x" * 40 and "is 177 (offsets 120 to 176" in after.stderr.decode()


def test_consume_follow_commits_what_it_printed_while_it_runs(tmp_path):
    """Killed with SIGKILL (no chance to commit at the end), it repeats nothing already committed."""
    fc(tmp_path, "produce", "t", input=b"a\nb\nc\n")
    member = subprocess.Popen(
        [str(SCRIPT), "consume", "t", "--group", "g", "--from-beginning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=_env(tmp_path),
    )
    assert member.stdout is not None
    try:
        assert [member.stdout.readline() for _ in range(3)] == [b"a\n", b"b\n", b"c\n"]
        deadline = time.monotonic() + 30  # the commit interval is 5 s
        while read_group(str(tmp_path), "g")[1].get(TopicPartition("t", 0)) != 3:
            assert time.monotonic() < deadline, "what was printed was not committed within 30 s"
            time.sleep(0.1)
    finally:
        member.kill()
        member.wait(timeout=60)
        member.stdout.close()
    fc(tmp_path, "produce", "t", input=b"d\n")
    assert fc(tmp_path, "consume", "t", "--group", "g", "--no-follow").stdout == b"d\n"


# -- scriptable output: --format json ----------------------------------------------------------


def test_consume_json_is_binary_safe_with_the_encoding_stated(tmp_path):
    binary = bytes(range(256))
    with Producer(str(tmp_path)) as p:
        p.send("t", binary, key=b"\xff\xfe", headers=[("h", b"\x00\x80"), ("h", b"text")], timestamp_ms=5)
        p.send("t", "héllo".encode(), timestamp_ms=6)
        p.send("t", None, key=b"gone", timestamp_ms=7)  # a tombstone
    lines = fc(tmp_path, "consume", "t", "--from-beginning", "--no-follow", "--format", "json").stdout.splitlines()
    first, second, third = (json.loads(line) for line in lines)
    keys = ["topic", "partition", "offset", "timestamp", "key", "key_encoding", "value", "value_encoding", "headers"]
    assert [list(r) for r in (first, second, third)] == [keys] * 3  # the same keys, in the same order, every time
    assert (first["value_encoding"], base64.b64decode(first["value"])) == ("base64", binary)
    assert (first["key_encoding"], base64.b64decode(first["key"])) == ("base64", b"\xff\xfe")
    assert first["headers"] == [
        {"key": "h", "value": base64.b64encode(b"\x00\x80").decode(), "encoding": "base64"},
        {"key": "h", "value": "text", "encoding": "utf-8"},  # a repeated header name is kept, in order
    ]
    assert (second["value"], second["value_encoding"], second["key"], second["key_encoding"]) == ("héllo", "utf-8", None, None)
    assert (third["value"], third["value_encoding"], third["key"]) == (None, None, "gone")
    help_text = fc(tmp_path, "consume", "--help").stdout.decode()
    assert "base64" in help_text and "value_encoding" in help_text


def test_topics_and_groups_describe_themselves_as_json_lines(tmp_path):
    fc(tmp_path, "topics", "create", "a", "--partitions", "2", "--config", "retention.ms=3600000")
    fc(tmp_path, "topics", "create", "b")
    fc(tmp_path, "produce", "a", "--partition", "1", input=b"x\ny\nz\n")
    listed = fc(tmp_path, "topics", "list", "--format", "json").stdout.decode().splitlines()
    assert [json.loads(line) for line in listed] == [{"topic": "a", "partitions": 2}, {"topic": "b", "partitions": 1}]
    (line,) = fc(tmp_path, "topics", "describe", "a", "--format", "json").stdout.decode().splitlines()
    desc = json.loads(line)
    assert list(desc) == ["topic", "partitions", "config"] and desc["config"] == {"retention_ms": 3600000}
    assert [(p["partition"], p["first_offset"], p["end_offset"], p["records"]) for p in desc["partitions"]] == [
        (0, 0, 0, 0),
        (1, 0, 3, 3),
    ]
    assert all(type(p["size_bytes"]) is int and p["size_bytes"] >= 0 for p in desc["partitions"])

    fc(tmp_path, "consume", "a", "--group", "g", "--from-beginning", "--max-messages", "2")
    assert [json.loads(x) for x in fc(tmp_path, "groups", "list", "--format", "json").stdout.decode().splitlines()] == [
        {"group": "g"}
    ]
    (line,) = fc(tmp_path, "groups", "describe", "g", "--format", "json").stdout.decode().splitlines()
    group = json.loads(line)
    assert list(group) == ["group", "generation", "members", "partitions"]
    assert group["group"] == "g" and group["members"] == []  # the consumer has exited
    rows = {(r["topic"], r["partition"]): r for r in group["partitions"]}
    assert (rows[("a", 1)]["committed"], rows[("a", 1)]["end_offset"], rows[("a", 1)]["lag"]) == (2, 3, 1)
    assert rows[("a", 0)]["committed"] is None and rows[("a", 0)]["lag"] is None  # no commit: no lag (Kafka shows -)
    assert all(list(r) == ["topic", "partition", "committed", "end_offset", "lag", "owner", "owner_pid", "owner_alive"]
               for r in group["partitions"])  # fmt: skip
    # Without names: every topic, every group (--all-groups), one object per line, as kafka-topics --describe.
    every = [json.loads(x) for x in fc(tmp_path, "topics", "describe", "--format", "json").stdout.decode().splitlines()]
    assert [d["topic"] for d in every] == ["a", "b"] and every[0]["config"] == desc["config"]
    assert [
        json.loads(x)["topic"] for x in fc(tmp_path, "topics", "describe", "--topic", "b", "--format", "json").stdout.splitlines()
    ] == ["b"]
    fc(tmp_path, "consume", "b", "--group", "h", "--from-beginning", "--no-follow")
    groups = fc(tmp_path, "groups", "describe", "--all-groups", "--format", "json").stdout.decode().splitlines()
    assert [json.loads(x)["group"] for x in groups] == ["g", "h"] and json.loads(groups[0]) == group
    none = fc(tmp_path, "groups", "describe", check=False)
    assert none.returncode == 2 and "--all-groups" in none.stderr.decode()
    bad = fc(tmp_path, "topics", "list", "--format", "xml", check=False)
    assert bad.returncode == 2 and bad.stderr.decode().count("\n") == 1


def test_consume_json_into_produce_json_copies_records_byte_for_byte(tmp_path):
    originals = [
        (bytes(range(256)), b"\xff\xfe", [("h", b"\x00\x80"), ("h", b"text")], 5),
        ("héllo".encode(), None, [], 6),
        (None, b"gone", [], 7),  # a tombstone
        (b"", b"k", [], 8),  # an empty value, not a tombstone
    ]
    with Producer(str(tmp_path)) as p:
        for value, key, headers, ts in originals:
            p.send("src", value, key=key, headers=headers, timestamp_ms=ts)
    dumped = fc(tmp_path, "consume", "src", "--from-beginning", "--no-follow", "--format", "json").stdout
    fc(tmp_path, "produce", "copy", "--format", "json", input=dumped)
    with Consumer("copy", root=str(tmp_path), auto_offset_reset="earliest") as c:
        got = [r for recs in c.poll(timeout_ms=5000).values() for r in recs]
    assert [(r.value, r.key, r.headers, r.timestamp) for r in got] == originals
    for line, message in [
        (b"not json\n", "line 1 is not a JSON object"),
        (b'{"key": "k"}\n', 'with a "value"'),
        (b'{"value": "!!", "value_encoding": "base64"}\n', "value is not valid base64"),
        (b'{"value": "x", "value_encoding": "hex"}\n', 'must be "utf-8" or "base64"'),
        (b'{"value": "x", "headers": [{"key": "h", "value": null}]}\n', "header values are bytes, never null"),
        (b'{"value": "x", "timestamp": "soon"}\n', "timestamp must be milliseconds"),
        (b'{"value": "\\udc80"}\n', "value is not UTF-8 text"),
    ]:
        bad = fc(tmp_path, "produce", "copy", "--format", "json", input=line, check=False)
        assert bad.returncode == 2 and message in bad.stderr.decode(), bad.stderr.decode()
    mixed = fc(tmp_path, "produce", "copy", "--format", "json", "--property", "parse.key=true", input=dumped, check=False)
    assert mixed.returncode == 2 and "a --format json line names its fields" in mixed.stderr.decode()
