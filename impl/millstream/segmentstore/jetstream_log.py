"""JetStreamLog: a replicated Tier-1 durable data log on NATS JetStream (one stream per container).

Theory of operation
-------------------
A container's log is one JetStream stream (file storage, ``replicas`` copies -- 3 in a cluster, 1 on
a lone server), named ``<CLUSTER>_tier1_<container id>``, whose subjects are
``millstream.<cluster>.tier1.<container id>.<kind>`` (``data``, ``epoch``, ``truncate``: one per
record kind, so an operator can tell them apart).  A record is one message.  JetStream numbers the
messages of a stream 1, 2, 3, ... (its *stream sequence*); besides the data records the stream holds
two kinds of control records, so the log keeps its own numbering of data records in a header.

* Fencing.  Every message this log publishes carries ``Nats-Expected-Last-Sequence: N``, and the
  stream stores it only if its last stream sequence is exactly ``N``.  ``initialize()`` reads the
  stream's state, then publishes an *epoch record* conditioned on the last stream sequence it saw,
  carrying ``1 +`` the highest epoch any record of the stream carries.  The older owner's publish
  that expected the epoch record's place is refused (JetStream error 10071, "wrong last sequence");
  the older owner fails it and every later write with ``DataLogFencedError`` (it reads what took its
  place and finds the newer epoch) and closes itself.  If another new owner raced in between, the
  epoch record itself is refused and ``initialize()`` reads the state again and retries
  (``JETSTREAM_LOG_FENCE_ATTEMPTS_MAX`` times, also while a stream leader is being elected).
* Stale writes (a limit of the expected-last-sequence check, found here).  The check compares
  numbers only.  An older owner that pipelines has publishes in flight that expect the sequences
  *after* the one the epoch record took: the one expecting the epoch record's own sequence finds it
  and is stored right after it (reproduced: 200 pipelined publishes while a new owner takes over;
  ``tests/cluster/test_jetstream_log.py``).  JetStream has no check naming *who* wrote the last
  message that works here: ``Nats-Expected-Last-Msg-Id`` is checked when a replicated stream applies
  a message, not when it accepts it, and a mismatch there is a "critical write error" that stops the
  stream on every replica (nats-server 2.15, seen here); ``Nats-Expected-Last-Subject-Sequence``
  refuses pipelined publishes on a replicated stream (error 10164).  So such *stale records* are
  kept out by the log, not by JetStream:

  - the older owner never acknowledges one: its publish before it was refused, and acknowledgements
    complete in order, so that failure comes first and fails every later write;
  - recovery skips them: a record whose epoch is below that of a record before it is stale, and so is
    every later record of the current epoch (that owner's chain is broken: its next publish was
    refused, so it acknowledged none of them) until the next epoch record;
  - the new owner whose publish a stale record refused fails with ``WriteFailedError`` (it is not
    fenced -- no newer owner exists -- but it cannot continue its epoch; its container restarts and
    the next owner recovers).  It tells the two cases apart by reading what took its place
    (``JETSTREAM_LOG_REFUSAL_SCAN_MESSAGES_MAX``).
* Pipelining.  One owner predicts its stream sequences: the record after stream sequence ``s``
  expects ``s``.  A sender task publishes records in append order, up to
  ``JETSTREAM_LOG_PUBLISHES_IN_FLIGHT_MAX`` unacknowledged at once, without waiting for each
  acknowledgement.  JetStream acknowledges a message of a replicated stream after its quorum stored
  it (with ``sync_interval: always``, fsynced); a completer task takes the acknowledgements strictly in
  order and completes the futures in order.  A failure is final: the first failed acknowledgement (a
  refusal, a timeout after ``ack_timeout_seconds``, a lost connection) fails its record and every
  later one -- ``DataLogFencedError`` for error 10071 from a newer owner, ``WriteFailedError``
  (outcome unknown) for anything else -- and the log closes.  A later record of ours that JetStream refuses because an
  earlier one was lost is covered by the earlier failure, which is reported first.
* Numbering.  ``LogAddress.sequence`` numbers *data* records 1, 2, 3, ... over the log's whole life;
  ``locator`` is ``(stream sequence,)``.  Each data record carries its own sequence in a header, and
  each control record the highest data sequence issued before it, so the next owner continues the
  numbering from the stream alone, even when a truncation purged every data record.  Recovery checks
  that the data sequences it reads are contiguous and that each record's CRC32 header matches its
  payload (a damaged record raises ``DataCorruptionError`` naming both sequences).  A record whose
  publish failed and did not land leaves no trace, so its sequence is reissued, as the contract says.
* Truncation.  ``truncate(upto)`` first publishes a *truncation record* (through the same pipeline,
  so it is fenced like any write) saying "data records up to ``upto.sequence`` are discarded", then
  purges the stream below ``upto``'s stream sequence + 1 (every kind of record).  The truncation
  record survives the purge (it comes after ``upto``), so the stream keeps the highest epoch and data
  sequence; it always starts with a valid record of the owner that truncated (a stale record before
  its truncation record would have refused it); and a purge that fails or never ran leaves records
  that recovery skips by the truncation record.
* Reading.  ``read()`` is synchronous in the interface, so ``initialize()`` loads every record above
  the truncation point into memory, one message get after another.  What it holds is bounded by what
  the stream may hold: the stream is created with ``max_bytes = JETSTREAM_LOG_STREAM_BYTES_MAX`` and
  the discard-new policy, so a log that is never truncated fails its appends (``WriteFailedError``)
  rather than grow without bound.  The DurableLog above truncates after every metadata checkpoint,
  long before that.
* Close.  ``close()`` stops the sender, waits (bounded) for the acknowledgements of what is already
  published and completes those, and fails every record not yet published with
  ``ObjectClosedError`` -- it was never written.  An admitted wart: a published record whose
  acknowledgement does not arrive within ``ack_timeout_seconds`` fails with ``ObjectClosedError`` too,
  although it may have landed (JetStream cannot take a message back); the next owner then reads it.

What JetStream needs to be: a server (or cluster) with JetStream enabled and a ``max_payload`` of at
least ``write_settings.max_write_length_bytes`` plus ``JETSTREAM_LOG_HEADER_BYTES_MAX`` -- NATS counts
headers in the payload limit and its default is exactly 1 MiB, less than a full DataFrame plus
headers.  ``initialize()`` checks the server's limit and raises ``InvalidArgumentError`` naming it.
``millstream.testing.nats_cluster`` starts servers configured that way.

Message headers (all values ASCII decimal)::

    Nats-Expected-Last-Sequence  the stream sequence this message expects to follow (the fencing)
    Millstream-Kind              data | epoch | truncate
    Millstream-Epoch             the writer's epoch
    Millstream-Sequence          data: this record's data sequence;
                                 epoch, truncate: the highest data sequence issued before it
    Millstream-Truncated         epoch, truncate: data records up to here are discarded
    Millstream-Crc32             data: zlib.crc32 of the payload
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import json
import logging
import re
import zlib
from collections.abc import Awaitable, Iterator, Sequence
from typing import Final, TypeVar

import attrs
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RawStreamMsg, RetentionPolicy, StorageType, StreamConfig

from millstream import limits
from millstream.errors import (
    DataCorruptionError,
    DataLogFencedError,
    DurableDataLogError,
    InternalError,
    InvalidArgumentError,
    ObjectClosedError,
    PayloadTooLargeError,
    WriteFailedError,
)
from millstream.segmentstore.durable_data_log import (
    DurableDataLog,
    LogAddress,
    LogRecord,
    OnDone,
    WriteSettings,
    notify_done,
)
from millstream.segmentstore.file_log import DEFAULT_MAX_WRITE_LENGTH_BYTES

__all__ = ["JetStreamLog", "stream_name_for", "subject_for"]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: JetStream's error code for a refused ``Nats-Expected-Last-Sequence``: "wrong last sequence".
WRONG_LAST_SEQUENCE_ERROR_CODE: Final = 10071

HEADER_EXPECTED_LAST_SEQUENCE: Final = "Nats-Expected-Last-Sequence"
HEADER_KIND: Final = "Millstream-Kind"
HEADER_EPOCH: Final = "Millstream-Epoch"
HEADER_SEQUENCE: Final = "Millstream-Sequence"
HEADER_TRUNCATED: Final = "Millstream-Truncated"
HEADER_CRC32: Final = "Millstream-Crc32"

_CLUSTER_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


class _Kind(enum.StrEnum):
    DATA = "data"
    EPOCH = "epoch"
    TRUNCATE = "truncate"


def stream_name_for(cluster_name: str, container_id: int) -> str:
    """The JetStream stream holding container ``container_id``'s log in cluster ``cluster_name``."""
    return f"{cluster_name}_tier1_{container_id}"


def subject_for(cluster_name: str, container_id: int) -> str:
    """The prefix of that stream's subjects: records go to ``<prefix>.data``, ``<prefix>.epoch`` and
    ``<prefix>.truncate`` by kind."""
    return f"millstream.{cluster_name}.tier1.{container_id}"


@attrs.define
class _Write:
    """A record on its way: queued, then published (``acknowledgement`` set), then completed."""

    kind: _Kind
    sequence: int  # data: its own; control: the highest data sequence issued before it
    data: bytes
    future: asyncio.Future[LogAddress]
    on_done: OnDone | None = None
    truncated: int = 0  # truncate records: data records up to here are discarded
    stream_sequence: int = 0  # set when published
    acknowledgement: asyncio.Future[tuple[str, int] | _Refusal] | None = None


@attrs.frozen
class _Refusal:
    """JetStream refused a publish: its error code (10071: wrong last sequence) and description."""

    error_code: int
    description: str

    def __str__(self) -> str:
        return f"JetStream error {self.error_code}: {self.description}"


def _parse_reply(message: Msg) -> tuple[str, int] | _Refusal:
    """A publish's reply: ``(stream, sequence)`` if stored, a ``_Refusal`` otherwise."""
    status = (message.headers or {}).get("Status")
    if status is not None:  # 503: no responders -- no stream leader to take the message
        return _Refusal(int(status) if status.isdigit() else 0, f"status {status} (no stream leader?)")
    try:
        body = json.loads(message.data)
        if "error" in body:
            error = body["error"]
            return _Refusal(int(error.get("err_code", 0)), str(error.get("description", "")))
        return (str(body["stream"]), int(body["seq"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return _Refusal(0, f"unreadable acknowledgement {message.data[:200]!r}")


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    FAILED = "failed"  # a write failed or the log was fenced: it closed itself
    CLOSED = "closed"


class JetStreamLog(DurableDataLog):
    """Container ``container_id``'s Tier-1 log on JetStream.  See the module docstring.

    ``servers``: NATS URLs (every server of the cluster, so the client fails over).  ``replicas``:
    the stream's copies (3 for a cluster; at most the cluster's size).  Timeouts default to
    ``limits``; tests pass shorter ones.
    """

    def __init__(
        self,
        servers: Sequence[str],
        container_id: int,
        *,
        cluster_name: str = "millstream",
        replicas: int = 3,
        max_write_length_bytes: int = DEFAULT_MAX_WRITE_LENGTH_BYTES,
        stream_bytes_max: int = limits.JETSTREAM_LOG_STREAM_BYTES_MAX,
        ack_timeout_seconds: float = limits.JETSTREAM_LOG_ACK_TIMEOUT_SECONDS,
        request_timeout_seconds: float = limits.JETSTREAM_LOG_REQUEST_TIMEOUT_SECONDS,
        publishes_in_flight_max: int = limits.JETSTREAM_LOG_PUBLISHES_IN_FLIGHT_MAX,
    ) -> None:
        if not servers:
            raise InvalidArgumentError("JetStreamLog needs at least one NATS server URL")
        if not _CLUSTER_NAME.fullmatch(cluster_name):
            raise InvalidArgumentError(f"cluster name {cluster_name!r}: 1-64 letters, digits, _ or -")
        if container_id < 0:
            raise InvalidArgumentError(f"container id must be >= 0, not {container_id}")
        if replicas < 1 or max_write_length_bytes < 0 or publishes_in_flight_max < 1:
            raise InvalidArgumentError("replicas and publishes_in_flight_max must be >= 1, max_write_length_bytes >= 0")
        if ack_timeout_seconds <= 0 or request_timeout_seconds <= 0:
            raise InvalidArgumentError("timeouts must be positive")
        self._servers = list(servers)
        self._stream = stream_name_for(cluster_name, container_id)
        self._subject = subject_for(cluster_name, container_id)
        self._subjects = {kind: f"{self._subject}.{kind.value}" for kind in _Kind}
        self._replicas = replicas
        self._max_write_length_bytes = max_write_length_bytes
        self._stream_bytes_max = stream_bytes_max
        self._ack_timeout_seconds = ack_timeout_seconds
        self._request_timeout_seconds = request_timeout_seconds
        self._publishes_in_flight_max = publishes_in_flight_max
        self._state = _State.NEW
        self._failure: DurableDataLogError | None = None
        self._epoch = 0
        self._connection: NatsClient | None = None
        self._jetstream: JetStreamContext | None = None
        self._reply_prefix = ""
        self._recovered: list[LogRecord] = []
        self._appended = False
        self._next_sequence = 1  # the next data sequence append() issues
        self._durable_through = 0  # highest data sequence acknowledged (or recovered)
        self._truncated_through = 0
        self._stream_sequences: dict[int, int] = {}  # data sequence -> stream sequence, above truncation
        self._last_stream_sequence = 0  # the stream sequence the next publish expects
        self._queued: collections.deque[_Write] = collections.deque()  # not yet published
        self._published: collections.deque[_Write] = collections.deque()  # awaiting acknowledgement
        self._wake_sender = asyncio.Event()
        self._wake_completer = asyncio.Event()
        self._room = asyncio.Event()  # set while fewer than publishes_in_flight_max are published
        self._tasks: list[asyncio.Task[None]] = []

    # --- DurableDataLog ------------------------------------------------------------------------------

    @property
    def write_settings(self) -> WriteSettings:
        return WriteSettings(max_write_length_bytes=self._max_write_length_bytes)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def stream_name(self) -> str:
        """The JetStream stream this log writes (for operators and tests)."""
        return self._stream

    async def initialize(self) -> int:
        """Connect, create or look up the stream, fence every older owner with an epoch record and
        load the records for ``read()``.  Returns the new epoch.

        Raises ``ObjectClosedError`` if closed, ``InternalError`` if called twice,
        ``InvalidArgumentError`` if the servers' ``max_payload`` is too small for a full record,
        ``DataCorruptionError`` if the stream's records are damaged or out of sequence, and
        ``WriteFailedError`` if JetStream cannot be reached, has no quorum, or other owners kept
        racing in for ``JETSTREAM_LOG_FENCE_ATTEMPTS_MAX`` attempts; the log is then closed.
        """
        self._require(_State.NEW)
        try:
            await self._connect()
            await self._ensure_stream()
            for _attempt in range(limits.JETSTREAM_LOG_FENCE_ATTEMPTS_MAX):
                try:
                    refusal = await self._fence_once()
                    if refusal is None:
                        break
                    last_error = f"the epoch record was refused ({refusal}): another owner wrote in between"
                except WriteFailedError as error:  # no stream leader yet, or an older owner purged meanwhile
                    last_error = str(error)
                # A refusal can also come from a stream leader that has not settled after losing its
                # quorum (its count of proposed messages ahead of what it stored): give it time.
                await asyncio.sleep(limits.JETSTREAM_LOG_RETRY_PAUSE_SECONDS)
            else:
                raise WriteFailedError(
                    f"JetStream log {self._stream}: no epoch record written in "
                    f"{limits.JETSTREAM_LOG_FENCE_ATTEMPTS_MAX} attempts; the last: {last_error}"
                )
        except BaseException:
            await self._disconnect()
            self._state = _State.CLOSED
            raise
        self._state = _State.OPEN
        loop = asyncio.get_running_loop()
        self._room.set()
        self._tasks = [loop.create_task(self._send(), name=f"{self._stream} sender"),
                       loop.create_task(self._complete(), name=f"{self._stream} completer")]
        return self._epoch

    def read(self) -> Iterator[LogRecord]:
        """The records above the truncation point, loaded by ``initialize()``.  Raises
        ``InternalError`` unless called after ``initialize()`` and before the first append,
        ``ObjectClosedError`` if closed."""
        self._require(_State.OPEN)
        if self._appended:
            raise InternalError("read() after the first append()")
        return iter(list(self._recovered))

    def append(self, data: bytes | bytearray | memoryview, on_done: OnDone | None = None) -> asyncio.Future[LogAddress]:
        """Queue one record (see ``DurableDataLog.append``)."""
        payload = bytes(data)
        if len(payload) > self._max_write_length_bytes:
            raise PayloadTooLargeError(
                f"record of {len(payload)} bytes exceeds the log's limit of {self._max_write_length_bytes}"
            )
        self._require(_State.OPEN)
        self._appended = True
        self._recovered = []  # read() is over: let the recovered records go
        future: asyncio.Future[LogAddress] = asyncio.get_running_loop().create_future()
        self._queued.append(_Write(_Kind.DATA, self._next_sequence, payload, future, on_done))
        self._next_sequence += 1
        self._wake_sender.set()
        return future

    async def truncate(self, upto: LogAddress) -> None:
        """Discard data records up to and including ``upto``: a truncation record, then a purge.
        Idempotent; a lower address does nothing.  Raises ``InvalidArgumentError`` if ``upto`` is not
        a durable record of this log, ``ObjectClosedError`` if closed, ``DataLogFencedError`` if a
        newer owner took over and ``WriteFailedError`` if JetStream failed -- both final, as for an
        append (the log closes)."""
        self._require(_State.OPEN)
        if not 1 <= upto.sequence <= self._durable_through:
            raise InvalidArgumentError(f"{upto} is not a durable record of this log")
        if upto.sequence <= self._truncated_through:
            return
        stream_sequence = self._stream_sequences[upto.sequence]
        future: asyncio.Future[LogAddress] = asyncio.get_running_loop().create_future()
        self._queued.append(_Write(_Kind.TRUNCATE, self._next_sequence - 1, b"", future, truncated=upto.sequence))
        self._wake_sender.set()
        await future
        assert self._jetstream is not None
        try:
            # Everything below, control records included: the stream keeps a suffix of its history
            # that starts with a record of ours (see "Stale writes" in the module docstring).
            await self._request(self._jetstream.purge_stream(self._stream, seq=stream_sequence + 1))
        except WriteFailedError as error:
            # The truncation record is durable: recovery skips these records; the next truncate
            # purges them.  The caller learns that space was not reclaimed.
            raise WriteFailedError(f"JetStream log {self._stream}: purge below {stream_sequence + 1} failed: "
                                   f"{error}") from error.__cause__
        if upto.sequence > self._truncated_through:
            for sequence in range(self._truncated_through + 1, upto.sequence + 1):
                self._stream_sequences.pop(sequence, None)
            self._truncated_through = upto.sequence

    async def close(self) -> None:
        """Stop publishing; complete what JetStream acknowledges within ``ack_timeout_seconds``; fail
        everything else with ``ObjectClosedError``; disconnect.  Idempotent."""
        if self._state is _State.CLOSED:
            return
        if self._state is _State.OPEN:
            self._state = _State.CLOSED  # the sender stops taking records
            closed = ObjectClosedError(f"JetStream log {self._stream}: closed")
            self._fail_writes(self._queued, closed)
            # Wait for the sender to finish the publish it may be in, then for the completer to
            # take the acknowledgements of what was published.
            sender, _completer = self._tasks
            self._wake_sender.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(sender), self._ack_timeout_seconds)
            self._fail_writes(self._queued, closed)
            self._wake_completer.set()
            if self._published:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._drained(), self._ack_timeout_seconds)
            self._fail_writes(self._published, closed)
        self._state = _State.CLOSED
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._disconnect()

    # --- Introspection -------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert the bookkeeping's shape: published records precede queued ones, in order."""
        writes = list(self._published) + list(self._queued)
        published = [write.stream_sequence for write in self._published]
        assert published == list(range(published[0], published[0] + len(published))) if published else True
        assert len(self._published) <= self._publishes_in_flight_max
        data = [write.sequence for write in writes if write.kind is _Kind.DATA]
        assert data == sorted(data)
        assert self._truncated_through <= self._durable_through < self._next_sequence
        if self._state is not _State.OPEN:
            assert not writes

    # --- Initialization ------------------------------------------------------------------------------

    async def _connect(self) -> None:
        async def on_error(error: Exception) -> None:
            _log.debug("JetStream log %s: connection error %r", self._stream, error)

        try:
            self._connection = await nats.connect(
                self._servers,
                connect_timeout=self._request_timeout_seconds,
                max_reconnect_attempts=limits.JETSTREAM_LOG_RECONNECT_ATTEMPTS_MAX,
                reconnect_time_wait=limits.JETSTREAM_LOG_RECONNECT_WAIT_SECONDS,
                error_cb=on_error,
                allow_reconnect=True,
            )
        except (nats.errors.Error, OSError, TimeoutError) as error:
            raise WriteFailedError(f"JetStream log {self._stream}: cannot connect to {self._servers}: "
                                   f"{error!r}") from error
        needed = self._max_write_length_bytes + limits.JETSTREAM_LOG_HEADER_BYTES_MAX
        if self._connection.max_payload < needed:
            raise InvalidArgumentError(
                f"NATS servers {self._servers} accept messages of {self._connection.max_payload} bytes; "
                f"the Tier-1 log needs {needed} (a full record plus headers): set max_payload in their config"
            )
        self._jetstream = self._connection.jetstream(timeout=self._request_timeout_seconds)
        # Our own reply subscription rather than nats-py's publish_async: its reply handler raises
        # instead of failing the future when JetStream refuses a publish (nats-py 2.16,
        # JetStreamContext._handle_async_reply calls APIError.from_error, which raises), so a refused
        # publish -- the very signal of fencing -- would never complete.
        self._reply_prefix = self._connection.new_inbox()
        await self._connection.subscribe(f"{self._reply_prefix}.*", cb=self._on_reply,
                                         pending_msgs_limit=4 * self._publishes_in_flight_max)

    async def _disconnect(self) -> None:
        connection, self._connection, self._jetstream = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), self._request_timeout_seconds)

    async def _ensure_stream(self) -> None:
        """Look the stream up, or create it.  Creating fails until the cluster has a meta leader, so
        it is retried, a bounded number of times."""
        assert self._jetstream is not None
        config = StreamConfig(
            name=self._stream,
            subjects=[f"{self._subject}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=self._replicas,
            max_bytes=self._stream_bytes_max,
            discard=DiscardPolicy.NEW,
            deny_delete=True,
        )
        last_error: BaseException | None = None
        for _attempt in range(limits.JETSTREAM_LOG_STREAM_CREATE_ATTEMPTS_MAX):
            try:
                await self._jetstream.stream_info(self._stream)
                return
            except nats.js.errors.NotFoundError:
                pass
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as error:
                last_error = error
                await asyncio.sleep(limits.JETSTREAM_LOG_RETRY_PAUSE_SECONDS)  # a leader is being elected
                continue
            try:
                await self._jetstream.add_stream(config)
                return
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as error:
                last_error = error  # another owner created it meanwhile, or no meta leader yet
                await asyncio.sleep(limits.JETSTREAM_LOG_RETRY_PAUSE_SECONDS)
        raise WriteFailedError(f"JetStream log {self._stream}: cannot create or find the stream: {last_error!r}")

    async def _fence_once(self) -> str | None:
        """Read the stream, then publish the epoch record conditioned on its last sequence.  None once
        written; JetStream's refusal if another owner wrote in between (the caller tries again)."""
        assert self._jetstream is not None
        info = await self._request(self._jetstream.stream_info(self._stream))
        first, last = info.state.first_seq, info.state.last_seq
        messages = await self._fetch(first, last) if last >= first and info.state.messages else []
        epoch, issued, truncated, records, sequences = self._scan(messages)
        headers = {
            HEADER_EXPECTED_LAST_SEQUENCE: str(last),
            HEADER_KIND: _Kind.EPOCH.value,
            HEADER_EPOCH: str(epoch + 1),
            HEADER_SEQUENCE: str(issued),
            HEADER_TRUNCATED: str(truncated),
        }
        try:
            acknowledgement = await self._request(self._jetstream.publish(
                self._subjects[_Kind.EPOCH], b"", timeout=self._request_timeout_seconds, headers=headers))
        except WriteFailedError as error:
            if _is_wrong_last_sequence(error.__cause__):
                return str(error.__cause__)
            raise
        self._epoch = epoch + 1
        self._last_stream_sequence = acknowledgement.seq
        self._next_sequence = issued + 1
        self._durable_through = issued
        self._truncated_through = truncated
        self._recovered = records
        self._stream_sequences = sequences
        return None

    async def _fetch(self, first: int, last: int) -> list[RawStreamMsg]:
        """Every message from stream sequence ``first`` to ``last``.  Purges leave holes (data purged
        below a truncation point, older control records purged), so each get asks for the next message
        at or after a sequence rather than for that sequence."""
        assert self._jetstream is not None
        messages: list[RawStreamMsg] = []
        sequence = first
        while sequence <= last:
            message = await self._request(self._jetstream.get_msg(
                self._stream, sequence, subject=f"{self._subject}.>", next=True))
            if message.seq is None or message.seq > last:
                break
            messages.append(message)
            sequence = message.seq + 1
        return messages

    def _scan(self, messages: list[RawStreamMsg]) -> tuple[int, int, int, list[LogRecord], dict[int, int]]:
        """(highest epoch, highest data sequence issued, truncated through, live records, their stream
        sequences).  Skips stale writes (see the module docstring); raises ``DataCorruptionError`` for a
        record that is damaged or breaks its owner's sequence."""
        epoch = issued = truncated = 0
        stale = False  # a stale write broke the current epoch's chain: its later records are void
        data: list[tuple[int, int, bytes]] = []  # (data sequence, stream sequence, payload)
        for message in messages:
            headers = message.headers or {}
            where = f"JetStream log {self._stream}: stream sequence {message.seq}"
            try:
                kind = _Kind(headers[HEADER_KIND])
                record_epoch = int(headers[HEADER_EPOCH])
                sequence = int(headers[HEADER_SEQUENCE])
                if kind is _Kind.EPOCH and record_epoch > epoch:
                    # A new owner: it wrote this right after everything it read, so it starts valid.
                    epoch, stale = record_epoch, False
                    issued, truncated = sequence, max(truncated, int(headers[HEADER_TRUNCATED]))
                    del data[next((i for i, (s, _, _) in enumerate(data) if s > issued), len(data)):]
                    continue
                if record_epoch < epoch or stale or (kind is _Kind.EPOCH):
                    stale = True  # an older owner's pipelined publish that landed after the fence
                    continue
                epoch = record_epoch  # the first records of a purged stream may precede any epoch record
                if kind is _Kind.TRUNCATE:
                    truncated = max(truncated, int(headers[HEADER_TRUNCATED]))
                    issued = max(issued, sequence)
                    continue
                payload = message.data or b""
                if zlib.crc32(payload) != int(headers[HEADER_CRC32]):
                    raise DataCorruptionError(f"{where}: record at sequence {sequence} is damaged (CRC)")
                if (data or issued) and sequence != issued + 1:
                    raise DataCorruptionError(f"{where}: record at sequence {sequence} follows {issued}")
                issued = sequence
                data.append((sequence, message.seq or 0, payload))
            except (KeyError, ValueError) as error:
                raise DataCorruptionError(f"{where}: not a millstream record ({error!r})") from error
        records = [LogRecord(LogAddress(sequence, (stream_sequence,)), payload)
                   for sequence, stream_sequence, payload in data if sequence > truncated]
        if [record.address.sequence for record in records] != list(range(truncated + 1, issued + 1)):
            raise DataCorruptionError(
                f"JetStream log {self._stream}: data records {truncated + 1}..{issued} expected above the "
                f"truncation point, found {[record.address.sequence for record in records][:10]}...")
        sequences = {record.address.sequence: record.address.locator[0] for record in records}
        return epoch, issued, truncated, records, sequences

    async def _request(self, awaitable: Awaitable[_T]) -> _T:
        """Await one JetStream request (bounded); NATS and JetStream errors become ``WriteFailedError``
        (with the original as ``__cause__``)."""
        try:
            return await asyncio.wait_for(awaitable, self._request_timeout_seconds * 2)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as error:
            raise WriteFailedError(f"JetStream log {self._stream}: {error!r}") from error

    # --- The pipeline --------------------------------------------------------------------------------

    async def _send(self) -> None:
        """Publish queued records in order, at most ``publishes_in_flight_max`` unacknowledged.  Each
        publish names a reply subject of its own; ``_on_reply`` takes the answer."""
        connection = self._connection
        assert connection is not None
        while self._state is _State.OPEN:
            if not self._queued:
                self._wake_sender.clear()
                await self._wake_sender.wait()
                continue
            if len(self._published) >= self._publishes_in_flight_max:
                self._room.clear()
                await self._room.wait()
                continue
            write = self._queued.popleft()
            write.stream_sequence = self._last_stream_sequence + 1
            headers = {
                HEADER_EXPECTED_LAST_SEQUENCE: str(self._last_stream_sequence),
                HEADER_KIND: write.kind.value,
                HEADER_EPOCH: str(self._epoch),
                HEADER_SEQUENCE: str(write.sequence),
            }
            if write.kind is _Kind.DATA:
                headers[HEADER_CRC32] = str(zlib.crc32(write.data))
            else:
                headers[HEADER_TRUNCATED] = str(write.truncated)
            self._published.append(write)
            self._last_stream_sequence += 1
            write.acknowledgement = asyncio.get_running_loop().create_future()
            try:
                reply = f"{self._reply_prefix}.{write.stream_sequence}"
                await connection.publish(self._subjects[write.kind], write.data, reply=reply, headers=headers)
            except (nats.errors.Error, OSError) as error:
                write.acknowledgement.set_exception(error)
            self._wake_completer.set()

    async def _on_reply(self, message: Msg) -> None:
        """JetStream's answer to one publish (its reply subject ends with the stream sequence it
        expected): an acknowledgement, an API error, or a no-responders status (no stream leader)."""
        try:
            stream_sequence = int(message.subject.rsplit(".", 1)[1])
        except ValueError:
            return
        index = stream_sequence - self._published[0].stream_sequence if self._published else -1
        if not 0 <= index < len(self._published):
            return  # a late answer to a write already failed or completed
        acknowledgement = self._published[index].acknowledgement
        if acknowledgement is None or acknowledgement.done():
            return
        acknowledgement.set_result(_parse_reply(message))
    async def _complete(self) -> None:
        """Take acknowledgements strictly in publish order; the first failure is final."""
        while True:
            if not self._published or self._published[0].acknowledgement is None:
                self._wake_completer.clear()
                await self._wake_completer.wait()
                continue
            write = self._published[0]
            assert write.acknowledgement is not None
            try:
                if write.acknowledgement.done():  # the common case under load: no timer, no extra future
                    reply = write.acknowledgement.result()
                else:
                    reply = await asyncio.wait_for(asyncio.shield(write.acknowledgement), self._ack_timeout_seconds)
            except asyncio.CancelledError:
                raise
            except (nats.errors.Error, OSError, TimeoutError) as error:
                self._on_failure(write, error)
                return
            if isinstance(reply, _Refusal):
                fenced = _is_wrong_last_sequence(reply) and await self._newer_owner_wrote(write.stream_sequence)
                self._on_failure(write, reply, fenced=fenced)
                return
            if reply != (self._stream, write.stream_sequence):
                self._on_failure(write, InternalError(f"acknowledged as {reply}, expected "
                                                      f"{(self._stream, write.stream_sequence)}"))
                return
            self._published.popleft()
            self._room.set()
            if write.kind is _Kind.DATA:
                self._durable_through = write.sequence
                self._stream_sequences[write.sequence] = write.stream_sequence
            if not write.future.done():  # the caller may have cancelled it; the record is durable anyway
                write.future.set_result(LogAddress(write.sequence, (write.stream_sequence,)))
            notify_done(write.on_done, write.future)

    async def _drained(self) -> None:
        while self._published:
            write = self._published[-1]
            if write.future.done():
                return
            await asyncio.wait([write.future])

    async def _newer_owner_wrote(self, stream_sequence: int) -> bool:
        """After a "wrong last sequence" refusal of our publish for ``stream_sequence``: did a newer
        owner write there (we are fenced), or only an older owner's stale publish (we are not, but our
        chain is broken: see the module docstring)?  Reads what lies from there on, at most
        ``JETSTREAM_LOG_REFUSAL_SCAN_MESSAGES_MAX`` messages; more written by others, or a failure
        to read, counts as fenced (the host's coordination has the last word either way)."""
        assert self._jetstream is not None
        try:
            info = await self._request(self._jetstream.stream_info(self._stream))
            last = min(info.state.last_seq, stream_sequence + limits.JETSTREAM_LOG_REFUSAL_SCAN_MESSAGES_MAX - 1)
            for message in await self._fetch(stream_sequence, last):
                if int((message.headers or {}).get(HEADER_EPOCH, "0")) > self._epoch:
                    return True
            return info.state.last_seq > last
        except (DurableDataLogError, ValueError):
            return True

    def _on_failure(self, write: _Write, error: BaseException | _Refusal, *, fenced: bool = False) -> None:
        if self._state is _State.CLOSED:
            failure: DurableDataLogError | ObjectClosedError = ObjectClosedError(
                f"JetStream log {self._stream}: closed before stream sequence {write.stream_sequence} was acknowledged")
        elif fenced:
            failure = DataLogFencedError(
                f"JetStream log {self._stream}: epoch {self._epoch} was fenced by a newer owner "
                f"(stream sequence {write.stream_sequence} refused: wrong last sequence)")
        elif _is_wrong_last_sequence(error):
            failure = WriteFailedError(
                f"JetStream log {self._stream}: stream sequence {write.stream_sequence} was taken by an older "
                f"owner's stale publish; epoch {self._epoch} cannot continue (not written)")
        else:
            failure = WriteFailedError(
                f"JetStream log {self._stream}: stream sequence {write.stream_sequence} failed "
                f"(outcome unknown): {error}")
        failure.__cause__ = error if isinstance(error, BaseException) else None
        if isinstance(failure, DurableDataLogError):
            self._failure = failure
            self._state = _State.FAILED
        self._fail_writes(self._published, failure)
        self._fail_writes(self._queued, failure)
        self._wake_sender.set()
        self._room.set()

    def _fail_writes(self, writes: collections.deque[_Write], failure: BaseException) -> None:
        while writes:
            write = writes.popleft()
            if not write.future.done():
                error = type(failure)(*failure.args)
                error.__cause__ = failure.__cause__
                write.future.set_exception(error)
            notify_done(write.on_done, write.future)

    def _require(self, *states: _State) -> None:
        if self._state in states:
            return
        if self._state is _State.NEW:
            raise InternalError("the JetStream log is used before initialize()")
        if _State.NEW in states:
            if self._state is _State.CLOSED:
                raise ObjectClosedError(f"JetStream log {self._stream}: closed")
            raise InternalError("initialize() may be called only once")
        error = ObjectClosedError(f"JetStream log {self._stream}: {self._state.value}")
        error.__cause__ = self._failure
        raise error


def _is_wrong_last_sequence(error: BaseException | _Refusal | None) -> bool:
    """Whether JetStream refused a publish because the stream's last message is not the one expected."""
    if isinstance(error, _Refusal):
        return error.error_code == WRONG_LAST_SEQUENCE_ERROR_CODE
    return isinstance(error, nats.js.errors.APIError) and error.err_code == WRONG_LAST_SEQUENCE_ERROR_CODE
