"""The chunk storage contract: what tier-2 needs from a folder, S3 or any fsspec filesystem.

A :class:`ChunkStorage` holds named objects (byte strings) under one root. The
contract is small on purpose, as in Pravega's chunk layer: a binding fills in
``_do_*`` methods and the base class does what every binding needs once
(name and argument checks, capability checks, DEBUG logging, error translation).

Invariants every binding keeps:

- ``write`` is atomic: a reader sees the whole new object or the previous state
  (nothing, or the whole old object), never a prefix. Writing an existing name
  replaces it (tiering never reuses a name, so this only matters to retries).
- ``read(name, offset, length)`` returns ``min(length, size - offset)`` bytes
  (empty at or past the end), and raises :class:`ObjectNotFoundError` for a
  missing object whatever the range (``length == 0`` included).
- ``create_new(name, data)`` writes ``name`` only if no object of that name exists, as
  atomically as ``write``, and says whether it did: of callers racing on one name, exactly
  one gets True, and the others get False and write nothing. Bindings whose backend offers
  a conditional create (a hard link, S3's ``If-None-Match: *``) set ``atomic_create``; the
  others (fsspec's memory filesystem and any without one) check then write under a lock of
  this process, which is not atomic across processes, and leave ``atomic_create`` False.
- ``delete`` of a missing object succeeds (idempotent, as Kafka's remote storage).
- ``list(prefix)`` returns the objects whose name starts with ``prefix``, sorted
  by name; names are relative to the storage root. Files that are not valid
  object names (temporary files, foreign files) are not listed. ``list`` and ``info`` give
  each object's last-modified time in ``modified_ms`` wherever the backend reports one
  (every binding here does; None is allowed for a filesystem that does not).
- Errors from the layer below never leak: they are translated at this boundary
  into :class:`TierError` and its subclasses, with the operation, the object
  name and the storage URL in the message, and never a credential.

Object names are ``/``-separated relative paths of segments of ``[A-Za-z0-9._=-]``
(no empty segment, no ``.`` or ``..``, no leading ``/``), at most 1024 characters.
"""

from __future__ import annotations

import builtins
import logging
import re
import time
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self, TypeGuard, TypeVar

from ..errors import ConfigError, FileChannelError, InvalidNameError, TierError

log = logging.getLogger("filechannel")

MAX_NAME_CHARS = 1024
_SEGMENT = re.compile(r"[A-Za-z0-9._=-]+")
_T = TypeVar("_T")

Data = bytes | bytearray | memoryview


@dataclass(frozen=True)
class ObjectInfo:
    """One object of a chunk storage: its name (relative to the root), its length in bytes, and its
    last-modified time in milliseconds since the epoch, as the backend's clock gives it (S3 in whole
    seconds), or None where the backend reports none.

    ``modified_ms`` is not part of equality: two listings of the same objects compare equal.
    """

    name: str
    length: int
    modified_ms: int | None = field(default=None, compare=False)


def is_valid_name(name: object) -> TypeGuard[str]:
    """True if ``name`` is a valid object name (see the module docstring)."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        return False
    return all(_SEGMENT.fullmatch(part) and part not in (".", "..") for part in name.split("/"))


def validate_name(name: object, what: str = "object name") -> str:
    """Return ``name`` if it is a valid object name, else raise :class:`InvalidNameError`."""
    if not is_valid_name(name):
        raise InvalidNameError(
            f"{what} {name!r} is not allowed: use '/'-separated segments of [A-Za-z0-9._=-], "
            f"no '.' or '..' segment, no leading or doubled '/', at most {MAX_NAME_CHARS} characters"
        )
    return name


def validate_prefix(prefix: object) -> str:
    """Return ``prefix`` if it is "" or a valid name, possibly ending with "/" (a folder)."""
    if prefix == "":
        return ""
    if isinstance(prefix, str) and validate_name(prefix.removesuffix("/"), "list prefix"):
        return prefix
    raise InvalidNameError(f"list prefix {prefix!r} is not allowed: use '' or an object name, optionally ending with '/'")


def _check_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{what} must be an int >= 0, not {value!r}")
    return value


def _byte_view(name: str, data: object) -> memoryview:
    """``data`` as a flat view of bytes (a copy only for a non-contiguous view); ConfigError if not bytes-like."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ConfigError(f"data for {name!r} must be bytes, bytearray or memoryview, not {type(data).__name__}")
    view = memoryview(data)
    return view.cast("B") if view.c_contiguous else memoryview(view.tobytes())


def redact_url(url: str) -> str:
    """``url`` without a ``user:password@`` part or a query (which may hold a token), safe to print and log."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc and not parts.query:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query="..." if parts.query else ""))


class ChunkStorage(ABC):
    """A tier-2 object store (see the module docstring for the invariants every binding keeps).

    Subclasses implement the ``_do_*`` methods and :meth:`_translate_error`;
    they never validate names or log: the public methods here do that once per
    call. Optional operations are announced by the capability flags; calling
    one a binding lacks raises :class:`TierError` naming the flag. Instances are
    safe to share between threads.
    """

    # A binding's class sets them, or its instance where they depend on the backend (fsspec's).
    supports_concat: bool = False
    supports_append: bool = False
    supports_truncate: bool = False
    #: True where :meth:`create_new` is a conditional create of the backend (atomic across processes and
    #: machines); False where it is a check then a write under a lock of this process only.
    atomic_create: bool = False

    def __init__(self, url: str) -> None:
        self.url = redact_url(url)
        self._closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the contract ---------------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        """True if the object exists, False if it does not; any other failure raises (never a silent False)."""
        validate_name(name)
        return self._call("exists", name, lambda: self._do_exists(name))

    def write(self, name: str, data: Data) -> None:
        """Store ``data`` as the whole object ``name``, atomically; an existing object is replaced."""
        validate_name(name)
        view = _byte_view(name, data)
        self._call("write", name, lambda: self._do_write(name, view), len(view))

    def create_new(self, name: str, data: Data) -> bool:
        """Store ``data`` as the object ``name`` only if no object of that name exists: True if it did.

        The object appears whole or not at all (as with :meth:`write`). False means an object of that
        name exists and nothing was written. Of callers racing on one name, exactly one gets True
        (across processes and machines only where :attr:`atomic_create` is True). A False after an
        error-free call can still follow this caller's own earlier attempt whose answer was lost (a
        retried request): to claim something, put a token of your own in ``data`` and, on False,
        read the object back and compare.
        """
        validate_name(name)
        view = _byte_view(name, data)
        return self._call(
            "create_new",
            name,
            lambda: self._do_create_new(name, view),
            len(view),
            outcome=lambda created: "created" if created else "exists, nothing written",
        )

    def read(self, name: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``name`` from ``offset``; fewer (or none) past the end of the object."""
        validate_name(name)
        _check_int(offset, "offset")
        _check_int(length, "length")
        if length == 0:  # still an error for a missing object, as any other read
            return self._call("read", name, lambda: self._read_nothing(name))
        return self._call("read", name, lambda: self._do_read(name, offset, length), length)

    def info(self, name: str) -> ObjectInfo:
        """The object's length and last-modified time; :class:`ObjectNotFoundError` if it does not exist."""
        validate_name(name)
        return self._call("info", name, lambda: self._do_info(name))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Objects whose name starts with ``prefix``, sorted by name."""
        validate_prefix(prefix)
        found = self._call("list", prefix, lambda: self._do_list(prefix))
        return sorted(found, key=lambda info: info.name)

    def delete(self, name: str) -> None:
        """Delete the object; a missing object is success."""
        validate_name(name)
        self._call("delete", name, lambda: self._do_delete(name))

    # builtins.list: in this class's annotations, plain ``list`` is the method above
    def concat(self, target: str, sources: builtins.list[str]) -> None:
        """Write ``target`` as the sources' bytes in order, atomically; the sources stay (delete them after)."""
        validate_name(target, "target name")
        if not isinstance(sources, list | tuple) or not sources:
            raise ConfigError(f"concat into {target!r} needs a non-empty list of source names, not {sources!r}")
        for source in sources:
            validate_name(source, "source name")
        self._require("supports_concat", "concat")
        self._call("concat", target, lambda: self._do_concat(target, list(sources)))

    def append(self, name: str, data: Data) -> None:
        """Add ``data`` at the end of the existing object ``name`` (not atomic: a crash may leave a prefix of it)."""
        validate_name(name)
        view = _byte_view(name, data)
        self._require("supports_append", "append")
        self._call("append", name, lambda: self._do_append(name, view), len(view))

    def truncate(self, name: str, length: int) -> None:
        """Cut the existing object ``name`` to ``length`` bytes (``length`` <= its length)."""
        validate_name(name)
        _check_int(length, "length")
        self._require("supports_truncate", "truncate")
        self._call("truncate", name, lambda: self._do_truncate(name, length))

    def close(self) -> None:
        """Release the binding's resources; idempotent. Later calls raise :class:`TierError`."""
        if not self._closed:
            self._closed = True
            self._do_close()

    # -- what a binding implements --------------------------------------------------------------------

    @abstractmethod
    def _do_exists(self, name: str) -> bool: ...

    @abstractmethod
    def _do_write(self, name: str, data: memoryview) -> None: ...

    @abstractmethod
    def _do_create_new(self, name: str, data: memoryview) -> bool: ...

    @abstractmethod
    def _do_read(self, name: str, offset: int, length: int) -> bytes: ...

    @abstractmethod
    def _do_info(self, name: str) -> ObjectInfo: ...

    @abstractmethod
    def _do_list(self, prefix: str) -> builtins.list[ObjectInfo]: ...

    @abstractmethod
    def _do_delete(self, name: str) -> None: ...

    def _do_concat(self, target: str, sources: builtins.list[str]) -> None:
        raise NotImplementedError  # only called when supports_concat is True

    def _do_append(self, name: str, data: memoryview) -> None:
        raise NotImplementedError  # only called when supports_append is True

    def _do_truncate(self, name: str, length: int) -> None:
        raise NotImplementedError  # only called when supports_truncate is True

    def _do_close(self) -> None:  # noqa: B027 - most bindings hold nothing to release
        """Release resources (a client, connections)."""

    @abstractmethod
    def _translate_error(self, exc: Exception, op: str, name: str) -> TierError | None:
        """Our error for ``exc`` raised by ``op`` on ``name``, or None to let it propagate (a bug, not I/O)."""

    # -- machinery ------------------------------------------------------------------------------------

    def _read_nothing(self, name: str) -> bytes:
        self._do_info(name)
        return b""

    def _require(self, flag: str, op: str) -> None:
        if not getattr(self, flag):
            raise TierError(f"{op} is not supported by {self.url} ({type(self).__name__}.{flag} is False): check the flag first")

    def _call(
        self,
        op: str,
        name: str,
        fn: Callable[[], _T],
        nbytes: int | None = None,
        outcome: Callable[[_T], str] | None = None,
    ) -> _T:
        """Run ``fn`` (one operation), translating errors and logging at DEBUG (never credentials).

        ``outcome(result)``, if given, is said in the log line (what happened, never data).
        """
        if self._closed:
            raise TierError(f"cannot {op} {name!r}: the storage {self.url} is closed")
        start = time.perf_counter()
        try:
            result = fn()
        except FileChannelError as exc:
            log.debug("tier %s %s %r failed: %s", op, self.url, name, exc)
            raise
        except Exception as exc:
            err = self._translate_error(exc, op, name)
            if err is None:
                raise
            log.debug("tier %s %s %r failed: %s", op, self.url, name, err)
            raise err from exc
        if log.isEnabledFor(logging.DEBUG):
            size = nbytes if nbytes is not None else len(result) if isinstance(result, bytes) else None
            log.debug(
                "tier %s %s %r%s%s in %.1f ms",
                op,
                self.url,
                name,
                f" ({size} bytes)" if size is not None else "",
                f": {outcome(result)}" if outcome is not None else "",
                (time.perf_counter() - start) * 1000,
            )
        return result
