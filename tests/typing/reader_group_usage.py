"""What ``ReaderGroup.reader()`` and its asyncio twin return, checked by mypy -- tox's lint env runs
``mypy tests/typing`` against the installed wheel -- and not collected by pytest.  A reader made with
a ``Serializer[T]`` reads ``EventRead[T]``; without one, bytes."""

from __future__ import annotations

from typing import Any, assert_type

import millstream
from millstream.client import (
    AsyncEventStreamReader,
    AsyncReaderGroup,
    EventRead,
    EventStreamReader,
    JsonSerializer,
    ReaderConfig,
    ReaderGroup,
    StringSerializer,
)


def blocking(group: ReaderGroup) -> None:
    text = group.reader("r1", StringSerializer())
    assert_type(text, EventStreamReader[str])
    read = text.read_next_event(1.0)
    assert_type(read, EventRead[str])
    assert_type(read.event, str | None)
    raw = group.reader("r2", config=ReaderConfig())
    assert_type(raw, EventStreamReader[bytes])
    assert_type(raw.read_next_event(1.0).event, bytes | None)
    group.reader_offline("r3", text.position())


async def asynchronous(group: AsyncReaderGroup) -> None:
    values = await group.reader("r1", JsonSerializer())
    assert_type(values, AsyncEventStreamReader[Any])  # (JSON values are Any)
    raw = await group.reader("r2")
    assert_type(raw, AsyncEventStreamReader[bytes])
    assert_type((await raw.read_next_event(1.0)).event, bytes | None)


def from_the_client(client: millstream.Client) -> None:
    with client.reader_group("s/g") as group:
        assert_type(group.reader("r", StringSerializer()), EventStreamReader[str])
