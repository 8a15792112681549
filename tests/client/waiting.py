"""Waiting on a condition in tests: polled with a deadline, never a fixed sleep."""

import time


def wait_for(condition, timeout=60.0, what="condition"):
    """Return once ``condition()`` is true; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
