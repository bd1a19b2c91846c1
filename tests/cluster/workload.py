"""The exactly-once workload the cluster tests run while nodes stop or die, recorded in a ``History``:
rounds of tagged events from an idempotent writer, a transaction of tagged events, and a reader
group's read-back (``test_cluster_controller.py`` in one process, ``test_cluster_kill.py`` under
``millstream cluster up``).  Each test keeps its own faults and assertions; this only writes, reads and
records."""

from __future__ import annotations

from typing import Any

from millstream.client import AsyncClient
from millstream.testing.history import EventTag, History, Outcome, TransactionOutcome
from millstream.values import ReaderGroupConfig

#: Reads that return nothing before a read-back gives up (each waits up to a second for an event).
EMPTY_READS_MAX = 120
#: Routing keys the rounds spread their events over.
ROUTING_KEYS = 8


class RecordedWorkload:
    """Writes to ``stream`` through ``client``, every event recorded in ``history``."""

    def __init__(self, client: AsyncClient, stream: str, history: History) -> None:
        self.client = client
        self.stream = stream
        self.history = history
        self.writer: Any = client.event_writer(stream)
        #: Events written by ``write_round`` and transactions committed, so far.
        self.sequence = 0
        self.transaction_events = 0

    @property
    def written(self) -> int:
        """How many events must be read back: every round's and every committed transaction's."""
        return self.sequence + self.transaction_events

    async def write_round(self, count: int) -> None:
        """``count`` tagged events over the routing keys, flushed: all acknowledged."""
        tags = []
        for _ in range(count):
            self.sequence += 1
            tag = EventTag("w", self.sequence)
            key = f"k{self.sequence % ROUTING_KEYS}"
            self.history.write_invoked(tag, key=key)
            await self.writer.write_event(tag.payload(key=key), routing_key=key)
            tags.append(tag)
        await self.writer.flush()
        self.history.writes_completed(tags, Outcome.ACKED)

    async def commit_transaction(self, transactions: Any, name: str, count: int) -> None:
        """A transaction ``name`` of ``count`` tagged events (writer "t", numbered on from earlier
        transactions) on routing key "tk", begun on ``transactions`` (a transactional writer) and committed."""
        transaction = await transactions.begin()
        tags = []
        for index in range(count):
            tag = EventTag("t", self.transaction_events + index + 1)
            self.history.write_invoked(tag, key="tk", transaction=name)
            await transaction.write_event(tag.payload(key="tk"), routing_key="tk")
            tags.append(tag)
        await transaction.commit()
        self.history.writes_completed(tags, Outcome.ACKED)
        self.history.transaction_completed(name, TransactionOutcome.COMMITTED)
        self.transaction_events += count

    async def read_back(self, group_name: str, reader_name: str = "r1") -> int:
        """Read the stream from its start with a new reader group until every event written was read
        (or ``EMPTY_READS_MAX`` reads came back empty), recorded as one pass; return how many were read."""
        group = await self.client.reader_group(group_name, config=ReaderGroupConfig([self.stream]))
        reader = await group.reader(reader_name)
        seen = empty = 0
        while seen < self.written and empty < EMPTY_READS_MAX:
            read = await reader.read_next_event(1.0)
            if read.event is None:
                empty += 1
                continue
            self.history.read("group", read.event)
            seen += 1
        self.history.pass_complete("group")
        await group.close()
        return seen
