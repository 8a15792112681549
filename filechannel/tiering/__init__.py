"""Tier-2: chunk storage for sealed segments (a local folder, S3, any fsspec filesystem).

This package imports the engine and the root layout (``root.py``), never the channel nor
the client, and the engine never imports it: ``FileChannel`` builds a channel's
:class:`~.context.TierContext` (see DESIGN.md "Layers"). The storage contract is
:class:`ChunkStorage`; :func:`open_storage` picks a binding from a URL.
"""

from .bindings import open_storage
from .storage import ChunkStorage, ObjectInfo

__all__ = ["ChunkStorage", "ObjectInfo", "open_storage"]
