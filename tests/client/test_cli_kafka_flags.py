"""Kafka's console tools' flags on the filechannel command, run through the console script's entry point
(tests/cli_helpers.py), as a real console script where a command waits.

Modelled on what ConsoleConsumerTest / ConsoleProducerTest / ResetConsumerGroupOffsetTest /
DeleteConsumerGroupsTest check: the console consumer starts at the end and waits, its flags
and --property formatting; the producer's parse.key; reset-offsets scenarios with dry-run,
execute and clamping; group deletion; Kafka's dotted topic configs.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from filechannel.cli.kafka import PRODUCER_PROPERTIES, LineFormatError, LineReader, parse_properties
from filechannel.client import Admin, Consumer, Producer, TopicPartition
from filechannel.client.group import list_groups, read_group
from filechannel.engine.position import PositionStore
from filechannel.errors import ConfigError

from ..cli_helpers import SCRIPT, fc


def _send(root, topic, values, partition=None, key=None):
    with Producer(str(root)) as p:
        for v in values:
            p.send(topic, value=v, key=key, partition=partition)


def test_consume_starts_at_the_end_and_waits_for_new_records(tmp_path):
    Admin(tmp_path).create_topic("t", partitions=1)
    _send(tmp_path, "t", [b"old"])
    env = {**os.environ, "FILECHANNEL_ROOT": str(tmp_path)}
    proc = subprocess.Popen(
        [str(SCRIPT), "consume", "--topic", "t", "--max-messages", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        deadline = time.monotonic() + 60
        i = 0
        while proc.poll() is None and time.monotonic() < deadline:
            _send(tmp_path, "t", [b"new-%d" % i])  # until the waiting consumer, positioned at the end, sees one
            i += 1
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()
    assert out.startswith(b"new-") and out.count(b"\n") == 1  # never the record there before it started
    assert b"Processed a total of 1 messages" in err


def test_timeout_ms_ends_an_idle_consumer_and_from_beginning_starts_at_the_first_record(tmp_path):
    _send(tmp_path, "t", [b"a", b"b"])
    proc = fc(tmp_path, "consume", "--topic", "t", "--from-beginning", "--timeout-ms", "300")
    assert proc.stdout == b"a\nb\n" and b"Processed a total of 2 messages" in proc.stderr
    assert fc(tmp_path, "consume", "--topic", "t", "--timeout-ms", "300").stdout == b""  # from the end


def test_partition_and_offset(tmp_path):
    Admin(tmp_path).create_topic("t", partitions=2)
    _send(tmp_path, "t", [b"p0-%d" % i for i in range(3)], partition=0)
    _send(tmp_path, "t", [b"p1-%d" % i for i in range(5)], partition=1)
    got = fc(tmp_path, "consume", "--topic", "t", "--partition", "1", "--offset", "2", "--max-messages", "2").stdout
    assert got == b"p1-2\np1-3\n"
    got = fc(tmp_path, "consume", "--topic", "t", "--partition", "0", "--from-beginning", "--timeout-ms", "300").stdout
    assert got == b"p0-0\np0-1\np0-2\n"
    got = fc(tmp_path, "consume", "--topic", "t", "--partition", "1", "--offset", "earliest", "--max-messages", "1").stdout
    assert got == b"p1-0\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--offset", "3"], "the partition is required when --offset is specified"),
        (["--partition", "0", "--group", "g"], "--group and --partition cannot be specified together"),
        (["--partition", "0", "--offset", "1", "--from-beginning"], "--from-beginning and --offset cannot"),
        (["--partition", "0", "--offset", "-4"], "the offset '-4' is incorrect"),
        (["--property", "print.colour=true"], "unknown --property 'print.colour'"),
        (["--property", "print.key=yes"], "print.key must be true or false"),
    ],
)
def test_consumer_flag_combinations_kafka_refuses(tmp_path, args, message):
    _send(tmp_path, "t", [b"x"])
    proc = fc(tmp_path, "consume", "--topic", "t", "--timeout-ms", "100", *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr.decode() and "Traceback" not in proc.stderr.decode()


def test_print_properties_follow_kafkas_default_formatter(tmp_path):
    Admin(tmp_path).create_topic("t", partitions=1)
    with Producer(str(tmp_path)) as p:
        p.send("t", value=b"v1", key=b"k1", timestamp_ms=1234, headers=[("h", b"x")])
        p.send("t", value=b"v2", timestamp_ms=1235)
    base = ["consume", "--topic", "t", "--from-beginning", "--timeout-ms", "300"]
    assert fc(tmp_path, *base, "--property", "print.key=true").stdout == b"k1\tv1\nnull\tv2\n"
    got = fc(
        tmp_path,
        *base,
        "--property",
        "print.key=true",
        "--property",
        "key.separator=:",
        "--property",
        "print.timestamp=true",
        "--property",
        "print.offset=true",
        "--property",
        "print.partition=true",
        "--property",
        "print.headers=true",
        "--property",
        "null.literal=-",
    ).stdout
    assert got == b"CreateTime:1234:Partition:0:Offset:0:h:x:k1:v1\nCreateTime:1235:Partition:0:Offset:1:NO_HEADERS:-:v2\n"


def test_produce_with_kafkas_flags(tmp_path):
    fc(tmp_path, "produce", "--topic", "t", "--property", "parse.key=true", input=b"k1\tv1\nk2\tv2\n")
    fc(tmp_path, "produce", "--topic", "t", "--property", "parse.key=true", "--property", "key.separator=:", input=b"k3:v3\n")
    got = fc(tmp_path, "consume", "--topic", "t", "--from-beginning", "--timeout-ms", "300", "--property", "print.key=true")
    assert sorted(got.stdout.splitlines()) == [b"k1\tv1", b"k2\tv2", b"k3\tv3"]
    bad = fc(tmp_path, "produce", "--topic", "t", "--property", "parse.key=true", input=b"no-separator\n", check=False)
    assert bad.returncode != 0 and "line 1 has no key separator '\\t'" in bad.stderr.decode()
    fc(tmp_path, "produce", "--topic", "u", "--property", "parse.key=true", "--property", "ignore.error=true", input=b"whole\n")
    got = fc(tmp_path, "consume", "--topic", "u", "--from-beginning", "--timeout-ms", "300", "--property", "print.key=true")
    assert got.stdout == b"null\twhole\n"


def _group_with_offsets(root):
    """Group g has committed offsets 3 and 1 on t's partitions, each holding 6 records."""
    Admin(root).create_topic("t", partitions=2)
    for p in (0, 1):
        _send(root, "t", [b"%d" % i for i in range(6)], partition=p)

    c = Consumer(root=str(root), group_id="g", enable_auto_commit=False)
    c.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
    c.commit({TopicPartition("t", 0): 3, TopicPartition("t", 1): 1})
    c.close(autocommit=False)


def _committed(root):
    return {(tp.topic, tp.partition): off for tp, off in read_group(str(root), "g")[1].items()}


@pytest.mark.parametrize(
    ("scenario", "want"),
    [
        (["--to-earliest"], {("t", 0): 0, ("t", 1): 0}),
        (["--to-latest"], {("t", 0): 6, ("t", 1): 6}),
        (["--to-offset", "4"], {("t", 0): 4, ("t", 1): 4}),
        (["--shift-by", "-2"], {("t", 0): 1, ("t", 1): 0}),  # 1 - 2 is clamped to the first offset
        (["--shift-by", "4"], {("t", 0): 6, ("t", 1): 5}),  # 3 + 4 is clamped to the end
        (["--to-current"], {("t", 0): 3, ("t", 1): 1}),
        (["--to-datetime", "2000-01-01T00:00:00.000"], {("t", 0): 0, ("t", 1): 0}),
        (["--to-datetime", "2999-01-01T00:00:00.000"], {("t", 0): 6, ("t", 1): 6}),
    ],
)
def test_reset_offsets_scenarios_dry_run_then_execute(tmp_path, scenario, want):
    _group_with_offsets(tmp_path)
    before = _committed(tmp_path)
    dry = fc(tmp_path, "groups", "reset-offsets", "--group", "g", "--topic", "t", *scenario, "--dry-run")
    rows = [line.split() for line in dry.stdout.decode().splitlines()[1:]]
    assert {(r[1], int(r[2])): int(r[3]) for r in rows} == want
    assert _committed(tmp_path) == before  # a dry run changes nothing
    plain = fc(tmp_path, "groups", "reset-offsets", "--group", "g", "--topic", "t", *scenario)
    assert "No action will be performed" in plain.stderr.decode() and _committed(tmp_path) == before
    fc(tmp_path, "groups", "reset-offsets", "g", "--topic", "t", *scenario, "--execute")
    assert _committed(tmp_path) == want


def test_reset_offsets_of_some_partitions_and_clamping_warnings(tmp_path):
    _group_with_offsets(tmp_path)
    # As in Kafka, a group that does not exist yet can be given its starting offsets.
    fc(tmp_path, "groups", "reset-offsets", "--group", "new", "--topic", "t", "--to-offset", "2", "--execute")
    assert {tp.partition: off for tp, off in read_group(str(tmp_path), "new")[1].items()} == {0: 2, 1: 2}
    proc = fc(tmp_path, "groups", "reset-offsets", "--group", "g", "--topic", "t:1", "--to-offset", "99", "--execute")
    assert "New offset (99) is higher than latest offset for t-1. Value will be set to 6" in proc.stderr.decode()
    assert _committed(tmp_path) == {("t", 0): 3, ("t", 1): 6}
    for args, message in [
        (["--topic", "t", "--to-earliest", "--to-latest"], "exactly one of"),
        (["--to-earliest"], "--all-topics"),
        (["--topic", "t:7", "--to-earliest"], "t has partitions 0 to 1"),
        (["--topic", "t:1,x", "--to-earliest"], "Invalid partition 'x' specified in topic arg 't:1,x'"),
        (["--topic", "t", "--to-earliest", "--dry-run", "--execute"], "--dry-run and --execute cannot"),
    ]:
        bad = fc(tmp_path, "groups", "reset-offsets", "--group", "g", *args, check=False)
        assert bad.returncode != 0 and message in bad.stderr.decode(), bad.stderr.decode()


def _live_member(root):
    """A real consumer process in group g, alive until its stdin closes."""
    code = (
        "import sys\n"
        "from filechannel.client import Consumer\n"
        f"c = Consumer('t', root={str(root)!r}, group_id='g')\n"
        "c.poll(timeout_ms=100)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
        "c.close()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def test_reset_and_delete_are_refused_while_the_group_has_a_live_member(tmp_path):
    _group_with_offsets(tmp_path)
    member = _live_member(tmp_path)
    try:
        for args in (["reset-offsets", "--group", "g", "--all-topics", "--to-earliest", "--execute"], ["delete", "--group", "g"]):
            proc = fc(tmp_path, "groups", *args, check=False)
            assert proc.returncode != 0 and "inactive" in proc.stderr.decode(), proc.stderr.decode()
        assert list_groups(str(tmp_path)) == ["g"]
    finally:
        member.stdin.close()
        member.wait(timeout=60)
    fc(tmp_path, "groups", "reset-offsets", "--group", "g", "--all-topics", "--to-earliest", "--execute")
    assert set(_committed(tmp_path).values()) == {0}


def test_delete_removes_the_group_and_its_durable_positions(tmp_path):
    _group_with_offsets(tmp_path)
    assert "group.g" in PositionStore(str(tmp_path / "t" / "0")).names()
    proc = fc(tmp_path, "groups", "delete", "--group", "g")
    assert "Deletion of requested consumer groups ('g') was successful." in proc.stdout.decode()
    assert list_groups(str(tmp_path)) == []
    assert all("group.g" not in PositionStore(str(tmp_path / "t" / str(p))).names() for p in (0, 1))
    missing = fc(tmp_path, "groups", "delete", "g", check=False)
    assert missing.returncode != 0 and "no consumer group 'g'" in missing.stderr.decode()


def test_topics_create_takes_kafkas_dotted_configs(tmp_path):
    proc = fc(
        tmp_path,
        "topics",
        "create",
        "--topic",
        "t",
        "--partitions",
        "2",
        "--replication-factor",
        "1",
        "--config",
        "retention.ms=3600000",
        "--config",
        "retention.bytes=-1",
        "--config",
        "segment.bytes=1048576",
        "--config",
        "max.message.bytes=2048",
        "--config",
        "compression.type=uncompressed",
        "--config",
        "cleanup.policy=delete",
        "--config",
        "min.insync.replicas=2",
    )
    assert "min.insync.replicas means nothing on one machine" in proc.stderr.decode()
    config = Admin(tmp_path).describe_topic("t").config
    assert config["retention_ms"] == 3600000 and config.get("retention_bytes") is None
    assert config["segment_bytes"] == 1048576 and config["max_record_bytes"] == 2048 and config["compression"] == "none"
    for item, message in [
        ("compression.type=gzip", "zstd or not at all"),
        ("cleanup.policy=squash", "must be delete, compact, or compact,delete"),
        ("retention.msec=1", "unknown topic config 'retention.msec'"),
        ("segment.bytes=big", "must be an integer"),
    ]:
        bad = fc(tmp_path, "topics", "create", "u", "--config", item, check=False)
        assert bad.returncode != 0 and message in bad.stderr.decode(), bad.stderr.decode()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_ends_a_group_consumer_and_commits_what_it_printed(tmp_path, sig, code):
    Admin(tmp_path).create_topic("t", partitions=1)
    _send(tmp_path, "t", [b"a", b"b", b"c"])
    env = {**os.environ, "FILECHANNEL_ROOT": str(tmp_path)}
    proc = subprocess.Popen(
        [str(SCRIPT), "consume", "--topic", "t", "--group", "g", "--from-beginning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    try:
        assert [proc.stdout.readline() for _ in range(3)] == [b"a\n", b"b\n", b"c\n"]  # now waiting for more
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code and b"Processed a total of 3 messages" in err and b"Traceback" not in err
    assert _committed(tmp_path) == {("t", 0): 3}


def test_include_reads_every_topic_whose_whole_name_matches(tmp_path):
    for topic in ("events", "ev2", "xevents"):
        _send(tmp_path, topic, [topic.encode()])
    got = fc(tmp_path, "consume", "--include", "ev.*", "--from-beginning", "--timeout-ms", "300").stdout
    assert sorted(got.split()) == [b"ev2", b"events"]
    older = fc(tmp_path, "consume", "--whitelist", "ev.*", "--from-beginning", "--timeout-ms", "300").stdout
    assert sorted(older.split()) == [b"ev2", b"events"]  # Kafka 3's name for --include
    for args, message in [
        (["t", "--include", "ev.*"], "either a topic or --include"),
        (["--include", "ev.*", "--partition", "0"], "the topic is required when partition is specified"),
        (["--include", "("], "is not a regular expression"),
    ]:
        bad = fc(tmp_path, "consume", *args, "--timeout-ms", "100", check=False)
        assert bad.returncode != 0 and message in bad.stderr.decode(), bad.stderr.decode()


# -- the console producer's LineMessageReader (parse.headers, null.marker), ported from Kafka's LineMessageReaderTest


def _reader(**props):
    """A LineReader with Kafka's test defaults (parse.key and parse.headers true) and ``props`` (dots as underscores)."""
    items = ["parse.key=true", "parse.headers=true", *(f"{k.replace('_', '.')}={v}" for k, v in props.items())]
    return LineReader(parse_properties(items, PRODUCER_PROPERTIES, "produce"))


def _read_all(reader, text):
    return [reader.read(line, n) for n, line in enumerate(text.split(b"\n"), 1)]


def test_line_reader_headers_key_and_value():
    assert _read_all(_reader(), b"headerKey0:headerValue0,headerKey1:headerValue1\tkey0\tvalue0") == [
        (b"key0", b"value0", [("headerKey0", b"headerValue0"), ("headerKey1", b"headerValue1")])
    ]
    assert _read_all(_reader(), b":\t\t") == [(b"", b"", [("", b"")])]  # the minimal valid input
    assert _read_all(_reader(parse_headers="false"), b"key\t") == [(b"key", b"", [])]
    assert _read_all(_reader(parse_key="false"), b"headerKey:headerValue\tvalue") == [
        (None, b"value", [("headerKey", b"headerValue")])
    ]
    long = _reader(
        **{"key_separator": "\t\t", "headers_delimiter": "\t\t", "headers_separator": "---", "headers_key_separator": "::::"}
    )
    assert _read_all(long, b"headerKey0.0::::headerValue0.0---headerKey1.0::::\t\tkey\t\tvalue") == [
        (b"key", b"value", [("headerKey0.0", b"headerValue0.0"), ("headerKey1.0", b"")])
    ]
    custom = _reader(key_separator="#", headers_delimiter="!", headers_separator="&", headers_key_separator=":")
    assert _read_all(custom, b"h0.0:v0.0&h0.1:v0.1!key0#value0\nh1.0:v1.0!key1#value1") == [
        (b"key0", b"value0", [("h0.0", b"v0.0"), ("h0.1", b"v0.1")]),
        (b"key1", b"value1", [("h1.0", b"v1.0")]),
    ]


def test_line_reader_errors_and_ignore_error():
    reader = _reader()
    with pytest.raises(LineFormatError, match="line 2 has no key separator"):
        _read_all(reader, b"h0:v0\tkey0\tvalue0\nh1:v1\tkey1[MISSING-DELIMITER]value1")
    with pytest.raises(LineFormatError, match="line 1: the header b'key-val' has no header key separator"):
        reader.read(b"key-val\tkey0\tvalue0", 1)
    lenient = _reader(ignore_error="true")
    assert _read_all(
        lenient,
        b"h0:v0\tkey0\tvalue0\n"
        b"h1:v1,h2:v2[MISSING-HEADER-DELIMITER]key1\tvalue1\n"
        b"h3:v3\tkey2[MISSING-KEY-DELIMITER]value2\n"
        b"h4:v4[MISSING-HEADER-DELIMITER]key3[MISSING-KEY-DELIMITER]value3",
    ) == [
        (b"key0", b"value0", [("h0", b"v0")]),
        (None, b"value1", [("h1", b"v1"), ("h2", b"v2[MISSING-HEADER-DELIMITER]key1")]),
        (None, b"key2[MISSING-KEY-DELIMITER]value2", [("h3", b"v3")]),
        (None, b"h4:v4[MISSING-HEADER-DELIMITER]key3[MISSING-KEY-DELIMITER]value3", []),
    ]
    # Kafka gives a pair without separator a null value; a header value is bytes here: empty.
    assert lenient.read(b"key-val\tkey0\tvalue0", 1) == (b"key0", b"value0", [("key-val", b"")])


def test_line_reader_null_marker():
    plain = _reader(null_marker="<NULL>", parse_headers="false")
    assert _read_all(plain, b"key\t\nkey\t<NULL>\nkey\t<NULL>value\n<NULL>\tvalue\n<NULL>\t<NULL>") == [
        (b"key", b"", []),
        (b"key", None, []),
        (b"key", b"<NULL>value", []),
        (None, b"value", []),
        (None, None, []),
    ]
    with_headers = _reader(null_marker="<NULL>")
    assert _read_all(with_headers, b"h0:v0,h1:v1\t<NULL>\tvalue\n<NULL>\tkey\t<NULL>\nh0:,h1:v1\t<NULL>\t<NULL>") == [
        (None, b"value", [("h0", b"v0"), ("h1", b"v1")]),
        (b"key", None, []),
        (None, None, [("h0", b""), ("h1", b"v1")]),
    ]
    with pytest.raises(LineFormatError, match="a header name may not be the null marker"):
        with_headers.read(b"<NULL>:v0,h1:v1\tkey\tvalue", 1)
    with pytest.raises(LineFormatError, match="header values are bytes here, never null"):
        with_headers.read(b"h0:<NULL>,h1:v1\tkey\t<NULL>", 1)
    assert _reader().read(b"<NULL>:v0,h1:v1\tkey\tvalue", 1) == (b"key", b"value", [("<NULL>", b"v0"), ("h1", b"v1")])


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"headers_delimiter": "\t", "headers_separator": "\t"}, "headers.delimiter and headers.separator may not be equal"),
        ({"headers_key_separator": "\t"}, "headers.delimiter and headers.key.separator may not be equal"),
        ({"headers_key_separator": ","}, "headers.separator and headers.key.separator may not be equal"),
        ({"headers_delimiter": "-", "headers_separator": ":", "headers_key_separator": "/", "null_marker": "-"},
         "null.marker and headers.delimiter may not be equal"),
        ({"headers_delimiter": "-", "headers_separator": ":", "headers_key_separator": "/", "null_marker": ":"},
         "null.marker and headers.separator may not be equal"),
        ({"headers_delimiter": "-", "headers_separator": ":", "headers_key_separator": "/", "null_marker": "/"},
         "null.marker and headers.key.separator may not be equal"),
    ],
)  # fmt: skip
def test_line_reader_refuses_colliding_separators(props, message):
    with pytest.raises(ConfigError, match=message):
        _reader(**props)


def test_produce_parses_headers_and_consume_prints_them(tmp_path):
    lines = b"h1:v1,h2:v2\tk1\tone\n\tk2\ttwo\n"  # the second line: no headers (an empty list)
    fc(tmp_path, "produce", "t", "--reader-property", "parse.headers=true", "--property", "parse.key=true", input=lines)
    with Consumer("t", root=str(tmp_path), auto_offset_reset="earliest") as c:
        got = [r for recs in c.poll(timeout_ms=5000).values() for r in recs]
    assert [(r.key, r.value, r.headers) for r in got] == [(b"k1", b"one", [("h1", b"v1"), ("h2", b"v2")]), (b"k2", b"two", [])]
    base = ["consume", "t", "--from-beginning", "--no-follow", "--formatter-property", "print.headers=true"]
    assert fc(tmp_path, *base).stdout == b"h1:v1,h2:v2\tone\nNO_HEADERS\ttwo\n"
    # A tombstone from the console, as Kafka's null.marker makes one.
    fc(tmp_path, "produce", "t", "--property", "parse.key=true", "--property", "null.marker=NULL", input=b"k1\tNULL\n")
    last = fc(tmp_path, "consume", "t", "--partition", "0", "--offset", "2", "--no-follow", "--property", "print.key=true")
    assert last.stdout == b"k1\tnull\n"
    bad = fc(tmp_path, "produce", "t", "--property", "parse.headers=true", input=b"h1=v1\tvalue\n", check=False)
    assert bad.returncode == 2 and "line 1: the header b'h1=v1' has no header key separator ':'" in bad.stderr.decode()


# -- reset-offsets --by-duration / --from-file / --export, delete-offsets (ResetConsumerGroupOffsetTest,
# DeleteOffsetsConsumerGroupCommandIntegrationTest)


def test_reset_offsets_by_duration(tmp_path):
    Admin(tmp_path).create_topic("t", partitions=1)
    now_ms = int(time.time() * 1000)
    with Producer(str(tmp_path)) as p:
        for i in range(3):
            p.send("t", b"old-%d" % i, timestamp_ms=now_ms - 2 * 3600_000)  # two hours ago
        for i in range(2):
            p.send("t", b"new-%d" % i, timestamp_ms=now_ms - 60_000)  # a minute ago
    plan = {
        "PT30M": 3,  # the first record of the last half hour
        "P1D": 0,  # everything is younger than a day: the earliest
        "PT1S": 5,  # nothing that recent: the end, as Kafka falls back to the latest offset
        "PT2H30M": 0,
    }
    for duration, want in plan.items():
        fc(tmp_path, "groups", "reset-offsets", "--group", "g", "--topic", "t", "--by-duration", duration, "--execute")
        assert _committed(tmp_path) == {("t", 0): want}, duration
    for bad in ("30M", "PT", "P1DT", "PT15X", "1 hour"):
        proc = fc(tmp_path, "groups", "reset-offsets", "g", "--topic", "t", "--by-duration", bad, check=False)
        assert proc.returncode != 0 and "is not a duration like PT15M" in proc.stderr.decode(), bad


def test_reset_offsets_export_then_import_the_plan(tmp_path):
    _group_with_offsets(tmp_path)  # committed 3 and 1, 6 records in each partition
    export = fc(tmp_path, "groups", "reset-offsets", "--group", "g", "--all-topics", "--to-offset", "2", "--dry-run", "--export")
    assert export.stdout == b"t,0,2\nt,1,2\n" and _committed(tmp_path) == {("t", 0): 3, ("t", 1): 1}
    plan = tmp_path / "plan.csv"
    plan.write_bytes(export.stdout)
    fc(tmp_path, "groups", "reset-offsets", "--group", "g", "--from-file", str(plan), "--execute")
    assert _committed(tmp_path) == {("t", 0): 2, ("t", 1): 2}
    # The multi-group layout, one group's lines taken; offsets outside a partition are clamped as ever.
    plan.write_text("g,t,0,99\nother,t,1,5\ng,t,1,4\n")
    proc = fc(tmp_path, "groups", "reset-offsets", "g", "--from-file", str(plan), "--execute")
    assert "New offset (99) is higher than latest offset for t-0. Value will be set to 6" in proc.stderr.decode()
    assert _committed(tmp_path) == {("t", 0): 6, ("t", 1): 4}
    for content, message in [
        ("other,t,0,1\n", "No reset plan for group g found"),
        ("t,zero,1\n", "line 1: 't,zero,1' is not topic,partition,offset"),
        ("t,5,1\n", "t has partitions 0 to 1, not 5"),
        ("missing,0,1\n", "missing"),
    ]:
        plan.write_text(content)
        bad = fc(tmp_path, "groups", "reset-offsets", "g", "--from-file", str(plan), "--execute", check=False)
        assert bad.returncode != 0 and message in bad.stderr.decode(), bad.stderr.decode()
    assert _committed(tmp_path) == {("t", 0): 6, ("t", 1): 4}
    both = fc(tmp_path, "groups", "reset-offsets", "g", "--from-file", str(plan), "--topic", "t", check=False)
    assert both.returncode == 2 and "no --topic or --all-topics" in both.stderr.decode()


def test_delete_offsets_of_an_inactive_group(tmp_path):
    _group_with_offsets(tmp_path)
    proc = fc(tmp_path, "groups", "delete-offsets", "--group", "g", "--topic", "t:1")
    assert proc.stdout.decode().splitlines() == [
        "Request succeeded for deleting offsets from group g.",
        "",
        f"{'TOPIC':<15} {'PARTITION':<10} {'STATUS':<15}",
        f"{'t':<15} {'1':<10} {'Successful':<15}",
    ]
    assert _committed(tmp_path) == {("t", 0): 3}  # offsets.json and the durable position both forgot t[1]
    assert "group.g" not in PositionStore(str(tmp_path / "t" / "1")).names()
    assert "group.g" in PositionStore(str(tmp_path / "t" / "0")).names()
    # The group now starts t[1] by its auto_offset_reset, and t[0] where it committed.
    with Consumer("t", root=str(tmp_path), group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        first: dict[int, int] = {}
        deadline = time.monotonic() + 10
        while len(first) < 2 and time.monotonic() < deadline:
            for tp, recs in c.poll(timeout_ms=500).items():
                first.setdefault(tp.partition, recs[0].offset)
    assert first == {0: 3, 1: 0}
    fc(tmp_path, "groups", "delete-offsets", "g", "--topic", "t")
    assert _committed(tmp_path) == {}
    missing = fc(tmp_path, "groups", "delete-offsets", "--group", "nope", "--topic", "t", check=False)
    assert missing.returncode != 0 and "no consumer group 'nope'" in missing.stderr.decode()


def test_delete_offsets_is_refused_while_a_member_is_alive_and_works_for_a_deleted_topic(tmp_path):
    _group_with_offsets(tmp_path)
    member = _live_member(tmp_path)
    try:
        proc = fc(tmp_path, "groups", "delete-offsets", "g", "--topic", "t", check=False)
        assert proc.returncode != 0 and "inactive" in proc.stderr.decode()
    finally:
        member.stdin.close()
        member.wait(timeout=60)
    assert set(_committed(tmp_path)) == {("t", 0), ("t", 1)}  # kept (the member committed what it read on close)
    Admin(tmp_path).delete_topic("t")
    fc(tmp_path, "groups", "delete-offsets", "g", "--topic", "t")  # the stale offsets of a topic that is gone
    assert read_group(str(tmp_path), "g")[1] == {}


def test_client_properties_by_kafkas_names_and_the_other_console_flags(tmp_path):
    # ConsoleProducerTest / ConsoleConsumerTest: --producer-property, --request-required-acks, --sync,
    # --consumer-property, --isolation-level reach the client; a name the client does not know is an error.
    fc(
        tmp_path,
        "produce",
        "t",
        "--producer-property",
        "linger.ms=5",
        "--command-property",
        "client.id=console",
        "--request-required-acks",
        "all",
        "--sync",
        input=b"a\nb\nc\n",
    )
    got = fc(
        tmp_path,
        "consume",
        "t",
        "--from-beginning",
        "--no-follow",
        "--consumer-property",
        "max.poll.records=1",
        "--isolation-level",
        "read_committed",
    )
    assert got.stdout == b"a\nb\nc\n"
    for args, message in [
        (
            ["produce", "t", "--producer-property", "linger.msx=5"],
            "Producer has no setting 'linger_msx'; did you mean 'linger_ms'?",
        ),
        (["produce", "t", "--producer-property", "key.serializer=org.apache.kafka.StringSerializer"], "the console sends"),
        (["produce", "t", "--request-required-acks", "2"], "acks must be 0, 1, -1 or 'all'"),
        (["consume", "t", "--consumer-property", "group.id=g"], "use --group"),
        (["consume", "t", "--consumer-property", "max.poll.records"], "is not NAME=VALUE"),
    ]:
        bad = fc(tmp_path, *args, input=b"x\n", check=False)
        assert bad.returncode != 0 and message in bad.stderr.decode(), (args, bad.stderr.decode())
        assert bad.stderr.decode().count("\n") == 1, bad.stderr.decode()
    typo = fc(tmp_path, "produce", "new", "--producer-property", "lingr.ms=5", input=b"x\n", check=False)
    assert typo.returncode != 0 and "new" not in Admin(tmp_path).list_topics()  # a typo makes no topic


@pytest.mark.parametrize(
    "args, says",
    [
        (("groups", "reset-offsets", "--group", "g", "--all-topics", "--to-datetime", "nope", "--execute"), "--to-datetime"),
        (("consume", "t", "--consumer-property", "bogus.name=1", "--no-follow"), "bogus"),
        (("topics", "create", "u", "-c", "retention.ms=abc"), "retention.ms"),
        (("produce", "t", "--property", "foo=1"), "foo"),
    ],
)
def test_a_bad_value_is_a_usage_error_exit_2_in_one_line(tmp_path, args, says):
    """README, "Command line": exit 2 for a bad option or argument, 1 for anything else."""
    Admin(tmp_path).create_topic("t")
    proc = fc(tmp_path, *args, input=b"", check=False)
    [line] = proc.stderr.decode().splitlines()
    assert proc.returncode == 2 and line.startswith("error: ") and says in line, proc.stderr
    assert not (tmp_path / "u").exists()
