"""The segment-store server: segment containers served over TCP (optionally TLS) with the wire protocol.

Theory of operation.  A ``SegmentStoreServer`` owns a set of container ids (all of
``range(container_count)`` by default) and runs each through a ``ContainerHost``, which restarts a
container after a Tier-1 failure.  A segment belongs to container
``naming.container_of(segment, container_count)``; a request for a segment of a container this
server does not own is answered ``WrongHost``.

Each accepted socket becomes a ``Connection`` (``_connection``): the transport reads into the
server's one shared receive buffer, the sans-I/O ``wire.Decoder`` turns bytes into commands, each
command is dispatched in order, and the replies of one event-loop turn leave in one write.  Appends
take the hot path: a block is checked once, as a whole (never event by event in Python), charged
against the in-flight budget, and handed to its writer's ``WriterSession`` (``_appends``, sans I/O),
which chains event-number compare-and-sets across a pipeline of blocks and orders the
acknowledgements; the block's bytes go to the container as they came off the wire, without another
copy.  Reads and administration are tasks in the connection's ``asyncio.TaskGroup``.

Backpressure: a connection stops reading from its socket while its own append bytes in flight, or
the server's, are over their limits (``_config.IngressBudget``, after Pravega's ConnectionTracker),
while too many of its other requests are in flight, or while its peer does not read the replies.

Hostile peers: nothing is allocated from a length a peer announces -- partly received frames are
held as their bytes arrive, within ``_config.ReceiveBudget``, large ones in buffers recycled through
``_config.FramePool`` -- and frames are limited to 64 KiB until a connection authenticates.  Every
slot has a deadline (Hello, a started frame, idleness) and one peer address gets at most
``connections_per_address_max`` of them.  What peers can make the server log goes through a
``RateLimitedLog``; after a burst of closed connections the freed heap goes back to the operating
system (``_memory``).

The node's controller, when it hosts one (``attach_controller``), shares the connections:
``ControllerRequest`` is dispatched to it as another request task (a server without one answers
``OperationUnsupported``).  Each append block accepted is also counted in ``statistics`` (bytes and
events per segment), which the controller drains for auto-scaling.

Shutdown (``stop``) stops accepting, stops reading, lets every append and administrative request
already received finish and be answered (bounded), cancels waiting tail reads, closes the
connections and stops the containers.
"""

from millstream.server._appends import WriterSession, scan_events
from millstream.server._config import FramePool, IngressBudget, ReceiveBudget, ServerConfig
from millstream.server._connection import Connection
from millstream.server._connection_state import ControllerEndpoint
from millstream.server._server import SERVER_LIFECYCLE, SegmentStoreServer, ServerState
from millstream.server._stats import SegmentStatistics

__all__ = [
    "SERVER_LIFECYCLE",
    "Connection",
    "ControllerEndpoint",
    "FramePool",
    "IngressBudget",
    "ReceiveBudget",
    "SegmentStatistics",
    "SegmentStoreServer",
    "ServerConfig",
    "ServerState",
    "WriterSession",
    "scan_events",
]
