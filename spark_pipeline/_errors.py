"""The errors of the ``millstream`` data source, beside the store's own (``millstream.errors``).

Each subclasses the store error it resembles, so ``except InvalidArgumentError`` still catches a bad
option.  The data source also raises store errors unchanged where they say it already:
``TruncatedDataError`` for data retention deleted before the query read it (never skipped),
``InvalidStreamCutError`` for an offset of another stream, ``StreamNotFoundError``,
``TransactionNotOpenError`` when a sink transaction's lease lapsed before the driver committed it.
"""

from __future__ import annotations

from millstream.errors import CallerError, InvalidArgumentError

__all__ = ["FenceAheadError", "OptionError", "SchemaMismatchError"]


class OptionError(InvalidArgumentError):
    """An option of the ``millstream`` data source is missing or malformed (the message names it,
    and ``option`` holds its name).  Raised when the DataFrame is loaded or the query starts, before
    anything is read or written."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"option {option!r}: {message}")
        self.option = option

    def __reduce__(self) -> tuple[type[OptionError], tuple[str, str]]:
        # Spark ships exceptions between processes by pickling them; keep both arguments.
        return (type(self), (self.option, str(self).split(": ", 1)[1]))


class SchemaMismatchError(InvalidArgumentError):
    """An event does not fit the schema the query reads with (option ``schema`` with
    ``serializer=json``), or a DataFrame written to the sink lacks the columns its ``serializer``
    needs.  The message names the option, and for an event its stream, segment and offset.  Nothing
    of the task's partition was returned (the task fails; Spark fails the query)."""


class FenceAheadError(CallerError):
    """The output stream's fence records a later batch of this query than the one Spark asks the sink
    to commit.  Spark only ever re-runs the last batch of its offset log, so the query's checkpoint
    is older than its output: it was restored from a copy, or two queries share one checkpoint.
    Nothing was committed (the batch's transactions were aborted); start the query with a checkpoint
    that agrees with the output, or with a new one (a new query id, a new fence)."""
