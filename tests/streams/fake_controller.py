"""A controller for the fake segment store (``tests.client.fake_server``): just enough of the
controller contract for a stream writer -- ``get_stream``, ``get_current_segments``,
``get_successors``, ``get_segment_uri`` -- over streams whose segments may live on several fake
servers, with scaling and sealing done by the test, step by step when it wants to interleave faults.

A scale is the controller's workflow in the contract's order: create the successors (on the server
the test names) -> record the new epoch -> seal the predecessors.  ``scale(..., seal=False)`` stops
after recording the epoch, so a test can choose the moment the seal lands (``seal_segments``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import attrs

from millstream.client import SegmentWithRange, canonical_json
from millstream.errors import (
    InvalidArgumentError,
    InvalidScaleError,
    MillstreamError,
    StreamNotFoundError,
    StreamSealedError,
)
from millstream.naming import segment_id, stream_segment_name
from millstream.wire.commands import ControllerReply, ControllerRequest, ErrorMessage, OperationUnsupported
from millstream.wire.error_codes import error_code_of
from tests.client.fake_server import FakeSegment, FakeServer, _Connection


@attrs.define
class FakeStream:
    scope: str
    name: str
    epochs: list[list[SegmentWithRange]]
    next_number: int
    sealed: bool = False
    state: str = "active"

    @property
    def current(self) -> list[SegmentWithRange]:
        return self.epochs[-1]

    def segment(self, identifier: int) -> SegmentWithRange | None:
        for epoch in self.epochs:
            for segment in epoch:
                if segment.segment_id == identifier:
                    return segment
        return None


class FakeController:
    """Streams, epochs and successors; each segment is served by one of ``servers``."""

    def __init__(self) -> None:
        self.streams: dict[tuple[str, str], FakeStream] = {}
        self.home: dict[str, FakeServer] = {}  # segment name -> the server that holds it
        self.calls: list[str] = []

    def create_stream(self, stream: str, segments: int, server: FakeServer) -> FakeStream:
        scope, name = stream.split("/")
        created = []
        for number in range(segments):
            identifier = segment_id(0, number)
            qualified = stream_segment_name(scope, name, identifier)
            server.segments[qualified] = FakeSegment()
            self.home[qualified] = server
            created.append(SegmentWithRange(identifier, number / segments, (number + 1) / segments if
                                            number + 1 < segments else 1.0, qualified))
        record = FakeStream(scope, name, [created], segments)
        self.streams[(scope, name)] = record
        return record

    def scale(self, stream: str, seal: list[int], new_ranges: list[tuple[float, float]], *, server: FakeServer,
              seal_now: bool = True) -> list[SegmentWithRange]:
        """Create successors on ``server`` and record the new epoch; then (``seal_now``) seal ``seal``."""
        record = self.streams[tuple(stream.split("/"))]  # type: ignore[index]
        current = record.current
        sealed = [s for s in current if s.segment_id in seal]
        if len(sealed) != len(seal):
            raise InvalidScaleError(f"{seal} are not all in the current epoch")
        epoch = len(record.epochs)
        created = []
        for low, high in new_ranges:
            identifier = segment_id(epoch, record.next_number)
            record.next_number += 1
            qualified = stream_segment_name(record.scope, record.name, identifier)
            server.segments[qualified] = FakeSegment()
            self.home[qualified] = server
            created.append(SegmentWithRange(identifier, low, high, qualified))
        kept = [s for s in current if s.segment_id not in seal]
        record.epochs.append(sorted(kept + created, key=lambda s: s.key_start))
        if seal_now:
            self.seal_segments(sealed)
        return created

    def seal_segments(self, segments: list[SegmentWithRange]) -> None:
        for segment in segments:
            fake = self.home[segment.name].segments[segment.name]
            fake.sealed = True
            fake.wake()

    def seal_stream(self, stream: str) -> None:
        record = self.streams[tuple(stream.split("/"))]  # type: ignore[index]
        self.seal_segments(record.current)
        record.sealed = True
        record.state = "sealed"

    # --- The RPC -----------------------------------------------------------------------------------

    def _stream(self, body: dict[str, Any]) -> FakeStream:
        record = self.streams.get((body["scope"], body["stream"]))
        if record is None:
            raise StreamNotFoundError(f"stream {body['scope']}/{body['stream']} does not exist")
        return record

    def _json(self, segment: SegmentWithRange, *, uri: bool = False) -> dict[str, Any]:
        value: dict[str, Any] = {"id": segment.segment_id, "key_start": segment.key_start,
                                 "key_end": segment.key_end, "name": segment.name}
        if uri:
            value["uri"] = self.home[segment.name].uri
        return value

    def handle(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(method)
        if method == "get_stream":
            record = self._stream(body)
            return {"config": {"scaling": {"type": "fixed", "target_rate": 0.0, "scale_factor": 0,
                                           "min_segments": len(record.epochs[0])},
                               "retention": {"type": "none", "limit": 0.0}},
                    "sealed": record.sealed, "state": record.state, "epoch": len(record.epochs) - 1,
                    "segments": [self._json(s) for s in record.current]}
        if method == "get_current_segments":
            record = self._stream(body)
            return {"epoch": len(record.epochs) - 1, "segments": [self._json(s, uri=True) for s in record.current]}
        if method == "get_successors":
            record = self._stream(body)
            identifier = body["segment_id"]
            segment = record.segment(identifier)
            if segment is None:
                raise InvalidArgumentError(f"no segment {identifier}")
            # Successors: the segments of the epoch after the last one holding it that overlap it.
            last = max(i for i, epoch in enumerate(record.epochs) if segment in epoch)
            if last + 1 >= len(record.epochs):
                return {"successors": []}
            following = [s for s in record.epochs[last + 1] if s not in record.epochs[last]]
            result = []
            for successor in following:
                if successor.key_start < segment.key_end and segment.key_start < successor.key_end:
                    value = self._json(successor)
                    value["predecessors"] = sorted(
                        p.segment_id for p in record.epochs[last] if p not in record.epochs[last + 1]
                        and p.key_start < successor.key_end and successor.key_start < p.key_end)
                    result.append(value)
            return {"successors": result}
        if method == "get_segment_uri":
            server = self.home.get(body["segment"])
            if server is None:
                raise InvalidArgumentError(f"no segment {body['segment']!r}")
            return {"uri": server.uri}
        if method == "seal_stream":
            record = self._stream(body)
            if not record.sealed:
                raise StreamSealedError("use FakeController.seal_stream")
            return {}
        raise _Unsupported(method)


class _Unsupported(Exception):
    pass


class _ControllerConnection(_Connection):
    def on_ControllerRequest(self, c: ControllerRequest) -> None:
        controller: FakeController = self.server.controller  # type: ignore[attr-defined]
        try:
            reply = controller.handle(c.method, json.loads(c.body))
        except _Unsupported:
            self.send(OperationUnsupported(c.request_id, c.method))
            return
        except MillstreamError as error:
            self.send(ErrorMessage(c.request_id, "", error_code_of(error), str(error)))
            return
        self.send(ControllerReply(c.request_id, canonical_json(reply)))


class ControllerFakeServer(FakeServer):
    """A ``FakeServer`` that also answers ``ControllerRequest`` from ``controller``."""

    def __init__(self, controller: FakeController, **options: Any) -> None:
        super().__init__(**options)
        self.controller = controller

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _ControllerConnection(self), "127.0.0.1", port or self.port)
        self.port = self._server.sockets[0].getsockname()[1]
