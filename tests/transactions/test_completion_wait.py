"""``wait_for_completion``'s schedule of status requests: a commit usually completes within tens of
milliseconds (a Spark sink waits for one every micro-batch), so the wait asks at the first, short
delay for ``TRANSACTION_STATUS_POLL_STEADY_SECONDS`` before the delay starts doubling -- a doubling
delay from the start overshoots a completion by up to as long again.  Driven by a fake clock: the
real transaction's status answers are stood in for, so nothing here depends on timing."""

from __future__ import annotations

from pathlib import Path

import millstream
from millstream import limits
from millstream.client import ScalingPolicy, StreamConfig, TransactionStatus


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_wait_asks_at_the_short_delay_first_and_doubles_only_after_the_steady_stretch(tmp_path: Path) -> None:
    with millstream.standalone(tmp_path / "store") as node, millstream.connect(node.uri) as client:
        client.stream_manager().create_scope("sc")
        client.stream_manager().create_stream("sc/st", StreamConfig(scaling=ScalingPolicy.fixed(1)))
        with client.transactional_writer("sc/st") as writer:
            txn = writer.begin().core
            clock = _Clock()
            writer.core.clock = clock
            answers = 80
            asked: list[float] = []

            async def check_status() -> TransactionStatus:
                asked.append(clock.now)
                return TransactionStatus.COMMITTED if len(asked) > answers else TransactionStatus.COMMITTING

            txn.check_status = check_status  # type: ignore[method-assign]
            assert client.run(txn.wait_for_completion(60.0)) is TransactionStatus.COMMITTED
    initial = limits.TRANSACTION_STATUS_POLL_INITIAL_SECONDS
    steady = [d for d in clock.slept if d == initial]
    assert len(steady) * initial >= limits.TRANSACTION_STATUS_POLL_STEADY_SECONDS - initial, (
        "the delay stays at its first value for the steady stretch")
    after = clock.slept[len(steady):]
    assert after and all(b == min(2 * a, limits.TRANSACTION_STATUS_POLL_SECONDS_MAX)
                         for a, b in zip([initial, *after], after, strict=False)), "then it doubles, bounded"
    assert len(clock.slept) == answers
