"""millstream's errors: one tree, shared with the model (see ``millstream.model.errors``).

The model's module defines the vocabulary both packages share; the classes below are the
implementation's own -- the wire codec's and the controller's -- in the same tree (every exception
class millstream raises lives in one of the two modules)."""

import millstream.model.errors as _errors
from millstream.model.errors import *  # noqa: F403  (the tree is defined once, in the model package)
from millstream.model.errors import (
    ConnectionLostError,
    DataCorruptionError,
    LocalProtocolError,
    MillstreamError,
    PayloadTooLargeError,
    RemoteProtocolError,
    RetryableError,
)

__all__ = list(_errors.__all__)
__all__ += [
    "CommandTooLargeError",
    "ControllerUnreachableError",
    "FrameTooLargeError",
    "IncompatibleVersionError",
    "InvalidCommandError",
    "MalformedEventError",
    "MalformedFrameError",
    "MetadataConflictError",
    "TooManyTailReadersError",
    "UnknownCommandError",
    "WireProtocolError",
]


# --- The wire codec (``millstream.wire``, which re-exports them) -----------------------------------
# Bytes received that break the protocol are the peer's fault (``RemoteProtocolError``); a command
# the caller asks to encode that the protocol cannot carry is the caller's (``LocalProtocolError``).


class WireProtocolError(RemoteProtocolError):
    """Root of the errors about bytes received: bytes that are not a valid frame, append data that is
    not whole events, a peer that speaks no version we do.

    Raised by ``Decoder.feed`` (the decoder is then poisoned and the connection must be closed), by
    ``count_events``/``iter_events`` and by ``negotiate``.  The *peer* is at fault (``PeerError``):
    whoever sent the bytes; retrying the same bytes fails the same way.  (What the caller hands to
    ``encode`` is the caller's fault instead: ``InvalidCommandError``.)"""


class MalformedFrameError(WireProtocolError):
    """A frame's header or fields break the layout: a negative length, a field past the frame's end,
    bytes after its last field, a bool other than 0/1, a string that is not UTF-8.  The decoder is
    poisoned; the server closes the connection."""


class FrameTooLargeError(MalformedFrameError):
    """A frame header announces more than the decoder accepts: ``FRAME_BYTES_MAX``, or the lower
    ``Decoder.frame_bytes_max`` a server sets for a connection that has not authenticated yet.
    Raised as soon as the header is complete, before a byte of the body is buffered (poisoned, as for
    any malformed frame)."""


class UnknownCommandError(WireProtocolError):
    """A frame's type code names no command this codec knows.  Raised as soon as the header is
    complete; the decoder is poisoned, the server closes the connection."""


class MalformedEventError(WireProtocolError):
    """Append data is not a sequence of whole framed events (a type other than 0, a negative length,
    an event cut short).  The block must not be appended; the server closes the connection (a
    reader that meets such bytes in a segment raises it too: the bytes came from elsewhere)."""


class IncompatibleVersionError(WireProtocolError):
    """``negotiate`` found no protocol version both sides speak (or the peer's range is empty).  The
    connection must be closed."""


class InvalidCommandError(LocalProtocolError):
    """``encode`` was given something it cannot put on the wire: not a command, or a field that does
    not fit its wire type (an int out of range, a string over 65,535 UTF-8 bytes or with a lone
    surrogate, a bool field holding something else).  The caller is at fault; nothing was encoded."""


class CommandTooLargeError(InvalidCommandError, PayloadTooLargeError):
    """``encode`` was given a command whose frame would exceed ``FRAME_BYTES_MAX``, or
    ``encode_event`` a payload that could not fit in a frame.  Nothing was encoded."""


# --- The segment store and the controller ----------------------------------------------------------


class TooManyTailReadersError(RetryableError):
    """More tail reads wait on one segment than ``TAIL_READERS_PER_SEGMENT_MAX``; retry later."""


class MetadataConflictError(RetryableError):
    """A conditional append to the controller's metadata log found the log longer than this
    controller knew: another controller instance wrote meanwhile.  Nothing was appended (a partly
    written snapshot is skipped on replay).  Raised by ``MetadataLog.append`` and
    ``write_snapshot``; the controller catches up and plans again, so it never reaches a client."""


# --- Signals that stay inside millstream (issue 22, item 4: every exception class in the tree) -----

__all__ += ["DamagedRecordError", "MergeOutcomeUnknownError"]


class DamagedRecordError(DataCorruptionError):
    """A ``FileLog`` ledger holds a record at ``offset`` that is damaged (no record header, an
    implausible length, a checksum mismatch) or cut short by the end of what was written.  Raised
    while a ledger is scanned; recovery drops a torn tail (a record cut short at the very end, never
    acknowledged) and reports anything else as a ``DataCorruptionError`` naming the ledger, so it does
    not reach a caller itself."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class MergeOutcomeUnknownError(ConnectionLostError):
    """A large event's merge into its target segment lost its reply, and retrying could not settle
    whether the merge happened (the connection stayed down past the outage budget, or the transient
    segment is gone now).  Raised inside the large-event writer's commit, which fails the event and
    raises ``ConnectionLostError`` from it: whether the event was stored is unknown."""


# --- The cluster's coordination on ZooKeeper (``millstream.cluster``: issue 23) --------------------

__all__ += ["AssignmentConflictError", "CoordinationError", "CoordinationUnavailableError", "SessionLostError",
            "Tier1UnavailableError"]


class CoordinationError(MillstreamError):
    """Root of the errors of the cluster's coordination (membership, election and the container map
    on ZooKeeper).  Not raised itself."""


class CoordinationUnavailableError(CoordinationError, RetryableError, ConnectionError):
    """ZooKeeper could not be reached within the connection timeout: a wrong address, a server that
    is down, or (test equipment) a ZooKeeper server that would not start.  Raised by
    ``ClusterMember.start`` (nothing was registered: the host must not serve) and by
    ``ZooKeeperServer.start``.  Retrying helps once ZooKeeper answers."""


class AssignmentConflictError(CoordinationError, RetryableError):
    """A conditional write of the container map found a newer version than the writer read: another
    leader wrote the map meanwhile (this one was deposed, or raced a successor).  Nothing was written.
    Raised by ``write_assignment``; an elected member reads the map again and recomputes, a deposed one
    stops writing."""


class Tier1UnavailableError(CoordinationError, RetryableError, ConnectionError):
    """The replicated Tier-1 (NATS JetStream) could not be reached, or answered without JetStream,
    within the check's timeout: a wrong address, servers that are down, or servers started without
    JetStream.  Raised by ``check_jetstream`` before a cluster node starts (``millstream serve
    --tier1``), so that a host given a wrong address fails at once, naming it, instead of starting
    and failing every container it is given.  Retrying helps once the servers answer."""


class SessionLostError(CoordinationError):
    """This host's ZooKeeper session expired: its registration is gone and its containers may already
    be assigned to other hosts.  The member stops every container (it cannot know whether it still
    owns them) and completes ``ClusterMember.stopped`` with this error; it never serves again under
    that session.  Not retryable in place: a new member must join."""


# --- The client in a cluster (``millstream.client._controller``) ---------------------------------------


class ControllerUnreachableError(ConnectionLostError):
    """A client of a cluster could not find its controller: no seed said where the controller runs
    (every node asked was unreachable, or answered that it is moving), or the node named could not be
    reached.  Nothing was sent, so ``ControllerClient`` retries it within the reconnect budget, and
    raises ``ReconnectBudgetExceededError`` from it once that is spent."""
