"""``ReaderGroup.reader()`` (and its asyncio twin) is typed by its serializer (issue 20 item 8): mypy
checks ``tests/typing/reader_group_usage.py`` in tox's lint env; here, what the py env can see -- the
overloads and their return types -- so a change that drops them fails a test too."""

from __future__ import annotations

import typing

from millstream.client import AsyncReaderGroup, ReaderGroup


def test_reader_returns_a_reader_of_the_serializers_type() -> None:
    for method, reader in ((ReaderGroup.reader, "EventStreamReader"), (AsyncReaderGroup.reader,
                                                                        "AsyncEventStreamReader")):
        returns = [overload.__annotations__["return"] for overload in typing.get_overloads(method)]
        assert returns == [f"{reader}[bytes]", f"{reader}[_T]"], returns
        assert method.__annotations__["config"] == "ReaderConfig | None"
    assert ReaderGroup.reader_offline.__annotations__["position"] == "Position | None"
