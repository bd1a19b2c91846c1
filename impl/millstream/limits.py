"""Every limit in millstream, in one place, each with its reason.

A limit is a promise: a queue that can grow without bound, a retry that never gives up or a wait
without a timeout is a bug.  Values here are upper bounds, not tuning knobs.

Test equipment keeps its own, beside its code: the simulated network's are ``millstream.testing.limits``,
the benchmarks' (in a clone, not in the package) ``bench/limits.py``.
"""

from __future__ import annotations

from typing import Final

KIB: Final = 1024
MIB: Final = 1024 * KIB

# --- Tier 1 and DataFrames -------------------------------------------------------------------------

#: One DataFrame, i.e. one Tier-1 write.  Large enough that a full frame costs about one fdatasync
#: of 1 MiB (the disk's efficient write size, see reference/performance-baselines.md), small enough
#: that one stuck write does not hold much.  Pravega's BookKeeper limit is 1 MiB - 1 KiB.
DATA_FRAME_SIZE_BYTES_MAX: Final = 1 * MIB

#: Bytes of DataFrames handed to Tier 1 and not yet acknowledged.  Beyond this the processor stops
#: sealing frames and waits: the log is the bottleneck, and more in flight only adds latency.
#: (Pravega: bookkeeper.write.outstanding.bytes.max = 256 MiB.)
DATA_LOG_IN_FLIGHT_BYTES_MAX: Final = 256 * MIB

#: A FileLog ledger file rolls over at this size, so truncation can delete whole files.
FILE_LOG_LEDGER_SIZE_BYTES_MAX: Final = 256 * MIB

# --- Tier 1 on NATS JetStream (segmentstore/jetstream_log.py) --------------------------------------

#: Bytes one container's JetStream stream may hold (the stream's max_bytes, discard-new).  Recovery
#: loads everything above the truncation point into memory (read() is synchronous), so this bounds
#: that; the DurableLog truncates after every metadata checkpoint (CHECKPOINT_FRAME_BYTES_MIN), far below.
JETSTREAM_LOG_STREAM_BYTES_MAX: Final = 1024 * MIB

#: Publishes of one log awaiting JetStream's acknowledgement.  Pipelining hides the quorum round trip;
#: 64 full frames (64 MiB) already keep a three-server cluster busy, and a bounded window keeps the
#: predicted-sequence pipeline short when one publish fails and all later ones must be refused.
JETSTREAM_LOG_PUBLISHES_IN_FLIGHT_MAX: Final = 64

#: Longest wait for one publish's acknowledgement before the write fails (outcome unknown) and the
#: log closes.  A leader election after a server loss takes a few seconds; a quorum that stays lost
#: must fail the container rather than hang it.
JETSTREAM_LOG_ACK_TIMEOUT_SECONDS: Final = 30.0

#: One JetStream API request (stream info, create, message get, purge) and the connect timeout.
JETSTREAM_LOG_REQUEST_TIMEOUT_SECONDS: Final = 10.0

#: initialize() re-reads the stream and retries its epoch record this many times, each after
#: JETSTREAM_LOG_RETRY_PAUSE_SECONDS (about 20 s in all) -- other new owners racing in, a stream leader
#: being elected after a server loss, or settling after its quorum came back (seen under load: its
#: conditional publishes refused for a while); more means two hosts fight over one container, which
#: assignment must fix, or JetStream has no quorum.
JETSTREAM_LOG_FENCE_ATTEMPTS_MAX: Final = 40

#: Creating (or finding) the stream fails until the cluster has a meta leader: retries, each after
#: JETSTREAM_LOG_RETRY_PAUSE_SECONDS (so about 30 s in all, a generous bound for an election).
JETSTREAM_LOG_STREAM_CREATE_ATTEMPTS_MAX: Final = 60
JETSTREAM_LOG_RETRY_PAUSE_SECONDS: Final = 0.5

#: Reconnects of a log's NATS connection after a server loss before the connection gives up (and
#: every pending write fails): enough to reach each server of a cluster several times.
JETSTREAM_LOG_RECONNECT_ATTEMPTS_MAX: Final = 10

#: Between two connection attempts to the same server (nats-py's default is 2 s).  A lost server is
#: replaced by another of the list at once; this only paces retries of the same one, so the whole
#: budget (and the time a wrong address takes to fail at start-up) is about 5 s.
JETSTREAM_LOG_RECONNECT_WAIT_SECONDS: Final = 0.5

#: After a refused publish the log reads what others wrote in its place, to tell a newer owner
#: (fenced) from an older owner's stale pipelined publishes (at most JETSTREAM_LOG_PUBLISHES_IN_FLIGHT_MAX
#: per stale owner).  Beyond this many messages it concludes it was fenced.
JETSTREAM_LOG_REFUSAL_SCAN_MESSAGES_MAX: Final = 256

#: Room for one message's headers (about 200 bytes are used): the servers' max_payload must exceed
#: the largest record by this much (NATS counts headers in max_payload).
JETSTREAM_LOG_HEADER_BYTES_MAX: Final = 1 * KIB

# --- Operations ------------------------------------------------------------------------------------

#: One append's payload.  A client block of events travels as one append; the wire frame limit
#: (16 MiB - 1) caps it in practice.  Larger appends span several DataFrames.
APPEND_LENGTH_BYTES_MAX: Final = 16 * MIB - 1

#: Attribute updates carried by one operation (keeps one record's size and validation cost bounded).
ATTRIBUTE_UPDATES_PER_OPERATION_MAX: Final = 1024

#: Attributes one segment may hold; each idempotent writer costs one.  Checkpoints carry them all.
ATTRIBUTES_PER_SEGMENT_MAX: Final = 100_000

#: A segment name, encoded as UTF-8.
SEGMENT_NAME_LENGTH_BYTES_MAX: Final = 1024

#: Segments one container may know (active, sealed or tombstoned).  Pravega: 25,000 active.
SEGMENTS_PER_CONTAINER_MAX: Final = 1_000_000

# --- Tier 2 (long-term storage) -------------------------------------------------------------------

#: A chunk name, encoded as UTF-8 (a segment name plus epoch, offset and a unique suffix).
CHUNK_NAME_LENGTH_BYTES_MAX: Final = 2048

#: Longest any single Tier-2 call may take before it fails with StorageUnavailableError.
CHUNK_STORAGE_CALL_TIMEOUT_SECONDS: Final = 60.0

#: Threads doing blocking Tier-2 file I/O (reads, writes, fsyncs) for one chunk storage.
CHUNK_STORAGE_THREADS_MAX: Final = 4

#: Tier-2 bytes one flush writes for one segment (one chunk write, one flush operation).  Big enough
#: that a flush costs about one fsync of sequential data, small enough to bound the memory one flush
#: pins and the bytes a failed write leaves behind.  (Pravega: storage.flush.threshold.bytes = 4 MiB.)
STORAGE_FLUSH_BYTES_MAX: Final = 4 * MIB

#: A segment with fewer unflushed bytes than this waits (up to the age below) for more, so Tier 2
#: gets few large writes rather than many small ones.  (Each segment's threshold is this scaled by 1
#: to 2, so that segments filling at one rate do not all come due at once: ``StorageWriter``.)
STORAGE_FLUSH_BYTES_MIN: Final = 1 * MIB

#: ... but no byte waits longer than this to start its way to Tier 2, so the log can be truncated
#: and recovery stays short even for quiet segments.  (Pravega: storage.flush.threshold.millis = 30 s.)
STORAGE_FLUSH_AGE_SECONDS: Final = 5.0

#: Acknowledged bytes not yet in Tier 2 (summed over a container's segments) beyond which appends are
#: throttled: they are the only copy outside the log, so they can be neither evicted nor truncated
#: away; without a bound a slow Tier 2 would grow memory and the log without end.
UNFLUSHED_BYTES_MAX: Final = 512 * MIB

#: Longest one throttled append waits before checking again (it keeps waiting while Tier 2 lags).
THROTTLE_WAIT_SECONDS_MAX: Final = 1.0

#: A Tier-2 call that failed is retried after this delay, doubling up to the cap ...
STORAGE_RETRY_DELAY_SECONDS: Final = 0.05
STORAGE_RETRY_DELAY_SECONDS_MAX: Final = 5.0

# --- The OperationProcessor ------------------------------------------------------------------------

#: Operations waiting in a container's processing queue.  Producers wait (backpressure) when full.
OPERATION_QUEUE_LENGTH_MAX: Final = 65_536

#: Payload bytes waiting in a container's processing queue.  Producers wait when exceeded.
OPERATION_QUEUE_BYTES_MAX: Final = 256 * MIB

#: Operations the processor takes from its queue in one pass (Pravega: MAX_READ_AT_ONCE).
PROCESSOR_TAKE_COUNT_MAX: Final = 1000

#: Ceiling on the dynamic batching delay (Pravega: max.batching.delay.millis = 50): a blip in Tier-1
#: latency must not become a long stall.
BATCHING_DELAY_SECONDS_MAX: Final = 0.050

#: Tier-1 writes whose latency and fill ratio feed the batching delay (a moving window).
BATCHING_STATISTICS_WINDOW: Final = 32

# --- Metadata checkpoints --------------------------------------------------------------------------

#: A metadata checkpoint is written after this many committed frames ... (Pravega: 300)
CHECKPOINT_FRAME_COUNT_MIN: Final = 300

#: ... or after this many bytes of frames, whichever comes first (Pravega: 256 MiB).
CHECKPOINT_FRAME_BYTES_MIN: Final = 256 * MIB

# --- Reads -----------------------------------------------------------------------------------------

#: One read returns at most this much (Pravega's server caps ReadSegment at 2 MiB).
READ_LENGTH_BYTES_MAX: Final = 2 * MIB

#: Longest a tail read may wait for new data before returning empty.
TAIL_READ_WAIT_SECONDS_MAX: Final = 60.0

#: Tail reads waiting on one segment at once.
TAIL_READERS_PER_SEGMENT_MAX: Final = 10_000

#: Memory for segment data (the cache).  Beyond it, bytes already in Tier 2 are evicted (lowest
#: offsets first).  Pravega sizes its cache from the container's memory; 1 GiB suits a small node.
CACHE_BYTES_MAX: Final = 1024 * MIB

#: Memory for blocks read back from Tier 2 by catch-up readers, kept apart from the cache so a
#: reader far behind the tail never evicts the tail.
CATCH_UP_CACHE_BYTES_MAX: Final = 64 * MIB

#: A read that misses memory fetches this aligned block from Tier 2 (sequential catch-up readers
#: then cost one Tier-2 read per block).
TIER_TWO_READ_BLOCK_BYTES: Final = 1 * MIB

# --- Lifecycle -------------------------------------------------------------------------------------

#: How long stopping a container waits for in-flight Tier-1 writes before failing them.
SHUTDOWN_TIMEOUT_SECONDS: Final = 10.0

#: A container host restarts a container that stopped on a Tier-1 failure this many times in a row
#: (the delay doubling from the first to the cap) before it gives up and reports the failure.
CONTAINER_RESTARTS_MAX: Final = 8
CONTAINER_RESTART_DELAY_SECONDS: Final = 0.1
CONTAINER_RESTART_DELAY_SECONDS_MAX: Final = 10.0

# --- Server (segment store over TCP) --------------------------------------------------------------

#: One event inside an append block (the classic event API).  Large enough for any record a stream
#: processor emits, half a wire frame so that a whole event plus its block's framing always fits one
#: ``AppendBlock``; larger events go through the large-event API.  (Pravega: 8 MiB, the same reason.)
EVENT_LENGTH_BYTES_MAX: Final = 8 * MIB

#: A side that has sent nothing for this long sends a ``KeepAlive``; one that has received nothing
#: for ``KEEPALIVE_MISSED_MAX`` intervals closes the connection.  Short enough that a dead peer (a
#: killed process, a pulled cable) frees its writers' in-flight bytes within half a minute, long
#: enough that an idle connection costs nearly nothing.
KEEPALIVE_INTERVAL_SECONDS: Final = 10.0
KEEPALIVE_MISSED_MAX: Final = 3

#: Append bytes in flight (received, not yet acknowledged) over all connections of one server.  At
#: or above it, every connection stops reading until acknowledgements bring it down.  Pravega pauses
#: at 512 MiB on machines with many GiB of direct memory; this machine has 2 cores and a few GiB to
#: share, and one writer needs only bandwidth x latency in flight (150 MB/s x 20 ms = 3 MB), so
#: 128 MiB is dozens of busy writers' worth.  It stays below the container's operation queue limit
#: (``OPERATION_QUEUE_BYTES_MAX``), so the server's own backpressure acts first.
SERVER_IN_FLIGHT_BYTES_MAX: Final = 128 * MIB

#: One connection stops reading once its in-flight append bytes reach
#: max(``SERVER_CONNECTION_IN_FLIGHT_BYTES_MIN``, 2 x ``SERVER_CONNECTION_IN_FLIGHT_BYTES_TARGET`` -
#: total in flight): alone it may use up to twice its share, under load its share shrinks so one fast
#: writer cannot starve the others, and it never drops below one block's worth.  (Pravega's shape:
#: max(1 MiB, 2 x 128 MiB - total); scaled to this machine as above.)
SERVER_CONNECTION_IN_FLIGHT_BYTES_TARGET: Final = 32 * MIB
SERVER_CONNECTION_IN_FLIGHT_BYTES_MIN: Final = 1 * MIB

#: Each append block is charged this much on top of its data: the Python objects that carry it
#: (command, task, future, operation) cost about that much, and the charge bounds the *number* of
#: blocks in flight too (128 MiB / 2 KiB = 65,536, the container's ``OPERATION_QUEUE_LENGTH_MAX``).
SERVER_APPEND_OVERHEAD_BYTES: Final = 2 * KIB

#: Requests other than appends (reads, including waiting tail reads; administration) in flight on one
#: connection.  Beyond it the connection stops reading until some are answered.  A reader needs one
#: tail read per segment it follows; 1,024 covers a reader following every segment of a big stream.
SERVER_CONNECTION_REQUESTS_MAX: Final = 1024

#: What the reads in flight on one connection may return together (each counts its requested length,
#: at most ``READ_LENGTH_BYTES_MAX``).  Beyond it the connection stops reading until a read returns,
#: so a peer cannot make one connection hold 1,024 x 2 MiB of replies at once.  256 MiB lets a
#: reader follow 256 segments with 1 MiB tail reads (or 1,024 with 256 KiB ones) on one connection.
SERVER_CONNECTION_READ_BYTES_MAX: Final = 256 * MIB

#: Connections one server holds open; beyond it new ones are closed at once (and logged).  Each costs
#: a few KiB of objects and two tasks (an idle one about 8 KiB, measured from outside the process);
#: 4,096 is far more clients than a 2-core node serves well.
SERVER_CONNECTIONS_MAX: Final = 4096

#: Bytes read from a socket at a time: the size of the server's one receive buffer, which every
#: connection reads into (a read is decoded before the next one starts).  Matches asyncio's own read
#: size; a large frame is received straight into a buffer of its own instead.
SERVER_RECEIVE_BUFFER_BYTES: Final = 256 * KIB

#: Replies buffered for a peer that does not read them before the server stops reading from it (the
#: transport's high-water mark), so a client that never reads cannot grow the server's memory.
SERVER_SEND_BUFFER_BYTES_MAX: Final = 4 * MIB

#: A client must say Hello within this long after connecting (or finishing the TLS handshake), so a
#: port scanner or a stuck peer does not hold a connection slot.
SERVER_HELLO_TIMEOUT_SECONDS: Final = 10.0

#: Graceful shutdown waits this long for appends already received to be acknowledged (and the
#: acknowledgements sent) before closing connections anyway; what is cut off was never acknowledged,
#: so writers re-send it after reconnecting.
SERVER_SHUTDOWN_DRAIN_SECONDS: Final = 10.0

#: A TLS handshake that has not finished after this long is abandoned (asyncio's default is 60 s).
SERVER_TLS_HANDSHAKE_TIMEOUT_SECONDS: Final = 10.0

# --- Server: hostile peers (memory before authentication, slots, slow senders) ---------------------

#: The largest frame a connection may send before it has authenticated (with authentication off:
#: before its Hello; with it on: before a request whose token the server accepted).  Every request a
#: client opens a connection with fits easily (a Hello is 16 bytes, a request with a token well under
#: 4 KiB), so nobody needs more before proving who they are, while 4,096 unauthenticated connections
#: can then make the server hold at most a few hundred MiB even if each really sends this much.
SERVER_UNAUTHENTICATED_FRAME_BYTES_MAX: Final = 64 * KIB

#: Bytes of partly received frames (received, not yet decoded) over all connections of one server.
#: Past it a connection that needs more room for its frame stops reading until others finish theirs
#: (one at a time may go on regardless, so the server always makes progress).  Room is taken as bytes
#: arrive, never from a length a peer announces, so a peer must send what it makes the server hold.
#: 64 MiB is a hundred and more writers' 512 KiB blocks arriving at once -- more than a 2-core node
#: receives in a few hundred milliseconds -- and little beside the 128 MiB of appends in flight.
SERVER_RECEIVE_BUFFERED_BYTES_MAX: Final = 64 * MIB

#: ... but every connection may hold this much of a partly received frame whatever the total, so small
#: frames (every request, every block of a lightly loaded writer) are never held up by someone else's
#: large ones.  4,096 connections x 64 KiB = 256 MiB at worst, and only if each really sends it.
SERVER_CONNECTION_RECEIVE_BUFFERED_BYTES_MIN: Final = 64 * KIB

#: A large frame's buffer grows as its bytes arrive: to at most twice what arrived, and by at least
#: this much, never past the frame's length.  Small, so that room stays in proportion to what a peer
#: really sent: one that announces 16 MiB and sends 8 bytes gets 4 KiB (4,096 of them: 16 MiB), not a
#: read's worth each.  A writer's 512 KiB block usually starts with a good part of it in its first
#: read, so it needs one or two steps (a few more if it starts at the very end of a read).
SERVER_LARGE_FRAME_GROWTH_MIN_BYTES: Final = 4 * KIB

#: Buffers of large frames already received are kept, this many bytes of them over the server, for
#: the next large frames (a writer sends blocks of similar sizes back to back): a frame that fits one
#: is received into it whole -- two socket reads for a 512 KiB block, no new memory, no growth steps --
#: instead of into a buffer that grows with each read.  Only a buffer at least as long as the frame is
#: used (nothing announced makes the server allocate), and the pool itself is bounded: 16 MiB is
#: thirty-two 512 KiB blocks.
SERVER_LARGE_FRAME_POOL_BYTES_MAX: Final = 16 * MIB

#: A frame whose first byte arrived must be complete within this long (time the server itself made
#: the peer wait -- backpressure -- does not count), so a peer that drips a frame byte by byte does
#: not keep its slot and its bytes forever.  A 16 MiB frame needs only ~560 KB/s to make it.
SERVER_FRAME_TIMEOUT_SECONDS: Final = 30.0

#: A connection with nothing in flight on which no whole frame arrived for this long is closed (a
#: KeepAlive is a frame: a live client sends one every ``KEEPALIVE_INTERVAL_SECONDS``, so only peers
#: that do not speak the protocol, or drip, reach it).  The same span as a dead peer's
#: ``KEEPALIVE_MISSED_MAX`` missed keep-alives -- and a server configured with another keep-alive
#: interval takes that many of its own intervals, unless its idle timeout is set.
SERVER_IDLE_TIMEOUT_SECONDS: Final = KEEPALIVE_MISSED_MAX * KEEPALIVE_INTERVAL_SECONDS

#: Connections one peer address may hold open, beside ``SERVER_CONNECTIONS_MAX`` over all: one host
#: (or one attacker) cannot take every slot.  A client keeps at most ``CLIENT_CONNECTIONS_PER_ENDPOINT_MAX``
#: (4) per server, so 1,024 is over two hundred client processes on one machine (all of a
#: standalone node's local clients share 127.0.0.1); raise it in the server config for more.
SERVER_CONNECTIONS_PER_ADDRESS_MAX: Final = 1024

#: Writer sessions (``SetupAppend``s of distinct writer ids) one connection may hold; each costs the
#: server a little memory for as long as the connection lives.  A client process rarely writes to more
#: than a few hundred segments at once over one connection.
SERVER_CONNECTION_WRITERS_MAX: Final = 4096

#: The server's housekeeping (summaries of rate-limited log messages, giving memory back) runs this
#: often.  Each run is a few dictionary lookups unless it has something to do.
SERVER_HOUSEKEEPING_INTERVAL_SECONDS: Final = 1.0

#: Once this many connections closed since the last time, housekeeping gives the C heap's free pages
#: back to the operating system (``malloc_trim``; ``server._memory``): a flood of connections leaves
#: megabytes of freed pages that glibc would otherwise keep.  A trim walks the heap (milliseconds),
#: so a steady trickle of short connections pays for one only now and then.
SERVER_MEMORY_TRIM_AFTER_CLOSES: Final = 256

#: The text of an error reply (``ErrorMessage``, ``AuthTokenCheckFailed``) is cut to this many UTF-8
#: bytes, so a reply always fits its 65,535-byte string field whatever a request quoted into it.
SERVER_ERROR_TEXT_BYTES_MAX: Final = 4 * KIB

#: An error message quotes at most this many characters of an offending name or value.
ERROR_QUOTE_CHARACTERS_MAX: Final = 100

#: A kind of warning a peer can cause (a connection closed for bad input, a refused token) is logged at
#: most this many times per window; the rest are counted and summarized once per window, so a flood
#: of bad connections costs a few lines a minute instead of one line each.
LOG_BURST_MAX: Final = 20
LOG_WINDOW_SECONDS: Final = 60.0

#: Distinct kinds of message one rate-limited log keeps counts for (kinds are fixed strings in the
#: code, so this is only a backstop).
LOG_KINDS_MAX: Final = 256

# --- Client ----------------------------------------------------------------------------------------

#: Connections a client keeps to one server.  Each idempotent writer session gets a connection of its
#: own while there are fewer than this many (so one writer's large blocks do not queue behind
#: another's); requests and readers share the least-loaded one.  A Python server serves a connection
#: from one event loop, so more connections than this add sockets, not throughput.
CLIENT_CONNECTIONS_PER_ENDPOINT_MAX: Final = 4

#: Opening a TCP (and TLS) connection and exchanging Hello may take this long before the attempt
#: counts as failed (a server under heavy load still answers within a few seconds).
CLIENT_CONNECT_TIMEOUT_SECONDS: Final = 10.0

#: A request (other than a tail read's own wait) not answered within this long fails with
#: ``RequestTimeoutError``: the server is stuck or the reply was lost.  Generous, because the server
#: throttles appends and administration when Tier 2 lags (``THROTTLE_WAIT_SECONDS_MAX`` per check).
CLIENT_REQUEST_TIMEOUT_SECONDS: Final = 30.0

#: A writer whose oldest unacknowledged block has waited this long for its ``DataAppended`` (while
#: the connection itself looks alive) treats the connection as broken: it reconnects, sets up again
#: and re-sends what is unacknowledged, which is safe because the event number is stored with the
#: data.  This is how a lost acknowledgement is recovered.
CLIENT_APPEND_ACK_TIMEOUT_SECONDS: Final = 30.0

#: The default per-outage reconnect budget (``ClientConfig.reconnect_budget_seconds``, which an
#: application may raise, to forever): a server that was reached and went away is tried again for this
#: long, counted from the first failure after the last success, before a call (a writer, a reader, a
#: request) gives up.  Longer than a container takes to recover or a node to restart; short enough that
#: a program whose server died reports it within a minute.  Per outage, so short outages never add up.
CLIENT_RECONNECT_BUDGET_SECONDS: Final = 40.0

#: The default initial connect budget (``ClientConfig.initial_connect_budget_seconds``): a client that
#: never reached any server tries this long (a server still starting) before ``ConnectFailedError``
#: names the address.  A refused connection usually means a wrong address or port, which retrying
#: cannot fix, so a few seconds; a TLS handshake failure is never retried.
CLIENT_INITIAL_CONNECT_BUDGET_SECONDS: Final = 5.0

#: Seed URIs one client may be given (a cluster's nodes, ``AsyncClient``): a few reach any cluster --
#: any live one leads to the controller -- and each is asked in turn when the controller moves, so a
#: long list would only lengthen the search.
CLIENT_SEEDS_MAX: Final = 64

#: The wait before reconnect attempt n is min(initial x multiplier**(n-1), max), times a jitter factor
#: in [0.5, 1) drawn from the client's seeded RNG, so many clients cut off together do not come back
#: in lock step.
CLIENT_RECONNECT_DELAY_INITIAL_SECONDS: Final = 0.01
CLIENT_RECONNECT_DELAY_MULTIPLIER: Final = 2.0
CLIENT_RECONNECT_DELAY_SECONDS_MAX: Final = 5.0

#: A writer refused as sealed reads what the segment stores for it once the seal is visible (the
#: seal is usually one Tier-1 write from committing): it polls after 1 ms, doubling up to the
#: reconnect delay's maximum, at most this many times -- about 40 s in all, like reconnecting, so a
#: container restarting meanwhile is waited for, and a seal lost in a crash is reported.
CLIENT_SEAL_VISIBLE_POLL_INITIAL_SECONDS: Final = 0.001
CLIENT_SEAL_VISIBLE_POLLS_MAX: Final = 20

#: A writer's bytes not yet acknowledged (the open block and every block in flight, all segments of
#: the writer).  Beyond it ``write_event`` waits until acknowledgements bring it under half of this.
#: One writer needs bandwidth x round trip in flight (150 MB/s x 20 ms = 3 MB); 16 MiB leaves room for
#: a slow fsync without letting a stalled server grow the client's memory.  A single event larger
#: than what is left is admitted when nothing else is in flight.
CLIENT_WRITER_UNACKED_BYTES_MAX: Final = 16 * MIB

#: One append block (many events, one ``AppendBlock`` frame, one container append).  Under load the
#: writer grows its blocks toward what arrives in about half a round trip, up to this; larger blocks
#: would only add latency and memory.  (Pravega: 2 x 256 KiB - 1 KiB.)  An event larger than this
#: travels in a block of its own.
CLIENT_WRITER_BLOCK_BYTES_MAX: Final = 512 * KIB

#: The writer never waits more than this to fill a block (Pravega's batch window): the block size it
#: aims for is what arrives in min(half a round trip, this).
CLIENT_WRITER_BATCH_WINDOW_SECONDS_MAX: Final = 0.020

#: Distinct routing keys whose hash a writer remembers (hashing a key costs more than the rest of
#: routing).  The memo empties when full.
CLIENT_ROUTING_KEY_CACHE_SIZE_MAX: Final = 65_536

#: A reader asks for this much per ``ReadSegment`` (the server caps it at ``READ_LENGTH_BYTES_MAX``).
CLIENT_READ_LENGTH_BYTES: Final = 1 * MIB

#: How long a blocking client waits for its event-loop thread to start, and for it to end once the
#: client is closed.  (A blocking call itself is bounded by the request, acknowledgement and reconnect
#: limits above; a thread that misses this is stuck -- a bug -- and is left behind as a daemon.)
CLIENT_CLOSE_TIMEOUT_SECONDS: Final = 60.0

#: How long a CLI command that read as a reader waits for each step of its clean-up (the reader leaving
#: its group, ``read --stream`` deleting its own group) before it says what was left behind and exits
#: anyway.  Each step is a few requests; a step that misses this is stuck, and a command the user
#: stopped with Ctrl-C must still end.
CLI_CLEANUP_TIMEOUT_SECONDS: Final = 20.0

#: ``millstream write`` flushes after this many events, so that what it must remember to say where to
#: resume after an interruption (the input position of each event since the last flush: a few
#: bytes each) stays bounded; a flush every 65,536 events costs one round trip in that many.
CLI_WRITE_FLUSH_EVENTS: Final = 65_536

#: ``millstream stream describe --rate-seconds`` counts the events appended while it samples by
#: reading them; beyond this many bytes appended in the sample it reports bytes/s only (events/s as
#: unknown) rather than read a busy stream's whole traffic.  64 MiB reads in well under a second.
CLI_RATE_SAMPLE_READ_BYTES_MAX: Final = 64 * MIB

#: ``millstream stream describe --rate-seconds``: the longest sample it takes (an hour: beyond that,
#: the controller's tail cuts or the metrics are the better source).
CLI_RATE_SAMPLE_SECONDS_MAX: Final = 3600.0

# --- Stream writer (routing over a stream's epochs, hand-over to successors) -----------------------

#: An event routed to a segment whose keys moved on between routing and buffering (it was sealed and
#: handed over to its successors in that instant, by the loop thread) is routed again.  Each repeat
#: needs another hand-over to complete in the same instant, so two are already rare; a run this long
#: means the writer's view is broken, and it says so (``InternalError``) instead of spinning.
CLIENT_WRITER_REROUTES_MAX: Final = 64

#: ``flush`` waits for every segment writer; a segment sealed meanwhile hands its events over and flush
#: waits again, for the successors.  Each further round needs another scale to complete while flush
#: waits for acknowledgements; a stream that keeps scaling faster than a round trip for this many
#: rounds is broken, and flush says so (``InternalError``) instead of following it forever.
CLIENT_WRITER_FLUSH_ROUNDS_MAX: Final = 1000

# --- Controller (scopes, streams, epochs, scaling, stream cuts, retention, reader groups) ----------

#: Segments one epoch of a stream may have (a fixed policy's count, an auto-scaling policy's
#: ``min_segments``, and what splits may grow a stream to).  Each segment costs a little in every
#: writer, reader and epoch record; a 2-core node serves a few hundred busy segments at most.
CONTROLLER_SEGMENTS_PER_EPOCH_MAX: Final = 1024

#: Largest ``scale_factor`` (how many parts one hot segment may split into at once).
CONTROLLER_SCALE_FACTOR_MAX: Final = 64

#: Scopes, streams (over all scopes) and reader groups (over all scopes) one controller keeps.  Its
#: whole metadata is in memory and in every snapshot; these keep a snapshot a few MiB at most.
CONTROLLER_SCOPES_MAX: Final = 10_000
CONTROLLER_STREAMS_MAX: Final = 10_000
CONTROLLER_READER_GROUPS_MAX: Final = 10_000

#: Epochs one stream keeps.  Truncation forgets epochs whose segments are all deleted, so only a
#: stream scaled this often and never truncated reaches it; then it refuses to scale
#: (``InvalidScaleError``) rather than grow its record without end.  (At one auto-scale per mute
#: period that is two weeks of scaling without pause.)
CONTROLLER_EPOCHS_PER_STREAM_MAX: Final = 10_000

#: One record of the controller's metadata log (length-prefixed JSON in the system segment).  A scale
#: of ``CONTROLLER_SEGMENTS_PER_EPOCH_MAX`` segments needs about 100 KiB; snapshots are cut into
#: parts of at most this size.
CONTROLLER_RECORD_BYTES_MAX: Final = 1 * MIB

#: A snapshot of the whole metadata is appended (and the log truncated before it) after this many
#: records, or this many bytes of records, since the last one, so replay on start stays short.
CONTROLLER_SNAPSHOT_RECORDS: Final = 1000
CONTROLLER_SNAPSHOT_BYTES: Final = 16 * MIB

#: A conditional append to the metadata log that finds the log longer than expected (another
#: controller instance wrote) is retried, after catching up, at most this many times.
CONTROLLER_COMMIT_ATTEMPTS_MAX: Final = 5

#: A segment-store call from the controller that meets a restarting container
#: (``ContainerUnavailableError``) is retried this many times, the delay doubling from the first value
#: up to the cap: about 30 s, longer than a container takes to recover.
CONTROLLER_STORE_RETRY_ATTEMPTS_MAX: Final = 12
CONTROLLER_STORE_RETRY_DELAY_SECONDS: Final = 0.02
CONTROLLER_STORE_RETRY_DELAY_SECONDS_MAX: Final = 5.0
#: How long a cluster controller's store keeps trying to reach the host the map gave a segment before it
#: reads the map again (``cluster._segment_store``): a host that died stays in the map for a ZooKeeper
#: session timeout, and the store's own retries (above) wait that out, each with a fresh look at the map.
CLUSTER_STORE_RECONNECT_BUDGET_SECONDS: Final = 2.0
#: A cluster node whose controller fails to start (a container it must reach is still moving: the
#: store's retries above ran out) starts it again this many times, the delay doubling from the first
#: value up to the cap -- a few minutes in all, while the node keeps the controller's container.
CLUSTER_CONTROLLER_START_ATTEMPTS_MAX: Final = 10
CLUSTER_CONTROLLER_START_DELAY_SECONDS: Final = 0.5
CLUSTER_CONTROLLER_START_DELAY_SECONDS_MAX: Final = 10.0
#: A node's reply to the controller's ``drain_append_counts`` holds at most this many bytes of counts;
#: the rest waits for the next tick.  A megabyte is some 15,000 segments' counts, far more than one
#: node's containers take appends for in a tick, and well inside a frame.
CLUSTER_APPEND_COUNTS_REPLY_BYTES_MAX: Final = MIB

#: A request waits at most this long for another scale, seal, truncation or update of the same stream
#: to finish (one at a time per stream) before it fails with ``RequestTimeoutError``.
CONTROLLER_STREAM_LOCK_WAIT_SECONDS: Final = 60.0

#: A node that hosts its controller opens its port before the controller has started (it keeps its state
#: in the node's own containers, which recover first): a ``ControllerRequest`` that comes meanwhile waits
#: this long for it, then fails with the retryable ``ContainerUnavailableError``.  Recovery of a large
#: metadata log takes seconds; a minute is far beyond it.
CONTROLLER_START_WAIT_SECONDS: Final = 60.0

#: A background task being stopped is cancelled again after this long if it is still running: on
#: CPython 3.11 a cancellation can be lost (``millstream.tasks``); a loop that lost it must not keep a
#: stop waiting forever.
TASK_CANCEL_RETRY_SECONDS: Final = 1.0

#: A ``ControllerRequest`` body (JSON) larger than this is refused unparsed.
CONTROLLER_REQUEST_BODY_BYTES_MAX: Final = 4 * MIB

#: Nesting of arrays and objects in a ``ControllerRequest`` body, checked before it is parsed: every
#: method's body nests four or five levels deep, and a parser (or a ``repr``) that recursed through
#: thousands of levels would exhaust the stack.
CONTROLLER_REQUEST_JSON_DEPTH_MAX: Final = 32

#: The controller's periodic work (auto-scaling decisions, resuming interrupted workflows) runs every
#: this many seconds; the per-segment rates are sampled at the same tick.  (Pravega: 5 s ticks.)
CONTROLLER_TICK_SECONDS: Final = 5.0

#: The tail cut of every stream that changed is recorded (with its time and size) this often; stream
#: cuts "at a time" and size/time retention choose among recorded cuts, so this is their resolution.
#: Retention runs at the same period.  (Pravega records at its retention frequency, 30 min.)
CONTROLLER_TAIL_CUT_INTERVAL_SECONDS: Final = 60.0

#: Recorded tail cuts kept per stream.  Beyond it the cut whose removal leaves the smallest gap is
#: dropped, so old history thins out instead of being forgotten (retention by time still finds a cut
#: near any age).
CONTROLLER_RETENTION_CUTS_PER_STREAM_MAX: Final = 1000

#: Auto-scaling (Pravega's constants): rates are moving averages over these windows (minutes) ...
AUTO_SCALE_WINDOWS_MINUTES: Final = (2, 5, 10, 20)
#: ... no decision is taken for a segment during its first this many seconds of being measured (a new
#: segment, or any segment after the controller restarted), so averages have time to settle ...
AUTO_SCALE_COOLDOWN_SECONDS: Final = 600.0
#: ... and a stream that was just auto-scaled (or whose auto-scale failed) is not auto-scaled again
#: for this long, so one burst does not cause a cascade of scales.
AUTO_SCALE_MUTE_SECONDS: Final = 120.0

#: Segments whose append counts the segment store keeps between two drains by the controller (every
#: ``CONTROLLER_TICK_SECONDS``).  Beyond it appends to further segments go uncounted until the next
#: drain (and are counted as dropped): a bound for a store whose controller never drains.
STATISTICS_SEGMENTS_MAX: Final = 100_000

# --- Transactions (stream transactions, leases, commit workflows, the fenced multi-commit) ---------

#: A transaction's lease when the writer names none.  A transaction whose lease lapses (its writer
#: stopped pinging: it crashed, or a Spark task died with its executor) is aborted, so this is how long
#: an orphan holds its segments; the pinger renews it several times per lease, so a live writer never
#: loses it to a slow round trip.
TRANSACTION_LEASE_DEFAULT_SECONDS: Final = 120.0

#: The longest lease the controller grants (``LeaseTooLargeError`` beyond it): Pravega's maximum.  A
#: longer lease would only keep orphans longer; a long-running transaction is kept alive by pings.
TRANSACTION_LEASE_SECONDS_MAX: Final = 600.0

#: The shortest lease: the controller checks leases on its tick (``CONTROLLER_TICK_SECONDS``), so a
#: shorter one would only be honoured to within a tick anyway; tests use leases of a few seconds.
TRANSACTION_LEASE_MIN_SECONDS: Final = 1.0

#: Pings stop extending a transaction once it has been open for min(this many leases, the cap below)
#: -- Pravega's maximum execution time -- so a writer stuck in a loop of pings cannot hold a
#: transaction (and its segments) forever.
TRANSACTION_EXECUTION_LEASES_MAX: Final = 1000
TRANSACTION_EXECUTION_SECONDS_MAX: Final = 86_400.0

#: The client pings every lease / max(sqrt(lease in seconds), this) seconds: Pravega's interval for
#: leases of 9 s and more (lease / sqrt(lease)), and at least this many pings per shorter lease, so
#: one lost or late ping never lets a live transaction lapse.
TRANSACTION_PINGS_PER_LEASE_MIN: Final = 3.0

#: Transactions of one stream that are not finished (open, committing or aborting), and of all streams
#: together.  Each is a record in the controller's memory and snapshots and one hidden segment per
#: segment of its epoch in the store; beyond these ``create_transaction`` refuses
#: (``InvalidArgumentError``) until some finish -- far more than a Spark job's tasks per batch.
TRANSACTIONS_ACTIVE_PER_STREAM_MAX: Final = 10_000
TRANSACTIONS_ACTIVE_MAX: Final = 100_000

#: Finished (committed or aborted) transactions the controller remembers per stream, so a status query
#: or a retried request after the fact gets a true answer; the oldest finished is forgotten first
#: (then its id is ``TransactionNotFoundError``).
TRANSACTIONS_FINISHED_PER_STREAM_MAX: Final = 1000

#: Transactions one ``commit_transactions`` call may list (one metadata record holds them all: 1000
#: ids are about 35 KiB, far below ``CONTROLLER_RECORD_BYTES_MAX``); a Spark batch has one per task.
TRANSACTIONS_PER_COMMIT_MAX: Final = 1000

#: A fence key (a Spark query id, a sink id) is at most this many characters, and one stream records at
#: most this many keys (each query writing to the stream has one; a key is kept as long as the stream).
FENCE_KEY_LENGTH_MAX: Final = 256
FENCE_KEYS_PER_STREAM_MAX: Final = 10_000

#: Fence values are integers in [0, this]: a batch id of Spark is a 64-bit signed long.
FENCE_VALUE_MAX: Final = 2**63 - 1

#: One run of a stream's transaction workflows (the controller's worker, or a request that finishes
#: them) takes at most this many steps (start, merge, finish, abort) before it lets the next run go on;
#: a run that ends with work left is resumed at once by the worker, or by the next tick.
TRANSACTION_WORKFLOW_STEPS_PER_RUN_MAX: Final = 10_000

#: A roll numbers each duplicate segment with the first free number that puts it in the container of
#: the segment it duplicates (a merge is container-local).  The container map spreads numbers
#: uniformly, so a container count of c needs about c tries; this bound is far beyond any count a
#: cluster has, and reaching it is a bug (``InternalError``), not bad luck.
TRANSACTION_DUPLICATE_NUMBER_TRIES_MAX: Final = 100_000

#: Sealing a stream first commits its committing transactions and aborts its open ones; a transaction
#: begun or committed concurrently makes it do so again, at most this many times
#: (``RequestTimeoutError`` then: the stream is too busy with transactions to be sealed now).
TRANSACTION_SEAL_ROUNDS_MAX: Final = 10

#: ``Transaction.wait_for_completion`` asks for the status with a delay that doubles from the first
#: value up to the second, for at most the given time by default (a commit finishes within a few
#: metadata writes and one merge per segment; a minute covers a container restarting under it).
TRANSACTION_STATUS_POLL_INITIAL_SECONDS: Final = 0.005
TRANSACTION_STATUS_POLL_SECONDS_MAX: Final = 0.5
TRANSACTION_COMPLETION_WAIT_SECONDS: Final = 60.0
#: ... but for this long from the start of the wait the delay stays at the first value: a commit
#: usually completes within tens of milliseconds, and a doubling delay would overshoot that by up to
#: as much again -- on every Spark micro-batch, whose sink waits for its transactions' merge
#: (measured on a loaded 2-core machine: median 86 ms doubling, 58 ms asking every 5 ms).
TRANSACTION_STATUS_POLL_STEADY_SECONDS: Final = 0.25

#: A commit whose reply was lost (the connection broke) is resolved by asking for the transaction's
#: status; while it is still OPEN the commit is sent again, at most this many times in all.
TRANSACTION_COMMIT_ATTEMPTS_MAX: Final = 5

# --- The Spark data source (millstream.spark) ------------------------------------------------------

#: A source task hands Spark its events in Arrow record batches of at most this many rows and this
#: many payload bytes, whichever is reached first: Spark copies each batch into the JVM whole, so the
#: bytes bound a task's memory beyond one event, and the rows match Spark's own Arrow batch size
#: (spark.sql.execution.arrow.maxRecordsPerBatch = 10,000) so per-batch overhead stays negligible.
SPARK_ARROW_BATCH_ROWS_MAX: Final = 10_000
SPARK_ARROW_BATCH_BYTES_MAX: Final = 16 * MIB

#: A source task reads its range, which was written before the batch was planned; a read that
#: returns nothing before the range's end means the data is not there (yet: a segment store still
#: recovering).  The task waits and reads again, at most this many times, waiting this long each time
#: (about a minute in all: a recovery takes seconds), then fails with the reason.
SPARK_READ_EMPTY_ATTEMPTS_MAX: Final = 120
SPARK_READ_EMPTY_WAIT_SECONDS: Final = 0.5

#: A source task reading its range keeps this many ``ReadSegment`` requests in flight (each at most
#: the client's read length, 1 MiB): the store answers the next while the task decodes the last.
#: Measured on loopback (2 cores, 108-byte events): one in flight 265 MB/s, two 312, four 380; the
#: bound is also the task's read memory (4 MiB).
SPARK_READ_AHEAD_MAX: Final = 4

#: Where a query starts, the data source opens (and closes) a TCP connection to the controller's
#: address first, waiting at most this long: a wrong address then fails the query in seconds, naming
#: it, rather than after the client's reconnect budget (minutes).  A store on the other side of a
#: slow network still answers a connect well within it.
SPARK_CONTROLLER_CONNECT_TIMEOUT_SECONDS: Final = 5.0

#: The planner moves a batch's end into the successors of sealed segments, round after round while
#: successors are sealed and empty too (scales in quick succession); each round moves one epoch on, so
#: this bounds the epochs one planning call crosses -- reaching it is a bug (``InternalError``).
SPARK_PLAN_SCALE_ROUNDS_MAX: Final = 10_000
#: The bytes of a segment's range the source's planner reads to learn the mean size of its events,
#: from which ``maxRowsPerBatch`` becomes a byte offset at a known event boundary (the store's index,
#: ``EventBoundaries``) instead of a count of every event: one small read per segment and batch.
SPARK_PLAN_SAMPLE_BYTES: Final = 64 * KIB

#: The lease of the sink's store transactions by default.  A task's transaction stays open from its
#: first row until the driver commits the batch, and nothing pings it once the task has returned, so
#: the lease must outlast the batch's slowest task plus the commit (a first batch takes 4-13 s to warm
#: up; a stateful batch on a busy machine, tens of seconds); a task killed with its executor leaves
#: its transaction to expire after this long.  ``transactionLeaseSeconds`` overrides it.
SPARK_SINK_TRANSACTION_LEASE_SECONDS: Final = 300.0

#: A sink task hands its framed events to the client's event loop once this many bytes are queued
#: (and at its end), not per Arrow batch and segment.  Each hand-over is a round trip between the
#: task's thread and the loop's, and under load each such GIL hand-over cost 10-25 ms in a Python
#: worker (profiled: 18 hand-overs were half of a 1.1 s task of 83,000 rows); 4 MiB makes that a few
#: per task while bounding what a task holds beyond the pipeline's own unacknowledged window.
SPARK_SINK_APPEND_BUFFER_BYTES: Final = 4 * MIB

# --- Reader groups (state synchronizer, readers, checkpoints) --------------------------------------

#: A reader group's shared state is one segment of records (a full state, then updates); once this
#: many bytes of updates follow the last full state, the next writer appends a full state and
#: truncates the segment before it, so a joining reader replays at most about this much.  (Pravega:
#: 512 KiB, compacted with probability 5% per update.)
READER_GROUP_STATE_COMPACTION_BYTES: Final = 512 * KIB

#: A state update that finds the segment longer than it expected (another reader wrote first) reads
#: what it missed, plans again and retries, at most this many times.  Every failed attempt means
#: another client's update succeeded, so only a group with this many writers racing one reader for
#: every single update could exhaust it.
READER_GROUP_STATE_UPDATE_ATTEMPTS_MAX: Final = 200

#: Checkpoints of one group in progress at once (Pravega's maxOutstandingCheckpointRequest): each
#: stops its readers from rebalancing until they have recorded it, so more would only pile up.
READER_GROUP_CHECKPOINTS_OUTSTANDING_MAX: Final = 3

#: Completed checkpoints a group's state keeps (by name, for a reset to one of them); older ones
#: are dropped as newer ones complete.  Their cuts are also returned to whoever initiated them.
READER_GROUP_CHECKPOINTS_KEPT: Final = 10

#: Readers online in one group at once, and segments one group holds at once (assigned, unassigned,
#: waiting for predecessors, or read to their end): bounds on the state every reader keeps and on
#: the full-state record (which must fit one event, ``EVENT_LENGTH_BYTES_MAX``).
READER_GROUP_READERS_MAX: Final = 1024
READER_GROUP_SEGMENTS_MAX: Final = 16_384

#: Reader ids and checkpoint names: printable, at most this many characters.
READER_GROUP_NAME_LENGTH_MAX: Final = 255

#: Rebalancing timers count in units of this many seconds (Pravega's TIME_UNIT, 1 s): after acquiring,
#: a reader waits (readers - ranking) units before acquiring again, after releasing (1 + ranking)
#: units, so the least loaded readers take segments first.  A reader's configuration may shorten it.
READER_TIME_UNIT_SECONDS: Final = 1.0

#: Lags below this count as this much when comparing readers' loads (Pravega's ASSUMED_LAG_MILLIS):
#: readers that keep up are compared by segment count alone.
READER_ASSUMED_LAG_SECONDS: Final = 30.0

#: A reader writes a heartbeat (its lag) to the group this often, from a task of its own so that an
#: application busy with one event is not taken for dead ...
READER_HEARTBEAT_SECONDS: Final = 2.0
#: ... and the other readers declare it offline (its segments go back to the pool at their last
#: checkpointed offsets) once they have seen no heartbeat of it for this long.
READER_OFFLINE_TIMEOUT_SECONDS: Final = 30.0

#: A reader's long poll at the tail of its segments, and on the group's state segment (a change there
#: -- a checkpoint, a reset, a segment freed -- wakes it at once).  Below ``TAIL_READ_WAIT_SECONDS_MAX``.
READER_TAIL_WAIT_SECONDS: Final = 30.0

#: A blocking reader takes at most this many events from its event loop per hand-off (a hand-off costs
#: tens of microseconds, far too much per event); they are returned one by one from a local queue.
READER_BLOCKING_BATCH_EVENTS_MAX: Final = 1024

#: How long ``initiate_checkpoint`` waits, by default, for every online reader to record its position.
#: A reader that never calls ``read_next_event`` again holds a checkpoint until it is declared offline.
READER_GROUP_CHECKPOINT_WAIT_SECONDS: Final = 300.0

#: A long poll at the tail of a segment (and on the group's state segment) asks for at most this
#: much: what arrives while it waits is small, and each read in flight counts its requested length
#: against the connection's read budget (``SERVER_CONNECTION_READ_BYTES_MAX``), so a reader following
#: hundreds of segments must not ask for a full read length at every tail.  Reads while catching up
#: ask for the client's full read length.
READER_TAIL_READ_LENGTH_BYTES: Final = 128 * KIB

# --- Large events (transient segments, the byte-stream writer, the large-event reader) -------------

#: One large event (``LargeEventWriter.stream_event``).  PDP-43's figure: room for any video frame or
#: batch a device writes at once, while one event still fits a segment's life many times over and a
#: reader streaming it at 100 MB/s finishes in about ten seconds.  The event's length travels as the
#: i32 of its framing header, so it could not exceed 2 GiB - 1 anyway.
LARGE_EVENT_LENGTH_BYTES_MAX: Final = 1024 * MIB

#: An ``EventWriter`` holds what it was given in memory up to this much before it creates a transient
#: segment: a commit at or under it is one plain append through the ordinary writer (no transient
#: segment, no merge), as PDP-43 asks.  It is the classic event limit, so such an event is exactly
#: one a classic writer could have written.
LARGE_EVENT_INLINE_BYTES_MAX: Final = EVENT_LENGTH_BYTES_MAX

#: One conditional append of a large event's bytes to its transient segment.  Large enough that the
#: per-request cost (a frame, a task, an operation, an acknowledgement) is lost in the bytes, small
#: enough that a resend after a reconnect re-sends little and the Tier-1 frames it spans (1 MiB each)
#: flow while the next chunk is on its way.  Well under the wire frame (16 MiB).
LARGE_EVENT_CHUNK_BYTES_MAX: Final = 2 * MIB

#: Chunks of one ``EventWriter`` (or ``ByteStreamWriter``) sent and not yet acknowledged, in bytes:
#: they are kept for a resend after a reconnect, so this bounds the writer's memory beyond its inline
#: buffer.  bandwidth x round trip is ~3 MB (see ``CLIENT_WRITER_UNACKED_BYTES_MAX``); four chunks
#: keep the pipeline full through a slow fsync.  ``write`` waits while it is reached.
LARGE_EVENT_UNACKED_BYTES_MAX: Final = 8 * MIB

#: Attributes (one per writer id) a transient segment may hold.  One writer writes it; PDP-43A allows
#: 16, which covers a writer that reconnected with new ids a few times.  A further writer id is
#: refused (``TransientSegmentError``).
TRANSIENT_SEGMENT_ATTRIBUTES_MAX: Final = 16

#: A transient segment whose writer's connection closed is deleted this long after, unless a
#: connection sets up appends to it (or merges it) meanwhile.  Longer than a writer keeps trying to
#: reconnect (``CLIENT_RECONNECT_BUDGET_SECONDS`` per outage, by default), so "reconnect and resend" can
#: succeed; short enough that an abandoned large event's bytes do not linger.
TRANSIENT_SEGMENT_DISCONNECT_GRACE_SECONDS: Final = 60.0

#: A transient segment nobody appended to, set up appends to or merged for this long is deleted by the
#: idle sweep, connected writer or not: an application that stopped streaming an event for five
#: minutes has abandoned it, and the segment store must not keep its bytes forever.  After a restart
#: (recovery from the log) every transient segment found starts a fresh idle period, as PDP-43 asks.
TRANSIENT_SEGMENT_IDLE_SECONDS: Final = 300.0

#: How often the server's sweep looks for transient segments past their grace period or idle time.
#: Deletion is housekeeping, so a few seconds late costs nothing; the sweep itself is a dictionary
#: scan (plus, for segments recovered from a log, one listing of each container's segments).
TRANSIENT_SEGMENT_SWEEP_INTERVAL_SECONDS: Final = 5.0

#: Transient segments one server tracks at once (created and not yet merged or deleted).  Each holds
#: up to a large event's bytes in Tier 1/2 until it is merged; 4,096 is far more large events in
#: flight than a 2-core node moves at once.  Beyond it ``CreateTransientSegment`` is refused
#: (``TransientSegmentError``) until some are merged, aborted or expire.
TRANSIENT_SEGMENTS_PER_SERVER_MAX: Final = 4096

#: Merged transient segments whose merge the server remembers (name -> target and its length after
#: the merge), so a ``MergeSegments`` retried after a lost reply is answered as the first one was
#: instead of "no such segment".  A writer retries within its reconnect window; the oldest are
#: forgotten first.
TRANSIENT_SEGMENT_MERGES_REMEMBERED_MAX: Final = 4096

#: A reader's default in-memory limit for one event: ``read_next_event`` returns events up to this
#: long as values and raises ``EventTooLargeError`` for longer ones, which are read through
#: ``EventRead.stream_event()`` instead.  The classic event limit, so code written for classic events
#: behaves exactly as before; a reader may raise it (``ReaderConfig.event_in_memory_bytes_max``) up to
#: ``LARGE_EVENT_LENGTH_BYTES_MAX`` if it can afford the memory.
READER_EVENT_IN_MEMORY_BYTES_MAX: Final = EVENT_LENGTH_BYTES_MAX

# --- Tokens (millstream.auth, `millstream token issue`) ---------------------------------------------------

#: The longest lifetime `millstream token issue --ttl` gives a token.  A token cannot be revoked on
#: its own -- only changing the node's secret revokes it, with every other token -- so a leaked one
#: is valid until it expires: a year bounds that, and an operator issues a new one instead.
TOKEN_TTL_SECONDS_MAX: Final = 366 * 24 * 3600.0

#: A secret file longer than this is refused unread (`--auth-secret-file`): a secret is a few dozen
#: bytes, and a larger file is the wrong file (a certificate, a log), not a better secret.
SECRET_FILE_BYTES_MAX: Final = 64 * 1024

# --- Event boundaries (truncating segments that hold events: millstream.segmentstore.event_boundaries)

#: A segment that holds events remembers an offset where an event begins at least every this many
#: bytes (the end of the append that crosses each mark), so that checking a truncation offset reads
#: from a known boundary not far below it.  1 MiB: one read of the cache, or one Tier-2 block.
EVENT_BOUNDARY_INDEX_SPACING_BYTES: Final = 1 * MIB

#: ... but at most this many per segment (8 KiB of offsets, in memory and in every metadata
#: checkpoint); past it every other one is dropped and the spacing doubles.  So the spacing is 1 MiB
#: up to about 1 GiB of segment, 2 MiB up to 2 GiB, ..., 8 MiB up to 8 GiB.
EVENT_BOUNDARY_INDEX_ENTRIES_MAX: Final = 1024

#: Bytes one truncation check may read, hopping from event header to event header between the
#: nearest known boundary and the offset (a large event is hopped over, not read).  Between two known
#: boundaries lie about the spacing plus one append, so this covers segments up to about 8 GiB of small
#: events; beyond, an offset far from any known boundary among small events is refused as
#: unconfirmable (``EventBoundaryError`` says so) rather than read without bound.
EVENT_BOUNDARY_SCAN_BYTES_MAX: Final = 16 * MIB
#: Offsets in one ``EventBoundaries`` reply (8 bytes each: 16 KiB).  A segment's index holds at most
#: ``EVENT_BOUNDARY_INDEX_ENTRIES_MAX`` entries, plus its start and length, so a reply holds all the
#: known boundaries of any range; the bound is what a request naming a huge range gets at most.
EVENT_BOUNDARIES_REPLY_ENTRIES_MAX: Final = 2 * EVENT_BOUNDARY_INDEX_ENTRIES_MAX

# --- Writers with a stable writer id (issue 20, item 4) ------------------------------------------------

#: Longest stable writer id (``event_writer(stream, serializer, writer_id=...)``), in characters.  It
#: names the writer in errors and logs and is hashed into one wire writer id per segment; a name is
#: something an operator types (a pipeline, a source partition), not a payload.
STABLE_WRITER_ID_LENGTH_MAX: Final = 256

#: The largest sequence a writer with a stable id accepts (exclusive): the wire's event numbers and
#: the writer-id attribute are signed 64-bit, and a source offset fits.
STABLE_WRITER_SEQUENCE_LIMIT: Final = 2**63

#: How many segments' writer-id attributes a writer with a stable id reads at once when it starts
#: (every segment of the stream from its head, to learn its deduplication floors): one request each,
#: so a stream with a long history starts in a few round trips without flooding its segment stores.
STABLE_WRITER_ATTRIBUTE_READS_CONCURRENT_MAX: Final = 16

# --- Metrics and health (millstream.metrics, millstream.health: issue 25, items 1 and 2) ------------

#: Segments whose append totals the metrics keep (per segment: bytes, events, blocks since the node
#: started).  Segment names are chosen by clients, so this bounds memory whatever they create; a
#: segment beyond it counts in its container's totals only, and deleted segments are forgotten.
METRICS_SEGMENTS_TRACKED_MAX: Final = 10_000

#: Per-segment series in one scrape: the segments with the most bytes appended.  Prometheus keeps
#: every series it ever saw for its retention; a hundred per node is what a dashboard can show.
METRICS_SEGMENT_SERIES_MAX: Final = 100

#: Readers' positions the server remembers for reader lag (one per connection and segment read, the
#: end of its last read); beyond it new positions are not tracked until some are forgotten (their
#: connection closed).  A reader reads a few segments; 10,000 covers thousands of readers.
METRICS_READ_POSITIONS_MAX: Final = 10_000

#: The metrics endpoint (``/metrics``, ``/healthz``, ``/readyz``, ``/status``): its HTTP request head,
#: connections at once, and how long a client may take to send its request.  It serves monitoring
#: systems, a few at a time, whose requests are one short line and a few headers.
METRICS_REQUEST_HEAD_BYTES_MAX: Final = 8 * KIB
METRICS_CONNECTIONS_MAX: Final = 64
METRICS_REQUEST_TIMEOUT_SECONDS: Final = 10.0

#: How long ``millstream node status`` waits for the endpoint's answer.
NODE_STATUS_TIMEOUT_SECONDS: Final = 10.0

# --- The cluster's coordination on ZooKeeper (millstream.cluster: issue 23) ------------------------

#: A host's ZooKeeper session timeout: how long after a host stops answering ZooKeeper expires its
#: session, removes its registration and lets the leader give its containers to others.  It bounds
#: how soon a dead host's containers are served again (issue 23's target: within 10 s of the loss),
#: and it must outlast a loaded host's pauses (a full garbage collection, a slow fsync) so that a
#: live host is not declared dead.  Pravega's default is 10 s; 6 s leaves 4 s for reassignment and
#: log recovery.  ZooKeeper clamps it into the server's [2, 20] ticks unless the server says otherwise.
ZOOKEEPER_SESSION_TIMEOUT_SECONDS: Final = 6.0

#: How long a host waits for ZooKeeper to answer when it starts: a wrong address fails within this.
ZOOKEEPER_CONNECT_TIMEOUT_SECONDS: Final = 15.0

#: One ZooKeeper request (read or conditional write of the map, a registration).  A request on a
#: connection that drops fails at once; this bounds one sent to a server that stopped answering.
ZOOKEEPER_REQUEST_TIMEOUT_SECONDS: Final = 10.0

#: How long stopping a member waits for its election thread to leave the election.
ZOOKEEPER_ELECTION_STOP_TIMEOUT_SECONDS: Final = 10.0

#: How many times a host starts a container again, under one map generation, after an older map's
#: owner fenced it while this host held the container's claim (``ContainerManager``).  One restart
#: heals the start-up race (an older claimant opens once); a few more cover an old owner's container
#: restarting after a failure; the bound stops a ping-pong nobody foresaw until the next map.
CLUSTER_CONTAINER_RECLAIMS_MAX: Final = 3

#: How many times a claim of a container's znode is retried when another host's conditional write
#: got there first (each retry re-reads the claim; two hosts at most contend under one generation).
CLUSTER_CLAIM_ATTEMPTS_MAX: Final = 5

#: How long ``millstream serve --tier1`` waits for NATS JetStream to answer before it refuses to
#: start (a wrong address fails within this, naming it).  Loopback or a LAN answers in milliseconds;
#: a loaded machine may take a second or two to accept a connection.
CLUSTER_TIER1_CHECK_TIMEOUT_SECONDS: Final = 5.0

#: How long ``millstream cluster up`` waits for its ZooKeeper, NATS servers and nodes to be ready
#: (each node prints its address and the map gives every container a claimed owner) before it stops
#: everything and fails.  A JVM and three JetStream servers start in seconds here; a loaded CI
#: machine may take many times that.
CLUSTER_UP_START_TIMEOUT_SECONDS: Final = 120.0

#: How long ``millstream cluster up`` gives each child (node, NATS server, ZooKeeper) to exit after
#: SIGTERM before it SIGKILLs it: a node drains what its containers acknowledged first.
CLUSTER_UP_STOP_TIMEOUT_SECONDS: Final = 30.0
