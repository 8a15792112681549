"""The settings are typed: a type checker run on a user's code reports a misspelt or mistyped setting.

``ChannelSettings`` (``FileChannel(path, **settings)``) and ``TopicSettings``
(``Admin.create_topic(name, partitions, **settings)``) are TypedDicts beside ``ChannelConfig``,
which validates at run time; the tests here keep the three in step.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import get_type_hints

import pytest

import filechannel
from filechannel import ChannelConfig, ChannelSettings, ConfigError, FileChannel, TopicSettings
from filechannel.client.topics import TOPIC_SETTINGS, validate_topic_config

ROOT = Path(__file__).resolve().parents[1]


def test_channel_settings_are_exactly_the_settings_from_kwargs_accepts_with_their_types():
    names = {f.name for f in dataclasses.fields(ChannelConfig)}
    assert ChannelSettings.__required_keys__ == frozenset()
    assert set(ChannelSettings.__optional_keys__) == names
    # The same types as ChannelConfig's fields (fsync and compression: the Literals it validates).
    assert get_type_hints(ChannelSettings) == get_type_hints(ChannelConfig)
    ChannelConfig.from_kwargs(**{name: getattr(ChannelConfig(), name) for name in ChannelSettings.__optional_keys__})


def test_topic_settings_are_the_settings_a_topic_stores():
    assert TopicSettings.__required_keys__ == frozenset()
    assert tuple(TopicSettings.__annotations__) == TOPIC_SETTINGS
    assert set(TopicSettings.__optional_keys__) < set(ChannelSettings.__optional_keys__)
    for writer_only in set(ChannelSettings.__optional_keys__) - set(TopicSettings.__optional_keys__):
        with pytest.raises(ConfigError, match=rf"unknown topic setting\(s\) {writer_only};"):
            validate_topic_config({writer_only: getattr(ChannelConfig(), writer_only)})


def test_the_settings_are_exported_and_a_misspelt_one_still_fails_at_run_time(tmp_path):
    assert {"ChannelSettings", "TopicSettings"} <= set(filechannel.__all__)
    with pytest.raises(ConfigError, match=r"unknown channel setting\(s\) fsyn; known:"):
        FileChannel(tmp_path / "ch", fsyn="never")  # type: ignore[call-arg]
    assert not os.path.exists(tmp_path / "ch")


USER_CODE = """\
from filechannel import FileChannel, TopicSettings
from filechannel.client import Admin

FileChannel("d", fsync="never", segment_bytes=1 << 20, retention_ms=None, flush_interval=0)
FileChannel("d", fsyn="never")
FileChannel("d", segment_bytes="big")
FileChannel("d", fsync="sometimes")
Admin("r").create_topic("t", 3, exist_ok=True, retention_ms=1000, compression="none")
Admin("r").create_topic("t", flush_interval=0.1)
settings: TopicSettings = {"segment_bytes": 1 << 20, "tier": "file:///tmp/t"}
Admin("r").create_topic("t", **settings)
from filechannel.client import Consumer, Producer
Producer("r", linger_ms=5, acks="all", bootstrap_servers="k:9092", compression_type="gzip", retries=3)
Producer("r", linger_mss=5)
Producer("r", max_request_size="1m")
Consumer("t", root="r", group_id="g", max_poll_interval_ms=60_000, security_protocol="SSL", fetch_min_bytes=1)
Consumer("t", root="r", max_poll_intervall_ms=60_000)
Consumer("t", root="r", allow_auto_create_topics="yes")
with FileChannel("d") as ch, ch.ack_receiver("g") as rx:  # each context manager is its own class
    rx.ack(1)
"""


def test_mypy_reports_a_misspelt_or_mistyped_setting_in_user_code(tmp_path):
    pytest.importorskip("mypy", reason="mypy is in the dev extra")
    (tmp_path / "user.py").write_text(USER_CODE)
    # The checkout under test (the editable install's import hook is invisible to mypy).
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    argv = [sys.executable, "-m", "mypy", "--no-incremental", f"--cache-dir={tmp_path / 'cache'}"]
    argv += ["--follow-imports=silent", "--no-error-summary", "--hide-error-context", "user.py"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    errors: dict[int, str] = {}
    for line in proc.stdout.splitlines():
        name, lineno, kind, message = line.split(":", 3)
        assert name == "user.py" and kind in (" error", " note"), proc.stdout
        if kind == " error":
            errors[int(lineno)] = errors.get(int(lineno), "") + message
    assert sorted(errors) == [5, 6, 7, 9, 14, 15, 17, 18], proc.stdout + proc.stderr
    assert 'Unexpected keyword argument "fsyn"' in errors[5]
    assert '"segment_bytes"' in errors[6] and '"str"; expected "int"' in errors[6]
    assert "\"Literal['sometimes']\"" in errors[7]
    assert 'Unexpected keyword argument "flush_interval"' in errors[9] and '"create_topic"' in errors[9]
    # kafka-python's names, beyond the clients' own arguments, are typed too (kafka_names.ProducerConfigs)
    assert 'Unexpected keyword argument "linger_mss"' in errors[14] and '"Producer"' in errors[14]
    assert '"max_request_size"' in errors[15] and '"str"; expected "int"' in errors[15]
    assert 'Unexpected keyword argument "max_poll_intervall_ms"' in errors[17]
    assert '"allow_auto_create_topics"' in errors[18] and '"str"; expected "bool"' in errors[18]
    # lines 19-20: `with` gives each class itself (``__enter__`` returns Self), so an ack receiver can ack
    assert proc.returncode == 1
