"""Events the source cannot decode, written to the stream the query named (``deadLetterStream``).

Theory of operation.  Without the option, an event the serializer cannot decode (not UTF-8, not
JSON, a field that does not fit the schema) fails its task with a ``SchemaMismatchError`` naming its
stream, segment and offset: Spark fails the query and nothing is skipped.  With it, the decoder
hands the event over as a ``DeadLetter`` instead and the batch goes on without it; the task writes
each one, as a JSON document (``envelope``: the position, the reason and the bytes in base64),
into one store transaction of the dead-letter stream, routed by its source segment (so a segment's
dead letters keep their order), and commits that transaction once it has read its whole range.

Exactly once, per range.  A micro-batch's task reads one segment range, and Spark re-reads exactly
that range when it retries the task or re-runs the batch after a crash.  So the commit is the fenced
multi-commit, keyed by the query and the source segment (``fence_key``) with the range's end offset
as the value: a range's end only grows from one batch to the next, and a second commit of the same
range finds its value recorded and commits nothing (its transaction is aborted).  Dead letters
therefore appear once each, and only after their range was read to its end (a task stopped early
aborts its transaction).  ``spark.read`` (a batch read) has no query id to fence by: a task retry
there may write a range's dead letters again -- each carries its position, so a reader can tell.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import Sequence

from millstream.client import CommitOutcome, Transaction, TransactionalEventStreamWriter
from millstream.spark._decoding import DeadLetter
from millstream.spark._store import StoreSession

__all__ = ["DeadLetterWriter", "envelope", "fence_key"]

_log = logging.getLogger("millstream.spark")


def envelope(letter: DeadLetter) -> bytes:
    """The event written for ``letter``: a JSON object with its position, the reason and its bytes."""
    return json.dumps({"stream": letter.stream, "segment": letter.segment_id, "offset": letter.offset,
                       "reason": letter.reason, "payload_base64": base64.b64encode(letter.payload).decode("ascii")},
                      separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def fence_key(query_id: str, stream: str, segment_id: int) -> str:
    """The fence of a query's dead letters from one source segment (the stream's name hashed, so a
    key stays short: a query may read several streams into one dead-letter stream)."""
    digest = hashlib.blake2b(stream.encode("utf-8"), digest_size=8).hexdigest()
    return f"spark-dead-letters/{query_id}/{digest}/{segment_id}"


class DeadLetterWriter:
    """The dead letters of one task's range: written as they come, committed at the range's end."""

    def __init__(self, session: StoreSession, stream: str, *, fence: tuple[str, int] | None,
                 lease_seconds: float) -> None:
        self._session = session
        self._stream = stream
        self._fence = fence
        self._lease_seconds = lease_seconds
        self._writer: TransactionalEventStreamWriter[bytes] | None = None
        self._txn: Transaction[bytes] | None = None
        self.written = 0

    def add(self, letters: Sequence[DeadLetter]) -> None:
        for letter in letters:
            if self._txn is None:
                self._writer = self._session.client.transactional_writer(self._stream,
                                                                         lease_seconds=self._lease_seconds)
                self._txn = self._writer.begin()
            assert self._txn is not None
            self._txn.write_event(envelope(letter), routing_key=f"{letter.stream}/{letter.segment_id}")
            self.written += 1

    def commit(self) -> None:
        """Commit what was written (nothing if nothing was), once per range (see the module docstring)."""
        if self._txn is None:
            return
        try:
            self._txn.flush()
            result = self._session.client.commit_transactions(self._stream, [self._txn.txn_id], fence=self._fence)
            if result.outcome is CommitOutcome.ALREADY_COMMITTED:
                _log.info("the dead letters of this range were written to %s before (fence %s): not again",
                          self._stream, self._fence)
        finally:
            self._close()

    def abort(self) -> None:
        if self._txn is not None:
            try:
                self._txn.abort()
            except Exception:  # its lease expires it; the task's own error is the one to report
                _log.warning("could not abort the dead-letter transaction %s", self._txn.txn_id, exc_info=True)
        self._close()

    def _close(self) -> None:
        writer, self._writer, self._txn = self._writer, None, None
        if writer is not None:
            writer.close()
