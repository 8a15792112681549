"""The suite's own set-up: pytest-xdist's ``--dist loadgroup`` really groups (tests/conftest.py).

The Spark tests share one worker and its one Spark session, and the HDFS tests one HDFS, only if
pytest-xdist hands every test of a group to one worker, which it does by naming each such test
``nodeid@group`` on the worker. With pytest 9.2 that renaming has no effect (pytest-xdist issue
1386) and nothing says so: the marks are ignored and every worker starts a Spark session and an
HDFS of its own. This test says so.
"""

import pytest


@pytest.mark.xdist_group("grouping")
def test_a_grouped_test_carries_its_group_under_loadgroup(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not on a pytest-xdist worker under --dist loadgroup: there is no grouping to check")
    assert request.node.nodeid.endswith("@grouping"), (
        f"pytest-xdist did not group {request.node.nodeid!r}: this pytest and pytest-xdist do not work together "
        "under --dist loadgroup; install the versions of constraints.txt"
    )
