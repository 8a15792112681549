"""Types of the C module built from _codec.c (optional: the Python code falls back when it does
not import). Each function's pure-Python reference is named in _codec.c's docstrings."""

import _thread
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, ParamSpec, Self, TypeVar, final

from _typeshed import ReadableBuffer

from .record import Headers

_T = TypeVar("_T")
_R = TypeVar("_R")
_P = ParamSpec("_P")
_Tuple = TypeVar("_Tuple", bound=tuple[Any, ...])
_Fields = TypeVar("_Fields", bound=tuple[Any, ...])  # a Record, or any tuple of as many fields as slots names

def crc32c(data: ReadableBuffer, previous: int = 0, /) -> int: ...
def set_fold(on: bool, /) -> bool: ...
def encode_batch(
    values: list[bytes], timestamp: int, index_interval: int, since_index: int, rel_start: int, pos0: int, max_before: int, /
) -> tuple[list[bytes], bytes, bytes, int, int]: ...
def shaped(
    record_type: type[_Tuple],
    template: tuple[object, ...],
    records: list[_Fields],
    slots: tuple[int, ...],
    size_slots: tuple[int, ...] = ...,
    headers_type: type[list[Any]] | type[tuple[Any, ...]] | None = None,
    /,
) -> list[_Tuple]: ...
def decode_plain(
    buf: ReadableBuffer,
    pos: int,
    offset: int,
    max_records: int,
    out: list[Any],
    record_type: type[tuple[Any, ...]],
    template: tuple[object, ...],
    slots: tuple[int, int, int, int, int],
    /,
) -> tuple[int, int, int]: ...
def decode_columns(
    buf: ReadableBuffer, pos: int, offset: int, max_records: int, columns: list[bytearray], keep_from: int, keep_to: int, /
) -> tuple[int, int, int]: ...
def scan_frames(
    buf: bytes,
    pos: int,
    offset: int,
    max_payload: int,
    interval: int,
    since: int,
    max_ts: int,
    marks: list[tuple[int, int, int]],
    /,
) -> tuple[int, int, int, int, bool]: ...
def write_pieces(
    fd: int, pieces: list[bytes], nbytes: int, write_bytes: int, writev_bytes: int, iov_max: int, join_below: int, /
) -> None: ...
def pread_nowait(fd: int, size: int, position: int, /) -> bytes: ...  # where the platform has RWF_NOWAIT

class StateCore:
    """The writer state's counters as C integers (writer_state.WriterState subclasses it)."""

    segment_base: int
    segment_id: int
    segment_size: int
    end_offset: int
    since_index: int
    max_timestamp: int
    created_ms: int

def Mutex() -> _thread.LockType:  # a type in C, typed as the threading.Lock it behaves as
    """A threading.Lock (of a type of its own) that AppendCore takes without a Python call."""

class AppendCore:
    """The appender's buffer and limits (appender.Appender subclasses it, and sets them)."""

    _mutex: threading.Lock
    _state: StateCore | None
    _pending: list[bytes]
    _index: list[tuple[bytes, bytes]]
    _pending_bytes: int
    _roll_bytes: int
    _max_payload: int
    _index_interval: int
    _buffer_bytes: int
    _prefix_ts: int
    _wall_offset_ns: int
    _prefix_crc: int
    _check_at: float
    _flush_due: float
    _always: bool
    _flushing: bool
    def append(
        self, value: bytes | None, *, key: bytes | None = None, headers: Headers | None = None, timestamp: int | None = None
    ) -> int: ...
    def append_stamped(self, value: bytes, /) -> tuple[int, int]: ...

class SentCore:
    """Where a sent record went, as C fields: the base of client/futures.SentFuture."""

    _at: tuple[int, int]  # (offset, timestamp), made when read
    _size: int

@final
class ProducerSend(Generic[_P, _R]):
    """Producer.send's common case; any other call goes to ``fallback``."""

    # routes: topic -> (AppendCore, where); a topic whose value is anything else goes to the fallback
    def __init__(self, routes: dict[str, Any], fallback: Callable[_P, _R], future_type: type[_R], /) -> None: ...
    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R: ...
    @property
    def sent(self) -> int: ...

@final
class Ready(Coroutine[Any, Any, _T]):
    """An awaitable already done: a coroutine to collections.abc.Coroutine (it has its methods)."""

    def __await__(self) -> Generator[Any, None, _T]: ...
    def __iter__(self) -> Self: ...
    def __next__(self) -> Any: ...
    def send(self, value: object, /) -> Any: ...
    def throw(self, typ: Any, val: Any = None, tb: Any = None, /) -> Any: ...
    def close(self) -> None: ...

@final
class AsyncSend(Generic[_P, _R]):
    """AsyncProducer.send's common case: ``send(topic, value)`` gives a :class:`Ready`; any other call goes to ``slow``."""

    def __init__(
        self,
        send: Callable[[str, Any], object],
        slow: Callable[_P, Coroutine[Any, Any, _R]],
        deliver: Callable[[Any], object],
        done_type: type,
        /,
    ) -> None: ...
    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> Coroutine[Any, Any, _R]: ...

@final
class WriteBehind:
    """One write at a time: submitted by one thread, written by another without the GIL (see _codec.c)."""

    def submit(
        self,
        fd: int,
        pieces: list[bytes],
        nbytes: int,
        write_bytes: int,
        writev_bytes: int,
        iov_max: int,
        join_below: int,
        after: list[tuple[int, bytes, int]],
        /,
    ) -> None: ...
    def run(self, linger: float, /) -> int: ...
    def poll(self) -> int | None: ...
    def wait(self) -> int | None: ...
    def collect(self) -> tuple[int, int]: ...
    def close(self) -> None: ...
