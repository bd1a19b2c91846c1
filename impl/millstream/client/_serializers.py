"""Serializers: how an event value becomes the bytes of an event, and back.

Any object with ``serialize(value) -> bytes`` and ``deserialize(data) -> value`` is a
``Serializer``.  The three here cover the common cases; they raise ``InvalidArgumentError`` for a
value they cannot encode or bytes they cannot decode, and then nothing is written (or the reader's
position stays before the bad event).
"""

from __future__ import annotations

import json
from typing import Any, Protocol, TypeVar

from millstream.errors import InvalidArgumentError

__all__ = ["BytesSerializer", "JsonSerializer", "Serializer", "StringSerializer", "is_identity"]

T = TypeVar("T")


class Serializer(Protocol[T]):
    """Turns event values into bytes and back.  ``deserialize(serialize(v))`` equals ``v``."""

    def serialize(self, value: T, /) -> bytes:
        ...

    def deserialize(self, data: bytes, /) -> T:
        ...


class BytesSerializer:
    """Events are bytes already (bytearray and memoryview are copied to bytes)."""

    def serialize(self, value: bytes, /) -> bytes:
        if type(value) is bytes:
            return value
        if isinstance(value, (bytearray, memoryview)):
            return bytes(value)
        raise InvalidArgumentError(f"BytesSerializer writes bytes, not {type(value).__name__}")

    def deserialize(self, data: bytes, /) -> bytes:
        return data

    def __repr__(self) -> str:
        return "BytesSerializer()"


class StringSerializer:
    """Events are text, stored as UTF-8."""

    def serialize(self, value: str, /) -> bytes:
        if not isinstance(value, str):
            raise InvalidArgumentError(f"StringSerializer writes str, not {type(value).__name__}")
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InvalidArgumentError(f"an event is not encodable as UTF-8: {error}") from None

    def deserialize(self, data: bytes, /) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidArgumentError(f"an event is not UTF-8 text: {error}") from None

    def __repr__(self) -> str:
        return "StringSerializer()"


class JsonSerializer:
    """Events are JSON values (dicts, lists, strings, numbers, booleans, None), stored as compact
    UTF-8 JSON.  NaN and infinities are refused: they are not JSON."""

    def serialize(self, value: Any, /) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError, RecursionError) as error:
            raise InvalidArgumentError(f"an event is not a JSON value: {error}") from None

    def deserialize(self, data: bytes, /) -> Any:
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as error:
            raise InvalidArgumentError(f"an event is not JSON: {error}") from None

    def __repr__(self) -> str:
        return "JsonSerializer()"


def is_identity(serializer: object) -> bool:
    """Whether ``serializer`` passes bytes through unchanged (writers and readers then skip the per-event
    call; a subclass may override a method, so only the class itself counts)."""
    return type(serializer) is BytesSerializer
