"""Origins: many roots tiering into one bucket URL, each under a prefix of its own (issue 37).

Real roots with real daemons (``run(once=True)``, idle active segments sealed so every record is
uploaded) tier into one URL.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from filechannel.client import Admin, Producer
from filechannel.errors import ConfigError, InvalidNameError
from filechannel.root import RootLayout
from filechannel.tiering import open_storage
from filechannel.tiering.daemon import TieringDaemon

from ..client.cli_helpers import fc
from .tier_helpers import SMALL

TOPIC_SETTINGS = {**SMALL, "local_retention_bytes": 0}


def edge_root(tmp_path: Path, origin: str | None, url: str, options: dict, partitions: int = 2) -> Path:
    """A root with ``origin`` (None: the default origin) and a tiered topic ``clicks`` at ``url``."""
    root = tmp_path / (origin or "default-root")
    if origin is not None:
        Admin(root).set_origin(origin)
    Admin(root).create_topic("clicks", partitions, tier=url, tier_options=options, **TOPIC_SETTINGS)
    return root


def produce(root: Path, origin: str, count: int, start: int = 0, partitions: int = 2, timestamp: int | None = None) -> None:
    with Producer(root=root) as producer:
        for i in range(start, start + count):
            producer.send("clicks", value(origin, i), partition=i % partitions, timestamp_ms=timestamp)


def value(origin: str, i: int) -> bytes:
    return f"{origin}-{i:06d}-".encode() + bytes(range(i % 7, i % 7 + 40))


def upload_all(root: Path) -> None:
    """One daemon pass that seals the idle active segments first: every record sent is uploaded."""
    with TieringDaemon(root, roll_idle_ms=0) as daemon:
        report = daemon.run(once=True)
    assert report.failures == [] and report.uploaded > 0


def listing(url: str, options: dict) -> dict[str, int]:
    with open_storage(url, **options) as storage:
        return {o.name: o.length for o in storage.list("")}


def test_a_url_holds_one_layout_default_origin_or_named_origins(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    plain = edge_root(tmp_path, None, url, {})
    produce(plain, "x", 10)
    upload_all(plain)
    named = edge_root(tmp_path, "edge-1", url, {})
    produce(named, "edge-1", 10)
    with TieringDaemon(named) as daemon:
        failures = daemon.run(once=True).failures
    assert failures and all("claimed by a root without an origin" in f and "edge-1" in f for f in failures)
    assert listing(f"{url}/edge-1", {}) == {}  # nothing of the named root was written (but its registration)
    produce(plain, "x", 10, start=10)
    upload_all(plain)  # which does not stop the default root: the named root never claimed

    other = f"file://{tmp_path}/bucket2"
    first = edge_root(tmp_path / "b2", "edge-2", other, {})
    produce(first, "edge-2", 10)
    upload_all(first)
    late_plain = edge_root(tmp_path / "b2", None, other, {})
    produce(late_plain, "x", 10)
    with TieringDaemon(late_plain) as daemon:
        failures = daemon.run(once=True).failures
    assert failures and all("holds roots with origins (edge-2" in f and "tier.origin" in f for f in failures)
    assert not [n for n in listing(other, {}) if n == ".claim.json" or n.startswith("clicks/")]


def test_the_origin_is_set_before_the_first_tiered_topic_and_must_be_a_name(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for bad in ("", "a.b", "../x", ".hidden", "a/b"):
        with pytest.raises(InvalidNameError):
            Admin(root).set_origin(bad)
    Admin(root).set_origin("edge-1")
    Admin(root).set_origin("edge-1")  # the same again: fine
    assert Admin(root).origin() == "edge-1" and RootLayout(root).tier_config({"tier": "s3://b/fc"}) == {
        "tier": "s3://b/fc/edge-1"
    }
    Admin(root).create_topic("clicks", 1, tier=f"file://{tmp_path}/bucket")
    with pytest.raises(ConfigError, match=r"cannot be set now.*tiered topic"):
        Admin(root).set_origin("edge-2")
    assert fc(root, "config").stdout.decode().splitlines()[-1] == "tier.origin=edge-1"
    fresh = tmp_path / "fresh"
    assert fc(fresh, "config", "tier.origin=edge-9").stdout.decode().splitlines()[-1] == "tier.origin=edge-9"
    bad = fc(fresh, "config", "tier.origin=a.b", check=False)
    assert bad.returncode == 2 and b"no dot" in bad.stderr


def test_two_roots_of_one_origin_are_two_roots_on_one_prefix_and_the_second_refuses(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/bucket"
    first = edge_root(tmp_path / "a", "edge-1", url, {}, partitions=1)
    produce(first, "edge-1", 10, partitions=1)
    upload_all(first)
    second = edge_root(tmp_path / "b", "edge-1", url, {}, partitions=1)
    produce(second, "other", 10, partitions=1)
    with TieringDaemon(second) as daemon:
        failures = daemon.run(once=True).failures
    assert failures and all("is owned by another root" in f and "edge-1" in f for f in failures)
    assert {n.split("/")[0] for n in listing(url, {})} == {".origins", "edge-1"}  # the first root's uploads stand
