"""The daemon's lock of a root's tier-2 (``ROOT/.tier/daemon.lock``): one tiering daemon per
root holds it while it runs, and an operation that must not run beside a daemon (``fsck
--repair``, ``import``, ``defrag``) holds it for its length (:func:`exclusive`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from ..engine.lock import FileLock
from ..errors import TierError, os_errors
from ..root import RootLayout

LOCK_FILE = "daemon.lock"


@contextmanager
def exclusive(tier_dir: str, what: str) -> Iterator[None]:
    """Hold the daemon's lock of ``tier_dir`` (``ROOT/.tier``) for an operation that must not
    run beside a daemon (``what``: fsck --repair, import, defrag); TierError if one runs,
    :class:`ReadOnlyError` in a replica root (they write to tier-2 or to its index, which only
    ``tier rebuild --refresh`` changes there)."""
    replica = RootLayout(os.path.dirname(os.path.abspath(tier_dir))).replica()
    if replica is not None:
        raise replica.refusal(what)
    with os_errors("create tier folder", tier_dir):
        os.makedirs(tier_dir, exist_ok=True)
    lock = FileLock(os.path.join(tier_dir, LOCK_FILE))
    try:
        if not lock.acquire(blocking=False):
            raise TierError(
                f"cannot {what}: a tiering daemon holds {os.path.join(tier_dir, LOCK_FILE)}; stop it first (SIGTERM), then retry"
            )
        yield
    finally:
        lock.close()
