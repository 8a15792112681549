"""Exponential backoff with full jitter, for the retries tier-2 does itself.

Full jitter (AWS architecture blog, "Exponential Backoff And Jitter"): the n-th wait is
uniform in ``[0, min(cap, base * 2**n))``, so clients that failed together do not retry
together. botocore already retries a request that failed before its response (connection
errors, throttling, 5xx); this is for what it does not retry, such as a response body
cut half-way.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """At most ``attempts`` tries of one step; the waits between them grow from ``base`` seconds up to ``cap``."""

    attempts: int
    base: float = 0.05
    cap: float = 2.0

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` consecutive failures (>= 1)."""
        return random.uniform(0.0, min(self.cap, self.base * 2 ** (failures - 1)))

    def sleep(self, failures: int) -> None:
        time.sleep(self.delay(failures))
