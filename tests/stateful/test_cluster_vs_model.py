"""Containers moving between simulated hosts, in lockstep with the model (``millstream.model.cluster``).

Hypothesis drives three simulated hosts, each a real ``ContainerManager`` (with its ``ContainerHost``,
``SegmentContainer`` and ``StorageWriter``) for one container on a shared simulated Tier 1 and Tier 2
(``tests/trace/cluster_run.py``'s hosts, with the coordination layer simulated: the test is the
assigner, claims are kept in memory with the claim znodes' rules).  The rules are the faults and the
work: sessions expiring under running hosts (zombies, which go on appending and flushing until the
log refuses them), the zombie noticing, maps written and read at once or late (slow fencing: the old
owner writes on until the new one has read the map and opened the log), hosts crashing (leaving) and
coming back (joining), appends, flushes, truncations.  Every step the implementation reports (the
same reports as the trace validation, in Cluster.tla's vocabulary) is replayed on the model -- it must
be a step the model allows, with the values the implementation gave -- and after every rule the two
must agree on what is visible: which hosts serve, what a reader gets from each, who is current and
its storage length; every invariant of the model holds.  A run that reaches a partial adoption (no
counterpart in Cluster.tla: see ``cluster_run``) stops comparing there.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from millstream.model import cluster as cm
from tests.trace.cluster_run import CONTAINER, HOSTS, ClusterRun

REPLICAS = 3


def replay(model: cm.ClusterState, action: str, fields: dict[str, Any]) -> cm.ClusterState:
    """One reported step on the model (``NotEnabled`` if the model does not allow it)."""
    host = fields.get("h", "")
    if action == "Assign":
        return cm.assign(model, CONTAINER, host)
    if action == "Start":
        model = cm.start(model, host, CONTAINER)
        assert model.own[host][CONTAINER].epoch == fields["epoch"], "the log's epoch is not the model's"
        return model
    if action == "ClientAppend":
        model = cm.client_append(model, host, CONTAINER)
        record = model.log[CONTAINER][-1]
        assert (record.id, record.offset) == (fields["id"], fields["off"]), (record, fields)
        return model
    if action == "QuorumCommit":
        return cm.quorum_commit(model, CONTAINER)
    if action == "Acknowledge":
        return cm.acknowledge(model, host, CONTAINER)
    if action == "LogWriteFenced":
        return cm.log_write_fenced(model, host, CONTAINER)
    if action == "WriteChunk":
        chunk = cm.target_chunk(model, host, CONTAINER)
        before = model.chunks[CONTAINER].get(chunk, ())
        model = cm.write_chunk(model, host, CONTAINER)
        assert model.chunks[CONTAINER][chunk] == before + tuple(fields["units"]), "the chunk write differs"
        return model
    if action == "CommitFlush":
        model = cm.commit_flush(model, host, CONTAINER)
        assert model.own[host][CONTAINER].storage == fields["storage"], "the flushed length differs"
        return model
    if action == "Truncate":
        return cm.truncate(model, host, CONTAINER, len(model.log[CONTAINER]) - fields["remaining"] + 1)
    if action == "SessionExpires":
        return cm.session_expires(model, host)
    if action == "Reconnect":
        return cm.reconnect(model, host)
    if action == "Crash":
        return cm.crash(model, host)
    if action == "Restart":
        return cm.restart(model, host)
    raise AssertionError(f"unknown step {action}")


def agree(model: cm.ClusterState, fields: dict[str, Any]) -> None:
    """What the implementation showed (an ``Observe``) is what the model holds."""
    assert {host for host in HOSTS if model.serving(host, CONTAINER)} == fields["serving"], "who serves differs"
    for host, units in fields["reads"]:
        me = model.own[host][CONTAINER]
        assert me.units[:me.acked] == units, f"a reader of {host} gets {units}, the model {me.units[:me.acked]}"
    current = fields["current"]
    if current == "none":
        assert not any(model.current(host, CONTAINER) for host in HOSTS), "the model has a current owner"
    else:
        assert model.current(current, CONTAINER), f"{current} is not current in the model"
        assert model.own[current][CONTAINER].storage == fields["storage"], "the storage length differs"


async def _end_every_task() -> None:
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class ClusterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.run = ClusterRun(seed=0, steps=0)
        self.model = cm.initial_state(HOSTS, [CONTAINER], REPLICAS)
        self.replayed = 0
        self.hook = self.run.hook()
        self.hook.start()
        self.loop.run_until_complete(self.run.boot_all())

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self.run.stop_all())
        finally:
            self.hook.stop()
            # (a killed container's StorageWriter runs until its host stops it: end what is left)
            self.loop.run_until_complete(_end_every_task())
            self.loop.close()

    def act(self, action: str, *hosts: str, **options: Any) -> None:
        self.loop.run_until_complete(self.step(action, *hosts, **options))
        events = self.run.trace[self.replayed:self.run.cut_at if self.run.cut is not None else None]
        self.replayed += len(events)
        for event in events:
            if event.action == "Observe":
                agree(self.model, event.fields)
            else:
                self.model = replay(self.model, event.action, event.fields)
            cm.check_invariants(self.model)

    async def step(self, action: str, *hosts: str, **options: Any) -> None:
        await getattr(self.run, action)(*hosts, **options)
        await self.run.settle()
        await self.run.observe()

    def with_status(self, status: str) -> list[str]:
        return [host for host in HOSTS if self.run.status[host] == status]

    def serving(self) -> list[str]:
        return self.run.serving() if self.run.created and self.run.cut is None else []

    def zombies(self) -> list[str]:
        current = self.run.current()
        return [host for host in self.serving() if host != current]

    def unflushed(self) -> list[str]:
        return [host for host in self.serving() if self.run.unflushed(host)]

    @precondition(lambda self: self.run.cut is None and self.with_status("live")
                  and (self.run.assigned is None or self.run.status[self.run.assigned] != "live"))
    @rule(data=st.data(), late=st.booleans())
    def assign(self, data: st.DataObject, late: bool) -> None:
        """The container's host has no live session: a map gives it to a live host, read at once or
        (slow fencing) only at a later ``deliver``."""
        self.act("assign", data.draw(st.sampled_from(self.with_status("live"))), deliver=not late)

    @precondition(lambda self: self.run.cut is None and self.run.assigned is not None)
    @rule()
    def deliver(self) -> None:
        """The live hosts read the newest map; the one it names claims the container and opens its log."""
        self.act("deliver")

    @precondition(lambda self: self.run.current() is not None and self.serving())
    @rule(count=st.integers(1, 3))
    def append(self, count: int) -> None:
        """The current owner appends units."""
        for _ in range(count):
            current = self.run.current()
            if current is not None:
                self.act("append", current)

    @precondition(lambda self: self.zombies())
    @rule(data=st.data())
    def zombie_append(self, data: st.DataObject) -> None:
        """A zombie appends: refused once a newer owner opened the log, accepted before (slow fencing)."""
        self.act("append", data.draw(st.sampled_from(self.zombies())))

    @precondition(lambda self: self.unflushed())
    @rule(data=st.data())
    def flush(self, data: st.DataObject) -> None:
        """A serving host flushes to Tier 2 (a fenced zombie's chunk lands, its flush record is refused)."""
        self.act("flush", data.draw(st.sampled_from(self.unflushed())))

    @precondition(lambda self: self.serving() and self.run.current() is not None)
    @rule()
    def truncate(self) -> None:
        current = self.run.current()
        assert current is not None
        self.act("truncate", current)

    @precondition(lambda self: self.run.cut is None and self.with_status("live")
                  and len(self.with_status("expired")) < 2)
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        """ZooKeeper expires the session of a host that runs on: a zombie."""
        self.act("expire", data.draw(st.sampled_from(self.with_status("live"))))

    @precondition(lambda self: self.run.cut is None and self.with_status("expired"))
    @rule(data=st.data())
    def reconnect(self, data: st.DataObject) -> None:
        """The zombie learns its session expired: it stops serving and joins again."""
        self.act("reconnect", data.draw(st.sampled_from(self.with_status("expired"))))

    @precondition(lambda self: self.run.cut is None and len(self.with_status("down")) < 2)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """A host leaves: its process dies."""
        self.act("crash", data.draw(st.sampled_from([host for host in HOSTS if self.run.status[host] != "down"])))

    @precondition(lambda self: self.run.cut is None and self.with_status("down"))
    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        """A host joins again."""
        self.act("restart", data.draw(st.sampled_from(self.with_status("down"))))


if os.environ.get("MILLSTREAM_PROFILE") == "nightly":
    ClusterMachine.TestCase.settings = settings(max_examples=1_000, stateful_step_count=100)
else:
    ClusterMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50)
TestClusterVsModel = ClusterMachine.TestCase
