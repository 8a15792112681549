"""A consumer's side of its group (aiokafka's ``group_coordinator.py``): membership,
rebalances and the rebalance listener's calls, and the offsets committed through ``group.py``.

A :class:`GroupCoordinator` decides which partitions its consumer's
:class:`~.subscription.SubscriptionState` reads: with a group, what the group assigns and
this member owns (joined, synced every heartbeat interval, joined again once evicted, left
on close); without one, every partition of the subscribed topics. It commits positions (on demand, every
``auto_commit_interval_ms``, before a revocation and on close) and reads committed offsets.
Opening and closing the partitions it decides on is the ``set_assignment`` it is given.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial
from typing import Literal, overload

from ..channel import FileChannel
from ..errors import CommitFailedError, ConfigError
from .group import GroupMember, position_name
from .records import OffsetAndMetadata, TopicPartition, check_offset, to_tp
from .subscription import SubscriptionState
from .transaction_log import recover_transactions

# What commit takes: offsets, OffsetAndMetadata or both by partition (three dict types: a dict's value type is invariant).
CommitOffsets = (
    dict[TopicPartition, int] | dict[TopicPartition, OffsetAndMetadata] | dict[TopicPartition, OffsetAndMetadata | int]
)


class GroupCoordinator:
    """The group side of a consumer reading ``subscription`` (see the module docstring).

    ``member``: its membership of the group, None without a ``group_id`` (then nothing is
    committed). ``set_assignment(tps)`` makes ``tps`` the assigned partitions (closing the
    others, opening the new ones).
    """

    def __init__(
        self,
        subscription: SubscriptionState,
        member: GroupMember | None,
        set_assignment: Callable[[set[TopicPartition]], None],
        *,
        auto_commit: bool,
        auto_commit_interval_ms: int,
    ) -> None:
        self.member = member
        self._subscription = subscription
        self._set_assignment = set_assignment
        self._joined = False
        self._auto_commit = auto_commit and member is not None
        self._auto_commit_interval = auto_commit_interval_ms / 1000
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval

    # -- membership and rebalances ---------------------------------------------------------------

    def resubscribe(self) -> None:
        """A new subscription: join the group again with its topics and take what it assigns
        (without a group: every partition of its topics), telling the listener."""
        self._joined = False
        self.refresh_assignment(force=True)

    def unsubscribed(self) -> None:
        """No subscription any more: in the group with no topics (the partitions are closed)."""
        if self.member is not None and self._joined:
            self.member.join([], {})
        self._joined = False

    def leave(self) -> None:
        """Leave the group (on close): its partitions go to the other members."""
        if self.member is not None:
            self.member.leave()

    def refresh_assignment(self, force: bool = False) -> None:
        """Bring the set of partitions read up to date (group rebalance, new topics).

        Every ``metadata_max_age_ms`` a subscription lists its topics again; a topic that
        appeared (or whose partition count changed) joins the group again with the new
        topic set, or, without a group, is simply opened.
        """
        subscription = self._subscription
        if not subscription.follows_topics():
            return
        topics_changed = subscription.refresh_topics(force)
        member = self.member
        if member is None:
            if force or topics_changed:
                self._rebalance_alone(subscription.subscribed_partitions())
            return
        if not force and not topics_changed and not member.changed() and not member.heartbeat_due():
            return
        counts = subscription.counts
        if not self._joined or topics_changed:
            member.join(list(counts), counts)
            self._joined = True
        parts = subscription.parts
        listener = subscription.listener
        owned = self._owned_after_sync(member)
        revoked = set(parts) - owned
        if revoked:
            if self._auto_commit:
                positions = subscription.positions()
                self._commit_quietly({tp: positions[tp] for tp in revoked if tp in positions})
            if listener is not None:
                listener.on_partitions_revoked(revoked)
            self._set_assignment(set(parts) - revoked)
            # Give them up only now (no longer held): from here on another member may read them.
            owned = self._owned_after_sync(member)
        added = owned - set(parts)
        self._set_assignment(set(parts) | added)
        if added and listener is not None:
            listener.on_partitions_assigned(added)

    def _owned_after_sync(self, member: GroupMember) -> set[TopicPartition]:
        """Sync ``member`` (holding the partitions read now) and return what it owns; first
        joining again (:meth:`_rejoin`) as long as it is no longer in the group."""
        counts = self._subscription.counts
        while (synced := member.sync(counts, held=set(self._subscription.parts))) is None:
            self._rejoin(member)
        return synced[1]

    def _rejoin(self, member: GroupMember) -> None:
        """This member is no longer in its group (evicted for a heartbeat older than its
        ``session_timeout_ms``, or gone for want of a poll in ``max_poll_interval_ms``): the
        partitions it read are lost (others may own them already, so nothing is committed),
        the listener is told they are revoked, and it joins the group again."""
        lost = set(self._subscription.parts)
        listener = self._subscription.listener
        if lost and listener is not None:
            listener.on_partitions_revoked(lost)
        self._set_assignment(set())
        counts = self._subscription.counts
        member.join(list(counts), counts)

    def _rebalance_alone(self, tps: set[TopicPartition]) -> None:
        """A subscription without a group: read ``tps``, telling the listener what changed."""
        held = set(self._subscription.parts)
        listener = self._subscription.listener
        revoked = held - tps
        if revoked and listener is not None:
            listener.on_partitions_revoked(revoked)
        added = tps - held
        self._set_assignment(tps)
        if added and listener is not None:
            listener.on_partitions_assigned(added)

    # -- what a poll does besides fetching ------------------------------------------------------------

    def upkeep(self) -> float:
        """Before a poll's fetch: rebalance if due, auto-commit if due. Returns the longest the
        poll may then wait for records (a member's heartbeat interval; inf without a group)."""
        self.polled()
        self.refresh_assignment()
        if self._auto_commit_due():
            self._commit_quietly(self._subscription.positions())
        return math.inf if self.member is None else self.member.heartbeat_interval

    def polled(self) -> None:
        """A poll (a fetch, or records handed out): a group member's ``max_poll_interval_ms``
        starts again."""
        if self.member is not None:
            self.member.polled()

    def upkeep_due(self) -> bool:
        """Whether a poll now has file work to do besides reading records: an auto-commit, a
        listing of the topics (every ``metadata_max_age_ms``), or joining or heartbeating the
        group. A group's state file is not looked at (that is a stat): a rebalance is then
        seen at the next heartbeat, as a Kafka member learns of one from a heartbeat's answer."""
        if self._auto_commit_due():
            return True
        if not self._subscription.follows_topics():
            return False
        if self._subscription.metadata_due():
            return True
        member = self.member
        return member is not None and (not self._joined or member.left_group or member.heartbeat_due())

    def _auto_commit_due(self) -> bool:
        return self._auto_commit and bool(self._subscription.parts) and time.monotonic() >= self._next_auto_commit

    # -- offsets -------------------------------------------------------------------------------------

    def committed_offset(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp``, or None (none committed, or no group)."""
        if self.member is None:
            return None
        recover_transactions(self._subscription.store)  # a dead producer's committed offsets count too
        return self.member.committed_offset(tp, self._subscription.store.root)

    @overload
    def committed(self, tp: TopicPartition, metadata: Literal[False]) -> int | None: ...

    @overload
    def committed(self, tp: TopicPartition, metadata: bool) -> int | OffsetAndMetadata | None: ...

    def committed(self, tp: TopicPartition, metadata: bool) -> int | OffsetAndMetadata | None:
        """``tp``'s committed offset, or None; ``metadata``: an :class:`OffsetAndMetadata` with
        the metadata committed with it."""
        offset = self.committed_offset(tp)
        if offset is None or not metadata or self.member is None:
            return offset
        return OffsetAndMetadata(offset, self.member.committed_metadata(tp), -1)

    def commit(self, offsets: CommitOffsets | None) -> None:
        """Commit ``offsets`` (None: the positions), each checked before anything is written
        (see ``Consumer.commit``)."""
        if self.member is None:
            raise ConfigError("commit needs a group_id: create the Consumer with group_id=...")
        texts: dict[TopicPartition, str] = {}
        if offsets is None:
            plain = self._subscription.positions()
        else:
            if not isinstance(offsets, dict):
                raise ConfigError(f"commit takes a dict {{TopicPartition: offset}}, not {type(offsets).__name__}")
            plain = {to_tp(tp): check_offset(to_tp(tp), o, "commit") for tp, o in offsets.items()}
            for tp, o in offsets.items():
                if isinstance(o, OffsetAndMetadata) and o.metadata:
                    if not isinstance(o.metadata, str):
                        raise ConfigError(f"commit {tp}: the metadata must be a str, not {type(o.metadata).__name__}")
                    texts[to_tp(tp)] = o.metadata
        self._commit_checked(plain, check_ends=offsets is not None, metadata=texts)

    def commit_positions(self) -> None:
        """On close: commit the positions if auto-commit is on (a commit this member lost is let go)."""
        if self._auto_commit and self._subscription.parts:
            self._commit_quietly(self._subscription.positions())

    def _check_ends(self, offsets: dict[TopicPartition, int]) -> None:
        """ConfigError unless each offset is at most its partition's end offset (the partition exists)."""
        for tp, off in offsets.items():
            end = self._subscription.with_channel(tp, lambda ch: ch.end_offset)
            if off > end:
                raise ConfigError(
                    f"commit {tp.topic}[{tp.partition}]: offset {off} is past the partition's end offset {end}; "
                    "commit the offset of the next record to read (last offset read + 1)"
                )

    def _commit_checked(
        self, offsets: dict[TopicPartition, int], check_ends: bool = False, metadata: dict[TopicPartition, str] | None = None
    ) -> None:
        """Store ``offsets`` (ints in range) in the group and in the partitions' durable positions.

        ``check_ends``: also check them against the partitions' end offsets, after the
        ownership check and before anything is written (user-given offsets; positions are
        valid by construction).
        """
        group = self.member
        if group is None or not offsets:
            return
        manual = self._subscription.manual
        group.commit(offsets, manual=manual, check=self._check_ends if check_ends else None, metadata=metadata)
        key = position_name(group.group_id)

        def store(ch: FileChannel, offset: int) -> None:
            ch.positions.set(key, offset)

        for tp, off in offsets.items():
            self._subscription.with_channel(tp, partial(store, offset=off))
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval

    def _commit_quietly(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit positions (valid by construction) for auto-commit, rebalance and close."""
        try:
            self._commit_checked(offsets)
        except CommitFailedError:
            pass  # lost them already; the new owner resumes from the last good commit
