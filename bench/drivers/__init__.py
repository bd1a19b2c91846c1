"""Drivers: one module per system the harness measures (see ``_base`` for what a driver provides).

* ``millstream_standalone``: millstream's own client against a ``millstream standalone`` process;
* ``nats_jetstream``: NATS JetStream, fsync per message (equal durability) or the server's default;
* ``redis_streams``: Redis Streams, ``appendfsync always`` (equal durability) or ``everysec``.

``all_drivers()`` builds one of each, keyed by the name workloads use.  Building a driver imports no
client library and starts nothing.
"""

from __future__ import annotations

from bench.drivers._base import Availability, Consumer, Driver, Session

__all__ = ["Availability", "Consumer", "Driver", "Session", "all_drivers"]


def all_drivers() -> dict[str, Driver]:
    from bench.drivers.millstream_standalone import MillstreamDriver
    from bench.drivers.nats_jetstream import NatsJetStreamDriver
    from bench.drivers.redis_streams import RedisStreamsDriver

    drivers: list[Driver] = [
        MillstreamDriver(),
        NatsJetStreamDriver(sync_always=True),
        RedisStreamsDriver(fsync_always=True),
        NatsJetStreamDriver(sync_always=False),
        RedisStreamsDriver(fsync_always=False),
    ]
    return {driver.name: driver for driver in drivers}
