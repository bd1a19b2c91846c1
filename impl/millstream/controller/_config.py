"""``ControllerConfig``: the controller's periods and thresholds.

It lives apart from ``_controller`` because the parts ``Controller`` is built from read it too
(``_transaction_workflows`` names it): below them all, it imports none of them.
"""

from __future__ import annotations

from typing import Any

import attrs

from millstream import limits
from millstream.controller._metadata_log import METADATA_SEGMENT
from millstream.errors import InvalidArgumentError

__all__ = ["ControllerConfig"]


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgumentError(f"{attribute.name} must be a positive number, not {value!r}")


@attrs.frozen(kw_only=True)
class ControllerConfig:
    """The controller's periods and thresholds (defaults and reasons in ``millstream.limits``).
    ``periodic=False`` runs no background loop: the owner calls ``tick`` (tests on a manual clock).
    ``transaction_workflows=False`` runs no step of a stream transaction's workflows by itself (no
    worker, no lease expiry on ``tick``, no commit resumed on ``start``): the owner calls the steps
    (``start_commit``, ``merge_transaction_segment``, ``finish_commit``, ``finish_abort``,
    ``expire_leases``, ``drive_transactions``) -- the stateful test against the model does."""

    tick_seconds: float = attrs.field(default=limits.CONTROLLER_TICK_SECONDS, validator=_positive)
    tail_cut_interval_seconds: float = attrs.field(default=limits.CONTROLLER_TAIL_CUT_INTERVAL_SECONDS,
                                                   validator=_positive)
    auto_scale_cooldown_seconds: float = attrs.field(default=limits.AUTO_SCALE_COOLDOWN_SECONDS,
                                                     validator=_positive)
    auto_scale_mute_seconds: float = attrs.field(default=limits.AUTO_SCALE_MUTE_SECONDS, validator=_positive)
    snapshot_records: int = attrs.field(default=limits.CONTROLLER_SNAPSHOT_RECORDS, validator=_positive)
    snapshot_bytes: int = attrs.field(default=limits.CONTROLLER_SNAPSHOT_BYTES, validator=_positive)
    stream_lock_wait_seconds: float = attrs.field(default=limits.CONTROLLER_STREAM_LOCK_WAIT_SECONDS,
                                                  validator=_positive)
    metadata_segment: str = METADATA_SEGMENT
    periodic: bool = True
    transaction_workflows: bool = True
