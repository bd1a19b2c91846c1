"""Every error class that crosses the wire comes back as the same class."""

from __future__ import annotations

import pytest

from millstream.errors import InternalError, StorageFullError, StreamSegmentMergedError, WrongHostError
from millstream.wire.error_codes import ERROR_CODES, UNKNOWN_ERROR_CODE, error_code_of, error_from_code


@pytest.mark.parametrize("cls", list(ERROR_CODES.values()), ids=lambda c: c.__name__)
def test_round_trip_keeps_the_class_and_message(cls: type[Exception]) -> None:
    error = error_from_code(error_code_of(cls("boom")), "boom")
    assert type(error) is cls
    assert str(error) == "boom"


def test_the_most_specific_class_wins() -> None:
    # StreamSegmentMergedError is also a StreamSegmentNotExistsError; StorageFullError also retryable.
    assert type(error_from_code(error_code_of(StreamSegmentMergedError("m")), "m")) is StreamSegmentMergedError
    assert type(error_from_code(error_code_of(StorageFullError("f")), "f")) is StorageFullError


def test_unclassified_errors_become_internal_errors() -> None:
    assert error_code_of(KeyError("x")) == UNKNOWN_ERROR_CODE
    assert isinstance(error_from_code(UNKNOWN_ERROR_CODE, "x"), InternalError)
    assert isinstance(error_from_code(9999, "from a newer server"), InternalError)
    # Errors with commands of their own (WrongHost) are a RetryableError here only by inheritance.
    assert ERROR_CODES[error_code_of(WrongHostError("w"))].__name__ == "RetryableError"
