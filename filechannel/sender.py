"""Senders: the user's handle for appending records to a channel."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Self

from .engine.appender import Appender
from .engine.record import Headers
from .errors import ChannelClosedError

if TYPE_CHECKING:
    from typing import Protocol

    from .config import ChannelConfig

    class _Channel(Protocol):
        """What a sender uses of its channel besides the appender it is handed: a
        :class:`~filechannel.channel.FileChannel`, which makes senders (this module does not
        import it). A type only: nothing checks it at run time."""

        config: ChannelConfig

        @property
        def closed(self) -> bool: ...


class Sender:
    """Appends records. Thread-safe; all senders of one channel share its buffer and flusher.

    With ``fsync="always"`` a send returns once its record is on disk; otherwise once it is
    buffered (``flush()`` writes the buffer to the OS, and fsyncs unless fsync is "never").
    """

    def __init__(self, channel: _Channel, appender: Appender) -> None:
        self._channel = channel
        self._appender = appender
        self._closed = False
        # The per-message hot path: calls go straight to the appender, one Python frame.
        self.send = appender.append  # type: ignore[method-assign]

    @property
    def appender(self) -> Appender:
        """The channel's one buffered writer, which this sender appends through (the Kafka-like
        producer's short path appends to it directly)."""
        return self._appender

    def send(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        timestamp: int | None = None,
    ) -> int:
        """Append one record; return its offset. ``timestamp`` in ms (default: now); a ``value``
        of None is a tombstone (read back as None, distinct from ``b""``).

        (Each sender binds ``send`` to its channel's appender; this method is what a closed
        sender falls back to.)
        """
        raise ChannelClosedError("this sender is closed")

    def send_many(self, values: Iterable[bytes], *, timestamp: int | None = None) -> range:
        """Append many key-less records sharing one timestamp; return their offsets.

        The whole batch is checked first: one value too large rejects all of them.
        """
        if self._closed:
            raise ChannelClosedError("this sender is closed")
        return self._appender.append_values(values, timestamp)

    def flush(self) -> None:
        """Write everything sent so far to the OS (and to disk unless fsync is "never")."""
        if self._closed:
            raise ChannelClosedError("this sender is closed")
        self._appender.drain(sync=self._channel.config.fsync != "never")

    def sync(self) -> None:
        """Write everything sent so far and fsync it, whatever the channel's fsync policy.

        Concurrent calls share fsyncs: what many threads sent while one fsync ran is
        covered by the next one (group commit).
        """
        if self._closed:
            raise ChannelClosedError("this sender is closed")
        self._appender.drain(sync=True)

    def close(self) -> None:
        """Flush, then refuse further sends. Closing twice is harmless.

        The sender is closed even if that flush raises (the error is raised after).
        """
        if not self._closed:
            try:
                if not self._channel.closed:
                    self.flush()
            finally:
                self._closed = True
                del self.send  # falls back to the class method, which refuses

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
