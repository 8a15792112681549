"""The flags Kafka users type for topics that change, configs, deleted records and groups
(kafka-topics --alter, kafka-configs, kafka-delete-records, kafka-consumer-groups), run through the
console script's entry point (tests/cli_helpers.py)."""

from __future__ import annotations

import json

from filechannel.client import Admin, Consumer, Producer, TopicPartition

from ..cli_helpers import fc


def _produce(root, n, partition=0):
    with Producer(root) as p:
        for i in range(n):
            p.send("t", b"%d" % i, partition=partition)


def _error_line(proc):
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_topics_alter_adds_partitions_and_refuses_fewer(tmp_path):
    fc(tmp_path, "topics", "create", "t", "--partitions", "1")
    _produce(tmp_path, 3)
    assert "now has 3 partition(s)" in fc(tmp_path, "topics", "alter", "--topic", "t", "--partitions", "3").stdout.decode()
    assert [p.end_offset for p in Admin(tmp_path).describe_topic("t").partitions] == [3, 0, 0]
    shrink = fc(tmp_path, "topics", "alter", "t", "--partitions", "2", check=False)
    assert shrink.returncode == 1 and "partitions can only be added" in _error_line(shrink)
    bad = fc(tmp_path, "topics", "alter", "t", "--partitions", "0", check=False)
    assert bad.returncode == 2
    missing = fc(tmp_path, "topics", "alter", "nope", "--partitions", "2", check=False)
    assert missing.returncode == 1 and "does not exist" in _error_line(missing)


def test_configs_alter_and_describe_as_kafka_configs(tmp_path):
    fc(tmp_path, "topics", "create", "t", "-c", "segment.bytes=8192")
    done = fc(
        tmp_path,
        "configs",
        "--alter",
        "--entity-type",
        "topics",
        "--entity-name",
        "t",
        "--add-config",
        "retention.ms=60000,retention.bytes=-1",
        "--add-config",
        'tier_options={"a": 1, "b": 2}',
        "--delete-config",
        "segment.bytes",
    )
    assert done.stdout.decode().strip() == "Completed updating config for topic t."
    assert Admin(tmp_path).describe_topic("t").config == {
        "retention_ms": 60000,
        "retention_bytes": None,
        "tier_options": {"a": 1, "b": 2},
    }
    text = fc(tmp_path, "configs", "--describe", "--entity-type", "topics", "--entity-name", "t").stdout.decode()
    assert text.splitlines()[0] == "Dynamic configs for topic t are:" and "  retention.ms=60000" in text.splitlines()
    (line,) = fc(tmp_path, "configs", "--describe", "--topic", "t", "--all", "--format", "json").stdout.decode().splitlines()
    described = json.loads(line)
    assert described["topic"] == "t"
    assert described["configs"]["retention.ms"] == "60000" and described["configs"]["segment.bytes"] == str(64 * 1024 * 1024)
    assert described["configs"]["tier_options"] == {"a": 1, "b": 2}


def test_configs_bad_values_exit_2_and_failed_operations_exit_1(tmp_path):
    fc(tmp_path, "topics", "create", "t")
    for args, message in [
        (["--add-config", "message.timestamp.type=LogAppendTime"], "CreateTime"),
        (["--add-config", "retention.msec=5"], "unknown topic config 'retention.msec'"),
        (["--add-config", "retention.ms=soon"], "must be an integer"),
        (["--add-config", "novalue"], "is not KEY=VALUE"),
        (["--delete-config", "nope"], "unknown topic setting 'nope'"),
    ]:
        proc = fc(tmp_path, "configs", "--alter", "--topic", "t", *args, check=False)
        assert proc.returncode == 2 and message in _error_line(proc), (args, proc.stderr)
    out_of_range = fc(tmp_path, "configs", "--alter", "--topic", "t", "--add-config", "segment.bytes=12", check=False)
    assert out_of_range.returncode == 1 and "segment_bytes must be" in _error_line(out_of_range)
    tier = fc(tmp_path, "configs", "--alter", "--topic", "t", "--add-config", "tier=file:///x", check=False)
    assert tier.returncode == 1 and "cannot change" in _error_line(tier)
    assert fc(tmp_path, "configs", "--topic", "t", check=False).returncode == 2  # neither --describe nor --alter
    assert Admin(tmp_path).describe_topic("t").config == {}


def test_delete_records_with_kafkas_offset_json_file(tmp_path):
    fc(tmp_path, "topics", "create", "t", "--partitions", "2")
    _produce(tmp_path, 10)
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "partitions": [{"topic": "t", "partition": 0, "offset": 4}, {"topic": "t", "partition": 1, "offset": -1}],
                "version": 1,
            }
        )
    )
    done = fc(tmp_path, "delete-records", "--offset-json-file", str(plan), "--bootstrap-server", "x:9092")
    assert done.stdout.decode().splitlines() == [
        "Executing records delete operation",
        "Records delete operation completed:",
        "partition: t-0\tlow_watermark: 4",
        "partition: t-1\tlow_watermark: 0",
    ]
    with Consumer(root=tmp_path, auto_offset_reset="earliest") as c:
        tp = TopicPartition("t", 0)
        assert c.beginning_offsets([tp]) == {tp: 4}
    plan.write_text('{"partitions": [{"topic": "t", "partition": 0}]}')
    bad = fc(tmp_path, "delete-records", "--offset-json-file", str(plan), check=False)
    assert bad.returncode == 2 and "not kafka-delete-records' format" in _error_line(bad)
    plan.write_text('{"partitions": [{"topic": "t", "partition": 5, "offset": 1}], "version": 1}')
    missing = fc(tmp_path, "delete-records", "--offset-json-file", str(plan), check=False)
    assert missing.returncode == 1 and "nothing deleted" in _error_line(missing)
    plan.write_text('{"partitions": [{"topic": "t", "partition": 0, "offset": 99}], "version": 1}')
    past = fc(tmp_path, "delete-records", "--offset-json-file", str(plan), check=False)
    assert past.returncode == 1 and "offsets run to 10" in _error_line(past)


def test_groups_flags_as_kafka_consumer_groups_spells_them_and_lag_without_a_commit(tmp_path):
    fc(tmp_path, "topics", "create", "t", "--partitions", "2")
    _produce(tmp_path, 5)
    with Consumer(root=tmp_path, group_id="g", enable_auto_commit=False) as c:
        c.assign([TopicPartition("t", 0)])
        c.commit({TopicPartition("t", 0): 2})
    assert fc(tmp_path, "groups", "--list").stdout.decode().split() == ["g"]
    text = fc(tmp_path, "groups", "--describe", "--group", "g").stdout.decode()
    rows = [line.split("│") for line in text.splitlines() if line.startswith("│")]
    cells = [[c.strip() for c in row[1:-1]] for row in rows]
    assert ["t", "0", "2", "5", "3", ""] in cells and ["t", "1", "-", "0", "-", ""] in cells
    (line,) = fc(tmp_path, "groups", "--describe", "--group", "g", "--format", "json").stdout.decode().splitlines()
    lags = {r["partition"]: (r["committed"], r["lag"]) for r in json.loads(line)["partitions"]}
    assert lags == {0: (2, 3), 1: (None, None)}
    both = fc(tmp_path, "groups", "--list", "--delete", "--group", "g", check=False)
    assert both.returncode == 2
    mixed = fc(tmp_path, "groups", "--list", "list", check=False)
    assert mixed.returncode == 2
    assert "was successful" in fc(tmp_path, "groups", "--delete", "--group", "g").stdout.decode()
    assert fc(tmp_path, "groups", "list").stdout.decode() == ""
    gone = fc(tmp_path, "groups", "--delete", "--group", "g", check=False)
    assert gone.returncode == 1 and "no consumer group 'g'" in _error_line(gone)
