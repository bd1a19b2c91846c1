"""Log flooding (issue 19, item 7): a peer that opens connection after connection of garbage makes the
server write a bounded number of lines -- the first few of each kind, then a count per window --
instead of one warning per connection."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from millstream import limits
from millstream.rate_limited_log import RateLimitedLog
from millstream.testing.clock import ManualClock
from tests.server.raw import RawClient, Tiers, run, serving

BAD_CONNECTIONS = 3 * limits.LOG_BURST_MAX


def server_lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "millstream.server" and text in r.getMessage()]


def test_a_flood_of_bad_connections_is_summarized_not_logged_line_by_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millstream.server")
    clock = ManualClock()

    async def scenario() -> None:
        async with serving(Tiers("simulated", tmp_path), clock=clock) as server:
            for _ in range(BAD_CONNECTIONS):
                client = await RawClient.connect(server.port)
                await client.send_bytes(b"\x00\x00\x10\x92" + bytes(12))  # an unknown command type
                await client.expect_closed()
            logged = server_lines(caplog, "closing connection")
            assert len(logged) == limits.LOG_BURST_MAX, len(logged)
            assert server.log.suppressed_total == {"closing connection %s: %s": BAD_CONNECTIONS - limits.LOG_BURST_MAX}
            # A window later the count is written, once, even though no new bad connection came.
            clock.advance(limits.LOG_WINDOW_SECONDS)
            server.log.flush()
            summaries = server_lines(caplog, "were not logged")
            assert len(summaries) == 1 and summaries[0].startswith(f"{BAD_CONNECTIONS - limits.LOG_BURST_MAX} more"), \
                summaries
            assert "UnknownCommandError" in summaries[0], "the summary quotes the last message"
    run(scenario)


def test_rate_limited_log_counts_per_kind_and_window(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="test.ratelimit")
    clock = ManualClock()
    log = RateLimitedLog(logging.getLogger("test.ratelimit"), clock, burst=2, window_seconds=10.0, kinds_max=3)

    def messages() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "test.ratelimit"]

    assert [log.warning("a %d", n) for n in range(5)] == [True, True, False, False, False]
    assert log.info("b %d", 1) and log.info("b %d", 2) and not log.info("b %d", 3)
    assert messages() == ["a 0", "a 1", "b 1", "b 2"]
    clock.advance(5.0)
    log.flush()  # not a window yet
    assert len(messages()) == 4
    clock.advance(5.0)
    assert log.warning("a %d", 5)  # a new window: the summary first, then the message
    assert messages()[4:] == ["3 more messages like 'a %d' in the last 10 s were not logged (the last: a 4)", "a 5"]
    log.flush(force=True)  # b's window ended too: summarized now
    assert messages()[6:] == ["1 more messages like 'b %d' in the last 10 s were not logged (the last: b 3)"]
    assert {r.levelno for r in caplog.records if "b %d" in r.getMessage()} == {logging.INFO}
    # Kinds are bounded: past kinds_max, new ones share the counts of "other".
    for kind in ("c", "d", "e", "f", "g"):
        log.error("x", kind=kind)
        log.error("x", kind=kind)
        log.error("x", kind=kind)
    log.check_invariants()
    assert log.suppressed_total["other"] > 0
    # A disabled level costs nothing and counts nothing.
    logging.getLogger("test.ratelimit").setLevel(logging.ERROR)
    assert not log.info("quiet")
    logging.getLogger("test.ratelimit").setLevel(logging.NOTSET)
