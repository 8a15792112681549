"""Assignment strategies: each one's assignment (every partition exactly once, balance,
stickiness), how a consumer names them, how a group agrees on one, and a cooperative
rebalance that revokes only what moves."""

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from filechannel.client import (
    Admin,
    Consumer,
    CooperativeStickyAssignor,
    RangePartitionAssignor,
    RoundRobinPartitionAssignor,
    StickyPartitionAssignor,
)
from filechannel.client.assignors import group_strategy, strategy_names
from filechannel.errors import ConfigError

from .listeners import Recorder

ALL = [RangePartitionAssignor, RoundRobinPartitionAssignor, StickyPartitionAssignor, CooperativeStickyAssignor]

groups = st.dictionaries(
    st.sampled_from(["m0", "m1", "m2", "m3", "m4"]),
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, unique=True),
    min_size=1,
)
counts = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 9), min_size=1)


def check_complete(subs, partitions, result):
    """Every partition of a subscribed topic exactly once, to a member subscribing to it."""
    assert set(result) == set(subs)
    given_out = [tp for tps in result.values() for tp in tps]
    assert len(given_out) == len(set(given_out))
    subscribed = {t for topics in subs.values() for t in topics}
    assert set(given_out) == {(t, p) for t, n in partitions.items() if t in subscribed for p in range(n)}
    for m, tps in result.items():
        assert all(t in subs[m] for t, _ in tps)


@pytest.mark.parametrize("assignor", ALL)
@given(subs=groups, partitions=counts, earlier=groups)
def test_every_partition_goes_to_exactly_one_subscribing_member(assignor, subs, partitions, earlier):
    previous = assignor.assign(earlier, partitions, {})  # what a sticky one starts from: another group's
    check_complete(subs, partitions, assignor.assign(subs, partitions, previous))


@pytest.mark.parametrize("assignor", [RoundRobinPartitionAssignor, StickyPartitionAssignor, CooperativeStickyAssignor])
@given(members=st.integers(1, 5), partitions=counts, earlier=groups)
def test_with_one_subscription_for_all_the_counts_differ_by_one_at_most(assignor, members, partitions, earlier):
    subs = {f"m{i}": sorted(partitions) for i in range(members)}
    previous = assignor.assign(earlier, partitions, {})
    sizes = [len(tps) for tps in assignor.assign(subs, partitions, previous).values()]
    assert max(sizes) - min(sizes) <= 1


@given(members=st.integers(1, 5), partitions=counts)
def test_range_gives_each_topic_in_contiguous_ranges_the_first_members_one_more(members, partitions):
    subs = {f"m{i}": sorted(partitions) for i in range(members)}
    result = RangePartitionAssignor.assign(subs, partitions, {})
    for topic, n in partitions.items():
        per_member = [[p for t, p in result[m] if t == topic] for m in sorted(subs)]
        assert [p for ps in per_member for p in ps] == list(range(n))  # contiguous, in member order
        assert [len(ps) for ps in per_member] == sorted((len(ps) for ps in per_member), reverse=True)
        assert max(map(len, per_member)) - min(map(len, per_member)) <= 1


def test_range_and_round_robin_as_kafka_deals_them():
    subs = {"m0": ["a", "b"], "m1": ["a", "b"]}
    partitions = {"a": 3, "b": 3}
    assert RangePartitionAssignor.assign(subs, partitions, {}) == {
        "m0": [("a", 0), ("a", 1), ("b", 0), ("b", 1)],
        "m1": [("a", 2), ("b", 2)],
    }
    assert RoundRobinPartitionAssignor.assign(subs, partitions, {}) == {
        "m0": [("a", 0), ("a", 2), ("b", 1)],
        "m1": [("a", 1), ("b", 0), ("b", 2)],
    }


@pytest.mark.parametrize("assignor", [StickyPartitionAssignor, CooperativeStickyAssignor])
@given(members=st.integers(1, 5), partitions=st.integers(0, 20))
def test_sticky_moves_only_what_balance_needs_when_a_member_joins(assignor, members, partitions):
    counts_ = {"a": partitions}
    before = assignor.assign({f"m{i}": ["a"] for i in range(members)}, counts_, {})
    after = assignor.assign({f"m{i}": ["a"] for i in range(members + 1)}, counts_, before)
    moved = sum(len(set(tps) - set(after[m])) for m, tps in before.items())
    assert moved == len(after[f"m{members}"]) == partitions // (members + 1)


def test_strategies_are_named_as_kafka_python_and_java_name_them():
    assert strategy_names((RangePartitionAssignor, RoundRobinPartitionAssignor)) == ["range", "roundrobin"]
    assert strategy_names(["RoundRobinPartitionAssignor", "sticky"]) == ["roundrobin", "sticky"]
    assert strategy_names("cooperative-sticky") == strategy_names(CooperativeStickyAssignor) == ["cooperative-sticky"]
    assert strategy_names("StickyPartitionAssignor") == ["sticky"]
    for bad in ("rangee", object, (), 3):
        with pytest.raises(ConfigError, match="partition_assignment_strategy"):
            strategy_names(bad)


def test_a_group_uses_the_first_strategy_its_members_share():
    assert group_strategy({"m0": ["range", "roundrobin"], "m1": ["roundrobin", "range"]}) == "range"
    assert group_strategy({"m0": ["range", "roundrobin"], "m1": ["roundrobin"]}) == "roundrobin"
    with pytest.raises(ConfigError, match="share no partition_assignment_strategy"):
        group_strategy({"m0": ["range"], "m1": ["sticky"]})


def member(root, strategy, listener=None):
    c = Consumer(
        root=root, group_id="g", enable_auto_commit=False, heartbeat_interval_ms=50, partition_assignment_strategy=strategy
    )
    c.subscribe(["t"], listener=listener)
    return c


def settle(*consumers, parts=6):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(timeout_ms=10)
        sizes = [len(c.assignment()) for c in consumers]
        if sum(sizes) == parts and max(sizes) - min(sizes) <= 1:
            return
    raise AssertionError("the group did not settle")


def test_members_agree_on_their_common_strategy_and_a_member_sharing_none_cannot_join(tmp_path):
    Admin(tmp_path).create_topic("t", 4)
    a = member(tmp_path, ("range", "roundrobin"))
    b = member(tmp_path, (RoundRobinPartitionAssignor,))
    try:
        settle(a, b, parts=4)
        assert sorted(tp.partition for tp in a.assignment()) in ([0, 2], [1, 3])  # dealt in turn: round-robin
        with pytest.raises(ConfigError, match="share no partition_assignment_strategy"):
            member(tmp_path, "sticky")
    finally:
        a.close()
        b.close()


def test_a_cooperative_rebalance_revokes_only_the_partitions_that_move(tmp_path):
    Admin(tmp_path).create_topic("t", 6)
    la, lb = Recorder(), Recorder()
    a = member(tmp_path, "cooperative-sticky", la)
    b = c = None
    try:
        assert la.events == [("assigned", [0, 1, 2, 3, 4, 5])]
        b = member(tmp_path, "cooperative-sticky", lb)
        settle(a, b)
        kept = sorted(tp.partition for tp in a.assignment())
        assert la.events[1:] == [("revoked", sorted(set(range(6)) - set(kept)))]  # the three that moved, no more
        c = member(tmp_path, "cooperative-sticky")
        settle(a, b, c)
        # Each gave up one partition, and kept the others without being told of them again.
        assert [e[0] for e in la.events[2:]] == ["revoked"] and len(la.events[2][1]) == 1
        assert set(la.events[2][1]) < set(kept)
        assert [e[0] for e in lb.events[1:]] == ["revoked"] and len(lb.events[1][1]) == 1
    finally:
        for x in (a, b, c):
            if x is not None:
                x.close()
