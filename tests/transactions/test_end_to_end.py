"""Stream transactions end to end over TCP, against ``millstream.standalone``: transactions begun in one
client and committed by id from another (as a Spark driver commits what its executors wrote), while a
plain writer writes and the stream splits under open transactions; readers in a reader group see each
transaction all or nothing, in commit order, between the writes before and after its commit (the
history checker finds no aborted read and no partial transaction read); the fenced multi-commit as the
Spark sink calls it, blocking, with a replayed batch; leases kept alive by the pinger on the real clock
and lapsing once it stops; bad input over the wire."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

import millstream
from millstream.client import (
    AsyncClient,
    CommitOutcome,
    ReaderConfig,
    ReaderGroupConfig,
    ScalingPolicy,
    StreamConfig,
    TransactionStatus,
)
from millstream.controller import ControllerConfig
from millstream.errors import (
    FenceValueError,
    InvalidArgumentError,
    LeaseTooLargeError,
    TransactionNotFoundError,
    TransactionNotOpenError,
)
from millstream.standalone import Node
from millstream.testing.history import EventTag, History, Outcome, TransactionOutcome, check
from tests.readers.helpers import FAST, Drain, run, wait_until
from tests.transactions.helpers import keys_in

KEYS = [*keys_in(0.0, 0.5, 4, "lo"), *keys_in(0.5, 1.0, 4, "hi")]
STREAM = "sc/st"


async def create(client: AsyncClient, segments: int) -> None:
    manager = client.stream_manager()
    await manager.create_scope("sc", exist_ok=True)
    await manager.create_stream(STREAM, StreamConfig(scaling=ScalingPolicy.fixed(segments)))


def test_transactions_resumed_by_id_in_another_client_are_read_all_or_nothing_in_commit_order(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        history = History()
        async with AsyncClient(node.uri) as executor, AsyncClient(node.uri) as driver:
            await create(executor, 2)
            plain = executor.event_writer(STREAM)
            sequence = {"plain": 0}

            async def write_plain(count: int) -> list[EventTag]:
                tags = []
                for n in range(count):
                    sequence["plain"] += 1
                    key = KEYS[n % len(KEYS)]
                    tag = EventTag("plain", sequence["plain"])
                    history.write_invoked(tag, key=key)
                    await plain.write_event(tag.payload(32, key=key), routing_key=key)
                    tags.append(tag)
                await plain.flush()
                history.writes_completed(tags, Outcome.ACKED)
                return tags

            writer = executor.transactional_writer(STREAM, lease_seconds=60)
            txns = [await writer.begin() for _ in range(5)]
            labels = {txn.txn_id: f"t{n}" for n, txn in enumerate(txns)}
            await write_plain(40)
            for txn in txns:
                for n in range(1, 31):
                    key = KEYS[n % len(KEYS)]
                    tag = EventTag(labels[txn.txn_id], n)
                    history.write_invoked(tag, key=key, transaction=labels[txn.txn_id])
                    await txn.write_event(tag.payload(32, key=key), routing_key=key)
                await txn.flush()
            # The stream splits under the open transactions: their commits roll.
            manager = executor.stream_manager()
            segments = (await manager.describe_stream(STREAM)).segments
            await manager.scale_stream(STREAM, [segments[0].segment_id], [(0.0, 0.25), (0.25, 0.5)])
            await write_plain(40)

            group = await driver.reader_group("sc/readers", config=ReaderGroupConfig([STREAM],
                                                                                    automatic_checkpoint_seconds=0))
            log: list[tuple[str, bytes]] = []
            stop = asyncio.Event()
            drains = [Drain(await group.reader(f"r{n}", config=FAST), log, stop).start() for n in range(2)]
            await wait_until(lambda: len(log) == 80, what="the plain events")
            assert all(EventTag.parse(p).writer == "plain" for _, p in log), "nothing of an open transaction is read"

            # The driver resumes by id and commits three in an order of its own; one is aborted, one
            # stays open.  Plain writes continue between the commits.
            order = [txns[3], txns[0], txns[1]]
            for txn in order:
                resumed = await driver.transaction(STREAM, str(txn.txn_id))
                assert resumed.info.status is TransactionStatus.OPEN
                assert await resumed.commit() is TransactionStatus.COMMITTING
                assert await resumed.wait_for_completion(20) is TransactionStatus.COMMITTED
                history.transaction_completed(labels[txn.txn_id], TransactionOutcome.COMMITTED)
                await write_plain(10)
            assert await txns[2].abort() is TransactionStatus.ABORTING
            history.transaction_completed(labels[txns[2].txn_id], TransactionOutcome.ABORTED)
            with pytest.raises(TransactionNotOpenError):
                await txns[2].write_event(b"late", routing_key=KEYS[0])
            with pytest.raises(TransactionNotOpenError):  # committed by the driver: the executor's copy knows
                await txns[0].commit()
            await wait_until(lambda: len(log) == 80 + 3 * 10 + 3 * 30, what="every committed event")
            await asyncio.sleep(0.3)  # (anything more would be an aborted or an open transaction's)
            stop.set()
            for drain in drains:
                await drain.join()
            assert len(log) == 200

            payloads = [p for _, p in log]
            history.read_all("all", payloads, complete=True)
            report = check(history)
            assert report.ok, report.summary()
            assert not report.resurrected and not report.partial_transactions and not report.lost
            # Per key: each transaction contiguous, transactions in commit order, after the plain events
            # written before its commit and before those written after.
            commit_rank = {labels[t.txn_id]: rank for rank, t in enumerate(order)}
            per_key: dict[str, list[EventTag]] = {}
            for payload in payloads:
                tag = EventTag.parse(payload)
                assert tag is not None
                key = payload.split(b"|", 1)[1].rstrip(b".").decode()
                per_key.setdefault(key, []).append(tag)
            for key, tags in per_key.items():
                sources = [t.writer for t in tags]
                committed = [s for s in sources if s != "plain"]
                runs = [s for n, s in enumerate(committed) if n == 0 or committed[n - 1] != s]
                assert runs == sorted(runs, key=commit_rank.__getitem__), (key, runs)
                for label, rank in commit_rank.items():
                    positions = [n for n, s in enumerate(sources) if s == label]
                    before = [t.sequence for t in tags[:positions[0]] if t.writer == "plain"]
                    after = [t.sequence for t in tags[positions[-1] + 1:] if t.writer == "plain"]
                    assert max(before) <= 80 + 10 * rank < min(after or [10**9]), (key, label, before, after)
            await txns[4].abort()
            await plain.close()

    with millstream.standalone(tmp_path) as node:
        run(scenario, 90)


def test_the_fenced_multi_commit_as_a_spark_driver_calls_it_blocking(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path) as node, millstream.connect(node.uri) as client:
        client.stream_manager().create_scope("sc")
        client.stream_manager().create_stream(STREAM, StreamConfig(scaling=ScalingPolicy.fixed(2)))

        def task(batch: int, partition: int, attempt: int = 0) -> str:
            """An executor's task: its own client, one transaction, its id back to the driver."""
            with millstream.connect(node.uri) as executor:
                writer = executor.transactional_writer(STREAM, millstream.JsonSerializer())
                txn = writer.begin()
                for row in range(5):
                    txn.write_event({"batch": batch, "partition": partition, "attempt": attempt, "row": row},
                                    routing_key=f"p{partition}-{row}")
                txn.flush()
                return str(txn.txn_id)

        first = [task(0, p) for p in range(3)]
        assert client.get_fence(STREAM, "query-1") is None
        result = client.commit_transactions(STREAM, first, fence=("query-1", 0))
        assert (result.outcome, result.recorded) == (CommitOutcome.COMMITTED, 0)
        # The driver died before its commit log: Spark replays batch 0 with new tasks.
        replay = [task(0, p, attempt=1) for p in range(3)]
        again = client.commit_transactions(STREAM, replay, fence=("query-1", 0))
        assert (again.outcome, again.recorded) == (CommitOutcome.ALREADY_COMMITTED, 0)
        assert client.commit_transactions(STREAM, first, fence=("query-1", 0)).outcome is \
            CommitOutcome.ALREADY_COMMITTED, "a retry of the first commit"
        second = [task(1, p) for p in range(3)]
        assert client.commit_transactions(STREAM, second, fence=("query-1", 1)).outcome is CommitOutcome.COMMITTED
        assert client.get_fence(STREAM, "query-1") == 1
        statuses = {t: client.transaction(STREAM, t).wait_for_completion(20) for t in first + replay + second}
        assert [statuses[t] for t in first + second] == [TransactionStatus.COMMITTED] * 6
        assert [statuses[t] for t in replay] == [TransactionStatus.ABORTED] * 3
        with pytest.raises(FenceValueError):
            client.commit_transactions(STREAM, [task(2, 0)], fence=("query-1", "2"))  # type: ignore[arg-type]
        # Read everything up to the tail, to the group's end -- not "until a second passes without an
        # event": a reader's first event may come later than that (it waits a random fraction of its
        # time unit before acquiring segments; on a loaded machine the join itself can take most of a
        # second).  This reader's client makes that wait 0.95 of a 2 s unit, so a test that took a
        # quiet second for the end would find no rows at all, every time.
        with millstream.connect(node.uri, rng=_LateFirstAcquire()) as reading:
            end = reading.stream_manager().tail_cut(STREAM)
            group = reading.reader_group("sc/check", config=ReaderGroupConfig({STREAM: (None, end)}))
            with group.reader("r", millstream.JsonSerializer(), config=ReaderConfig(time_unit_seconds=2.0)) as reader:
                rows = _read_to_end(reader)
        assert sorted((r["batch"], r["partition"], r["row"]) for r in rows) == sorted(
            (b, p, r) for b in (0, 1) for p in range(3) for r in range(5)), "every row once, no replayed row"
        assert {r["attempt"] for r in rows} == {0}


class _LateFirstAcquire:
    """A client's randomness whose ``random()`` is always 0.95 (a reader's first acquisition then
    waits 0.95 of its time unit); ids stay random."""

    def __init__(self) -> None:
        self._ids = random.Random(7)

    def random(self) -> float:
        return 0.95

    def getrandbits(self, k: int, /) -> int:
        return self._ids.getrandbits(k)


def _read_to_end(reader: Any, reads_max: int = 1000) -> list[Any]:
    """Every event ``reader`` returns until its group's end (``end_of_stream``).  Each read waits at
    most 30 s; the count of reads is bounded too, so a group that never ends fails the test."""
    rows = []
    for _ in range(reads_max):
        read = reader.read_next_event(timeout=30.0)
        if read.end_of_stream:
            return rows
        if read.event is not None:
            rows.append(read.event)
    pytest.fail(f"the reader did not reach its group's end in {reads_max} reads ({len(rows)} events)")


def test_the_pinger_keeps_a_lease_alive_and_a_writer_that_stops_pinging_loses_its_transaction(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(tmp_path, controller_config=ControllerConfig(tick_seconds=0.05))
        await node.start()
        try:
            async with AsyncClient(node.uri) as client:
                await create(client, 1)
                writer = client.transactional_writer(STREAM, lease_seconds=1)
                txn = await writer.begin()
                await txn.write_event(b"kept", routing_key="k")
                await asyncio.sleep(2.5)  # 2.5 leases: pings every ~0.33 s keep it open
                assert await txn.check_status() is TransactionStatus.OPEN
                assert writer.pinger.pings >= 4 and writer.pinger.failures == 0
                await writer.close()  # flushes and stops pinging, as a process that exits
                assert await txn.check_status() is TransactionStatus.OPEN
                await wait_until(lambda: node.controller is not None and node.controller.state.streams[
                    ("sc", "st")].transactions[txn.txn_id.hex].status.value == "aborted", seconds=10,
                    what="the lapsed lease to be aborted")
                with pytest.raises(TransactionNotOpenError):
                    await client.commit_transactions(STREAM, [txn.txn_id])
        finally:
            await node.stop()
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_bad_input_over_the_wire_gets_typed_errors(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await create(client, 1)
            controller = client.controller()
            with pytest.raises(LeaseTooLargeError):
                await client.transactional_writer(STREAM, lease_seconds=601).begin()
            with pytest.raises(TransactionNotFoundError):
                await client.transaction(STREAM, "0" * 32)
            with pytest.raises(InvalidArgumentError):
                await client.transaction(STREAM, "not a transaction id")
            txn = await client.transactional_writer(STREAM).begin()
            bad_bodies: list[tuple[str, dict[str, Any], type[Exception]]] = [
                ("commit_transaction", {"scope": "sc", "stream": "st", "txn": "XYZ"}, InvalidArgumentError),
                ("commit_transactions", {"scope": "sc", "stream": "st", "txns": [txn.txn_id.hex],
                                         "fence": ["q", 1.5]}, FenceValueError),
                ("commit_transactions", {"scope": "sc", "stream": "st", "txns": [txn.txn_id.hex],
                                         "fence": {"q": 1}}, FenceValueError),
                ("commit_transactions", {"scope": "sc", "stream": "st", "txns": txn.txn_id.hex}, InvalidArgumentError),
                ("create_transaction", {"scope": "sc", "stream": "st", "lease": "long"}, LeaseTooLargeError),
                ("ping_transaction", {"scope": "sc", "stream": "st"}, InvalidArgumentError),
                ("get_fence", {"scope": "sc", "stream": "st", "key": ""}, InvalidArgumentError),
            ]
            for method, body, error in bad_bodies:
                with pytest.raises(error):
                    await controller.call(method, body)
            assert await txn.check_status() is TransactionStatus.OPEN, "nothing changed it"
            await txn.write_event(b"x", routing_key="k")
            assert await txn.commit() is TransactionStatus.COMMITTING
            with pytest.raises(TransactionNotOpenError):
                await txn.commit()
            with pytest.raises(TransactionNotOpenError):
                await txn.write_event(b"y", routing_key="k")
            with pytest.raises(TransactionNotOpenError):
                await txn.abort()
            assert await txn.wait_for_completion(20) is TransactionStatus.COMMITTED
            info = (await client.stream_manager().describe_stream(STREAM)).segments[0]
            assert (await client.segments().info(info.name)).length == 9, "exactly the one committed event"

    with millstream.standalone(tmp_path) as node:
        run(scenario)


def test_a_commit_whose_reply_was_lost_is_resolved_by_asking_for_the_status(tmp_path: Path) -> None:
    """The connection breaks with the commit in flight: either the request was lost (the transaction
    is still open: the commit is sent again) or only its reply (it is committing: done).  Either way
    the commit is decided once and ``commit`` returns."""
    from millstream.errors import ConnectionLostError

    async def scenario() -> None:
        async with AsyncClient(node.uri) as client:
            await create(client, 1)
            controller = client.controller()
            original = controller.commit_transaction
            sent: list[str] = []

            async def reply_lost(scope: str, stream: str, txn_id: Any) -> TransactionStatus:
                sent.append("reply lost")
                await original(scope, stream, txn_id)
                raise ConnectionLostError("the connection broke before the reply")

            async def request_lost_once(scope: str, stream: str, txn_id: Any) -> TransactionStatus:
                if not sent:
                    sent.append("request lost")
                    raise ConnectionLostError("the connection broke before the request")
                sent.append("sent")
                return await original(scope, stream, txn_id)

            writer = client.transactional_writer(STREAM)
            for fault, expected in ((reply_lost, ["reply lost"]), (request_lost_once, ["request lost", "sent"])):
                sent.clear()
                txn = await writer.begin()
                await txn.write_event(b"e", routing_key="k")
                controller.commit_transaction = fault  # type: ignore[method-assign]
                try:
                    # Decided: COMMITTING, or already COMMITTED if the controller's worker finished the
                    # merges before the client asked for the status after the lost reply.
                    assert await txn.commit() in (TransactionStatus.COMMITTING, TransactionStatus.COMMITTED)
                finally:
                    controller.commit_transaction = original  # type: ignore[method-assign]
                assert sent == expected
                assert await txn.wait_for_completion(20) is TransactionStatus.COMMITTED
                with pytest.raises(TransactionNotOpenError):
                    await txn.commit()
            info = (await client.stream_manager().describe_stream(STREAM)).segments[0]
            assert (await client.segments().info(info.name)).length == 2 * 9, "each event stored once"

    with millstream.standalone(tmp_path) as node:
        run(scenario)
