"""DurableLog: a container's write-ahead log -- recovery by replay on start, then the OperationProcessor.

Recovery (``spec/DurableLog.tla``'s ``Recover``, ``spec/ContainerFailover.tla``'s ``Start``).  After
``initialize()`` fences any older owner, the log is read from its truncation point: the
DataFrameReader reassembles records (dropping a record a crash cut short), the first metadata
checkpoint loads the metadata, and every later operation is replayed through a metadata update
transaction -- it must validate where it stands and carry exactly the offsets and ids the container
would assign again, or the log is corrupt and the container refuses to start
(``DataCorruptionError``, naming where).  A later checkpoint must agree with what replay rebuilt.
Sequence numbers resume above the highest one seen in any entry, complete or not.  A log with
nothing in it gets a checkpoint first, so the log always starts with one.

The log is truncated only just below the frame a checkpoint begins in, and only once every byte that
checkpoint describes is in Tier 2 (``storage_writer``).  So the first frame read may begin with
records older than the checkpoint (they are part of it, and are skipped), and the checkpoint may
name segment bytes the log no longer holds -- its spans must then cover them, or the log is corrupt.
"""

from __future__ import annotations

from collections.abc import Callable

from millstream import limits
from millstream.clock import Clock
from millstream.errors import DataCorruptionError, MillstreamError
from millstream.segmentstore.data_frame import DataFrameReader
from millstream.segmentstore.durable_data_log import DurableDataLog
from millstream.segmentstore.metadata import (
    ContainerMetadata,
    checkpoint_body,
    checkpoint_version,
    deserialize_checkpoint,
    serialize_checkpoint,
)
from millstream.segmentstore.metadata_transaction import ContainerMetadataUpdateTransaction
from millstream.segmentstore.operation_processor import OperationProcessor
from millstream.segmentstore.operations import MetadataCheckpointOperation, Operation, deserialize
from millstream.segmentstore.tracing import Tracer

__all__ = ["DurableLog"]


class DurableLog:
    """Recovers a container's metadata (and, through ``on_committed``, its memory) from the log, then
    runs the OperationProcessor on it."""

    def __init__(
        self,
        metadata: ContainerMetadata,
        data_log: DurableDataLog,
        *,
        clock: Clock,
        on_committed: Callable[[list[Operation]], None],
        on_loaded: Callable[[ContainerMetadata], None] | None = None,
        tracer: Tracer | None = None,
        frame_length_max: int = limits.DATA_FRAME_SIZE_MAX_BYTES,
        checkpoint_frame_count: int = limits.CHECKPOINT_FRAME_COUNT_MIN,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        self.metadata = metadata
        self._wall_clock = wall_clock
        self._log = data_log
        self._clock = clock
        self._on_committed = on_committed
        self._on_loaded = on_loaded
        self._tracer = tracer
        self._frame_length_max = frame_length_max
        self._checkpoint_frame_count = checkpoint_frame_count
        self.processor: OperationProcessor | None = None
        #: Operations replayed by the last recovery.
        self.recovered_operations = 0

    async def start(self) -> OperationProcessor:
        """Take the log over, recover, and start processing.  Raises ``DataCorruptionError`` if the log
        cannot be trusted (nothing is written then), or the log's own errors (e.g. fencing)."""
        self.metadata.epoch = await self._log.initialize()
        reader = DataFrameReader(self._log.read())
        found_checkpoint = self._recover(reader)
        processor = OperationProcessor(
            self.metadata, self._log, clock=self._clock, on_committed=self._on_committed,
            next_sequence_number=reader.highest_sequence_number + 1,
            next_frame_number=(reader.last_address.sequence if reader.last_address else 0) + 1,
            frame_length_max=self._frame_length_max, tracer=self._tracer,
            checkpoint_frame_count=self._checkpoint_frame_count, wall_clock=self._wall_clock)
        if self._tracer is not None:
            self._tracer("Recover", frames=reader.frame_count)
        processor.start()
        if not found_checkpoint:
            processor.queue_checkpoint()
        self.processor = processor
        return processor

    def _recover(self, reader: DataFrameReader) -> bool:
        container = self.metadata.container_id
        transaction: ContainerMetadataUpdateTransaction | None = None
        skipped = None
        loaded_version = 0
        # What replay changes is stamped with the time of this recovery (the log holds no times): a
        # segment's last_modified_ms is then never earlier than the truth; later checkpoints correct it.
        recovered_at_ms = 0 if self._wall_clock is None else int(self._wall_clock() * 1000)
        for record in reader:
            where = f"container {container}, operation {record.sequence_number} (log record {record.address.sequence})"
            operation = deserialize(record.data, record.sequence_number)
            if transaction is None:
                if not isinstance(operation, MetadataCheckpointOperation):
                    if reader.frame_count == 1:
                        skipped = skipped or where
                        continue  # older than the first checkpoint, which the truncation kept: part of it
                    raise DataCorruptionError(f"{where}: the log does not start with a metadata checkpoint")
                operation.frame_number, operation.truncation_address = record.first_frame, record.address_before
                self._load(operation, where)
                loaded_version = checkpoint_version(operation.payload)
                transaction = ContainerMetadataUpdateTransaction(self.metadata, None)
                transaction.time_ms = recovered_at_ms
                self._on_committed([operation])
                continue
            if isinstance(operation, MetadataCheckpointOperation):
                self._compare(operation.payload, transaction, loaded_version, where)
                operation.frame_number, operation.truncation_address = record.first_frame, record.address_before
                self._on_committed([operation])
                continue
            try:
                transaction.replay(operation)
            except DataCorruptionError as error:
                raise DataCorruptionError(f"{where}: {error}") from error
            except MillstreamError as error:
                raise DataCorruptionError(f"{where}: does not replay: {error!r}") from error
            self._on_committed([operation])
            self.recovered_operations += 1
        if transaction is None and skipped is not None:
            raise DataCorruptionError(f"{skipped}: the log does not start with a metadata checkpoint")
        if transaction is not None:
            transaction.commit()
        self.metadata.check_invariants()
        return transaction is not None

    def _compare(self, payload: bytes, transaction: ContainerMetadataUpdateTransaction, loaded_version: int,
                 where: str) -> None:
        """A later checkpoint must hold what replay rebuilt, byte for byte -- compared in the older of
        its version and the loaded one's (what the loaded checkpoint lacked, replay cannot rebuild:
        a version-1 start knows no event boundaries), and without the modification times, which replay
        does not rebuild but takes over from it."""
        stored_version = checkpoint_version(payload)
        version = min(loaded_version, stored_version)
        stored = deserialize_checkpoint(payload, self.metadata.container_id)
        if stored_version != version:
            payload = serialize_checkpoint(stored.next_segment_id, stored.segments.values(), version=version)
        rebuilt = serialize_checkpoint(transaction.next_segment_id, transaction.snapshot(), version=version)
        if checkpoint_body(rebuilt) != checkpoint_body(payload):
            raise DataCorruptionError(f"{where}: checkpoint disagrees with the replayed log")
        if stored_version >= 2:
            transaction.adopt_modification_times(stored)

    def _load(self, checkpoint: MetadataCheckpointOperation, where: str) -> None:
        """Load the first checkpoint.  The bytes it names may be only in Tier 2 now; whether its spans
        (and later flushes) cover them is checked once replay is done (``SegmentContainer``)."""
        loaded = deserialize_checkpoint(checkpoint.payload, self.metadata.container_id)
        self.metadata.segments, self.metadata.ids_by_name = loaded.segments, loaded.ids_by_name
        self.metadata.next_segment_id = loaded.next_segment_id
        if self._on_loaded is not None:
            self._on_loaded(self.metadata)
