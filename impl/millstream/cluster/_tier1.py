"""A cluster node's replicated Tier-1: ``jetstream://`` addresses, the check before start, the logs.

``parse_jetstream_address("jetstream://h1:4222,h2:4222")`` gives the NATS URLs; ``check_jetstream``
connects to them once, bounded by its timeout, and asks JetStream for the account's state, so that a
node given a wrong address fails before it joins the cluster (``Tier1UnavailableError`` naming the
address) instead of joining and then failing every container the map gives it; ``jetstream_logs``
is the ``open_log`` of a ``ClusterNode``: one ``JetStreamLog`` per container (its docstring has the
stream layout and the fencing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from millstream import limits
from millstream.errors import InvalidArgumentError, Tier1UnavailableError
from millstream.segmentstore.durable_data_log import DurableDataLog

__all__ = ["JETSTREAM_SCHEME", "check_jetstream", "jetstream_logs", "parse_jetstream_address"]

JETSTREAM_SCHEME = "jetstream://"


def parse_jetstream_address(address: str) -> list[str]:
    """The NATS URLs of ``jetstream://HOST:PORT[,HOST:PORT...]``.  Raises ``InvalidArgumentError``
    for anything else."""
    if not isinstance(address, str) or not address.startswith(JETSTREAM_SCHEME):
        raise InvalidArgumentError(f"a Tier-1 address is {JETSTREAM_SCHEME}HOST:PORT[,HOST:PORT...], not {address!r}")
    urls = []
    for server in address.removeprefix(JETSTREAM_SCHEME).split(","):
        host, _, port = server.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in host:
            raise InvalidArgumentError(f"{server.strip()!r} in {address!r} is not HOST:PORT")
        urls.append(f"nats://{host}:{int(port)}")
    return urls


async def check_jetstream(urls: Sequence[str], *,
                          timeout_seconds: float = limits.CLUSTER_TIER1_CHECK_TIMEOUT_SECONDS) -> None:
    """Connect to ``urls`` and ask JetStream for the account's state, within ``timeout_seconds``.
    Raises ``Tier1UnavailableError`` naming the addresses if no server answers or JetStream does not."""
    import nats
    import nats.errors
    import nats.js.errors

    named = ",".join(url.removeprefix("nats://") for url in urls)
    connection = None
    try:
        async with asyncio.timeout(timeout_seconds):
            connection = await nats.connect(list(urls), connect_timeout=timeout_seconds, allow_reconnect=False,
                                            max_reconnect_attempts=0)
            await connection.jetstream(timeout=timeout_seconds).account_info()
    except TimeoutError as error:
        raise Tier1UnavailableError(f"NATS JetStream at {named} did not answer within {timeout_seconds} s (is the "
                                    f"address right and the server up?)") from error
    except (nats.errors.Error, nats.js.errors.Error, OSError) as error:
        raise Tier1UnavailableError(f"NATS JetStream at {named} cannot be used: {error!r} (is the address right, "
                                    f"the server up and JetStream enabled?)") from error
    finally:
        if connection is not None:
            await connection.close()


def jetstream_logs(urls: Sequence[str], *, cluster: str, replicas: int) -> Callable[[int], DurableDataLog]:
    """A ``ClusterNode``'s ``open_log``: container ``id``'s ``JetStreamLog`` on ``urls``."""
    from millstream.segmentstore.jetstream_log import JetStreamLog

    servers = list(urls)

    def open_log(container_id: int) -> DurableDataLog:
        return JetStreamLog(servers, container_id, cluster_name=cluster, replicas=replicas)
    return open_log
