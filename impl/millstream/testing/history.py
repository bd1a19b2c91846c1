"""A Jepsen-style history checker for streams: what was written, what was read, and what went wrong.

Theory of operation.  A fault test records a *history*: every event a writer tried to write (its
writer, routing key, per-writer sequence number, optional stream transaction) and how the attempt
ended -- ``ACKED`` (the store acknowledged it), ``FAILED`` (the store said definitely not written), or
``UNKNOWN`` (the outcome is indeterminate: a timeout, a lost connection, a killed process) -- and
every event a reader saw, grouped into *passes*.  A pass is one consistent reading: a reader group
from its start (or from a checkpoint it was reset to) until it stopped.  Within a pass every event
must be seen at most once; across passes (after a reset or a restart from a checkpoint) the same
event may be seen again.  A pass is *complete* when the reader read to the end of everything written.

``check`` derives the anomalies that the queue workload of Jepsen/Elle checks, for our guarantees:

* **lost** -- acknowledged (or in a committed transaction) but absent from a complete pass;
* **duplicated** -- seen more than once within one pass;
* **phantom** -- seen, but never written (payload garbage or someone else's data);
* **resurrected** -- seen, though its write definitely failed (or its transaction was aborted:
  an *aborted read*);
* **reordered** -- within one pass, two events of the same writer and routing key seen in the
  opposite order to the one they were written in;
* **gap** -- within one pass, events ``i < j`` of a writer and key were seen but an acknowledged
  event between them was not (seen at all, or seen but outside the window ``i..j``): a hole that a
  reader that "polled past" an acknowledged write would leave;
* **partial transaction** -- in a complete pass, some but not all events of a committed transaction;
  in any pass, an event of a transaction whose outcome is still open;
* **reread** -- in a pass that resumed from a checkpoint (``resume``), an event the application had
  processed before that checkpoint: exactly once after a reset means none of those again, and (in a
  complete pass) every other event that must appear.

Reader groups.  A pass is the group's delivery order -- every reader's events in the order the group
handed them out -- from its start, or from the checkpoint it was reset to, until the next reset; so
"reordered" and "gap" are per-routing-key order across the readers and across scaling (a key's events
move to a successor segment, read perhaps by another reader), and "duplicated" is an event handed out
twice between a checkpoint and the next reset.  A reader that crashes loses the events it returned
after its application last persisted its position: the group hands them out again, and ``forget``
takes the lost reads out of the pass so that their second delivery is not a duplicate.

Events carry their identity in their payload (``EventTag``), so a checker needs nothing but bytes
read back.  Unknown-outcome writes may appear or not, but at most once per pass and in order.
"""

from __future__ import annotations

import enum
import itertools
import struct
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from millstream.errors import InvalidArgumentError

__all__ = [
    "CheckReport",
    "EventTag",
    "History",
    "Outcome",
    "TransactionOutcome",
    "check",
]

_TAG_MAGIC: Final = b"MSEV"
_TAG = struct.Struct(">4sH16sQ")  # magic | writer length | writer (padded) | sequence


class Outcome(enum.Enum):
    """What a client learned of one write: acknowledged, failed, or unknown (it may be stored)."""

    ACKED = "acked"
    FAILED = "failed"
    UNKNOWN = "unknown"


class TransactionOutcome(enum.Enum):
    """What a client learned of one stream transaction: still open, committed, aborted, or unknown."""

    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNKNOWN = "unknown"


@attrs.frozen(order=True)
class EventTag:
    """An event's identity, carried at the start of its payload: (writer, sequence number)."""

    writer: str
    sequence: int

    def payload(self, size: int = 0, *, key: str | None = None) -> bytes:
        """A payload of at least ``size`` bytes that ``EventTag.parse`` turns back into this tag."""
        name = self.writer.encode()
        if len(name) > 16:
            raise InvalidArgumentError(f"writer name {self.writer!r} is longer than 16 bytes")
        head = _TAG.pack(_TAG_MAGIC, len(name), name, self.sequence)
        tail = b"" if key is None else b"|" + key.encode()
        body = head + tail
        return body + b"." * max(0, size - len(body))

    @staticmethod
    def parse(payload: bytes) -> EventTag | None:
        """The tag at the start of ``payload``, or None if it carries none (a phantom)."""
        if len(payload) < _TAG.size:
            return None
        magic, length, name, sequence = _TAG.unpack_from(payload)
        if magic != _TAG_MAGIC or length > 16:
            return None
        try:
            return EventTag(name[:length].decode(), sequence)
        except UnicodeDecodeError:
            return None


@attrs.define
class _Write:
    tag: EventTag
    key: str | None
    transaction: str | None
    outcome: Outcome | None = None


@attrs.frozen
class CheckReport:
    """What ``check`` found.  Each list holds the offending tags (or transaction ids), sorted."""

    written: int
    acked: int
    failed: int
    unknown: int
    passes: int
    reads: int
    lost: list[EventTag]
    duplicated: list[EventTag]
    phantom: list[bytes]
    resurrected: list[EventTag]
    reordered: list[tuple[EventTag, EventTag]]
    gaps: list[EventTag]
    partial_transactions: list[str]
    reread: list[EventTag] = attrs.field(factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.phantom or self.resurrected or self.reordered
                    or self.gaps or self.partial_transactions or self.reread)

    def summary(self) -> str:
        return (f"{self.written} written ({self.acked} acked, {self.failed} failed, {self.unknown} unknown), "
                f"{self.reads} read in {self.passes} pass(es): {len(self.lost)} lost, "
                f"{len(self.duplicated)} duplicated, {len(self.phantom)} phantom, "
                f"{len(self.resurrected)} resurrected, {len(self.reordered)} reordered, {len(self.gaps)} gaps, "
                f"{len(self.partial_transactions)} partial transactions, {len(self.reread)} reread after a reset")


class History:
    """The record of one test run.  Not thread-safe: record from one thread (or under a lock)."""

    def __init__(self) -> None:
        self._writes: dict[EventTag, _Write] = {}
        self._transactions: dict[str, TransactionOutcome] = {}
        self._passes: dict[str, list[bytes]] = {}
        self._complete: set[str] = set()
        self._processed: dict[str, frozenset[EventTag]] = {}

    # --- writes --------------------------------------------------------------------------------------

    def write_invoked(self, tag: EventTag, *, key: str | None = None, transaction: str | None = None) -> None:
        """A writer is about to write the event tagged ``tag`` (in ``transaction``, if given)."""
        if tag in self._writes:
            raise InvalidArgumentError(f"{tag} was invoked twice; tags must be unique")
        if transaction is not None:
            self._transactions.setdefault(transaction, TransactionOutcome.OPEN)
        self._writes[tag] = _Write(tag, key, transaction)

    def write_completed(self, tag: EventTag, outcome: Outcome) -> None:
        """How the write of ``tag`` ended.  An ACKED outcome is final; a later UNKNOWN does not undo it."""
        write = self._writes[tag]
        if write.outcome is Outcome.ACKED and outcome is not Outcome.ACKED:
            return
        write.outcome = outcome

    def writes_completed(self, tags: Iterable[EventTag], outcome: Outcome) -> None:
        for tag in tags:
            self.write_completed(tag, outcome)

    def transaction_completed(self, transaction: str, outcome: TransactionOutcome) -> None:
        self._transactions[transaction] = outcome

    # --- reads ---------------------------------------------------------------------------------------

    def read(self, pass_name: str, payload: bytes) -> None:
        """A reader in ``pass_name`` was handed ``payload``."""
        self._passes.setdefault(pass_name, []).append(bytes(payload))

    def read_all(self, pass_name: str, payloads: Iterable[bytes], *, complete: bool = False) -> None:
        for payload in payloads:
            self.read(pass_name, payload)
        self._passes.setdefault(pass_name, [])
        if complete:
            self.pass_complete(pass_name)

    def forget(self, pass_name: str, payload: bytes) -> None:
        """A read of ``pass_name`` was lost with a crashed reader before its application processed
        it: the group hands the event out again, so its next read in the pass is not a duplicate.
        Removes the last read of ``payload`` from the pass; ``InvalidArgumentError`` if there is none."""
        reads = self._passes.get(pass_name, [])
        for index in range(len(reads) - 1, -1, -1):
            if reads[index] == payload:
                del reads[index]
                return
        raise InvalidArgumentError(f"pass {pass_name!r} has no read of {payload[:40]!r} to forget")

    def resume(self, pass_name: str, processed: Iterable[bytes]) -> None:
        """Pass ``pass_name`` starts from a checkpoint (the group was reset to it): ``processed`` are
        the events the application had processed before the checkpoint.  None of them may be read in
        this pass (``reread``), and a complete pass must read every other event that must appear.
        Call it before the pass's first read; ``InvalidArgumentError`` for a payload with no tag."""
        if self._passes.get(pass_name):
            raise InvalidArgumentError(f"pass {pass_name!r} has reads already: resume it before its first read")
        tags = set()
        for payload in processed:
            tag = EventTag.parse(payload)
            if tag is None:
                raise InvalidArgumentError(f"a processed event carries no tag: {payload[:40]!r}")
            tags.add(tag)
        self._passes.setdefault(pass_name, [])
        self._processed[pass_name] = frozenset(tags)

    def pass_complete(self, pass_name: str) -> None:
        """The pass read to the end of everything written: absence now means loss."""
        self._passes.setdefault(pass_name, [])
        self._complete.add(pass_name)

    @property
    def writes(self) -> Sequence[tuple[EventTag, str | None, str | None, Outcome | None]]:
        return [(w.tag, w.key, w.transaction, w.outcome) for w in self._writes.values()]


def check(history: History) -> CheckReport:
    """Every anomaly in ``history`` (see the module docstring)."""
    writes = history._writes
    transactions = history._transactions

    def must_appear(write: _Write) -> bool:
        if write.transaction is not None:
            return transactions.get(write.transaction) is TransactionOutcome.COMMITTED
        return write.outcome is Outcome.ACKED

    def must_not_appear(write: _Write) -> bool:
        if write.transaction is not None:
            return transactions.get(write.transaction) is TransactionOutcome.ABORTED
        return write.outcome is Outcome.FAILED

    lost: set[EventTag] = set()
    duplicated: set[EventTag] = set()
    phantom: list[bytes] = []
    resurrected: set[EventTag] = set()
    reordered: set[tuple[EventTag, EventTag]] = set()
    gaps: set[EventTag] = set()
    partial: set[str] = set()
    reread: set[EventTag] = set()

    # Per (writer, key): the sequence numbers of writes that must appear, in order.
    required: dict[tuple[str, str | None], list[int]] = defaultdict(list)
    for written in writes.values():
        if must_appear(written):
            required[(written.tag.writer, written.key)].append(written.tag.sequence)
    for sequences in required.values():
        sequences.sort()

    reads = 0
    for pass_name, payloads in history._passes.items():
        reads += len(payloads)
        seen: dict[EventTag, int] = {}
        by_stream: dict[tuple[str, str | None], list[int]] = defaultdict(list)
        seen_transactions: dict[str, int] = defaultdict(int)
        processed = history._processed.get(pass_name, frozenset())
        for payload in payloads:
            tag = EventTag.parse(payload)
            write = writes.get(tag) if tag is not None else None
            if tag is None or write is None:
                phantom.append(payload)
                continue
            if tag in seen:
                duplicated.add(tag)
                continue
            seen[tag] = len(seen)
            if tag in processed:
                reread.add(tag)
            if must_not_appear(write):
                resurrected.add(tag)
            if write.transaction is not None:
                seen_transactions[write.transaction] += 1
                if transactions.get(write.transaction) is TransactionOutcome.OPEN:
                    partial.add(write.transaction)
            by_stream[(tag.writer, write.key)].append(tag.sequence)

        for (writer, key), sequences in by_stream.items():
            for earlier, later in itertools.pairwise(sequences):
                if later < earlier:
                    reordered.add((EventTag(writer, earlier), EventTag(writer, later)))
            # Gaps: required writes strictly between the lowest and highest sequence read, not read.
            if sequences:
                low, high = min(sequences), max(sequences)
                read_set = set(sequences)
                for sequence in required.get((writer, key), ()):
                    if low < sequence < high and sequence not in read_set:
                        gaps.add(EventTag(writer, sequence))

        if pass_name in history._complete:
            for write in writes.values():
                if must_appear(write) and write.tag not in seen and write.tag not in processed:
                    lost.add(write.tag)
            counts: dict[str, int] = defaultdict(int)
            for write in writes.values():
                if write.transaction is not None:
                    counts[write.transaction] += 1
            for transaction, outcome in transactions.items():
                got = seen_transactions.get(transaction, 0)
                if outcome is TransactionOutcome.COMMITTED and 0 < got < counts[transaction]:
                    partial.add(transaction)

    outcomes = [w.outcome for w in writes.values()]
    return CheckReport(
        written=len(writes),
        acked=outcomes.count(Outcome.ACKED),
        failed=outcomes.count(Outcome.FAILED),
        unknown=sum(1 for o in outcomes if o is Outcome.UNKNOWN or o is None),
        passes=len(history._passes),
        reads=reads,
        lost=sorted(lost),
        duplicated=sorted(duplicated),
        phantom=sorted(phantom),
        resurrected=sorted(resurrected),
        reordered=sorted(reordered),
        gaps=sorted(gaps - lost),
        partial_transactions=sorted(partial),
        reread=sorted(reread),
    )
