"""``controller._transactions``' checks where the controller's mutation sample (seed 2611, run whole in
round 5) found a boundary unpinned."""

from __future__ import annotations

import pytest

from millstream import limits
from millstream.controller._transactions import check_fence
from millstream.errors import FenceValueError


def test_a_fence_key_of_exactly_the_longest_length_is_valid_and_one_more_is_refused() -> None:
    """A key of ``FENCE_KEY_LENGTH_MAX`` characters is a valid fence key; one more character is refused.
    Kills ``len(key) > FENCE_KEY_LENGTH_MAX`` -> ``>=`` in ``check_fence`` (the longest valid key was
    refused as too long)."""
    longest = "k" * limits.FENCE_KEY_LENGTH_MAX
    assert check_fence((longest, 7)) == (longest, 7)
    with pytest.raises(FenceValueError, match="at most"):
        check_fence((longest + "k", 7))
