"""The error tree every millstream package shares.

Errors are split by whose fault they are and by whether retrying can help:

* ``CallerError`` -- the request is invalid in the state it met (a sealed segment, a wrong
  offset).  Nothing changed; the same request will fail again.
* ``StorageError`` -- a durable tier failed or holds data that cannot be trusted.
* ``PeerError`` -- the other end of a connection broke the protocol (bad bytes, a reply that answers
  nothing).  The connection is closed; nothing on it is trusted.  Retrying on a new connection to a
  healthy peer may succeed.
* ``RetryableError`` -- the request's outcome is unknown or it could not run now; the same
  request may succeed later (after a reconnect, or once the container has recovered).
* ``InternalError`` -- "cannot happen": a broken invariant inside millstream.

Each error names, in its docstring, when it is raised and what state the caller is left in.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BadAttributeUpdateError",
    "BadOffsetError",
    "CallerError",
    "CheckpointFailedError",
    "CheckpointLimitError",
    "ChunkExistsError",
    "ChunkNotFoundError",
    "ChunkStorageError",
    "ConnectionLostError",
    "ContainerUnavailableError",
    "DataCorruptionError",
    "DataLogFencedError",
    "DurableDataLogError",
    "EventReaderOpenError",
    "EventTooLargeError",
    "FenceValueError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidEventNumberError",
    "InvalidScaleError",
    "InvalidStreamCutError",
    "LargeEventFailedError",
    "LeaseExpiredError",
    "LeaseTooLargeError",
    "MillstreamError",
    "ObjectClosedError",
    "OperationUnsupportedError",
    "PayloadTooLargeError",
    "PeerError",
    "ProtocolError",
    "ReaderExistsError",
    "ReaderGroupExistsError",
    "ReaderGroupNotFoundError",
    "ReaderNotInGroupError",
    "RequestTimeoutError",
    "ReservedSegmentError",
    "RetryableError",
    "ScopeExistsError",
    "ScopeNotEmptyError",
    "ScopeNotFoundError",
    "StorageError",
    "StorageFullError",
    "StorageUnavailableError",
    "StreamExistsError",
    "StreamNotFoundError",
    "StreamNotSealedError",
    "StreamSealedError",
    "StreamSegmentExistsError",
    "StreamSegmentMergedError",
    "StreamSegmentNotExistsError",
    "StreamSegmentNotSealedError",
    "StreamSegmentSealedError",
    "StreamSegmentTruncatedError",
    "TransactionNotFoundError",
    "TransactionNotOpenError",
    "TransientSegmentError",
    "TruncatedDataError",
    "WriteFailedError",
    "WrongHostError",
]


class MillstreamError(Exception):
    """Root of every error millstream raises on purpose. Not raised itself."""


class RetryableError(MillstreamError):
    """The same request may succeed if retried; its earlier attempt may or may not have taken effect."""


class CallerError(MillstreamError):
    """The request is invalid in the state it met. Nothing changed; retrying it unchanged fails again."""


class InvalidArgumentError(CallerError, ValueError):
    """An argument is malformed (wrong type, out of range). Raised before anything is queued."""


class PayloadTooLargeError(InvalidArgumentError):
    """An append, attribute set or frame exceeds its limit (see ``millstream.limits``). Nothing was queued."""


class StreamSegmentNotExistsError(CallerError, LookupError):
    """The segment was never created, or has been deleted. Nothing changed."""


class StreamSegmentMergedError(StreamSegmentNotExistsError):
    """The segment was merged into another one and accepts no further operations. Nothing changed."""


class StreamSegmentExistsError(CallerError):
    """A segment of that name already exists. Nothing changed."""


class StreamSegmentSealedError(CallerError):
    """The segment is sealed: it takes no appends, attribute updates, seals or merges into it."""


class StreamSegmentNotSealedError(CallerError):
    """A merge source must be sealed first. Nothing changed."""


class BadOffsetError(CallerError):
    """A conditional append's expected offset is not the segment's length, or a truncation offset lies
    outside ``[start offset, length]``. Nothing changed."""


class BadAttributeUpdateError(CallerError):
    """An attribute update's condition failed (e.g. a compare-and-set saw another value), or it names an
    attribute the segment may not hold. The whole operation (data included) was rejected."""


class StreamSegmentTruncatedError(CallerError):
    """The requested offset lies below the segment's start offset (that data was truncated away), or a
    truncated segment was named as a merge source."""


class StorageError(MillstreamError):
    """A durable tier failed or holds data that cannot be trusted."""


class DataCorruptionError(StorageError):
    """Stored data failed validation (checksum, framing, or replay).  The container refuses to start
    rather than serve wrong bytes; the log is left untouched as evidence."""


class DurableDataLogError(StorageError):
    """A Tier-1 durable data log operation failed."""


class WriteFailedError(DurableDataLogError):
    """A Tier-1 write failed.  Its outcome is unknown: the data may or may not be durable.  The log
    closed itself; every later pending write failed too."""


class DataLogFencedError(DurableDataLogError):
    """Another owner (a newer epoch) took the log over.  This instance may not write again."""


class ChunkStorageError(StorageError):
    """A Tier-2 (long-term storage) chunk operation failed."""


class ChunkNotFoundError(ChunkStorageError, LookupError):
    """The chunk does not exist (never created, or deleted).  Nothing changed."""


class ChunkExistsError(ChunkStorageError):
    """A chunk of that name exists already.  Nothing changed."""


class StorageFullError(ChunkStorageError, RetryableError):
    """Tier 2 has no room.  Nothing was written; the caller throttles and retries once space frees."""


class StorageUnavailableError(ChunkStorageError, RetryableError):
    """Tier 2 failed or timed out.  A write may be partly applied (its chunk is longer than before but
    shorter than asked); the caller re-reads the chunk's length before retrying."""


class ContainerUnavailableError(RetryableError):
    """The segment container is not running (it is recovering or was stopped by a Tier-1 failure).
    An operation failed with this error may or may not have taken effect; retry once it is back."""


class ObjectClosedError(MillstreamError, RuntimeError):
    """The object was closed; it accepts no further calls."""


class ConnectionLostError(RetryableError, ConnectionError):
    """The connection to a server broke (or could not be made) before a reply arrived.  Requests in
    flight on it may or may not have taken effect; idempotent writers re-send what was not
    acknowledged after they reconnect."""


class RequestTimeoutError(RetryableError, TimeoutError):
    """No reply arrived within the request's time limit.  The request may still take effect."""


class WrongHostError(RetryableError):
    """The server does not own the container of the named segment (it moved, or the client asked the
    wrong server).  Nothing changed; ask the controller where the segment lives and retry there."""


class AuthenticationError(CallerError, PermissionError):
    """The request's token is missing, malformed, forged, expired, or does not grant this access to
    this resource.  Nothing changed."""


class ReservedSegmentError(CallerError, PermissionError):
    """A client asked to create, append to, truncate, seal, merge, update an attribute of or delete a
    segment that only the node itself changes that way (``millstream.auth.CLIENT_OPERATIONS``): one of
    a reserved scope (``_system``: the controller's metadata), a reserved name in a scope
    (``scope/_...``), a stream transaction's segment (its writers append; the controller commits and
    aborts) or a reader group's state (its state synchronizer appends and truncates).  Refused
    whatever the token, with authentication on or off.  Nothing changed."""


class InvalidEventNumberError(CallerError):
    """A writer's event number did not follow the last one stored for its writer id -- another writer
    with the same id wrote in between, or the number went backwards.  Nothing was appended; the
    server closed the writer's connection and the writer must set up again."""


class OperationUnsupportedError(CallerError, NotImplementedError):
    """The server does not implement the requested operation (an older server, or one that does not
    host what was asked for).  Nothing changed; the same request fails again on the same server."""


# --- Streams, scopes and reader groups (the controller) ------------------------------------------


class ScopeNotFoundError(CallerError, LookupError):
    """The scope was never created, or was deleted.  Nothing changed."""


class StreamNotFoundError(CallerError, LookupError):
    """The stream was never created in its scope, or was deleted (reading a deleted stream raises
    it too).  Nothing changed."""


class ReaderGroupNotFoundError(CallerError, LookupError):
    """The reader group was never created in its scope, or was deleted.  Nothing changed."""


class ScopeExistsError(CallerError):
    """A scope of that name exists already.  Nothing changed."""


class StreamExistsError(CallerError):
    """A stream of that name exists already in its scope (whatever its configuration).  Nothing changed."""


class ReaderGroupExistsError(CallerError):
    """A reader group of that name exists already in its scope.  Nothing changed."""


class ScopeNotEmptyError(InvalidArgumentError):
    """A scope that still holds streams or reader groups cannot be deleted.  Nothing changed."""


class StreamNotSealedError(InvalidArgumentError):
    """A stream must be sealed before it can be deleted.  Nothing changed."""


class StreamSealedError(InvalidArgumentError):
    """The stream is sealed: it cannot be scaled or reconfigured any more (sealing it again succeeds).
    Nothing changed."""


class InvalidScaleError(InvalidArgumentError):
    """A scale request names segments that are not in the stream's current epoch, or new key ranges
    whose union is not exactly the union of the sealed segments' ranges (or that overlap, or leave
    [0, 1)).  Nothing changed: no segment was created or sealed."""


class InvalidStreamCutError(InvalidArgumentError):
    """A stream cut is not a position of this stream: it names another stream's (or an unknown)
    segment, its segments do not cover the key space [0, 1) exactly once, an offset lies outside its
    segment, or (for truncation) it lies before the stream's current head.  Nothing changed."""


# --- Readers in reader groups ----------------------------------------------------------------------


class ReaderExistsError(CallerError):
    """A reader with that id is online in the reader group already (two processes must not share a
    reader id).  Nothing changed: the group's state is as it was."""


class ReaderNotInGroupError(CallerError, LookupError):
    """The reader is not online in its reader group: it was declared offline (by the application, or
    by the other readers after it stopped heartbeating) or the group forgot it.  Its segments went
    back to the group; the reader is closed and a new one must join to read on."""


class CheckpointLimitError(CallerError):
    """A reader group already has ``limits.READER_GROUP_CHECKPOINTS_OUTSTANDING_MAX`` checkpoints in
    progress.  Nothing changed; initiate it again once one completes."""


class CheckpointFailedError(RetryableError):
    """A checkpoint in progress was abandoned before every reader recorded its position: the group
    was reset (or deleted) meanwhile, or the wait for it timed out.  The group's readers are unaffected;
    a new checkpoint may be initiated."""


class TruncatedDataError(StreamSegmentTruncatedError):
    """A reader's next event lies in data that truncation or retention removed (the segment was
    truncated past the reader's offset, or deleted).  Nothing was skipped: the reader stays before the
    missing data and raises this again; reset the group to a stream cut at or after the stream's head
    to go on."""


# --- Stream transactions (the controller) ---------------------------------------------------------


class TransactionNotFoundError(CallerError, LookupError):
    """No transaction of the stream has that id: it was never begun there, or it finished so long ago
    that the controller forgot it (it keeps ``limits.TRANSACTIONS_FINISHED_PER_STREAM_MAX`` finished
    ones per stream).  Nothing changed."""


class TransactionNotOpenError(CallerError):
    """The stream transaction is not OPEN: it is committing or committed (so it cannot be written to,
    committed again or aborted) or aborting or aborted (so it cannot be written to or committed).
    The message names its status.  Nothing changed; a fenced multi-commit that lists it committed
    nothing and recorded nothing."""


class LeaseExpiredError(TransactionNotOpenError):
    """A ping came after the transaction's lease had lapsed: the controller aborts it (or already
    did) and will not renew it.  Nothing changed."""


class LeaseTooLargeError(InvalidArgumentError):
    """A transaction's lease is longer than ``limits.TRANSACTION_LEASE_SECONDS_MAX`` (or shorter than
    ``limits.TRANSACTION_LEASE_MIN_SECONDS``, or not a number).  Nothing was begun."""


class FenceValueError(InvalidArgumentError):
    """A fenced multi-commit's fence value is not an integer in [0, 2**63), or its key is not a
    non-empty string within ``limits.FENCE_KEY_LENGTH_MAX``.  Nothing changed."""


# --- Large events and transient segments ---------------------------------------------------------


class TransientSegmentError(InvalidArgumentError):
    """An operation that a transient segment (a large event's staging segment,
    ``<parent>#transient.<hex>``) does not allow: sealing, truncating or updating an attribute of one;
    creating one by name (only ``CreateTransientSegment`` makes them) or for a parent that is itself a
    hidden segment; merging into one anything but a sibling transient segment of the same parent, or
    merging one into anything but its parent or such a sibling; setting up more writer ids on one than
    ``limits.TRANSIENT_SEGMENT_ATTRIBUTES_MAX``; naming one where a stream segment is expected (the
    target of a large event or of a byte-stream writer).  Nothing changed."""


class LargeEventFailedError(RetryableError):
    """A large event could not be completed: its transient segment was deleted under it (idle expiry,
    or its writer's connection stayed down past the grace period), its target segment was sealed
    (scaling: continuing across a seal is out of scope, as in PDP-43), or reconnecting gave up.
    Nothing of it was merged -- readers never see any part of it -- and its ``EventWriter`` is closed;
    write the event again through a new one (the message says why this one failed)."""


class EventTooLargeError(CallerError):
    """``read_next_event`` met an event longer than the reader's in-memory limit
    (``ReaderConfig.event_in_memory_bytes_max``).  Nothing was consumed: the reader stays before the
    event and raises this again until the event is read through ``event_read.stream_event()`` (a
    bounded, file-like ``EventReader`` over exactly its bytes).  ``event_read`` is None when the error
    crossed the wire."""

    def __init__(self, message: str = "", event_read: object = None) -> None:
        super().__init__(message)
        self.event_read = event_read


class EventReaderOpenError(InvalidArgumentError):
    """The reader was asked to advance (``read_next_event``, or another ``stream_event``) while an
    ``EventReader`` it handed out is still open: a reader does not move past an event that is being
    streamed.  Nothing changed; close the ``EventReader`` first."""


class PeerError(MillstreamError):
    """The other end of a connection is at fault: what it sent cannot be trusted.  Bad bytes from a
    peer are never the caller's fault (``CallerError``), whichever side notices them: the server
    answers a malformed frame by closing the connection, a client treats a server's garbage as a
    broken connection."""


class RemoteProtocolError(PeerError):
    """The peer broke the protocol (a malformed frame, a reply that answers nothing, a block that ends
    inside an event).  The connection was closed; nothing on it is trusted.

    One of the protocol-error pair (h11's ``LocalProtocolError`` / ``RemoteProtocolError``): this
    one is the *other* end's fault, whichever side notices it; ``LocalProtocolError`` is ours."""


#: The name most of millstream raises ``RemoteProtocolError`` by (the same class).
ProtocolError = RemoteProtocolError


class InternalError(MillstreamError, AssertionError):
    """Cannot happen: an internal invariant was broken.  Treat the process as untrustworthy."""


# --- Event boundaries and data directories (issue 20, items 2 and 3) ------------------------------


class EventBoundaryError(BadOffsetError):
    """A truncation offset in a segment that holds events (a stream's segments, event writers' plain
    segments) does not lie on an event boundary: truncating there would cut an event in two and leave
    the segment unreadable from its head.  Or -- the message says so -- the store could not confirm
    it is one within its bounded scan (``limits.EVENT_BOUNDARY_SCAN_BYTES_MAX``).  Nothing changed;
    truncate at an offset a reader reported, a stream cut, or the segment's length.  (Over the wire it
    arrives as its base class, ``BadOffsetError``, with the same message.)"""


class DataDirectoryInUseError(CallerError):
    """Another process runs a node on this data directory (it holds the directory's lock file,
    ``node.lock``, which names its pid).  Two nodes on one directory would fence each other's logs.
    Nothing was started or changed; stop the other node first."""


__all__ += ["DataDirectoryInUseError", "EventBoundaryError"]


# --- The client: connecting, giving up after an outage, undecodable events -------------------------
# (One section, so that other additions to this module merge cleanly.)

__all__ += [
    "ConnectFailedError",
    "ReconnectBudgetExceededError",
    "TlsHandshakeError",
    "UndecodableEventError",
]


class ConnectFailedError(CallerError, ConnectionError):
    """No connection to the server could be made, and this client never reached any server before:
    the address is wrong, nothing listens there (refused), or it did not answer -- after trying for
    the client's initial connect budget (``ClientConfig.initial_connect_budget_seconds``).  The message
    names the address and the reason.  Nothing was sent; retrying with the same address and settings
    fails the same way (a server that *was* reached and went away raises the retryable
    ``ConnectionLostError`` instead, after the reconnect budget)."""


class TlsHandshakeError(ConnectFailedError):
    """The connection was made but TLS failed, and retrying cannot fix it: the server's certificate is
    not trusted (the client lacks its CA: ``--tls-ca`` / ``ssl_context``), names another host, or one
    side speaks TLS and the other plain TCP (a ``tcp://`` URI for a TLS server, or ``tls://`` for a
    plain one).  The message says which.  Never retried; nothing was sent."""


class ReconnectBudgetExceededError(ConnectionLostError):
    """A server that was reached before could not be reached again within the per-outage reconnect
    budget (``ClientConfig.reconnect_budget_seconds``, counted from the first failure after the last
    success), so the call gave up.  What was sent may or may not have taken effect.

    From a writer (its ``write_event``, ``flush`` and ``close`` raise it once it gave up, and it is
    closed for good) ``in_doubt`` holds every event it was given and has not seen acknowledged -- each
    may or may not be stored -- as ``InDoubtEvent`` values (``sequence``: the event's place among all
    the events written through that writer, from 1; ``segment``, ``routing_key``, ``payload``: its
    serialized bytes; ``application_sequence``: from a writer with a stable id, the sequence it was
    written with), in the order they were written.  Empty for any other call."""

    def __init__(self, message: str = "", in_doubt: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.in_doubt = in_doubt


class UndecodableEventError(InvalidArgumentError):
    """A reader's serializer refused the bytes of an event -- a "poison" event some writer stored (the
    serializer's own error is the ``__cause__``).  Nothing was skipped or consumed: every event before
    it was returned, the reader stays *at* it (its position and any checkpoint name ``offset``) and
    raises this again on every read until the application moves past it explicitly -- a reader in a
    group with ``reader.skip(error.event_read)``, a segment reader with ``seek(error.next_offset)`` --
    after looking at its raw bytes (``payload``) if it wishes.  ``segment``, ``offset`` (where its
    frame starts), ``length`` (of its payload) and ``next_offset`` (where the next event starts) name
    it; ``event_read`` is the reader's ``EventRead`` for it (None when the error crossed the wire).
    (An ``InvalidArgumentError``, as the serializers' errors are, so handlers of those still match.)"""

    def __init__(self, message: str = "", *, segment: str = "", offset: int = -1, length: int = -1,
                 payload: bytes = b"", event_read: object = None) -> None:
        super().__init__(message)
        self.segment = segment
        self.offset = offset
        self.length = length
        self.payload = payload
        self.event_read = event_read

    @property
    def next_offset(self) -> int:
        """Where the event after this one starts (its frame is an 8-byte header and the payload)."""
        return self.offset + 8 + self.length


# --- Writer identity (issue 20, item 4) ---------------------------------------------------------------

__all__ += ["InvalidSequenceError", "WriterIdInUseError"]


class WriterIdInUseError(CallerError):
    """A writer learned from the server (``AppendSetup``, or a sealed segment's writer-id attribute)
    that its writer id already holds events it never sent: another writer uses the same id -- two
    clients made with the same seeded ``rng``, or two processes given the same stable writer id at
    once.  Raised by the writer's next call (``write_event``, ``flush``, ``close``); the writer is
    failed, and none of its unacknowledged events was stored under its id."""


class InvalidSequenceError(InvalidArgumentError):
    """``write_event``'s ``sequence`` is wrong for the writer: missing (a writer with a stable writer
    id needs one per event), not an int in [1, 2**63), not above the last sequence this writer was
    given, or given to a writer with a random id (which cannot resume, so a sequence would promise
    what it cannot keep).  Raised before anything is buffered; the writer is unchanged."""


# --- The protocol-error pair (issue 22, item 4) ---------------------------------------------------

__all__ += ["LocalProtocolError", "RemoteProtocolError"]


class LocalProtocolError(InvalidArgumentError):
    """This side was about to break the protocol: it was asked to send something the protocol cannot
    carry (not a command, a field outside its wire type -- an int out of range, a string too long --
    or a frame over the frame limit).  The caller's fault, not the peer's (that is
    ``RemoteProtocolError``); nothing was sent and the connection is untouched."""


# --- The model's transitions (issue 22, item 4) ----------------------------------------------------

__all__ += ["NotEnabled"]


class NotEnabled(CallerError, AssertionError):
    """A model transition (``millstream.model.durable_log``, ``stable_writer``, ``exactly_once_sink``,
    ...) was asked for in a state where its spec's guard is false.  Raised by the transition before
    it builds a next state (the model's states are values: nothing changed).  The caller's fault; the
    exhaustive explorers in ``proofs/`` and the model tests catch it to learn that a step is not
    enabled.  (An ``AssertionError`` too, as the guard's violation always was.)"""
