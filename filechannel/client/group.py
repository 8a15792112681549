"""Consumer groups on one machine: membership, partition ownership, fenced commits.

Everything lives in ``ROOT/.groups/GROUP/``:

    group.lock          flock held for every read-modify-write of the files below
    state.json          {"generation": G, "members": {id: {"topics": [...], "pid": ..., "session_timeout_ms": ...}},
                         "assignment": {id: [[topic, partition], ...]},
                         "owners": {"topic/partition": id}, "partitions": {topic: count}}
    offsets.json        {"topic/partition": committed offset, ".metadata": {"topic/partition": text}}
    members/ID.lock     created and flocked under group.lock by member ID, and flocked
                        for as long as its process lives (a file nobody flocks is a dead
                        member's: deleted by the next member to look, under group.lock); its mtime
                        is the member's last heartbeat; kept while the process lives, even
                        once the member is evicted

Protocol:

- *Liveness*, Kafka's three rules. (1) A member holds an flock on its own
  ``members/ID.lock`` for its whole life; the kernel drops it when the process dies,
  however it dies. Anyone can tell a dead member by taking that lock without blocking.
  (2) Its heartbeat is the mtime of that file, touched every ``heartbeat_interval_ms`` by
  a background thread (``heartbeat.py``) whatever the consumer does, and at every join and
  sync: a member whose heartbeat is older than its own ``session_timeout_ms`` (stored with
  it in state.json) is evicted by the others, which only happens to a process stopped or
  hung as a whole. (3) When the consumer has not polled for ``max_poll_interval_ms``, its
  heartbeat thread takes it out of the group itself (under ``group.lock``, after checking
  the poll time again there), as Kafka's consumer leaves its group. An evicted member that
  lives keeps its file; its commits fail (:class:`CommitFailedError`) and its next poll's
  :meth:`GroupMember.sync` answers None: the consumer revokes what it read and joins again.
  Heartbeats do not rewrite state.json, so they do not wake the other members.
- *Static members* (``group_instance_id``): the member id is ``static_`` + the instance id,
  so a second live consumer with that id cannot take its life lock
  (:class:`FencedInstanceIdError`). A static member does not leave on close and is not
  evicted for a free lock: only once its life file's mtime (kept: its last heartbeat) is
  older than its session timeout. Joining again before that, with the same topics and
  partition counts, it takes its entry back without a new generation, and owns its
  partitions at once: the others do not rebalance.
- *Generations.* Every change of membership (join, leave, death, eviction) bumps the
  generation and recomputes the assignment, deterministically, with the members' common
  strategy (``assignors.py``: the first every member supports, in the first member's
  order; a join sharing none is refused, a ConfigError, before anything is written).
- *Ownership.* Being assigned a partition is not enough to read it: a member must also
  own it in ``owners``. A member gives up a partition it is no longer assigned (after
  its listener's ``on_partitions_revoked`` and, with auto-commit, a commit) before it
  could be handed on; a member takes a partition it is assigned once no live member
  owns it. So at no moment do two live members read one partition.
- *Fencing.* A commit is accepted only from the partition's current owner, checked under
  ``group.lock``; anyone else gets :class:`CommitFailedError`. A member that was evicted
  therefore cannot overwrite the offsets of the member that took over.
- *Timing.* Each member checks the state at every poll (a ``stat``), looks for dead
  members and takes free partitions every ``heartbeat_interval_ms``. The partitions of a
  killed member move within ``heartbeat_interval_ms`` plus one poll of a surviving member;
  those of a stopped member within ``session_timeout_ms``; those of a member that does not
  poll within ``max_poll_interval_ms`` plus a heartbeat interval.

Committed offsets are also written to each partition channel's durable positions as
``group.GROUP``, so garbage collection keeps what the group has not consumed, and so a
partition's committed offset survives a lost, emptied or corrupt offsets.json: a
partition missing from offsets.json (or all of them, if it cannot be read) falls back to
its durable position (logged as a warning).

state.json and offsets.json are only written under ``group.lock``, each through a temp
file named after the writer's pid and thread, so a temp file found by a member holding
the lock was left by a writer that died (or failed) mid-write: it is deleted when a member
is created.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..engine.files import opened_if_exists, read_if_exists, remove_tree, unlink_if_exists, write_atomically
from ..engine.lock import FileLock
from ..engine.names import validate_name
from ..engine.position import PositionStore
from ..errors import (
    CommitFailedError,
    ConfigError,
    CorruptRecordError,
    FencedInstanceIdError,
    FileChannelError,
    StorageError,
    os_errors,
)
from ..root import partition_name, partition_path, split_partition_name
from .assignors import ASSIGNORS, DEFAULT_STRATEGIES, group_strategy
from .heartbeat import Heartbeat
from .records import TopicPartition
from .topics import GROUPS_DIR

log = logging.getLogger("filechannel")

# The key of offsets.json holding commit metadata (topic names cannot start with "." so it names no partition).
METADATA_KEY = ".metadata"

# Temp files of write_atomically: NAME.PID.tmp or NAME.PID.THREAD.tmp.
_TMP = re.compile(r"^(?:state|offsets)\.json\.(\d+)(?:\.\d+)?\.tmp$")


_warned: set[tuple[str, bytes]] = set()  # unreadable offsets files already reported (once each)


STATE_FILE = "state.json"
OFFSETS_FILE = "offsets.json"
LOCK_FILE = "group.lock"
MEMBERS_DIR = "members"
# The member id of a static member (group_instance_id) starts with this; a dynamic one's never
# does (HOST-PID-HEX, the host name reduced to [A-Za-z0-9.-]).
STATIC_PREFIX = "static_"


def group_folder(root: str, group_id: str) -> str:
    """A group's folder: ``ROOT/.groups/GROUP`` (InvalidNameError for a name that is not one)."""
    return os.path.join(root, GROUPS_DIR, validate_name(group_id, "group_id"))


def position_name(group_id: str) -> str:
    """The name of a group's committed offset among a partition's durable positions (the
    channel's :class:`~filechannel.engine.position.PositionStore`): ``group.GROUP``."""
    return f"group.{group_id}"


def _life_path(folder: str, member_id: str) -> str:
    """The life lock of member ``member_id`` of the group in ``folder``: ``members/ID.lock``."""
    return os.path.join(folder, MEMBERS_DIR, member_id + ".lock")


def is_static(member_id: str) -> bool:
    """Whether ``member_id`` is a static member's (a consumer with a ``group_instance_id``)."""
    return member_id.startswith(STATIC_PREFIX)


def _life_lock_held(path: str) -> bool:
    """Whether a process holds the member life lock at ``path``; one nobody holds (its member
    died) is deleted, unless it is a static member's: its mtime is then the member's last
    heartbeat, which its session timeout runs from (deleted when it is evicted)."""
    with opened_if_exists(path, os.O_RDWR) as fd:
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    if not is_static(os.path.basename(path)):
        unlink_if_exists(path)
    return False


def tp_key(tp: TopicPartition) -> str:
    return partition_name(tp.topic, tp.partition)


def tp_from_key(key: str) -> TopicPartition:
    return TopicPartition(*split_partition_name(key))


@dataclass
class GroupState:
    generation: int = 0
    members: dict[str, dict[str, Any]] = field(default_factory=dict)
    assignment: dict[str, list[list[Any]]] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)

    @classmethod
    def decode(cls, data: bytes | None, path: str) -> GroupState:
        if not data:
            return cls()
        try:
            raw = json.loads(data)
            return cls(
                int(raw["generation"]),
                dict(raw["members"]),
                dict(raw["assignment"]),
                dict(raw["owners"]),
                {t: int(n) for t, n in raw.get("partitions", {}).items()},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"group state {path} is corrupt ({exc}); delete it to reset the group") from exc

    def encode(self) -> bytes:
        return json.dumps(
            {
                "generation": self.generation,
                "members": self.members,
                "assignment": self.assignment,
                "owners": self.owners,
                "partitions": self.partitions,
            },
            indent=1,
            sort_keys=True,
        ).encode()


def strategy_preferences(state: GroupState) -> dict[str, list[str]]:
    """Each member's assignment strategies in order of preference (a member written by a
    version without strategies constrains nothing)."""
    return {m: list(info["strategies"]) for m, info in state.members.items() if "strategies" in info}


class GroupMember:
    """One consumer's membership in a group (see the module docstring). Not thread-safe."""

    def __init__(
        self,
        root: str,
        group_id: str,
        *,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        max_poll_interval_ms: int = 300_000,
        group_instance_id: str | None = None,
        strategies: tuple[str, ...] | list[str] = DEFAULT_STRATEGIES,
    ) -> None:
        self.group_id = validate_name(group_id, "group_id")
        if not os.path.isdir(root):  # a typo in the root must not become a new, empty root
            raise ConfigError(
                f"the root folder {os.path.abspath(root)!r} does not exist, so group {group_id!r} cannot keep its "
                "state there: check the root, or create it with a topic first (filechannel topics create)"
            )
        self.folder = group_folder(root, group_id)
        self.members_folder = os.path.join(self.folder, MEMBERS_DIR)
        with os_errors("create group folder", self.members_folder):
            os.makedirs(self.members_folder, exist_ok=True)
        self.state_path = os.path.join(self.folder, STATE_FILE)
        self.offsets_path = os.path.join(self.folder, OFFSETS_FILE)
        self._lock = FileLock(os.path.join(self.folder, LOCK_FILE))
        if group_instance_id is not None:
            self.member_id = STATIC_PREFIX + validate_name(group_instance_id, "group_instance_id")
        else:
            host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:60]
            self.member_id = f"{host}-{os.getpid()}-{os.urandom(4).hex()}"
        # The life file is created and locked under group.lock: another member deletes a life
        # file nobody locks (a dead member's), under that lock. Created outside it, this file
        # was once deleted between its creation and its flock by a member starting at that
        # moment; this member then locked and touched a file no one could see, and the others
        # evicted it at every sync and it joined again (generations by the thousand, a
        # partition never moving).
        with self._lock.holding():
            self._remove_temp_files()
            self._remove_dead_life_files()
            self._life = FileLock(self._life_path(self.member_id))
            took_life = self._life.acquire(blocking=False)
        if not took_life:
            self._life.close()
            self._lock.close()
            raise FencedInstanceIdError(
                f"group_instance_id {group_instance_id!r} is in use by a live consumer of group {self.group_id!r}; "
                "give each consumer its own group_instance_id, or close the other one first"
            )
        self.session_timeout = session_timeout_ms / 1000
        self.heartbeat_interval = heartbeat_interval_ms / 1000
        self.max_poll_interval = max_poll_interval_ms / 1000
        self.strategies = list(strategies)
        self.generation = -1
        self._seen_inode = -1
        self._next_heartbeat = 0.0
        self.left_group = False  # left on its own for want of a poll (the heartbeat thread sets it): poll joins again
        self.heartbeat = Heartbeat(
            self._touch,
            self._leave_for_poll_timeout,
            interval=self.heartbeat_interval,
            max_poll_interval=self.max_poll_interval,
            name=f"filechannel-heartbeat-{self.group_id}",
        )

    # -- state under the group lock -----------------------------------------------------------

    def _load(self) -> GroupState:
        return GroupState.decode(read_if_exists(self.state_path, "group state"), self.state_path)

    def _remove_temp_files(self) -> None:
        """Delete temp files of state.json / offsets.json left by a writer that died mid-write.

        Called under ``group.lock``: every writer of those files holds it, so no temp file
        here is being written, except by this process (whose own are skipped).
        """
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return
        for name in names:
            m = _TMP.match(name)
            if m and int(m.group(1)) != os.getpid():
                unlink_if_exists(os.path.join(self.folder, name))

    def _remove_dead_life_files(self) -> None:
        """Delete the life files of dynamic members whose process is gone (an evicted member's
        file stays while it lives, so that it can come back; a static member's until it is
        evicted)."""
        try:
            names = os.listdir(self.members_folder)
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(".lock") and not is_static(name):
                _life_lock_held(os.path.join(self.members_folder, name))

    def _save(self, state: GroupState) -> None:
        write_atomically(self.state_path, state.encode())

    def member_alive(self, member_id: str) -> bool:
        """Whether member ``member_id``'s process still holds its life lock."""
        return member_id == self.member_id or _life_lock_held(self._life_path(member_id))

    def _reassign(self, state: GroupState) -> None:
        """A new generation: the assignment computed again by the members' common strategy
        (a sticky one starts from the current assignment)."""
        state.generation += 1
        subs = {m: list(info.get("topics", [])) for m, info in state.members.items()}
        subscribed = {t for topics in subs.values() for t in topics}
        assignor = ASSIGNORS[group_strategy(strategy_preferences(state))]
        previous = {m: [(t, p) for t, p in tps] for m, tps in state.assignment.items()}
        assigned = assignor.assign(subs, {t: n for t, n in state.partitions.items() if t in subscribed}, previous)
        state.assignment = {m: [[t, p] for t, p in tps] for m, tps in assigned.items()}
        state.owners = {k: v for k, v in state.owners.items() if v in state.members}

    def _life_path(self, member_id: str) -> str:
        return _life_path(self.folder, member_id)

    def _touch(self) -> None:
        """Heartbeat: the life file's mtime becomes now (through the open file, which no one
        else deletes while this process lives)."""
        with os_errors("heartbeat", self._life.path):
            os.utime(self._life.fd)

    def polled(self) -> None:
        """The consumer polled: its ``max_poll_interval_ms`` starts again."""
        self.heartbeat.polled()

    def join(self, topics: list[str], partitions: dict[str, int]) -> None:
        """Enter the group subscribed to ``topics`` (or change the subscription); also how a
        member that was evicted, or left for want of a poll, comes back."""
        self._touch()  # a member back from a SIGSTOP must not look hung before its heartbeat thread runs
        with self._lock.holding():
            state = self._load()
            evicted = self._evict(state)
            info: dict[str, Any] = {
                "topics": sorted(topics),
                "pid": os.getpid(),
                "session_timeout_ms": round(self.session_timeout * 1000),
                "strategies": self.strategies,
            }
            group_strategy({**strategy_preferences(state), self.member_id: self.strategies})  # ConfigError: none in common
            before = state.members.get(self.member_id)
            state.members[self.member_id] = info
            grown = {t: n for t, n in partitions.items() if state.partitions.get(t, 0) != n}
            state.partitions.update(partitions)
            # A static member back (same topics and strategies, same partitions, nobody evicted)
            # takes its place as it left it: no new generation, no rebalance of the others.
            same = before is not None and all(before.get(k) == info[k] for k in ("topics", "strategies"))
            if evicted or grown or not same:
                self._reassign(state)
            self._save(state)
            self.left_group = False

    def _drop_self(self, state: GroupState) -> bool:
        """Take this member out of ``state`` (its partitions freed, the others rebalanced);
        False if it was not in it."""
        if state.members.pop(self.member_id, None) is None:
            return False
        self._reassign(state)
        return True

    def _leave_for_poll_timeout(self) -> None:
        """Heartbeat thread: the consumer has not polled for ``max_poll_interval_ms``, so it
        leaves the group (Kafka's consumer does the same) and the others take its partitions.
        Checked again under the lock: a poll that started meanwhile keeps the membership (its
        sync waits for the lock, and sees the group as this left it)."""
        with self._lock.holding():
            if not self.heartbeat.overdue():
                return
            state = self._load()
            if not self._drop_self(state):
                return
            self.left_group = True
            self._save(state)
        log.warning(
            "consumer %s left group %r: it has not polled for max_poll_interval_ms (%.0f s); its partitions go to "
            "the other members and its next poll joins the group again (poll more often, or process fewer "
            "records per poll: max_poll_records)",
            self.member_id,
            self.group_id,
            self.max_poll_interval,
        )

    def leave(self) -> None:
        """Leave the group, releasing every partition; the others rebalance. The heartbeat
        thread is stopped first, and the member's files are closed.

        A static member does not leave (Kafka's does not either): its last heartbeat is now,
        its place and partitions wait for it for its ``session_timeout_ms``, and a consumer
        with its ``group_instance_id`` started meanwhile takes them back without a rebalance.
        """
        self.heartbeat.stop()
        if is_static(self.member_id):
            self._touch()
        else:
            with self._lock.holding():
                state = self._load()
                if self._drop_self(state):
                    self._save(state)
        self._life.close()
        if not is_static(self.member_id):
            unlink_if_exists(self._life_path(self.member_id))
        self._lock.close()

    def _evict(self, state: GroupState) -> bool:
        """Drop dead dynamic members, and members whose heartbeat is older than their own
        session timeout (a process hung as a whole: its heartbeat thread beats while it
        lives; or a static member closed or dead that did not come back in time). An evicted
        member that lives keeps its life file: its next poll joins again."""
        now = time.time()
        gone = []
        for m, info in state.members.items():
            if m == self.member_id:
                continue
            timeout = info.get("session_timeout_ms", self.session_timeout * 1000) / 1000
            try:
                beat = os.stat(self._life_path(m)).st_mtime
            except FileNotFoundError:
                beat = 0.0
            if now - beat > timeout or not (is_static(m) or self.member_alive(m)):
                gone.append(m)
        for m in gone:
            del state.members[m]
            if is_static(m) and not self.member_alive(m):
                unlink_if_exists(self._life_path(m))
        return bool(gone)

    # -- what a poll does ---------------------------------------------------------------------

    def changed(self) -> bool:
        """Whether state.json was replaced since we last synced (one stat)."""
        try:
            inode = os.stat(self.state_path).st_ino
        except FileNotFoundError:
            inode = -2
        return inode != self._seen_inode

    def heartbeat_due(self) -> bool:
        return time.monotonic() >= self._next_heartbeat

    def sync(
        self, partitions: dict[str, int], held: set[TopicPartition]
    ) -> tuple[set[TopicPartition], set[TopicPartition]] | None:
        """Heartbeat, evict the dead, give up what is neither assigned nor ``held``, take free assigned partitions.

        ``held`` are the partitions the caller reads now: it keeps owning those until it
        has closed them (after its revocation callback), and gives up every other partition
        it owns that the assignment no longer gives it. Deciding that here, from the state
        read under the lock, and not from an earlier call's answer, is what keeps a
        partition from staying owned by a member that does not read it (taken in one call,
        reassigned before the next: the other member would wait on it forever).

        Returns ``(assigned, owned)``: the partitions the assignment gives this member, and
        those of them it now owns (it may read them); None if it is no longer a member
        (evicted, or left for want of a poll): it owns nothing and must :meth:`join` again.
        state.json is rewritten only when membership or ownership changed, so syncs do not
        wake the other members.
        """
        self._touch()
        with self._lock.holding():
            state = self._load()
            if self.member_id not in state.members:
                return None
            dirty = False
            grown = {t: n for t, n in partitions.items() if state.partitions.get(t, 0) < n}
            if grown:
                state.partitions.update(grown)
            if self._evict(state) or grown:
                self._reassign(state)
                dirty = True
            assigned = {TopicPartition(t, p) for t, p in state.assignment.get(self.member_id, [])}
            for key, owner in list(state.owners.items()):
                if owner == self.member_id and tp_from_key(key) not in assigned and tp_from_key(key) not in held:
                    del state.owners[key]
                    dirty = True
            owned = set()
            for tp in sorted(assigned):
                key = tp_key(tp)
                holder = state.owners.get(key)
                if holder != self.member_id and (holder is None or holder not in state.members or not self.member_alive(holder)):
                    state.owners[key] = holder = self.member_id
                    dirty = True
                if holder == self.member_id:
                    owned.add(tp)
            if dirty:
                self._save(state)
            self._seen_inode = os.stat(self.state_path).st_ino
            self.generation = state.generation
            self._next_heartbeat = time.monotonic() + self.heartbeat_interval
            return assigned, owned

    # -- offsets ------------------------------------------------------------------------------

    def committed(self) -> dict[TopicPartition, int]:
        """The offsets in offsets.json ({} if it is missing, empty or unreadable)."""
        return read_offsets(self.offsets_path)

    def committed_offset(self, tp: TopicPartition, root: str) -> int | None:
        """``tp``'s committed offset: offsets.json's, else the partition's durable position."""
        offset = self.committed().get(tp)
        return offset if offset is not None else durable_offset(root, self.group_id, tp)

    def committed_metadata(self, tp: TopicPartition) -> str:
        """The metadata committed with ``tp``'s offset ("" if none, or if offsets.json was lost:
        the durable positions keep offsets only)."""
        return read_metadata(self.offsets_path).get(tp_key(tp), "")

    def commit(
        self,
        offsets: dict[TopicPartition, int],
        *,
        manual: bool = False,
        check: Callable[[dict[TopicPartition, int]], None] | None = None,
        metadata: dict[TopicPartition, str] | None = None,
    ) -> None:
        """Store ``offsets`` if this member owns every one of those partitions (fencing).

        Each committed partition's metadata becomes ``metadata``'s text for it, else ""
        (as in Kafka, a commit replaces the metadata with its own).

        A ``manual`` commit (a consumer that called ``assign``, or Spark's source) belongs
        to no generation: like Kafka's, it is accepted for partitions no live member owns.
        Every offset must be an int from 0 to 2**63-1, and ``check`` (if given) is called
        after the ownership check: both before anything is written, so a rejected commit
        leaves the stored offsets as they were.
        """
        for tp, off in offsets.items():
            if isinstance(off, bool) or not isinstance(off, int) or not 0 <= off < 2**63:
                raise ConfigError(f"commit {tp.topic}[{tp.partition}]: the offset must be an int from 0 to 2**63-1, not {off!r}")
        with self._lock.holding():
            state = self._load()
            if not manual and self.member_id not in state.members:
                raise CommitFailedError(
                    f"cannot commit for group {self.group_id!r}: consumer {self.member_id} was removed from the group "
                    f"(no heartbeat for session_timeout_ms, {self.session_timeout:g} s, or no poll for "
                    f"max_poll_interval_ms, {self.max_poll_interval:g} s) and its partitions went to the other "
                    "members; its next poll joins the group again"
                )
            for tp in offsets:
                owner = state.owners.get(tp_key(tp))
                if owner != self.member_id and not (manual and (owner is None or not self.member_alive(owner))):
                    raise CommitFailedError(
                        f"cannot commit {tp.topic}[{tp.partition}] for group {self.group_id!r}: this consumer no "
                        f"longer owns it (owner: {owner or 'none'}, generation {state.generation}); the group "
                        "rebalanced, poll again to get the current assignment"
                    )
            if check is not None:
                check(offsets)
            _merge_offsets(self.offsets_path, offsets, metadata or {})


def _merge_offsets(path: str, offsets: dict[TopicPartition, int], metadata: dict[TopicPartition, str]) -> None:
    """Rewrite offsets file ``path`` with ``offsets`` over the ones it holds; each of those
    partitions' metadata becomes ``metadata``'s text (none: removed). Under ``group.lock``."""
    current: dict[str, Any] = {tp_key(tp): off for tp, off in read_offsets(path).items()}
    current.update({tp_key(tp): int(off) for tp, off in offsets.items()})
    texts = read_metadata(path)
    for tp in offsets:
        text = metadata.get(tp, "")
        if text:
            texts[tp_key(tp)] = text
        else:
            texts.pop(tp_key(tp), None)
    if texts:
        current[METADATA_KEY] = texts
    write_atomically(path, json.dumps(current, sort_keys=True).encode())


class GroupOffsets:
    """A group's committed offsets written from outside its consumers: by a transaction
    (``transaction_log.py``), which commits them with the records it produced.

    The caller holds :meth:`holding` (``group.lock``) from its ownership check
    (:meth:`check_owner`) until its offsets are stored, so no rebalance hands a partition
    on in between; :meth:`store` writes each partition's durable position first, then
    offsets.json, as a consumer's commit leaves them, and writing the same offsets twice
    changes nothing (a transaction's recovery may store them again).
    """

    def __init__(self, root: str, group_id: str) -> None:
        self.root = root
        self.group_id = validate_name(group_id, "group_id")
        self.folder = group_folder(root, group_id)
        with os_errors("create group folder", self.folder):
            os.makedirs(self.folder, exist_ok=True)
        self._lock = FileLock(os.path.join(self.folder, LOCK_FILE))

    def holding(self) -> Any:
        """A context holding ``group.lock``."""
        return self._lock.holding()

    def check_owner(self, member_id: str, tps: Iterable[TopicPartition]) -> None:
        """CommitFailedError unless consumer ``member_id`` owns every partition of ``tps`` now
        (a consumer's own commit is fenced the same way). Under :meth:`holding`."""
        path = os.path.join(self.folder, STATE_FILE)
        state = GroupState.decode(read_if_exists(path, "group state"), path)
        for tp in tps:
            owner = state.owners.get(tp_key(tp))
            if owner != member_id:
                raise CommitFailedError(
                    f"cannot commit {tp.topic}[{tp.partition}] for group {self.group_id!r} in this transaction: consumer "
                    f"{member_id} no longer owns it (owner: {owner or 'none'}, generation {state.generation}); abort the "
                    "transaction and poll again"
                )

    def store(self, offsets: dict[TopicPartition, int]) -> None:
        """Store ``offsets`` (durable positions, then offsets.json). Under :meth:`holding`."""
        for tp, off in offsets.items():
            partition = partition_path(self.root, tp.topic, tp.partition)
            if os.path.isdir(partition):
                PositionStore(partition).set(position_name(self.group_id), off)
        _merge_offsets(os.path.join(self.folder, OFFSETS_FILE), offsets, {})

    def close(self) -> None:
        self._lock.close()


def delete_offsets(root: str, group_id: str, tps: list[TopicPartition]) -> None:
    """Forget ``group_id``'s committed offsets of ``tps`` (Kafka's ``--delete-offsets``): the
    group then starts those partitions by its ``auto_offset_reset``. The caller checks that no
    live member could commit them again.

    Under ``group.lock``, the partitions' durable positions first, then offsets.json: a
    delete cut short leaves the offsets listed (offsets.json still has them) and running it
    again finishes it; never an offset missing from offsets.json that its durable position
    would bring back.
    """
    folder = group_folder(root, group_id)
    if not os.path.isdir(folder):
        raise ConfigError(f"there is no consumer group {group_id!r} under {root!r}")
    offsets_path = os.path.join(folder, OFFSETS_FILE)
    with FileLock(os.path.join(folder, LOCK_FILE)).holding():
        _forget_positions(root, group_id, tps)
        keys = {tp_key(tp) for tp in tps}
        kept: dict[str, Any] = {tp_key(tp): off for tp, off in read_offsets(offsets_path).items() if tp_key(tp) not in keys}
        texts = {k: v for k, v in read_metadata(offsets_path).items() if k not in keys}
        if texts:
            kept[METADATA_KEY] = texts
        write_atomically(offsets_path, json.dumps(kept, sort_keys=True).encode())


def _forget_positions(root: str, group_id: str, tps: Iterable[TopicPartition]) -> None:
    """Delete ``group_id``'s committed offset from the durable positions of each partition of ``tps``."""
    for tp in tps:
        partition = partition_path(root, tp.topic, tp.partition)
        if os.path.isdir(partition):  # a deleted topic has none
            PositionStore(partition).delete(position_name(group_id))


def live_members(root: str, group_id: str) -> list[str]:
    """The members of ``group_id`` whose process is alive (whatever their heartbeats say); none if
    there is no such group. Joins nothing."""
    if group_id not in list_groups(root):
        return []
    state, _ = read_group(root, group_id)
    folder = group_folder(root, group_id)
    return [m for m in state.members if _life_lock_held(_life_path(folder, m))]


def require_inactive(root: str, group_id: str, what: str) -> None:
    """ConfigError (saying ``what`` needs it) unless no member of ``group_id`` is alive: how a
    change of the group's offsets from outside it (reset, delete) makes sure no member commits over it."""
    live = live_members(root, group_id)
    if live:
        raise ConfigError(
            f"{what} only when group {group_id!r} is inactive, but it has {len(live)} live member(s) "
            f"({', '.join(live)}); stop its consumers first"
        )


def delete_group(root: str, group_id: str) -> None:
    """Delete group ``group_id`` (Kafka's ``--delete``): its committed offsets kept in the
    partitions' durable positions, then its folder. ConfigError if there is no such group or a
    member of it is alive.

    In that order, so a delete killed half-way leaves the group listed (its offsets.json
    intact) and running it again finishes it; never positions that hold back garbage
    collection for a group that is gone.
    """
    state, offsets = read_group(root, group_id)
    require_inactive(root, group_id, "a group can be deleted")
    partitions = set(offsets) | {TopicPartition(t, p) for t, n in state.partitions.items() for p in range(n)}
    _forget_positions(root, group_id, sorted(partitions))
    folder = group_folder(root, group_id)
    with os_errors("delete group folder", folder):
        remove_tree(folder)


def restore_offsets(root: str, group_id: str, offsets: dict[TopicPartition, int]) -> bool:
    """Store ``group_id``'s committed ``offsets`` as a restore writes them (``tier import``, ``tier
    rebuild``): under ``group.lock``, each partition's durable position first (where its folder
    exists), then ``offsets.json``, as a commit leaves them. Never over an existing ``offsets.json``:
    then nothing is written and False is returned (the group's own commits win over a backup)."""
    for tp, off in offsets.items():
        if isinstance(off, bool) or not isinstance(off, int) or not 0 <= off < 2**63:
            raise ConfigError(f"restore {tp.topic}[{tp.partition}] of group {group_id!r}: {off!r} is not an offset")
    folder = group_folder(root, group_id)
    with os_errors("create group folder", folder):
        os.makedirs(folder, exist_ok=True)
    offsets_path = os.path.join(folder, OFFSETS_FILE)
    with FileLock(os.path.join(folder, LOCK_FILE)).holding():
        if os.path.exists(offsets_path):
            return False
        for tp, off in offsets.items():
            partition = partition_path(root, tp.topic, tp.partition)
            if os.path.isdir(partition):
                PositionStore(partition).set(position_name(group_id), off)
        write_atomically(offsets_path, json.dumps({tp_key(tp): off for tp, off in offsets.items()}, sort_keys=True).encode())
    return True


def list_groups(root: str) -> list[str]:
    folder = os.path.join(root, GROUPS_DIR)
    try:
        return sorted(g for g in os.listdir(folder) if os.path.isdir(os.path.join(folder, g)))
    except FileNotFoundError:
        return []


def read_offsets(path: str) -> dict[TopicPartition, int]:
    """The committed offsets stored in ``path``; {} (with a warning) if it is empty or corrupt.

    Never the only copy: each partition's durable position (:func:`durable_offset`) holds
    its committed offset too, and is used for every partition missing here.
    """
    data = read_if_exists(path, "group offsets")
    if data is None:
        return {}
    try:
        raw = json.loads(data)
        offsets = {tp_from_key(k): v for k, v in raw.items() if k != METADATA_KEY}
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 for v in offsets.values()):
            raise ValueError("an offset is not an int from 0 to 2**63-1")
        return offsets
    except (ValueError, TypeError, AttributeError) as exc:
        if (path, data) in _warned:
            return {}
        _warned.add((path, data))
        log.warning(
            "group offsets %s are unreadable (%s); using the partitions' durable positions instead (rewritten at the "
            "next commit)",
            path,
            exc,
        )
        return {}


def read_metadata(path: str) -> dict[str, str]:
    """The commit metadata stored in offsets file ``path`` by partition key; {} if none or unreadable
    (:func:`read_offsets` reports an unreadable file)."""
    data = read_if_exists(path, "group offsets")
    try:
        texts = json.loads(data).get(METADATA_KEY, {}) if data else {}
    except (ValueError, AttributeError):
        return {}
    if not isinstance(texts, dict):
        return {}
    return {k: v for k, v in texts.items() if isinstance(k, str) and isinstance(v, str)}


def durable_offset(root: str, group_id: str, tp: TopicPartition) -> int | None:
    """The offset group ``group_id`` last committed for ``tp``, from the partition's durable positions."""
    store = PositionStore(partition_path(root, tp.topic, tp.partition))
    try:
        return store.get(position_name(group_id))
    except (CorruptRecordError, StorageError) as exc:
        log.warning("cannot read group %r's durable position of %s[%d]: %s", group_id, tp.topic, tp.partition, exc)
        return None


def read_group(root: str, group_id: str) -> tuple[GroupState, dict[TopicPartition, int]]:
    """A group's state and committed offsets, for describing it (no membership taken)."""
    folder = group_folder(root, group_id)
    if not os.path.isdir(folder):
        raise ConfigError(f"there is no consumer group {group_id!r} under {root!r}")
    state_path = os.path.join(folder, STATE_FILE)
    state = GroupState.decode(read_if_exists(state_path, "group state"), state_path)
    offsets = read_offsets(os.path.join(folder, OFFSETS_FILE))
    for topic, count in state.partitions.items():
        for p in range(count):
            tp = TopicPartition(topic, p)
            if tp not in offsets and (offset := durable_offset(root, group_id, tp)) is not None:
                offsets[tp] = offset
    return state, offsets


def group_offsets(root: str, topic: str | None = None) -> dict[str, dict[str, int]]:
    """The committed offsets of every consumer group of ``root`` (of ``topic``'s partitions only if
    given), by group and partition key: what ``tier export`` adds to an export of the tier-2 metadata."""
    found: dict[str, dict[str, int]] = {}
    for group in list_groups(root):
        try:
            _, offsets = read_group(root, group)
        except FileChannelError:
            continue  # a damaged group's state: its offsets are not exported (its durable positions stay)
        kept = {tp_key(tp): off for tp, off in offsets.items() if topic is None or tp.topic == topic}
        if kept:
            found[group] = dict(sorted(kept.items()))
    return found


def restore_groups(root: str, groups: dict[str, dict[str, int]], ends: dict[str, int] | None = None) -> list[str]:
    """Store each group's committed offsets from an export (``tier import``, ``tier rebuild``) through
    :func:`restore_offsets` (under ``group.lock``, durable positions then ``offsets.json``, never over
    an existing one). With ``ends`` (partition -> end offset), an offset past a partition's end is
    lowered to it (records committed but never uploaded are gone). One line per group."""
    lines = []
    for group, offsets in sorted(groups.items()):
        restored = {}
        lowered = []
        for key, offset in sorted(offsets.items()):
            if ends is not None:
                if key not in ends:
                    continue
                if offset > ends[key]:
                    lowered.append(f"{key} {offset} -> {ends[key]}")
                    offset = ends[key]
            restored[tp_from_key(key)] = offset
        if not restored:
            continue
        if not restore_offsets(root, group, restored):
            lines.append(f"group {group}: kept its existing offsets ({os.path.join(group_folder(root, group), OFFSETS_FILE)})")
            continue
        note = f" (past the end, lowered: {', '.join(lowered)})" if lowered else ""
        lines.append(f"group {group}: restored the committed offsets of {len(restored)} partition(s){note}")
    return lines
