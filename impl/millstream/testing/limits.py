"""The simulation layer's limits, each with its reason (``millstream.limits`` holds the store's own).

A simulated network is test equipment, yet it is bounded like the store: a test that leaks
connections, or a receiver that stops reading, fails loudly instead of growing memory without end.
"""

from __future__ import annotations

from typing import Final

from millstream.limits import KIB, MIB

#: Bytes one direction of a simulated link may hold undelivered (a receiver that stopped reading, a
#: long partition).  Far above what a writer's unacknowledged-bytes budget lets it send; a pipe that
#: reaches it is cut rather than grown, as a real connection would break rather than buffer forever.
SIMULATED_NETWORK_PIPE_BYTES_MAX: Final = 64 * MIB

#: A simulated transport's default write-buffer high-water mark: asyncio's own default for sockets,
#: so flow control (``pause_writing``) starts where it would over TCP.
SIMULATED_NETWORK_WRITE_BUFFER_HIGH_BYTES: Final = 64 * KIB

#: Connections open at once on one simulated network: a test that leaks connections fails loudly
#: instead of growing without bound (the server's own cap, SERVER_CONNECTIONS_MAX, is lower).
SIMULATED_NETWORK_LINKS_MAX: Final = 10_000

#: A connect waits for a partition to end; a partition extended again and again makes it wait again,
#: at most this many times (each wait is bounded by the partition's own length).
SIMULATED_NETWORK_PARTITION_WAITS_MAX: Final = 1000
