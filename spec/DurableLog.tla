----------------------------- MODULE DurableLog -----------------------------
(***************************************************************************)
(* The write path of one segment container: processing queue, validation   *)
(* against the chain of metadata update transactions, DataFrames, pipelined *)
(* Tier-1 writes with out-of-order completion, in-order commit from the     *)
(* head, and the stop-on-failure rule.                                      *)
(*                                                                         *)
(* Theory of operation.  A client submits an operation; it waits in        *)
(* `queue`.  The OperationProcessor takes the head, validates it against   *)
(* `view` -- the container metadata as every operation processed so far    *)
(* would leave it (committed metadata plus the chain of uncommitted        *)
(* metadata update transactions) -- and either rejects it or gives it the  *)
(* next sequence number and serializes it into the DataFrame being built   *)
(* (`open`).  An operation that does not fit spans frames; a full frame is *)
(* sealed at once and handed to Tier 1 (`pending`); a partly filled frame  *)
(* is sealed whenever the processor chooses (when its queue runs dry).     *)
(* Tier 1 makes frames durable strictly in order (`Persist`), but the      *)
(* completion notices reach the processor in any order (`Complete(k)`).    *)
(* A notice for frame k commits every frame up to k, in order: their       *)
(* operations become visible in `meta` and are acknowledged.  A notice for *)
(* a frame that an earlier notice already covered is ignored.  A Tier-1    *)
(* write failure (or a crash) stops the container: everything not yet      *)
(* acknowledged fails with an unknown outcome and the in-memory state is   *)
(* gone.  `Recover` rebuilds the metadata by replaying the durable log.    *)
(*                                                                         *)
(* A frame's metadata update transaction is the list of operations whose   *)
(* last entry lies in that frame; committing frame k means folding those   *)
(* lists for every frame up to k onto `meta`.                              *)
(*                                                                         *)
(* Sizes are abstract units: a request carries `size`, a frame holds       *)
(* FrameCapacity units and every entry costs EntryHeader units of header.  *)
(* Trace validation instantiates these with the implementation's bytes.    *)
(*                                                                         *)
(* Results hold only within the bounds of the configuration checked.       *)
(***************************************************************************)
EXTENDS Naturals, Integers, Sequences, FiniteSets, TLC

CONSTANTS
    Segments,          \* segment names
    InitiallyActive,   \* segments that exist before the log begins
    Requests,          \* the requests a client may submit (records, see Request)
    MaxOps,            \* bound on submitted operations
    FrameCapacity,     \* units of payload one DataFrame holds
    EntryHeader,       \* units of header each entry costs
    MaxFailures        \* bound on Tier-1 write failures plus crashes

NoOffset == -1
NoSegment == "none"

Kinds == {"create", "append", "seal", "truncate", "merge", "delete", "checkpoint"}

(* A request: `seg` is the target (NoSegment for the container's own metadata *)
(* checkpoint, which every state accepts and which changes no segment); `src`  *)
(* the merge source (else NoSegment);                                          *)
(* `len` the data length of an append; `off` the expected offset of a        *)
(* conditional append (NoOffset for a plain one) or the truncation offset;   *)
(* `size` its serialized size in units.                                      *)
Request == [kind : Kinds, seg : Segments \cup {NoSegment}, src : Segments \cup {NoSegment},
            len : Nat, off : Int, size : Nat \ {0}]

ASSUME Requests \subseteq Request
ASSUME InitiallyActive \subseteq Segments
ASSUME MaxOps \in Nat /\ MaxFailures \in Nat
ASSUME FrameCapacity \in Nat /\ EntryHeader \in Nat /\ FrameCapacity > EntryHeader

VARIABLES
    status,      \* "running" | "stopped"
    queue,       \* operations submitted and not yet processed, in order
    submitted,   \* number of operations submitted (their ids are 1..submitted)
    nextSeq,     \* the next operation sequence number
    open,        \* the DataFrame being built: [entries, used]
    view,        \* metadata through the chain of uncommitted update transactions
    pending,     \* sealed frames handed to Tier 1, not yet durable
    log,         \* durable Tier-1 frames (survive failures and crashes)
    committed,   \* frames of `log` whose operations are visible in `meta`
    unnotified,  \* durable frames whose completion notice is still on its way
    meta,        \* the committed container metadata: what readers see
    results,     \* per operation id: what the client has been told
    failures     \* Tier-1 failures plus crashes so far

vars == <<status, queue, submitted, nextSeq, open, view, pending, log,
          committed, unnotified, meta, results, failures>>

-----------------------------------------------------------------------------
(* Segment metadata and the validation rules.                              *)

(* A segment's data is a sequence of runs: `len` units written by operation `id`. *)
Absent == [state |-> "absent", start |-> 0, data |-> <<>>]
Fresh  == [state |-> "active", start |-> 0, data |-> <<>>]

InitMeta == [s \in Segments |-> IF s \in InitiallyActive THEN Fresh ELSE Absent]

RECURSIVE SumRuns(_)
SumRuns(d) == IF d = <<>> THEN 0 ELSE Head(d).len + SumRuns(Tail(d))

Length(sm) == SumRuns(sm.data)

Exists(sm) == sm.state \in {"active", "sealed"}

MissingError(sm) == IF sm.state = "merged" THEN "merged" ELSE "not_exists"

(* "ok", or the name of the error the operation is rejected with. *)
Validate(m, op) ==
    LET t == m[op.seg] IN
    CASE op.kind = "checkpoint" -> "ok"
      [] op.kind = "create" ->
            IF t.state \in {"absent", "deleted"} THEN "ok"
            ELSE IF t.state = "merged" THEN "merged" ELSE "exists"
      [] op.kind = "append" ->
            IF ~Exists(t) THEN MissingError(t)
            ELSE IF t.state = "sealed" THEN "sealed"
            ELSE IF op.off # NoOffset /\ op.off # Length(t) THEN "bad_offset"
            ELSE "ok"
      [] op.kind = "seal" ->
            IF ~Exists(t) THEN MissingError(t)
            ELSE IF t.state = "sealed" THEN "sealed"
            ELSE "ok"
      [] op.kind = "truncate" ->
            (* Any offset within [start, length] is accepted here: data are abstract  *)
            (* units, not events.  Event boundaries lie below this level: for a       *)
            (* segment that holds events the implementation refuses an offset inside  *)
            (* an event before the operation is submitted (SegmentContainer.truncate, *)
            (* impl/segmentstore/event_boundaries.py), so this rule is unchanged.     *)
            IF ~Exists(t) THEN MissingError(t)
            ELSE IF op.off < t.start \/ op.off > Length(t) THEN "bad_offset"
            ELSE "ok"
      [] op.kind = "delete" ->
            IF ~Exists(t) THEN MissingError(t) ELSE "ok"
      [] op.kind = "merge" ->
            LET s == m[op.src] IN
            IF ~Exists(t) THEN MissingError(t)
            ELSE IF t.state = "sealed" THEN "sealed"
            ELSE IF ~Exists(s) THEN MissingError(s)
            ELSE IF s.state # "sealed" THEN "not_sealed"
            ELSE IF s.start # 0 THEN "truncated"
            ELSE "ok"

(* The offset the processor assigns to a valid operation. *)
AssignedOffset(m, op) ==
    CASE op.kind \in {"append", "seal", "merge"} -> Length(m[op.seg])
      [] op.kind = "truncate" -> op.off
      [] OTHER -> NoOffset

(* The effect of a valid operation. *)
Apply(m, op) ==
    CASE op.kind = "checkpoint" -> m
      [] op.kind = "create" -> [m EXCEPT ![op.seg] = Fresh]
      [] op.kind = "append" ->
            IF op.len = 0 THEN m
            ELSE [m EXCEPT ![op.seg].data = @ \o <<[id |-> op.id, len |-> op.len]>>]
      [] op.kind = "seal" -> [m EXCEPT ![op.seg].state = "sealed"]
      [] op.kind = "truncate" -> [m EXCEPT ![op.seg].start = op.off]
      [] op.kind = "delete" -> [m EXCEPT ![op.seg] = [Absent EXCEPT !.state = "deleted"]]
      [] op.kind = "merge" ->
            [m EXCEPT ![op.seg].data = @ \o m[op.src].data,
                      ![op.src] = [Absent EXCEPT !.state = "merged"]]

RECURSIVE Fold(_, _)
Fold(m, ops) == IF ops = <<>> THEN m ELSE Fold(Apply(m, Head(ops)), Tail(ops))

-----------------------------------------------------------------------------
(* DataFrames.  An entry is one piece of one operation's record.           *)

EmptyFrame == [entries |-> <<>>, used |-> 0]

Min(a, b) == IF a < b THEN a ELSE b

(* A frame can take another entry while it has room for a header and one unit. *)
HasRoom(used) == FrameCapacity - used >= EntryHeader + 1

(* Serialize `sop` (`remaining` units still to place) starting in `frame`.  *)
(* Returns the frames that filled up (sealed, in order) and the open frame. *)
RECURSIVE Pack(_, _, _, _)
Pack(frame, sop, remaining, first) ==
    LET k    == Min(remaining, FrameCapacity - frame.used - EntryHeader)
        last == k = remaining
        f    == [entries |-> Append(frame.entries,
                                    [op |-> sop, first |-> first, last |-> last]),
                 used |-> frame.used + EntryHeader + k]
    IN IF ~last
         THEN LET rest == Pack(EmptyFrame, sop, remaining - k, FALSE)
              IN [sealed |-> <<f.entries>> \o rest.sealed, open |-> rest.open]
       ELSE IF HasRoom(f.used)
         THEN [sealed |-> <<>>, open |-> f]
         ELSE [sealed |-> <<f.entries>>, open |-> EmptyFrame]

RECURSIVE Flatten(_)
Flatten(fs) == IF fs = <<>> THEN <<>> ELSE Head(fs) \o Flatten(Tail(fs))

(* The operations whose record ends in the given entries, in order. *)
EndingIn(es) == LET lasts == SelectSeq(es, LAMBDA e : e.last)
                IN [i \in 1..Len(lasts) |-> lasts[i].op]

OpsOf(fs) == EndingIn(Flatten(fs))

Frames(lo, hi) == SubSeq(log, lo, hi)

(* Every entry holds at least one unit, so no run writes more frames than this. *)
MaxSize == CHOOSE n \in {r.size : r \in Requests} : \A r \in Requests : r.size <= n
FrameNumbers == 1..(MaxOps * MaxSize)

(* Recovery: fold every operation whose record is complete in the log. *)
Replay(l) == Fold(InitMeta, OpsOf(l))

RECURSIVE MaxSeqOf(_)
MaxSeqOf(es) == IF es = <<>> THEN 0
                ELSE LET r == MaxSeqOf(Tail(es)) IN
                     IF Head(es).op.seq > r THEN Head(es).op.seq ELSE r

-----------------------------------------------------------------------------
(* Results the client sees. *)

NoResult      == [r |-> "none",     err |-> "ok", at |-> NoOffset]
PendingResult == [r |-> "pending",  err |-> "ok", at |-> NoOffset]
FailedResult  == [r |-> "failed",   err |-> "unavailable", at |-> NoOffset]
Rejected(e)   == [r |-> "rejected", err |-> e, at |-> NoOffset]
Acked(o)      == [r |-> "acked",    err |-> "ok", at |-> o]

-----------------------------------------------------------------------------
(* Actions. *)

Init ==
    /\ status = "running"
    /\ queue = <<>>
    /\ submitted = 0
    /\ nextSeq = 1
    /\ open = EmptyFrame
    /\ view = InitMeta
    /\ pending = <<>>
    /\ log = <<>>
    /\ committed = 0
    /\ unnotified = {}
    /\ meta = InitMeta
    /\ results = [i \in 1..MaxOps |-> NoResult]
    /\ failures = 0

(* A client hands the container a request. *)
Submit(r) ==
    /\ status = "running"
    /\ submitted < MaxOps
    /\ submitted' = submitted + 1
    /\ queue' = Append(queue, [kind |-> r.kind, seg |-> r.seg, src |-> r.src,
                               len |-> r.len, off |-> r.off, size |-> r.size,
                               id |-> submitted + 1, seq |-> 0, at |-> NoOffset])
    /\ results' = [results EXCEPT ![submitted + 1] = PendingResult]
    /\ UNCHANGED <<status, nextSeq, open, view, pending, log, committed,
                   unnotified, meta, failures>>

(* The OperationProcessor validates the head of the queue against the chain *)
(* and either rejects it or serializes it, sealing every frame it fills.    *)
Process ==
    /\ status = "running"
    /\ queue # <<>>
    /\ LET op  == Head(queue)
           err == Validate(view, op)
       IN IF err # "ok"
          THEN /\ results' = [results EXCEPT ![op.id] = Rejected(err)]
               /\ UNCHANGED <<nextSeq, open, view, pending>>
          ELSE LET sop == [op EXCEPT !.seq = nextSeq, !.at = AssignedOffset(view, op)]
                   p   == Pack(open, sop, op.size, TRUE)
               IN /\ pending' = pending \o p.sealed
                  /\ open' = p.open
                  /\ view' = Apply(view, sop)
                  /\ nextSeq' = nextSeq + 1
                  /\ UNCHANGED results
    /\ queue' = Tail(queue)
    /\ UNCHANGED <<status, submitted, log, committed, unnotified, meta, failures>>

(* The processor seals a partly filled frame and hands it to Tier 1. *)
SealFrame ==
    /\ status = "running"
    /\ open.entries # <<>>
    /\ pending' = Append(pending, open.entries)
    /\ open' = EmptyFrame
    /\ UNCHANGED <<status, queue, submitted, nextSeq, view, log, committed,
                   unnotified, meta, results, failures>>

(* Tier 1 makes the oldest in-flight frame durable. *)
Persist ==
    /\ status = "running"
    /\ pending # <<>>
    /\ log' = Append(log, Head(pending))
    /\ pending' = Tail(pending)
    /\ unnotified' = unnotified \cup {Len(log) + 1}
    /\ UNCHANGED <<status, queue, submitted, nextSeq, open, view, committed,
                   meta, results, failures>>

(* The completion notice for durable frame k arrives.  It commits every     *)
(* frame up to k from the head, in order; a notice already covered by a     *)
(* later frame's notice is ignored.                                         *)
Complete(k) ==
    /\ status = "running"
    /\ k \in unnotified
    /\ unnotified' = unnotified \ {k}
    /\ IF k > committed
       THEN LET done == OpsOf(Frames(committed + 1, k))
                ids  == {done[i].id : i \in 1..Len(done)}
                at(i) == (CHOOSE j \in 1..Len(done) : done[j].id = i)
            IN /\ meta' = Fold(meta, done)
               /\ committed' = k
               /\ results' = [i \in 1..MaxOps |->
                                IF i \in ids THEN Acked(done[at(i)].at)
                                ELSE results[i]]
       ELSE UNCHANGED <<meta, committed, results>>
    /\ UNCHANGED <<status, queue, submitted, nextSeq, open, view, pending, log,
                   failures>>

(* Stopping: every operation not yet acknowledged fails with an unknown     *)
(* outcome; memory (queue, open frame, chain) is lost; the log remains.     *)
Stop ==
    /\ status' = "stopped"
    /\ failures' = failures + 1
    /\ results' = [i \in 1..MaxOps |->
                     IF results[i].r = "pending" THEN FailedResult ELSE results[i]]
    /\ queue' = <<>>
    /\ open' = EmptyFrame
    /\ pending' = <<>>
    /\ unnotified' = {}
    /\ view' = meta
    /\ UNCHANGED <<submitted, nextSeq, log, committed, meta>>

(* A write is outstanding: a frame is in flight, or durable without its notice.  *)
(* Written as arithmetic rather than a disjunction: TLC turns each true disjunct  *)
(* of an action into its own successor, and the model's counts must match TLC's. *)
WriteOutstanding == Len(pending) + Cardinality({k \in unnotified : k > committed}) > 0

(* A Tier-1 write fails: a frame in flight is not durable, or a durable     *)
(* frame's notice reports failure (unknown outcome).  The container stops.  *)
FailWrite ==
    /\ status = "running"
    /\ failures < MaxFailures
    /\ WriteOutstanding
    /\ Stop

(* The process dies: whatever Tier 1 has not made durable is gone. *)
Crash ==
    /\ status = "running"
    /\ failures < MaxFailures
    /\ Stop

(* A stopped container restarts by replaying the durable log. *)
Recover ==
    /\ status = "stopped"
    /\ status' = "running"
    /\ meta' = Replay(log)
    /\ view' = meta'
    /\ committed' = Len(log)
    /\ nextSeq' = MaxSeqOf(Flatten(log)) + 1
    /\ UNCHANGED <<queue, submitted, open, pending, log, unnotified, results,
                   failures>>

Next ==
    \/ \E r \in Requests : Submit(r)
    \/ Process
    \/ SealFrame
    \/ Persist
    \/ \E k \in FrameNumbers : Complete(k)
    \/ FailWrite
    \/ Crash
    \/ Recover

Fairness ==
    /\ WF_vars(Process)
    /\ WF_vars(SealFrame)
    /\ WF_vars(Persist)
    /\ WF_vars(\E k \in FrameNumbers : Complete(k))
    /\ WF_vars(Recover)

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* Invariants. *)

TypeOK ==
    /\ status \in {"running", "stopped"}
    /\ submitted \in 0..MaxOps
    /\ committed \in 0..Len(log)
    /\ unnotified \subseteq 1..Len(log)
    /\ failures \in 0..MaxFailures
    /\ HasRoom(open.used)

(* Only durable frames are ever committed. *)
NothingVisibleBeforeDurable ==
    /\ committed <= Len(log)
    /\ \A k \in unnotified : k <= Len(log)

(* What readers see is exactly the committed prefix of the log, folded. *)
VisibleIsFoldOfCommitted ==
    status = "running" => meta = Fold(InitMeta, OpsOf(Frames(1, committed)))

(* Validation sees the committed metadata plus every uncommitted transaction. *)
ViewIsChain ==
    status = "running" =>
        view = Fold(meta, OpsOf(Frames(committed + 1, Len(log)) \o pending
                                \o <<open.entries>>))

(* Sequence numbers strictly increase along the log and are never reused,  *)
(* not even those of a record that a crash cut short.                      *)
SequenceNumbersIncrease ==
    LET es == Flatten(log \o pending \o <<open.entries>>) IN
    /\ \A i \in 1..Len(es) : es[i].op.seq < nextSeq
    /\ \A i \in 1..(Len(es) - 1) :
          IF es[i + 1].first THEN es[i + 1].op.seq > es[i].op.seq
          ELSE es[i + 1].op = es[i].op

(* Every operation in the log is valid where it stands, so replay succeeds *)
(* and assigns the offsets that were acknowledged.                          *)
LogReplaysCleanly ==
    LET ops == OpsOf(log) IN
    \A i \in 1..Len(ops) :
        LET before == Fold(InitMeta, SubSeq(ops, 1, i - 1)) IN
        /\ Validate(before, ops[i]) = "ok"
        /\ AssignedOffset(before, ops[i]) = ops[i].at

(* Every acknowledged operation is in the committed log, at the offset the *)
(* client was given; nothing committed was rejected or left unanswered.    *)
AckedAreDurable ==
    LET ops == OpsOf(Frames(1, committed)) IN
    /\ \A i \in 1..MaxOps : results[i].r = "acked" =>
          \E j \in 1..Len(ops) : ops[j].id = i /\ ops[j].at = results[i].at
    /\ \A j \in 1..Len(ops) : results[ops[j].id].r \in {"acked", "failed"}

RECURSIVE RunAt(_, _)
RunAt(d, o) == IF d = <<>> THEN [id |-> 0, len |-> 0]
               ELSE IF o = 0 THEN Head(d)
               ELSE IF o < Head(d).len THEN [id |-> 0, len |-> 0]
               ELSE RunAt(Tail(d), o - Head(d).len)

(* A segment's start (what truncation removed below) never passes its     *)
(* length, in what readers see and in what validation sees.                *)
StartWithinLength ==
    \A s \in Segments :
        /\ meta[s].start <= Length(meta[s])
        /\ view[s].start <= Length(view[s])

(* Every acknowledged append's bytes are readable at the acknowledged     *)
(* offset, for as long as its segment is neither deleted nor merged away,  *)
(* and readable relative to the start: at or after the segment's start,   *)
(* unless a truncation the client asked for, at an offset beyond the       *)
(* append's, came later.                                                   *)
AckedAppendsReadable ==
    LET ops == OpsOf(Frames(1, committed)) IN
    \A j \in 1..Len(ops) :
        LET o == ops[j] IN
        (/\ o.kind = "append" /\ o.len > 0
         /\ results[o.id].r = "acked"
         /\ ~\E l \in (j + 1)..Len(ops) :
               \/ ops[l].kind \in {"delete", "create"} /\ ops[l].seg = o.seg
               \/ ops[l].kind = "merge" /\ ops[l].src = o.seg)
        => /\ RunAt(meta[o.seg].data, o.at) = [id |-> o.id, len |-> o.len]
           /\ \/ meta[o.seg].start <= o.at
              \/ \E l \in (j + 1)..Len(ops) : ops[l].kind = "truncate" /\ ops[l].seg = o.seg /\ ops[l].off > o.at

-----------------------------------------------------------------------------
(* Liveness: every operation submitted is eventually answered. *)

EveryOperationAnswered ==
    \A i \in 1..MaxOps : results[i].r = "pending" ~> results[i].r # "pending"

=============================================================================
