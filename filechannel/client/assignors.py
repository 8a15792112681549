"""Partition assignment strategies (Kafka's ``partition_assignment_strategy``).

Each strategy is a class named as kafka-python's (or Java's) with its protocol ``name`` and
an ``assign(subscriptions, partitions, previous)`` function: ``subscriptions`` maps each
member (by id) to the topics it subscribes to, ``partitions`` each topic to its partition
count, ``previous`` is the group's assignment before this rebalance (only sticky ones look
at it). Invariants of every strategy: each partition of a subscribed topic goes to exactly
one member subscribing to its topic, every member gets an entry (maybe empty), and the
result depends only on the arguments (every member computes the same one).

Rebalances here are incremental whatever the strategy (``coordinator.py``): a member is told
of, and gives up, only the partitions that move, as with Kafka's cooperative-sticky; so
``CooperativeStickyAssignor`` assigns as ``StickyPartitionAssignor`` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from ..errors import ConfigError

Partition = tuple[str, int]
Assignment = dict[str, list[Partition]]


def _members_of(subscriptions: dict[str, list[str]], topic: str) -> list[str]:
    return sorted(m for m, topics in subscriptions.items() if topic in topics)


class RangePartitionAssignor:
    """Kafka's default: per topic, the partitions in contiguous ranges over the sorted
    members subscribing to it, the first ones taking one more when they do not divide evenly."""

    name: ClassVar[str] = "range"

    @staticmethod
    def assign(subscriptions: dict[str, list[str]], partitions: dict[str, int], previous: Assignment) -> Assignment:
        result: Assignment = {m: [] for m in subscriptions}
        for topic in sorted(partitions):
            members = _members_of(subscriptions, topic)
            if not members:
                continue
            share, extra = divmod(partitions[topic], len(members))
            start = 0
            for i, m in enumerate(members):
                count = share + (1 if i < extra else 0)
                result[m].extend((topic, p) for p in range(start, start + count))
                start += count
        return result


class RoundRobinPartitionAssignor:
    """Every subscribed partition, sorted by topic and number, dealt in turn to the sorted
    members, each partition to the next member in the circle that subscribes to its topic."""

    name: ClassVar[str] = "roundrobin"

    @staticmethod
    def assign(subscriptions: dict[str, list[str]], partitions: dict[str, int], previous: Assignment) -> Assignment:
        result: Assignment = {m: [] for m in subscriptions}
        circle = sorted(subscriptions)
        turn = 0
        for topic in sorted(partitions):
            if not _members_of(subscriptions, topic):
                continue
            for p in range(partitions[topic]):
                while topic not in subscriptions[circle[turn % len(circle)]]:
                    turn += 1
                result[circle[turn % len(circle)]].append((topic, p))
                turn += 1
        return result


class StickyPartitionAssignor:
    """Balanced, moving as few partitions as it can: each member keeps what it had (of the
    partitions that still exist and that it still subscribes to), the rest go one by one to
    the member subscribing to them that has the fewest, then partitions move from the
    member with the most to one with fewer while that narrows the gap by more than one.
    With one subscription for all, the counts then differ by one at most."""

    name: ClassVar[str] = "sticky"

    @staticmethod
    def assign(subscriptions: dict[str, list[str]], partitions: dict[str, int], previous: Assignment) -> Assignment:
        result: Assignment = {m: [] for m in subscriptions}
        wanted = {(t, p) for t, n in partitions.items() if _members_of(subscriptions, t) for p in range(n)}
        placed: set[Partition] = set()
        for m in sorted(previous):
            if m in result:
                for t, p in sorted(previous[m]):
                    if (t, p) in wanted and (t, p) not in placed and t in subscriptions[m]:
                        result[m].append((t, p))
                        placed.add((t, p))
        for t, p in sorted(wanted - placed):
            fewest = min(_members_of(subscriptions, t), key=lambda m: (len(result[m]), m))
            result[fewest].append((t, p))
        moved = True
        while moved:
            moved = False
            for giver in sorted(result, key=lambda m: (-len(result[m]), m)):
                for t, p in sorted(result[giver], reverse=True):
                    takers = [m for m in _members_of(subscriptions, t) if len(result[m]) < len(result[giver]) - 1]
                    if takers:
                        taker = min(takers, key=lambda m: (len(result[m]), m))
                        result[giver].remove((t, p))
                        result[taker].append((t, p))
                        moved = True
                        break
                if moved:
                    break
        return {m: sorted(tps) for m, tps in result.items()}


class CooperativeStickyAssignor(StickyPartitionAssignor):
    """Java's cooperative-sticky: the sticky assignment; its incremental rebalances are what
    every strategy gets here (see the module docstring)."""

    name: ClassVar[str] = "cooperative-sticky"


Assignor = type[RangePartitionAssignor | RoundRobinPartitionAssignor | StickyPartitionAssignor]
ASSIGNORS: dict[str, Assignor] = {
    cls.name: cls
    for cls in (RangePartitionAssignor, RoundRobinPartitionAssignor, StickyPartitionAssignor, CooperativeStickyAssignor)
}
_BY_CLASS_NAME = {cls.__name__: cls.name for cls in ASSIGNORS.values()}
# kafka-python's default: range first, then round-robin.
DEFAULT_STRATEGIES = (RangePartitionAssignor.name, RoundRobinPartitionAssignor.name)


def strategy_names(value: Any) -> list[str]:
    """The protocol names of a ``partition_assignment_strategy``: one strategy or a sequence
    of them, in order of preference, each a name (``"range"``, ``"roundrobin"``, ``"sticky"``,
    ``"cooperative-sticky"``), a class name (``"RangePartitionAssignor"``, ...) or a class
    (ours, or kafka-python's of the same name). ConfigError for anything else."""
    items: Iterable[Any] = [value] if isinstance(value, str) or not isinstance(value, (list, tuple)) else value
    names = []
    for item in items:
        key = item if isinstance(item, str) else getattr(item, "__name__", None)
        name = key if key in ASSIGNORS else _BY_CLASS_NAME.get(key) if isinstance(key, str) else None
        if name is None:
            raise ConfigError(
                f"partition_assignment_strategy: {item!r} is not a strategy; use one or more of "
                f"{', '.join(sorted(ASSIGNORS))} (or their classes, {', '.join(sorted(_BY_CLASS_NAME))})"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise ConfigError("partition_assignment_strategy must name at least one strategy")
    return names


def group_strategy(preferences: dict[str, list[str]]) -> str:
    """The strategy a group's members (each with its strategies in order of preference)
    assign with: the first, in the first member's (sorted ids) order, that every member
    supports. ConfigError if they share none."""
    if not preferences:
        return DEFAULT_STRATEGIES[0]
    common = set.intersection(*(set(names) for names in preferences.values()))
    first = preferences[min(preferences)]
    for name in first:
        if name in common:
            return name
    listed = "; ".join(f"{m}: {', '.join(names)}" for m, names in sorted(preferences.items()))
    raise ConfigError(
        f"the group's members share no partition_assignment_strategy ({listed}); give every member of a group a common strategy"
    )
