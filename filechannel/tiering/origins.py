"""Origins: many roots tiering into one tier URL, each under a sub-prefix of its own.

A root with an origin (``filechannel config tier.origin=NAME``, :meth:`RootLayout.set_origin`)
keeps its whole tier-2 under ``<url>/<origin>/``: its storage is opened there
(:func:`~filechannel.root.origin_url`), so the claim, the epochs, the channels, the topics'
settings, the exports and the deletion marks are the same as a root's at a URL of its own,
and the claim rule of :mod:`.ownership` gives each origin prefix exactly one owner. A root
without an origin (the *default origin*) keeps its objects at the URL itself, as before
origins existed. Layout at the URL's top level (names relative to it)::

    .origins/<origin>.json    {"origin","registered_at_ms","root_id"}: a root of that origin tiers under <origin>/
    <origin>/.claim.json ...  that root's tier-2, laid out as any prefix's (DESIGN.md, "Tier-2 metadata")

Invariants:

- **One layout per URL.** A URL holds either a default-origin root's objects (its top-level
  ``.claim.json``) or named origins (``.origins/``), never both: a default root's topic
  ``clicks`` and an origin named ``clicks`` would share ``clicks/``. A daemon checks before
  it claims (:func:`enter_origin`) and refuses with :class:`OriginLayoutError`. Each side
  writes, then looks for the other (a named origin registers, then checks the top-level
  claim; a default root claims, then checks the registrations), so of two roots racing,
  at least one sees the other and refuses.
- **A registration is only a pointer.** It is written once (a conditional create) before
  the origin's claim and never changes; who owns the origin is its claim. Readers list
  origins as the registrations whose claim exists (:func:`bucket_origins`): one listing
  of ``.origins/`` and one GET per origin, never a listing of the bucket.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ..engine.clock import now_ms
from ..errors import ConfigError, CorruptRecordError, ObjectNotFoundError, OriginLayoutError
from ..root import TOPIC_FILE, validate_origin
from .ownership import CLAIM
from .storage import ChunkStorage, redact_url

ORIGINS = ".origins/"


def registration_name(origin: str) -> str:
    """The registration of ``origin`` at the URL's top level: ``.origins/<origin>.json``."""
    return f"{ORIGINS}{validate_origin(origin)}.json"


def top_url(url: str, origin: str | None) -> str:
    """The tier URL a root of ``origin`` was given, from the URL its storage is opened at
    (:func:`~filechannel.root.origin_url`'s inverse)."""
    if origin is None:
        return url
    suffix = "/" + validate_origin(origin)
    if not url.endswith(suffix):
        raise ConfigError(f"{redact_url(url)} is not under origin {origin!r}: a tier URL of this root must end in {suffix}")
    return url[: -len(suffix)]


def registered_origins(top: ChunkStorage) -> list[str]:
    """The origins registered at ``top`` (the tier URL's own storage), sorted; one listing."""
    found = []
    for info in top.list(ORIGINS):
        name = info.name[len(ORIGINS) :]
        if name.endswith(".json") and "/" not in name:
            try:
                found.append(validate_origin(name[: -len(".json")]))
            except ValueError:
                continue  # not a registration (a foreign object)
    return sorted(found)


def _refuse_named(top: ChunkStorage, origin: str) -> OriginLayoutError:
    url = redact_url(top.url).rstrip("/")
    return OriginLayoutError(
        f"{url} is claimed by a root without an origin ({url}/{CLAIM}: its topics are at the URL's top level), so a "
        f"root of origin {origin!r} cannot tier under it (its topics and that root's would mix); give the topics of "
        f"this root another tier URL, or tier every root sharing {url} with an origin of its own"
    )


def _refuse_default(top: ChunkStorage, origins: list[str]) -> OriginLayoutError:
    url = redact_url(top.url).rstrip("/")
    shown = ", ".join(origins[:5]) + (", ..." if len(origins) > 5 else "")
    return OriginLayoutError(
        f"{url} holds roots with origins ({shown}: {url}/{ORIGINS}), so a root without an origin cannot tier at its "
        "top level (its topics and theirs would mix); set this root's origin first (`filechannel config "
        "tier.origin=NAME`, before its first tiered topic) or give its topics another tier URL"
    )


def claimed_origins(top: ChunkStorage) -> list[str]:
    """The registered origins whose prefix is claimed (sorted): the roots that tier under ``top``'s
    URL by origin. A registration without a claim (a root refused before it claimed) is none."""
    return [o for o in registered_origins(top) if top.exists(f"{o}/{CLAIM}")]


def enter_origin(top: ChunkStorage, origin: str | None, root_id: str, claim: Callable[[], None]) -> None:
    """Check that a root of ``origin`` (None: the default origin) may tier under the URL whose
    storage is ``top``, and ``claim()`` its prefix, in the order that keeps one layout per URL:
    each side checks, claims, and checks again, so of a default root and a named one racing,
    the later claim's second check sees the other's claim (the module docstring).
    :class:`OriginLayoutError` if the URL holds the other layout."""

    def refusal() -> OriginLayoutError | None:
        if origin is None:
            found = claimed_origins(top)
            return _refuse_default(top, found) if found else None
        return _refuse_named(top, origin) if top.exists(CLAIM) else None

    if origin is not None:
        body = {"origin": validate_origin(origin), "registered_at_ms": now_ms(), "root_id": root_id}
        top.create_new(registration_name(origin), json.dumps(body, sort_keys=True).encode())  # False: registered before
    if (refused := refusal()) is not None:
        raise refused
    claim()  # (and this root's epoch mark: exactly once)
    if (refused := refusal()) is not None:
        raise refused


def bucket_origins(top: ChunkStorage) -> list[str | None]:
    """The origins a reader of the tier URL whose storage is ``top`` finds: ``[None]`` (the
    default origin) if the URL's top level is claimed, else every registered origin whose
    prefix is claimed (sorted). :class:`OriginLayoutError` if it holds both."""
    named = claimed_origins(top)
    if top.exists(CLAIM):
        if named:
            raise _refuse_default(top, named)
        return [None]
    return list(named)


def prefix_topics(storage: ChunkStorage) -> dict[str, int]:
    """The topics a prefix (an origin's storage) describes, with their partition counts: each
    ``<topic>/topic.json`` the daemon copies beside the partitions. One listing of the prefix and
    one GET per topic; a copy that does not decode raises :class:`CorruptRecordError` naming it."""
    found: dict[str, int] = {}
    for info in storage.list(""):
        topic, _, tail = info.name.partition("/")
        if tail != TOPIC_FILE or topic.startswith("."):
            continue
        try:
            meta = json.loads(storage.read(info.name, 0, 1 << 20))
            partitions = meta["partitions"]
            if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= 10_000:
                raise ValueError(f"partitions is {partitions!r}")
        except ObjectNotFoundError:
            continue  # the topic was purged since the listing
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecordError(
                f"{redact_url(storage.url).rstrip('/')}/{info.name} is not a topic description ({exc}); the writing "
                "root's next `filechannel tier run` pass writes it again"
            ) from None
        found[topic] = partitions
    return found
