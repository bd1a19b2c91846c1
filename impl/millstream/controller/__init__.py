"""The controller: scopes, streams, epochs, scaling (manual and automatic), stream cuts, truncation,
retention, the reader-group registry and stream transactions.

Theory of operation.  The controller runs inside a node next to its segment store
(``millstream.standalone.Node`` hosts it) and reaches the segment containers in process through the
``SegmentStore`` protocol (``_segment_store``).  Clients reach it over the segment store's own
connections: a ``ControllerRequest(request_id, method, body)`` carries a method name and its request
as canonical JSON; ``ControllerRpc`` (``_rpc``) checks the body and calls the ``Controller``
(``_controller``), whose methods return typed values (``millstream.values``: ``StreamDescription``,
``StreamCut``, ``TransactionInfo`` ...); ``_rpc`` encodes each as the JSON object the reply carries
(``ControllerReply``), the wire format the client stub decodes.  The client side is
``millstream.client.ControllerClient`` and the ``StreamManager`` built on it.

Where to read on:

* ``_epochs`` -- key ranges, epochs, a stream's history, successors and predecessors, scale validation;
* ``_cuts`` -- stream cuts: validity, order, size, segments between two cuts, lower bounds;
* ``_state`` -- the metadata as a state machine over records (the stream lifecycle table);
* ``_metadata_log`` -- the records' durable home: a system segment written with conditional appends,
  replayed on start, compacted by snapshots;
* ``_autoscale`` -- moving-average rates and the split/merge decisions;
* ``_retention`` -- where size-, time- and consumption-based retention truncate;
* ``_config`` -- ``ControllerConfig``, the controller's periods and thresholds;
* ``_controller`` -- the workflows (create, scale, seal, truncate, delete), queries and periodic work;
* ``_transactions`` -- stream transactions: records, the lifecycle table, leases, commit order, the
  targets of a commit and a roll's epochs, the fenced multi-commit's decision (pure);
* ``_transaction_workflows`` -- their requests and workflows (begin, ping, commit, abort, the worker,
  lease expiry, the fenced multi-commit), which ``Controller`` inherits;
* ``_rpc`` -- the wire face.

Every decision is a pure function of the state, the rates and the injected time (STYLE.md #1, #2); the
``Controller`` only sequences them with the store and the log.
"""

from millstream.controller._autoscale import (
    AutoScalePlan,
    ScaleSignal,
    SegmentRates,
    Signal,
    fold_sample,
    plan_auto_scale,
    scale_signal,
)
from millstream.controller._config import ControllerConfig
from millstream.controller._controller import (
    READER_GROUP_STATE_PREFIX,
    Controller,
    reader_group_state_segment,
)
from millstream.controller._cuts import (
    Slice,
    cut_size,
    is_at_or_after,
    lower_bound,
    segments_before,
    segments_between,
    validate_cut,
)
from millstream.controller._epochs import (
    EpochRecord,
    SegmentRecord,
    StreamHistory,
    check_cover,
    initial_epoch,
    key_union,
    next_epoch,
    split_range,
    validate_scale,
)
from millstream.controller._metadata_log import METADATA_SEGMENT, MetadataLog, encode_record
from millstream.controller._retention import choose_truncation
from millstream.controller._rpc import METHODS, ControllerRpc, parse_request
from millstream.controller._segment_store import AppendCounts, LocalSegmentStore, SegmentState, SegmentStore
from millstream.controller._state import (
    STREAM_TRANSITIONS,
    ControllerState,
    RecordedCut,
    StreamRecord,
    StreamState,
    thin_recorded_cuts,
)
from millstream.controller._transactions import (
    RECORD_ACTIONS,
    TRANSACTION_LIFECYCLE,
    CommitStep,
    FenceDecision,
    FenceOutcome,
    TransactionRecord,
    TxnStatus,
    commit_target,
    decide_fenced_commit,
    lease_deadline,
    next_transaction_step,
    ping_deadline,
    roll_epochs,
)

__all__ = [
    "METADATA_SEGMENT",
    "METHODS",
    "READER_GROUP_STATE_PREFIX",
    "RECORD_ACTIONS",
    "STREAM_TRANSITIONS",
    "TRANSACTION_LIFECYCLE",
    "AppendCounts",
    "AutoScalePlan",
    "CommitStep",
    "Controller",
    "ControllerConfig",
    "ControllerRpc",
    "ControllerState",
    "EpochRecord",
    "FenceDecision",
    "FenceOutcome",
    "LocalSegmentStore",
    "MetadataLog",
    "RecordedCut",
    "ScaleSignal",
    "SegmentRates",
    "SegmentRecord",
    "SegmentState",
    "SegmentStore",
    "Signal",
    "Slice",
    "StreamHistory",
    "StreamRecord",
    "StreamState",
    "TransactionRecord",
    "TxnStatus",
    "check_cover",
    "choose_truncation",
    "commit_target",
    "cut_size",
    "decide_fenced_commit",
    "encode_record",
    "fold_sample",
    "initial_epoch",
    "is_at_or_after",
    "key_union",
    "lease_deadline",
    "lower_bound",
    "next_epoch",
    "next_transaction_step",
    "parse_request",
    "ping_deadline",
    "plan_auto_scale",
    "reader_group_state_segment",
    "roll_epochs",
    "scale_signal",
    "segments_before",
    "segments_between",
    "split_range",
    "thin_recorded_cuts",
    "validate_cut",
    "validate_scale",
]
