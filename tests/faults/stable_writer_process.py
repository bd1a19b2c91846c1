"""The application half of the writer-restart kill campaign: a process that replays a source into a
stream through a writer with a stable writer id, until it is killed or done.

Run from the repository root (``PYTHONPATH`` must reach it)::

    python -m tests.faults.stable_writer_process URI STREAM JOURNAL --resume-after R --events N

The source is deterministic: offset ``n`` (1-based) is the event tagged ``EventTag(WRITER_ID, n)``
with routing key ``source_key(n)`` -- what a replayable log (a Kafka partition, a file) gives.  The
process writes offsets ``R + 1 .. N`` with ``sequence=n`` through
``event_writer(STREAM, writer_id=WRITER_ID)``, flushing every ``FLUSH_EVERY`` events and at the end.
After each flush it journals the offset up to which the source is committed (everything before it
durable) -- the offset the application may resume after -- and how many events were dropped as
duplicates so far.

Journal lines (one ``os.write`` each on an ``O_APPEND`` descriptor, so a SIGKILL never leaves one
claiming more than happened; the test drops an unterminated last line)::

    READY I                  the writer learnt the stream (its floors)
    C I OFFSET DUPLICATES    flushed: every offset up to OFFSET is durable
    DONE I OFFSET DUPLICATES all written and flushed
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib
from pathlib import Path

import millstream as ms
from millstream.testing.history import EventTag

WRITER_ID = "ingest-7"
KEYS = 16
PAYLOAD_BYTES = 64
FLUSH_EVERY = 50


def source_key(offset: int) -> str:
    """The routing key of source offset ``offset`` (a pure function: a replay finds the same)."""
    return f"key-{zlib.crc32(offset.to_bytes(8, 'big')) % KEYS}"


def source_event(offset: int) -> bytes:
    return EventTag(WRITER_ID, offset).payload(PAYLOAD_BYTES, key=source_key(offset))


class Journal:
    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def line(self, *fields: object) -> None:
        os.write(self._fd, (" ".join(str(f) for f in fields) + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("uri")
    parser.add_argument("stream")
    parser.add_argument("journal", type=Path)
    parser.add_argument("--incarnation", type=int, required=True)
    parser.add_argument("--resume-after", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    arguments = parser.parse_args(argv)
    journal = Journal(arguments.journal)
    incarnation = arguments.incarnation
    with ms.connect(arguments.uri) as client:
        writer = client.event_writer(arguments.stream, writer_id=WRITER_ID)
        journal.line("READY", incarnation)
        for offset in range(arguments.resume_after + 1, arguments.events + 1):
            writer.write_event(source_event(offset), routing_key=source_key(offset), sequence=offset)
            if offset % FLUSH_EVERY == 0:
                writer.flush()
                journal.line("C", incarnation, offset, writer.duplicates)
        writer.flush()
        journal.line("DONE", incarnation, arguments.events, writer.duplicates)
        writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
