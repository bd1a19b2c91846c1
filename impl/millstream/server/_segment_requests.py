"""Requests on a server connection other than appends: reads, segment information and attributes,
segment administration and the controller's calls (``SegmentRequests``, a mixin of
``_connection.Connection``).

Theory of operation.  Cheap requests (segment info, attribute reads) are answered inline; every
container call that may wait runs as a task in the connection's task group (``_request``), counted
against the connection's limits on requests and read bytes in flight (``_ingress``).  Each checks
the request's token and the segment's owner first (``Connection._authorize``, ``_container``); a
request that is merely wrong gets its typed reply (``_error_replies``) and the connection carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from millstream import limits
from millstream.auth import SegmentOperation
from millstream.errors import (
    BadAttributeUpdateError,
    ContainerUnavailableError,
    InvalidArgumentError,
    StreamSegmentExistsError,
    StreamSegmentNotExistsError,
    StreamSegmentSealedError,
    TransientSegmentError,
)
from millstream.model.types import NULL_ATTRIBUTE_VALUE, AttributeUpdate, AttributeUpdateType
from millstream.naming import is_transient_segment
from millstream.segmentstore.event_boundaries import EVENT_SEGMENT_ATTRIBUTES
from millstream.server._connection_state import ConnectionState, ControllerEndpoint
from millstream.server._error_replies import _PAYLOAD_TOO_LARGE
from millstream.server._transient import check_merge
from millstream.wire import (
    Command,
    ControllerReply,
    ControllerRequest,
    CreateSegment,
    CreateTransientSegment,
    DeleteSegment,
    ErrorMessage,
    EventBoundaries,
    GetEventBoundaries,
    GetSegmentAttribute,
    GetSegmentInfo,
    MergeSegments,
    OperationUnsupported,
    ReadSegment,
    SealSegment,
    SegmentAttribute,
    SegmentAttributeUpdated,
    SegmentCreated,
    SegmentDeleted,
    SegmentInfo,
    SegmentRead,
    SegmentSealed,
    SegmentsMerged,
    SegmentTruncated,
    TruncateSegment,
    UpdateSegmentAttribute,
)
from millstream.wire.codec import encode_offsets
from millstream.wire.error_codes import error_code_of

if TYPE_CHECKING:
    from millstream.segmentstore.container import SegmentContainer

__all__ = ["SegmentRequests"]

_READ = SegmentOperation.READ
_REPLACE_IF_EQUALS = AttributeUpdateType.REPLACE_IF_EQUALS


class SegmentRequests(ConnectionState):
    """Reads, administration and the controller: the ``Connection``'s methods for them (a mixin over
    its state)."""

    @property
    def requests_in_flight(self) -> int:
        """This connection's requests being served (reads, administration, controller calls)."""
        return self._requests

    def _request(self, coroutine: Coroutine[Any, Any, None], *, read_bytes: int = 0) -> None:
        self._requests += 1
        self._read_bytes += read_bytes
        self._spawn(self._counted(coroutine, read_bytes), read=read_bytes > 0)

    async def _counted(self, coroutine: Coroutine[Any, Any, None], read_bytes: int) -> None:
        try:
            await coroutine
        finally:
            self._requests -= 1
            self._read_bytes -= read_bytes
            if not self._closing:
                self._update_reading()
                self._check_quiet()

    def _on_read_segment(self, command: ReadSegment) -> None:
        container = self._authorized_container(command.request_id, command.token, command.segment, _READ)
        if container is not None:
            reserved = max(1, min(command.suggested_length, limits.READ_LENGTH_BYTES_MAX))
            self._request(self._read(container, command), read_bytes=reserved)

    async def _read(self, container: SegmentContainer, command: ReadSegment) -> None:
        length = min(command.suggested_length, limits.READ_LENGTH_BYTES_MAX)
        wait_seconds = min(max(command.wait_ms, 0) / 1000.0, limits.TAIL_READ_WAIT_SECONDS_MAX)
        try:
            result = await container.read(command.segment, command.offset, length, wait_seconds=wait_seconds)
        except Exception as error:
            self._send(self._error_reply(command.request_id, command.segment, error, container))
            return
        positions = self._server.read_positions
        if positions is not None:  # (the node serves metrics: its reader lag)
            positions.record(self, command.segment, result.offset + len(result.data))
        self._send(SegmentRead(command.request_id, command.segment, result.offset, result.at_tail,
                               result.end_of_segment, result.data))

    def _on_get_segment_info(self, command: GetSegmentInfo) -> None:
        request_id, segment = command.request_id, command.segment
        container = self._authorized_container(request_id, command.token, segment, _READ)
        if container is None:
            return
        try:
            info = container.get_info(segment)
        except StreamSegmentNotExistsError:
            self._send(SegmentInfo(request_id, segment, False, False, False, 0, 0, 0))
            return
        except Exception as error:
            self._send(self._error_reply(request_id, segment, error))
            return
        self._send(SegmentInfo(request_id, segment, True, info.sealed, False, info.start_offset, info.length,
                               info.last_modified_ms))

    def _on_get_event_boundaries(self, command: GetEventBoundaries) -> None:
        """The segment's known event boundaries in the range (metadata, answered inline): at most
        ``limits.EVENT_BOUNDARIES_REPLY_ENTRIES_MAX`` of them, whatever range is asked for."""
        request_id, segment = command.request_id, command.segment
        container = self._authorized_container(request_id, command.token, segment, _READ)
        if container is None:
            return
        try:
            offsets = container.event_boundaries(segment, command.start_offset, command.end_offset,
                                                 limits.EVENT_BOUNDARIES_REPLY_ENTRIES_MAX)
        except Exception as error:
            self._send(self._error_reply(request_id, segment, error))
            return
        self._send(EventBoundaries(request_id, segment, encode_offsets(offsets)))

    def _on_get_segment_attribute(self, command: GetSegmentAttribute) -> None:
        request_id, segment = command.request_id, command.segment
        container = self._authorized_container(request_id, command.token, segment, _READ)
        if container is None:
            return
        try:
            value = container.get_info(segment).attributes.get(command.attribute_id, NULL_ATTRIBUTE_VALUE)
        except Exception as error:
            self._send(self._error_reply(request_id, segment, error))
            return
        self._send(SegmentAttribute(request_id, value))

    def _administer(self, request_id: int, segment: str, token: str,
                    operation: Coroutine[Any, Any, Command], what: SegmentOperation) -> None:
        """Run an administrative ``operation`` (after the token and ownership checks) as a request."""
        if self._authorized_container(request_id, token, segment, what) is None:
            operation.close()
            return
        self._request(self._reply_with(request_id, segment, operation))

    async def _reply_with(self, request_id: int, segment: str, operation: Coroutine[Any, Any, Command]) -> None:
        try:
            reply = await operation
        except Exception as error:
            reply = self._error_reply(request_id, segment, error)
        self._send(reply)

    def _on_create_segment(self, command: CreateSegment) -> None:
        async def create() -> Command:
            if is_transient_segment(command.segment):
                raise TransientSegmentError(f"{command.segment!r} is a transient segment's name: only "
                                            "CreateTransientSegment makes those")
            # Segments clients create by name hold events (event writers write there): their
            # truncation lands on event boundaries.  A byte-stream writer clears this when it opens one.
            await self._server.container_for(command.segment).create_segment(command.segment,
                                                                             EVENT_SEGMENT_ATTRIBUTES)
            return SegmentCreated(command.request_id, command.segment)
        self._administer(command.request_id, command.segment, command.token, create(), SegmentOperation.CREATE)

    def _on_create_transient_segment(self, command: CreateTransientSegment) -> None:
        parent, writer_id = command.parent, command.writer_id
        transients = self._server.transients

        async def create() -> Command:
            container = self._server.container_for(parent)
            info = container.get_info(parent)  # (raises: no such segment)
            if info.sealed:
                raise StreamSegmentSealedError(f"segment {parent!r} is sealed: it takes no large events")
            for _ in range(limits.TRANSIENT_SEGMENT_ATTRIBUTES_MAX):
                name = transients.new_name(parent, writer_id)
                try:
                    await container.create_segment(name)
                except StreamSegmentExistsError:
                    continue  # a leftover of an earlier run under that name: take the next one
                if not self._closing:
                    transients.created(name, parent, writer_id, self, self._clock.monotonic())
                else:  # the writer is gone already: its grace period starts now
                    transients.adopt(name, self._clock.monotonic())
                return SegmentCreated(command.request_id, name)
            raise TransientSegmentError(f"no free transient segment name for {parent!r}")
        self._administer(command.request_id, parent, command.token, create(), SegmentOperation.CREATE_TRANSIENT)

    def _on_seal_segment(self, command: SealSegment) -> None:
        async def seal() -> Command:
            _refuse_transient(command.segment, "sealed")
            with contextlib.suppress(StreamSegmentSealedError):  # sealing is idempotent on the wire
                await self._server.container_for(command.segment).seal(command.segment)
            return SegmentSealed(command.request_id, command.segment)
        self._administer(command.request_id, command.segment, command.token, seal(), SegmentOperation.SEAL)

    def _on_truncate_segment(self, command: TruncateSegment) -> None:
        async def truncate() -> Command:
            _refuse_transient(command.segment, "truncated")
            await self._server.container_for(command.segment).truncate(command.segment, command.offset)
            return SegmentTruncated(command.request_id, command.segment)
        self._administer(command.request_id, command.segment, command.token, truncate(), SegmentOperation.TRUNCATE)

    def _on_delete_segment(self, command: DeleteSegment) -> None:
        async def delete() -> Command:
            segment = command.segment
            try:
                await self._server.container_for(segment).delete(segment)
            except StreamSegmentNotExistsError:
                if is_transient_segment(segment):
                    self._server.transients.deleted(segment)  # (gone anyway: forget it)
                raise
            if is_transient_segment(segment):
                self._server.transients.deleted(segment)  # an abort
            return SegmentDeleted(command.request_id, segment)
        self._administer(command.request_id, command.segment, command.token, delete(), SegmentOperation.DELETE)

    def _on_merge_segments(self, command: MergeSegments) -> None:
        request_id, target, source = command.request_id, command.target, command.source
        if self._authorized_container(request_id, command.token, source, SegmentOperation.MERGE_FROM) is None:
            return

        async def merge() -> Command:
            check_merge(target, source)
            container = self._server.container_for(target)
            if self._server.container_for(source) is not container:
                raise InvalidArgumentError(f"{source!r} and {target!r} live in different containers; "
                                           "only a segment's own hidden segments can be merged into it")
            transients = self._server.transients
            transient = is_transient_segment(source)
            if transient:
                done = transients.merge_outcome(source)
                if done is not None and done[0] == target:  # a retry after a lost reply
                    return SegmentsMerged(request_id, target, source, done[1])
                if is_transient_segment(target):
                    transients.touch(target, self._clock.monotonic())
            try:
                with contextlib.suppress(StreamSegmentSealedError):
                    await container.seal(source)
                source_length = container.get_info(source).length
                offset = await container.merge(target, source)
            except StreamSegmentNotExistsError:
                done = transients.merge_outcome(source) if transient else None
                if done is not None and done[0] == target:  # the first attempt won the race
                    return SegmentsMerged(request_id, target, source, done[1])
                raise
            if transient:
                transients.merged(source, target, offset + source_length)
            return SegmentsMerged(request_id, target, source, offset + source_length)
        self._administer(request_id, target, command.token, merge(), SegmentOperation.MERGE_INTO)

    def _on_update_segment_attribute(self, command: UpdateSegmentAttribute) -> None:
        async def update() -> Command:
            _refuse_transient(command.segment, "given attribute updates")
            container = self._server.container_for(command.segment)
            try:
                await container.update_attributes(command.segment, (AttributeUpdate(
                    command.attribute_id, _REPLACE_IF_EQUALS, command.new_value, command.expected_value),))
            except BadAttributeUpdateError:
                return SegmentAttributeUpdated(command.request_id, False)
            return SegmentAttributeUpdated(command.request_id, True)
        self._administer(command.request_id, command.segment, command.token, update(),
                         SegmentOperation.UPDATE_ATTRIBUTE)

    def _on_controller_request(self, command: ControllerRequest) -> None:
        if self._server.controller is None and self._server.controller_expected:
            self._request(self._controller_request_when_started(command))
            return
        self._dispatch_controller_request(command)

    async def _controller_request_when_started(self, command: ControllerRequest) -> None:
        """The node's controller is starting: serve ``command`` once it has (``expect_controller``); a
        controller that does not start in time is a retryable ``ContainerUnavailableError``."""
        try:
            await asyncio.wait_for(self._server.controller_settled.wait(), limits.CONTROLLER_START_WAIT_SECONDS)
        except TimeoutError:
            self._send(self._error_reply(command.request_id, "", ContainerUnavailableError(
                f"the node's controller has not started within {limits.CONTROLLER_START_WAIT_SECONDS:g} s")))
            return
        if not self._closing:
            self._dispatch_controller_request(command)

    def _dispatch_controller_request(self, command: ControllerRequest) -> None:
        controller = self._server.controller
        if controller is None or not controller.knows(command.method):
            what = "ControllerRequest" if controller is None else f"ControllerRequest {command.method[:100]!r}"
            self._server.log.info("connection %s: unsupported %s (request %d)", self.peer,
                                  what, command.request_id)
            self._send(OperationUnsupported(command.request_id, what))
            return
        if len(command.body) > limits.CONTROLLER_REQUEST_BODY_BYTES_MAX:
            self._send(ErrorMessage(command.request_id, "", error_code_of(_PAYLOAD_TOO_LARGE),
                                    f"a controller request body of {len(command.body)} bytes exceeds "
                                    f"{limits.CONTROLLER_REQUEST_BODY_BYTES_MAX}"))
            return
        self._request(self._call_controller(controller, command))

    async def _call_controller(self, controller: ControllerEndpoint, command: ControllerRequest) -> None:
        try:
            body = await controller.handle(command.method, command.body)
        except Exception as error:
            self._send(self._error_reply(command.request_id, "", error))
            return
        if not self._authenticated and not self._closing:
            self._authenticate()  # (the controller checks the request's token with the server's authorizer)
        self._send(ControllerReply(command.request_id, body))



def _refuse_transient(segment: str, what: str) -> None:
    """Transient segments are never sealed, truncated or given attribute updates by request (PDP-43):
    their writer owns their bytes, and a merge seals them itself."""
    if is_transient_segment(segment):
        raise TransientSegmentError(f"transient segment {segment!r} cannot be {what}")
