"""Serializers as kafka-python takes them: a function of the value, or an object with
``serialize(topic, value)`` / ``deserialize(topic, data)`` (kafka-python's ``Serializer`` and
``Deserializer``, which schema-registry clients implement), and the ones kafka-python ships.

An object's method is bound to each topic once (:class:`TopicCodec`); a plain function is
called as it is.
"""

from __future__ import annotations

import abc
import functools
import json
from collections.abc import Callable
from typing import Any, cast

from ..errors import ConfigError


class Serializer(abc.ABC):
    """kafka-python's serializer object: ``serialize(topic, value)`` returns bytes (or None)."""

    @abc.abstractmethod
    def serialize(self, topic: str, value: Any) -> bytes | None: ...


class Deserializer(abc.ABC):
    """kafka-python's deserializer object: ``deserialize(topic, data)`` returns the object."""

    @abc.abstractmethod
    def deserialize(self, topic: str, data: bytes) -> Any: ...


class JsonSerializer(Serializer, Deserializer):
    """JSON, UTF-8 encoded, both ways (kafka-python's ``JsonSerializer``, which returns bytes here:
    a record holds bytes)."""

    def __init__(self, is_key: bool = False, **configs: Any) -> None:  # kafka-python passes the client's configs
        self.is_key = is_key

    def serialize(self, topic: str, value: Any) -> bytes:
        return json.dumps(value).encode()

    def deserialize(self, topic: str, data: bytes) -> Any:
        return json.loads(data)


class StringSerializer(Serializer, Deserializer):
    """Text in ``encoding`` (UTF-8 by default), both ways."""

    def __init__(self, encoding: str = "utf-8", is_key: bool = False, **configs: Any) -> None:
        self.encoding, self.is_key = encoding, is_key

    def serialize(self, topic: str, value: Any) -> bytes:
        return str(value).encode(self.encoding)

    def deserialize(self, topic: str, data: bytes) -> str:
        return data.decode(self.encoding)


# What key_serializer= / value_serializer= (and the deserializers) take.
Codec = Callable[[Any], Any] | Serializer | Deserializer


def check_codec(name: str, codec: object, method: str) -> None:
    """Refuse a ``name`` (e.g. "value_serializer") that is neither callable nor has ``method``."""
    if codec is not None and not callable(getattr(codec, method, None)) and not callable(codec):
        raise ConfigError(f"{name} must be a function or have a {method}(topic, value) method, not {codec!r}")


class TopicCodec:
    """A serializer or deserializer as a function of one value for a given topic: an object's
    ``method`` with the topic bound (one ``partial`` per topic, kept), a plain function as it is,
    None as None."""

    __slots__ = ("_method", "_per_topic", "_plain", "codec")

    def __init__(self, codec: Codec | None, method: str) -> None:
        self.codec = codec
        fn = getattr(codec, method, None)
        self._method: Callable[..., Any] | None = fn if callable(fn) else None
        self._plain: Callable[[Any], Any] | None = None if self._method else cast(Callable[[Any], Any] | None, codec)
        self._per_topic: dict[str, Callable[[Any], Any]] = {}

    def for_topic(self, topic: str) -> Callable[[Any], Any] | None:
        if self._method is None:
            return self._plain
        bound = self._per_topic.get(topic)
        if bound is None:
            bound = self._per_topic[topic] = functools.partial(self._method, topic)
        return bound
