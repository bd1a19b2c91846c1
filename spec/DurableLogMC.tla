---------------------------- MODULE DurableLogMC ----------------------------
(* Request sets for the model-checking configurations of DurableLog.        *)
EXTENDS DurableLog

Req(kind, seg, src, len, off, size) ==
    [kind |-> kind, seg |-> seg, src |-> src, len |-> len, off |-> off, size |-> size]

(* One segment: plain and conditional appends racing a seal. *)
AppendSealRequests ==
    { Req("append", "a", NoSegment, 1, NoOffset, 1),
      Req("append", "a", NoSegment, 1, 0, 1),
      Req("seal", "a", NoSegment, 0, NoOffset, 1) }

(* Records spanning frames, interleaved with the container's own metadata checkpoints. *)
CheckpointRequests ==
    { Req("append", "a", NoSegment, 2, NoOffset, 3),
      Req("checkpoint", NoSegment, NoSegment, 0, NoOffset, 1) }

(* Records that span DataFrames: a 3-unit append into 2-unit frames. *)
SpanningRequests ==
    { Req("append", "a", NoSegment, 2, NoOffset, 3),
      Req("append", "a", NoSegment, 1, NoOffset, 1) }

(* Truncation of a segment that appends grow: at an offset it has, and beyond its length. *)
TruncateRequests ==
    { Req("append", "a", NoSegment, 1, NoOffset, 1),
      Req("truncate", "a", NoSegment, 0, 1, 1),
      Req("truncate", "a", NoSegment, 0, 2, 1) }

(* Two segments: create, seal, merge, truncate, delete. *)
LifecycleRequests ==
    { Req("create", "b", NoSegment, 0, NoOffset, 1),
      Req("append", "b", NoSegment, 1, NoOffset, 1),
      Req("seal", "b", NoSegment, 0, NoOffset, 1),
      Req("merge", "a", "b", 0, NoOffset, 1),
      Req("truncate", "a", NoSegment, 0, 1, 1),
      Req("delete", "b", NoSegment, 0, NoOffset, 1) }
=============================================================================
