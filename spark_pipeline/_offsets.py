"""Source offsets: stream cuts as the JSON objects Spark logs and compares.

Spark keeps a source's offset as the JSON text of the dict the source returned (``json.dumps`` of
it, in the dict's own key order), writes it to ``<checkpoint>/offsets/<batch>`` and decides whether
a source has new data by comparing that text with the last one (reference/spark-exactly-once.md,
pitfall 3).  So an offset must have one spelling per position: here it is the stream cut's own
canonical form, ``StreamCut.to_json()`` --

    {"positions": {"<segment id>": <offset>, ...}, "stream": "scope/stream"}

-- with every key a string and every object's keys in sorted (string) order, which is also the
order ``json.loads`` gives back after a restart.  An offset can therefore be pasted into the
``start``/``end`` options, and one of another stream is recognised (``InvalidStreamCutError``,
naming both streams) instead of being read as positions of this one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from millstream.client import StreamCut
from millstream.errors import InvalidArgumentError, InvalidStreamCutError

__all__ = ["cut_of", "offset_json", "offset_of"]


def offset_of(cut: StreamCut) -> dict[str, Any]:
    """The Spark offset of ``cut``: a dict whose keys, at every level, are strings in sorted order."""
    positions = {str(segment): offset for segment, offset in cut.positions.items()}
    return {"positions": {key: positions[key] for key in sorted(positions)}, "stream": cut.stream}


def offset_json(offset: Mapping[str, Any]) -> str:
    """The text Spark logs for ``offset`` (and compares): ``json.dumps`` in the dict's key order."""
    return json.dumps(offset)


def cut_of(offset: Any, stream: str, *, what: str = "the offset") -> StreamCut:
    """The stream cut an offset holds, checked to be a position of ``stream``.  Raises
    ``InvalidStreamCutError`` for an offset of another stream (the query's checkpoint was made
    reading another stream) and ``InvalidArgumentError`` for anything that is not an offset of this
    source.  ``what`` names the offset in the message."""
    if isinstance(offset, (str, bytes)):
        try:
            offset = json.loads(offset)
        except ValueError as error:
            raise InvalidArgumentError(f"{what} is not JSON: {error}") from None
    if not isinstance(offset, Mapping) or set(offset) != {"positions", "stream"}:
        raise InvalidArgumentError(f"{what} {offset!r} is not a millstream offset "
                                   '({"positions": {"<segment id>": offset, ...}, "stream": "scope/stream"})')
    if offset["stream"] != stream:
        raise InvalidStreamCutError(
            f"{what} is a position of stream {offset['stream']!r}, but the query reads {stream!r}: the checkpoint "
            "was made reading another stream (start the query with a new checkpoint location, or read "
            f"{offset['stream']!r} again)")
    try:
        return StreamCut.from_wire(stream, offset["positions"])
    except InvalidArgumentError as error:
        raise InvalidArgumentError(f"{what} is not a stream cut: {error}") from None
