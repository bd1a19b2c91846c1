"""The benchmarks' limits, each with its reason (``millstream.limits`` holds the store's own).

They bound what the harness and its suites may do -- a workload file's sizes and rates, a sweep step's
bytes, every wait on a server or a driver -- so a bad workload file or a wedged system under test fails
the run, fast and with a message, instead of filling the disk or hanging.  They left
``millstream.limits`` with the benchmarks themselves: the shipped package has no use for them.
"""

from __future__ import annotations

from typing import Final

from millstream.limits import MIB

#: Segments / partitions one workload spreads its events over (the seed measures 1 and 16).
BENCH_SEGMENTS_MAX: Final = 64

#: One benchmark event.  Below NATS's default max_payload (1 MiB) so every peer takes it unchanged.
BENCH_EVENT_BYTES_MAX: Final = 1_000_000

#: Routing keys one workload draws from (the seed uses 10,000); the key table is held in memory.
BENCH_ROUTING_KEYS_MAX: Final = 1_000_000

#: Offered rates in one workload's sweep, and the highest offered rate: every step costs a server
#: start-up's worth of minutes at most, and no single Python writer comes near 10 M events/s.
BENCH_RATES_PER_WORKLOAD_MAX: Final = 32
BENCH_OFFERED_RATE_MAX: Final = 10_000_000

#: One measured window or warm-up (a sweep step stops by itself after warm-up + window + drain).
BENCH_DURATION_SECONDS_MAX: Final = 600.0

#: Bytes one sweep step writes at most (warm-up included): a fast system at "max" with 10 KB events
#: would otherwise fill the disk in a long window.
BENCH_STEP_BYTES_MAX: Final = 2 * 1024 * MIB

#: At a fixed rate the load loop sends when this much time's worth of events is due (at least one
#: event), and sleeps in between: sending each event the moment it falls due kept the loop spinning
#: -- at 150,000 events/s, 75,000 ticks a second of 2 events, a whole core of the writer's process
#: spent on pacing, beside the client it measures.  Each batch is stamped with the time its first
#: event fell due, so the wait counts as latency.  Half a millisecond, not one: a tick's events go
#: through the client in one event-loop turn, so the tick is also the burst the system under test
#: sees, and the send-time stamp charges each event up to a tick extra.  At 400,000 events/s (100 B,
#: 16 segments, 3 interleaved pairs) p95 fell from 9.74 to 7.30 ms; at 15,000/s the writer's CPU
#: rose from about 20 to 24 µs/event, a few % of a core.
BENCH_PACING_TICK_SECONDS: Final = 0.0005

#: Events the load loop hands a driver per pacing tick, and their bytes: a tick is one batch of
#: driver calls between two looks at the clock, so this bounds how far pacing can overshoot.
BENCH_TICK_EVENTS_MAX: Final = 2_000
BENCH_TICK_BYTES_MAX: Final = 1 * MIB

#: Distinct payloads a workload draws from (issue 26 item 1): users write distinct events, and a
#: harness that sends one payload object per batch flattered the writer by about 1.5x (no cache misses
#: on the payload, no allocation).  Event ``i`` of a step takes pool slot ``i mod`` this, behind its
#: send time.  The pool is slices of one random buffer of ``event_bytes + size`` bytes (75 KB for
#: 10 KB events), not ``size`` strings of their own (655 MB for 10 KB events).
BENCH_PAYLOAD_POOL_SIZE: Final = 1 << 16

#: Events a driver may have written and not yet seen acknowledged; beyond either bound the load loop
#: waits (backpressure) -- more in flight only adds latency and memory (20,000 events is 70 ms at
#: 300,000 events/s; every client here keeps far fewer in flight at its own best rate).
BENCH_IN_FLIGHT_EVENTS_MAX: Final = 20_000
BENCH_IN_FLIGHT_BYTES_MAX: Final = 32 * MIB

#: After a window ends, how long the harness waits for outstanding acknowledgements and for the
#: consumers to catch up before it counts the rest as missing.
BENCH_DRAIN_TIMEOUT_SECONDS: Final = 30.0

#: How long a server the harness starts (millstream standalone, nats-server, redis-server) may take
#: to accept connections, and to exit after SIGTERM before it is killed.
BENCH_SERVER_START_TIMEOUT_SECONDS: Final = 30.0
BENCH_SERVER_STOP_TIMEOUT_SECONDS: Final = 15.0

#: One consumer's long-poll read waits at most this long before it looks at the clock again.
BENCH_CONSUMER_POLL_SECONDS: Final = 0.5

#: Any one setup call of a driver (connect, create a stream, delete it) before the step fails.
BENCH_DRIVER_CALL_TIMEOUT_SECONDS: Final = 30.0

#: fio beyond its own --runtime (start-up, file layout) before it is killed.
BENCH_FIO_GRACE_SECONDS: Final = 30.0
