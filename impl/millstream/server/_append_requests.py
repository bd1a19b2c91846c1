"""Appends on a server connection: ``SetupAppend``, append blocks (whole, conditional, streamed in
parts) and their answers (``AppendRequests``, a mixin of ``_connection.Connection``).

Theory of operation.  An append block is checked (event numbers, event count, event lengths),
charged against the in-flight budget (``_ingress``) and handed to its writer's ``WriterSession``
(``_appends``: the pure part), which decides whether to submit it now.  A block that need not wait
goes to its container without a task of its own (``SegmentContainer.append_at_once`` hands back the
operation's future, whose callback answers); one that may wait (Tier 2 lags, the container's queue is
full) runs as a task, and later blocks follow it there so none overtakes it.  The session turns each
outcome into the reply the protocol has for it (``DataAppended``, ``SegmentIsSealed``,
``InvalidEventNumber``, ``ConditionalCheckFailed``...) and says what to re-submit.

A broken append -- an event number that does not increase, malformed events, an append without
``SetupAppend`` -- closes the connection after the reply that explains it (``_fail_protocol``); the
handler returns at once.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from typing import TYPE_CHECKING
from uuid import UUID

from millstream import limits
from millstream.auth import SegmentOperation
from millstream.errors import (
    BadAttributeUpdateError,
    BadOffsetError,
    ContainerUnavailableError,
    InvalidArgumentError,
    MillstreamError,
    ProtocolError,
    StreamSegmentNotExistsError,
    StreamSegmentSealedError,
    TransientSegmentError,
)
from millstream.model.types import NULL_ATTRIBUTE_VALUE, AttributeUpdate, AttributeUpdateType
from millstream.naming import is_transient_segment
from millstream.server._appends import Failure, PendingBlock, WriterSession, scan_events
from millstream.server._connection_state import ConnectionState
from millstream.server._error_replies import _PAYLOAD_TOO_LARGE, _length_or_zero, _text
from millstream.wire import (
    AppendBlock,
    AppendBlockEnd,
    AppendBlockPart,
    AppendSetup,
    ConditionalAppend,
    ConditionalBlockEnd,
    ErrorMessage,
    InvalidEventNumber,
    SetupAppend,
    WireProtocolError,
)
from millstream.wire.error_codes import error_code_of

if TYPE_CHECKING:
    from millstream.segmentstore.container import SegmentContainer

__all__ = ["AppendRequests"]

_REPLACE_IF_EQUALS = AttributeUpdateType.REPLACE_IF_EQUALS
_APPEND = SegmentOperation.APPEND


class AppendRequests(ConnectionState):
    """Appends: the ``Connection``'s methods for them (a mixin over its state)."""

    def _on_setup_append(self, command: SetupAppend) -> None:
        request_id, segment = command.request_id, command.segment
        container = self._authorized_container(request_id, command.token, segment, _APPEND)
        if container is None:
            return
        existing = self._writers.get(command.writer_id)
        if existing is None and len(self._writers) >= self._config.connection_writers_max:
            self._send(ErrorMessage(request_id, segment, error_code_of(InvalidArgumentError()),
                                    f"this connection has {len(self._writers)} writers set up already; "
                                    f"the limit is {self._config.connection_writers_max}"))
            return
        if existing is not None and not existing.idle:
            self._send(ErrorMessage(request_id, segment, error_code_of(InvalidArgumentError()),
                                    f"writer {command.writer_id} has appends in flight on this connection"))
            return
        try:
            info = container.get_info(segment)
        except Exception as error:
            self._send(self._error_reply(request_id, segment, error))
            return
        if is_transient_segment(segment):
            try:  # (re-)attaches this connection: a writer that reconnected in time carries on
                self._server.transients.attach(segment, self, command.writer_id, self._clock.monotonic())
            except TransientSegmentError as error:
                self._send(self._error_reply(request_id, segment, error))
                return
        # A sealed segment still gets AppendSetup: the writer learns what is stored, and its next
        # block is answered SegmentIsSealed.
        last = info.attributes.get(command.writer_id.int, NULL_ATTRIBUTE_VALUE)
        self._writers[command.writer_id] = WriterSession(command.writer_id, segment, last)
        self._drop_parts(command.writer_id)
        self._send(AppendSetup(request_id, segment, command.writer_id, last))

    def _session(self, writer_id: UUID, request_id: int) -> WriterSession | None:
        """The writer's session; None after closing the connection (no ``SetupAppend`` for it)."""
        session = self._writers.get(writer_id)
        if session is None:
            self._fail_protocol(f"an append for writer {writer_id} without SetupAppend",
                                ErrorMessage(request_id, "", error_code_of(ProtocolError()),
                                             f"writer {writer_id} did not SetupAppend on this connection"))
        return session

    def _on_append_block(self, command: AppendBlock) -> None:
        if self._version is None:
            self._fail_protocol("AppendBlock before Hello")
            return
        session = self._session(command.writer_id, command.request_id)
        if session is None:
            return
        self._accept_block(session, command.request_id, command.last_event_number, command.event_count,
                           command.data, None)

    def _accept_block(self, session: WriterSession, request_id: int, last_event_number: int,
                      event_count: int | None, data: bytes, expected_offset: int | None, *, raw: bool = False) -> None:
        writer_id = session.writer_id
        if last_event_number <= session.last_received:
            self._fail_protocol(
                f"writer {writer_id}: event number {last_event_number} does not follow {session.last_received}",
                InvalidEventNumber(request_id, writer_id, last_event_number))
            return
        if raw:  # a large event's chunk or a byte stream's bytes: not events, so nothing to scan
            if is_transient_segment(session.segment):
                self._server.transients.touch(session.segment, self._clock.monotonic())
            else:
                self._server.statistics.record(session.segment, len(data), 0)
            charge = len(data) + self._config.append_overhead_bytes
            block = PendingBlock(request_id, last_event_number, data, expected_offset, charge, raw=True)
            self._charge(charge)
            if session.accept(block):
                self._submit(session, block)
            else:
                self._answer(session)
            return
        try:
            count, longest = scan_events(data)
        except WireProtocolError as error:
            self._fail_protocol(f"writer {writer_id}: malformed events: {error}",
                                ErrorMessage(request_id, session.segment, error_code_of(error), _text(error)))
            return
        if event_count is not None and count != event_count:
            self._fail_protocol(f"writer {writer_id}: a block announces {event_count} events and holds {count}",
                                InvalidEventNumber(request_id, writer_id, last_event_number))
            return
        if longest > limits.EVENT_LENGTH_BYTES_MAX:
            message = f"an event of {longest} bytes exceeds {limits.EVENT_LENGTH_BYTES_MAX}"
            self._fail_protocol(f"writer {writer_id}: {message}",
                                ErrorMessage(request_id, session.segment, error_code_of(_PAYLOAD_TOO_LARGE), message))
            return
        self._server.statistics.record(session.segment, len(data), count)  # (per block: auto-scaling's rates)
        charge = len(data) + self._config.append_overhead_bytes
        block = PendingBlock(request_id, last_event_number, data, expected_offset, charge)
        if self._server.append_latency is not None:
            block.arrived = self._clock.monotonic()
        self._charge(charge)
        if session.accept(block):
            self._submit(session, block)
        else:
            self._answer(session)

    def _submit(self, session: WriterSession, block: PendingBlock) -> bool:
        """Hand ``block`` to its container.  False if that closed the connection (the segment's
        container is gone): the caller stops."""
        try:
            container = self._server.container_for(session.segment)
        except MillstreamError as error:
            self._abort(f"writer {session.writer_id}: cannot append to {session.segment!r}: {error}")
            return False
        if self._task_group is None or self._closing:
            return True
        updates = () if block.raw else (AttributeUpdate(session.writer_id.int, _REPLACE_IF_EQUALS,
                                                        block.last_event_number, block.comparison),)
        if not self._waiting_appends:
            # The fast path: no task per block, the operation's future calls back.  Not while an
            # append waits in a task (throttled, or the queue full): a later block must not overtake it.
            try:
                future = container.append_at_once(session.segment, block.data, updates,
                                                  expected_offset=block.expected_offset)
            except Exception as error:  # answered on a later turn, as the task path would: not from inside dispatch
                future = asyncio.get_running_loop().create_future()
                future.set_exception(error)
            if future is not None:
                future.add_done_callback(functools.partial(self._on_appended, container, session, block))
                return True
        self._waiting_appends += 1
        self._spawn(self._append(container, session, block, updates))
        return True

    async def _append(self, container: SegmentContainer, session: WriterSession, block: PendingBlock,
                      updates: tuple[AttributeUpdate, ...]) -> None:
        """An append that may have to wait (Tier 2 lags, or the container's queue is full)."""
        try:
            offset = await container.append(session.segment, block.data, updates,
                                            expected_offset=block.expected_offset)
        except Exception as error:
            self._appended(container, session, block, None, error)
        else:
            self._appended(container, session, block, offset, None)
        finally:
            self._waiting_appends -= 1

    def _on_appended(self, container: SegmentContainer, session: WriterSession, block: PendingBlock,
                     future: asyncio.Future[int]) -> None:
        if future.cancelled():  # (nothing here cancels it; a container that stops fails it instead)
            self._appended(container, session, block, None, ContainerUnavailableError("the append was cancelled"))
            return
        error = future.exception()
        try:
            self._appended(container, session, block, None if error is not None else future.result(), error)
        except Exception:  # a bug: this runs as a loop callback, so say so here and end the connection
            self._server.log.error("%s: handling an append's outcome failed", self.peer,
                                   exc_info=sys.exc_info()[1])
            self._abort("internal error while answering an append")

    def _appended(self, container: SegmentContainer, session: WriterSession, block: PendingBlock,
                  offset: int | None, error: BaseException | None) -> None:
        """The container stored ``block`` at ``offset``, or refused it with ``error``: answer what may be."""
        if error is None:
            assert offset is not None
            session.succeeded(block, offset)
            if block.arrived >= 0.0:
                observe = self._server.append_latency
                if observe is not None:
                    observe(container.container_id, self._clock.monotonic() - block.arrived)
        elif isinstance(error, BadAttributeUpdateError):
            session.failed(block, Failure.COMPARISON)
        elif isinstance(error, BadOffsetError):
            session.failed(block, Failure.OFFSET)
        elif isinstance(error, StreamSegmentSealedError):
            session.failed(block, Failure.SEALED, _length_or_zero(container, session.segment))
        elif isinstance(error, StreamSegmentNotExistsError):
            session.failed(block, Failure.GONE)
        else:  # ContainerUnavailableError, or anything unexpected: the writer reconnects
            if not self._closing:
                self._abort(f"writer {session.writer_id}: append to {session.segment!r} failed: {error!r}")
            return
        if self._closing or self._writers.get(session.writer_id) is not session:
            return
        if self._answer(session):
            self._update_reading()

    def _answer(self, session: WriterSession) -> bool:
        """Send what ``session`` may answer now; submit what it wants re-submitted.  False if that
        closed the connection (another writer with the same id, or the container is gone)."""
        answered, to_submit = session.drain()
        released = 0
        close: str | None = None
        for block in answered:
            released += block.charge
            reply = block.reply
            assert reply is not None
            self._send(reply)
            if type(reply) is InvalidEventNumber:
                close = (f"writer {session.writer_id}: another writer with the same id wrote to "
                         f"{session.segment!r} (event number {block.last_event_number})")
        self._release(released)
        if close is not None:
            self._abort(close)
            return False
        for block in to_submit:
            if not self._submit(session, block):
                return False
        self._check_quiet()
        return True

    def _on_conditional_append(self, command: ConditionalAppend) -> None:
        session = self._session(command.writer_id, command.request_id)
        if session is None:
            return
        if command.expected_offset < 0:
            self._send(ErrorMessage(command.request_id, session.segment, error_code_of(InvalidArgumentError()),
                                    f"expected_offset {command.expected_offset} is negative"))
            return
        self._accept_block(session, command.request_id, command.event_number, None, command.data,
                           command.expected_offset)

    def _on_conditional_block_end(self, command: ConditionalBlockEnd) -> None:
        session = self._session(command.writer_id, command.request_id)
        if session is None:
            return
        if command.expected_offset < 0:
            self._send(ErrorMessage(command.request_id, session.segment, error_code_of(InvalidArgumentError()),
                                    f"expected_offset {command.expected_offset} is negative"))
            return
        self._accept_block(session, command.request_id, command.event_number, None, command.data,
                           command.expected_offset, raw=True)

    def _on_append_block_part(self, command: AppendBlockPart) -> None:
        session = self._session(command.writer_id, -1)
        if session is None:
            return
        held = self._parts_bytes.get(command.writer_id, 0) + len(command.data)
        if held > limits.APPEND_LENGTH_BYTES_MAX:
            self._fail_protocol(f"writer {session.writer_id}: a streamed block exceeds "
                                f"{limits.APPEND_LENGTH_BYTES_MAX} bytes")
            return
        self._parts.setdefault(command.writer_id, []).append(command.data)
        self._parts_bytes[command.writer_id] = held
        self._charge(len(command.data))

    def _drop_parts(self, writer_id: UUID) -> bytes:
        parts = self._parts.pop(writer_id, [])
        self._release(self._parts_bytes.pop(writer_id, 0))
        return b"".join(parts)

    def _on_append_block_end(self, command: AppendBlockEnd) -> None:
        session = self._session(command.writer_id, command.request_id)
        if session is None:
            return
        head = self._drop_parts(command.writer_id)
        data = head + command.data if head else command.data
        if len(data) != command.size_of_whole_events:
            self._fail_protocol(
                f"writer {session.writer_id}: a streamed block of {len(data)} bytes announces "
                f"{command.size_of_whole_events}",
                ErrorMessage(command.request_id, session.segment, error_code_of(ProtocolError()),
                             "the block's parts do not add up to size_of_whole_events"))
            return
        if len(data) > limits.APPEND_LENGTH_BYTES_MAX:
            self._fail_protocol(f"writer {session.writer_id}: a streamed block exceeds the append limit")
            return
        self._accept_block(session, command.request_id, command.last_event_number, command.event_count, data, None)
