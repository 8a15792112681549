"""Progress of long commands on stderr: bars with counts and rates, drawn only on a terminal.

Into a file or a pipe nothing is drawn (rich would write a bar's last frame there): the
commands print their one summary line instead, which :meth:`Meter.summary` words with
the same counts and rates. A :class:`Meter` refreshes its bar at most every
``REFRESH_S``, so a command counting each record pays a clock read per record, not a
redraw.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich import filesize
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from .common import err

if TYPE_CHECKING:
    from rich.progress import Task, TaskID

REFRESH_S = 0.1


def byte_progress(shown: bool) -> Progress:
    """Progress bars of bytes (description, bar, bytes done, bytes per second, time left) on
    stderr, drawn only when ``shown`` and stderr is a terminal."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        _RateColumn(of_bytes=True),
        TimeRemainingColumn(),
        console=err,
        disable=not shown or not err.is_terminal,
    )


class _CountColumn(ProgressColumn):
    """``1,234/5,000 records`` (or ``1,234 records`` without a total), and bytes if counted."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit", "")
        done = f"{int(task.completed):,}" + (f"/{int(task.total):,}" if task.total is not None else "")
        nbytes = task.fields.get("nbytes", 0)
        return Text(f"{done} {unit}" + (f", {filesize.decimal(nbytes)}" if nbytes else ""))


class _RateColumn(ProgressColumn):
    """``12,345 records/s`` (``1.2 MB/s`` for bytes): rich's rate over the last seconds, or the
    mean since the start until rich has samples enough (a short task has only that)."""

    def __init__(self, of_bytes: bool = False) -> None:
        super().__init__()
        self._of_bytes = of_bytes

    def render(self, task: Task) -> Text:
        speed = task.speed
        if speed is None and task.elapsed:
            speed = task.completed / task.elapsed
        if speed is None:
            return Text("")
        if self._of_bytes:
            return Text(f"{filesize.decimal(int(speed))}/s")
        return Text(f"{speed:,.0f} {task.fields.get('unit', '')}/s")


def count_progress(shown: bool) -> Progress:
    """Progress bars of counted things (records, manifests, segments) with their rate, on
    stderr; drawn only when ``shown`` and stderr is a terminal."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        _CountColumn(),
        _RateColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not shown or not err.is_terminal,
    )


class Meter:
    """One counted task of a :func:`count_progress`: things and bytes done, the bar refreshed at
    most every ``REFRESH_S``, and the summary of the whole (count, seconds, rates)."""

    def __init__(self, progress: Progress, description: str, unit: str, total: int | None = None) -> None:
        self._progress = progress
        self.unit = unit
        self.count = 0
        self.nbytes = 0
        self._started = time.monotonic()
        self._shown_at = self._started
        self._task: TaskID = progress.add_task(description, total=total, unit=unit, nbytes=0)

    def add(self, count: int = 1, nbytes: int = 0) -> None:
        self.count += count
        self.nbytes += nbytes
        now = time.monotonic()
        if now - self._shown_at >= REFRESH_S:
            self._shown_at = now
            self.show()

    def set(self, count: int, total: int | None = None) -> None:
        """Say how far a task counted elsewhere is: ``count`` done of ``total``."""
        self.count = count
        if total is not None:
            self._progress.update(self._task, total=total)
        self.show()

    def show(self) -> None:
        self._progress.update(self._task, completed=self.count, nbytes=self.nbytes)

    def summary(self) -> str:
        """``in 0.5 s (2,000 records/s, 1.2 MB/s)``: the time since the start and the rates."""
        return rates(self.count, self.unit, time.monotonic() - self._started, self.nbytes)


def rates(count: int, unit: str, seconds: float, nbytes: int = 0) -> str:
    """``in 0.5 s (2,000 records/s, 1.2 MB/s)`` (the MB only if bytes were counted): what follows a
    command's own count in its summary line."""
    seconds = max(seconds, 1e-6)
    text = f"{count / seconds:,.0f} {unit}/s"
    if nbytes:
        text += f", {nbytes / 1e6 / seconds:,.1f} MB/s"
    return f"in {seconds:.1f} s ({text})"
