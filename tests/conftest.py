"""Shared test settings: hypothesis profiles (CI runs more examples); the session's SeaweedFS server."""

import os

import pytest
from hypothesis import HealthCheck, settings

from filechannel.bench.seaweed import running_seaweed

settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session")
def seaweed():
    """The session's SeaweedFS server (started on first use): the tier-2 tests' S3 and the README's."""
    with running_seaweed() as server:
        yield server


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (``--dist loadgroup``) every test of the session's Spark (those that take
    the ``spark`` fixture) runs on one worker, which starts the one local Spark session
    (tests/spark/conftest.py) instead of one per worker; likewise every HDFS test, for the one
    HDFS (tests/tiering/conftest.py). Tests marked ``spark`` that start Spark processes of their
    own (the README's block, the standalone cluster) run on any worker."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif item.get_closest_marker("hdfs"):
            item.add_marker(pytest.mark.xdist_group("hdfs"))
