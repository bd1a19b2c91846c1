"""Every limit in millstream, in one place, each with its reason.

A limit is a promise: a queue that can grow without bound, a retry that never gives up or a wait
without a timeout is a bug.  Values here are upper bounds, not tuning knobs.
"""

from __future__ import annotations

from typing import Final

KIB: Final = 1024
MIB: Final = 1024 * KIB

# --- Tier 1 and DataFrames -------------------------------------------------------------------------

#: One DataFrame, i.e. one Tier-1 write.  Large enough that a full frame costs about one fdatasync
#: of 1 MiB (the disk's efficient write size, see reference/performance-baselines.md), small enough
#: that one stuck write does not hold much.  Pravega's BookKeeper limit is 1 MiB - 1 KiB.
DATA_FRAME_SIZE_MAX_BYTES: Final = 1 * MIB

#: Bytes of DataFrames handed to Tier 1 and not yet acknowledged.  Beyond this the processor stops
#: sealing frames and waits: the log is the bottleneck, and more in flight only adds latency.
#: (Pravega: bookkeeper.write.outstanding.bytes.max = 256 MiB.)
DATA_LOG_IN_FLIGHT_BYTES_MAX: Final = 256 * MIB

#: A FileLog ledger file rolls over at this size, so truncation can delete whole files.
FILE_LOG_LEDGER_SIZE_MAX_BYTES: Final = 256 * MIB

# --- Operations ------------------------------------------------------------------------------------

#: One append's payload.  A client block of events travels as one append; the wire frame limit
#: (16 MiB - 1) caps it in practice.  Larger appends span several DataFrames.
APPEND_LENGTH_MAX_BYTES: Final = 16 * MIB - 1

#: Attribute updates carried by one operation (keeps one record's size and validation cost bounded).
ATTRIBUTE_UPDATES_PER_OPERATION_MAX: Final = 1024

#: Attributes one segment may hold; each idempotent writer costs one.  Checkpoints carry them all.
ATTRIBUTES_PER_SEGMENT_MAX: Final = 100_000

#: A segment name, encoded as UTF-8.
SEGMENT_NAME_LENGTH_MAX_BYTES: Final = 1024

#: Segments one container may know (active, sealed or tombstoned).  Pravega: 25,000 active.
SEGMENTS_PER_CONTAINER_MAX: Final = 1_000_000

# --- Tier 2 (long-term storage) -------------------------------------------------------------------

#: A chunk name, encoded as UTF-8 (a segment name plus epoch, offset and a unique suffix).
CHUNK_NAME_LENGTH_MAX_BYTES: Final = 2048

#: Longest any single Tier-2 call may take before it fails with StorageUnavailableError.
CHUNK_STORAGE_CALL_TIMEOUT_SECONDS: Final = 60.0

#: Threads doing blocking Tier-2 file I/O (reads, writes, fsyncs) for one chunk storage.
CHUNK_STORAGE_THREADS_MAX: Final = 4

# --- The OperationProcessor ------------------------------------------------------------------------

#: Operations waiting in a container's processing queue.  Producers wait (backpressure) when full.
OPERATION_QUEUE_LENGTH_MAX: Final = 65_536

#: Payload bytes waiting in a container's processing queue.  Producers wait when exceeded.
OPERATION_QUEUE_BYTES_MAX: Final = 256 * MIB

#: Operations the processor takes from its queue in one pass (Pravega: MAX_READ_AT_ONCE).
PROCESSOR_TAKE_COUNT_MAX: Final = 1000

#: Ceiling on the dynamic batching delay (Pravega: max.batching.delay.millis = 50): a blip in Tier-1
#: latency must not become a long stall.
BATCHING_DELAY_MAX_SECONDS: Final = 0.050

#: Tier-1 writes whose latency and fill ratio feed the batching delay (a moving window).
BATCHING_STATISTICS_WINDOW: Final = 32

# --- Metadata checkpoints --------------------------------------------------------------------------

#: A metadata checkpoint is written after this many committed frames ... (Pravega: 300)
CHECKPOINT_FRAME_COUNT_MIN: Final = 300

#: ... or after this many bytes of frames, whichever comes first (Pravega: 256 MiB).
CHECKPOINT_FRAME_BYTES_MIN: Final = 256 * MIB

# --- Reads -----------------------------------------------------------------------------------------

#: One read returns at most this much (Pravega's server caps ReadSegment at 2 MiB).
READ_LENGTH_MAX_BYTES: Final = 2 * MIB

#: Longest a tail read may wait for new data before returning empty.
TAIL_READ_WAIT_MAX_SECONDS: Final = 60.0

#: Tail reads waiting on one segment at once.
TAIL_READERS_PER_SEGMENT_MAX: Final = 10_000

# --- Lifecycle -------------------------------------------------------------------------------------

#: How long stopping a container waits for in-flight Tier-1 writes before failing them.
SHUTDOWN_TIMEOUT_SECONDS: Final = 10.0
