-------------------------- MODULE ContainerFailover --------------------------
(***************************************************************************)
(* Container failover across the two storage tiers: owners and epochs,     *)
(* fencing of the Tier-1 log, Tier-2 chunks named by epoch, flushing,      *)
(* metadata checkpoints, log truncation, and recovery by replay.           *)
(*                                                                         *)
(* Theory of operation.  Would-be owners compete for one container.  An    *)
(* owner starts by bumping the log's epoch (which fences every older       *)
(* owner: its next log write fails and it stops) and recovering: the       *)
(* container's metadata is the fold of the log from its first record (a    *)
(* checkpoint once the log was truncated), and the segment's bytes are the *)
(* LTS chunks the metadata names, up to the storage length, followed by    *)
(* the appends the log still holds.  A serving owner appends (one log     *)
(* record each), flushes -- it writes the bytes beyond the storage length  *)
(* into its own chunk, then commits the new layout with a log record --    *)
(* writes checkpoints, and truncates the log at a checkpoint once every    *)
(* byte before it is in LTS.                                               *)
(*                                                                         *)
(* An owner learns it was fenced only when a log write fails; until then   *)
(* it may keep writing bytes into its chunk.  That is harmless because the *)
(* layout lives in the log (a fenced owner cannot commit it), and because  *)
(* an owner never writes into a chunk another epoch created: a new owner   *)
(* always starts its own chunk, named by its epoch.  A new owner may,      *)
(* before its first chunk write, *adopt* units an older owner wrote but    *)
(* never recorded: a prefix of them verified equal to its unflushed units, *)
(* recorded by a flush naming the older chunk -- a log write, so fenced.   *)
(*                                                                         *)
(* One segment; every append is one unit, labelled with its id.  Each      *)
(* action is atomic, so a crash may fall between any two of them.  Results *)
(* hold only within the bounds of the configuration checked.               *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS
    Owners,           \* would-be owners of the container
    MaxAppends,       \* bound on appends
    MaxEpoch,         \* bound on takeovers of a container that has a serving owner
    MaxCrashes,       \* bound on crashes
    MaxCheckpoints    \* bound on metadata checkpoints

ASSUME MaxAppends \in Nat /\ MaxEpoch \in Nat /\ MaxCrashes \in Nat /\ MaxCheckpoints \in Nat

VARIABLES
    logEpoch,     \* the epoch recorded with the Tier-1 log: only its owner may write
    log,          \* the Tier-1 log: records not yet truncated, in order
    chunks,       \* Tier 2: epoch -> the units its chunk holds (created on first write)
    own,          \* owner -> what it holds in memory
    history,      \* ghost: the id of every append ever made durable, in order
    crashes,      \* crashes so far
    checkpoints   \* checkpoints written so far

vars == <<logEpoch, log, chunks, own, history, crashes, checkpoints>>

-----------------------------------------------------------------------------
(* Records, layouts and recovery. *)

(* A layout is a sequence of [chunk |-> epoch, len |-> units counted from the chunk's start]. *)
NoRecord == [kind |-> "none", epoch |-> 0, id |-> 0, off |-> 0, length |-> 0, storage |-> 0, layout |-> <<>>]

AppendRecord(e, i, o) == [NoRecord EXCEPT !.kind = "append", !.epoch = e, !.id = i, !.off = o]
FlushRecord(e, l, s) == [NoRecord EXCEPT !.kind = "flush", !.epoch = e, !.layout = l, !.storage = s]
CheckpointRecord(e, n, s, l) ==
    [NoRecord EXCEPT !.kind = "checkpoint", !.epoch = e, !.length = n, !.storage = s, !.layout = l]

(* Container metadata: the segment's length, the storage length, the layout. *)
EmptyMeta == [length |-> 0, storage |-> 0, layout |-> <<>>]

ApplyRecord(m, r) ==
    CASE r.kind = "append" -> [m EXCEPT !.length = r.off]
      [] r.kind = "flush" -> [m EXCEPT !.storage = r.storage, !.layout = r.layout]
      [] r.kind = "checkpoint" -> m

RECURSIVE FoldRecords(_, _)
FoldRecords(m, rs) == IF rs = <<>> THEN m ELSE FoldRecords(ApplyRecord(m, Head(rs)), Tail(rs))

(* The metadata a recovering owner rebuilds: from the first record, a checkpoint if any. *)
RecoveredMeta(l) ==
    IF l # <<>> /\ l[1].kind = "checkpoint"
    THEN FoldRecords([length |-> l[1].length, storage |-> l[1].storage, layout |-> l[1].layout], Tail(l))
    ELSE FoldRecords(EmptyMeta, l)

ChunkUnits(c) == IF c \in DOMAIN chunks THEN chunks[c] ELSE <<>>

(* The unit at position p of the segment in LTS, per layout; 0 if LTS does not have it. *)
RECURSIVE LtsUnit(_, _)
LtsUnit(layout, p) ==
    IF layout = <<>> THEN 0
    ELSE IF p <= Head(layout).len
         THEN IF p <= Len(ChunkUnits(Head(layout).chunk)) THEN ChunkUnits(Head(layout).chunk)[p] ELSE 0
         ELSE LtsUnit(Tail(layout), p - Head(layout).len)

(* The unit at position p from an append record still in the log; 0 if none. *)
LogUnit(l, p) ==
    LET found == {i \in 1..Len(l) : l[i].kind = "append" /\ l[i].off = p}
    IN IF found = {} THEN 0 ELSE l[CHOOSE i \in found : TRUE].id

(* What a recovering owner reads as the segment: LTS up to the storage length, then the log. *)
Recovered(l) ==
    LET m == RecoveredMeta(l) IN
    [p \in 1..m.length |-> IF p <= m.storage THEN LtsUnit(m.layout, p) ELSE LogUnit(l, p)]

LayoutLength(layout) == LET RECURSIVE S(_) S(x) == IF x = <<>> THEN 0 ELSE Head(x).len + S(Tail(x)) IN S(layout)

-----------------------------------------------------------------------------
(* Owners. *)

(* In memory: status, epoch, the segment's units, the committed storage length and layout, and the *)
(* units written into its own chunk beyond the storage length but not yet committed.               *)
Down == [status |-> "down", epoch |-> 0, units |-> <<>>, storage |-> 0, layout |-> <<>>, written |-> 0]

Serving(o) == own[o].status = "serving"
Current(o) == Serving(o) /\ own[o].epoch = logEpoch   \* its log writes will succeed

HasCurrentOwner == \E o \in Owners : Current(o)

Init ==
    /\ logEpoch = 0
    /\ log = <<>>
    /\ chunks = [e \in {} |-> <<>>]
    /\ own = [o \in Owners |-> Down]
    /\ history = <<>>
    /\ crashes = 0
    /\ checkpoints = 0

(* An owner takes over: it fences every older owner, then recovers from the log and LTS.  Takeovers *)
(* of a container that has a serving owner are bounded; recovering one that has none always works. *)
(* Written with IF rather than a disjunction: TLC would count each true disjunct as a successor. *)
StartAllowed == IF HasCurrentOwner THEN logEpoch < MaxEpoch ELSE TRUE

Start(o) ==
    /\ own[o].status = "down"
    /\ StartAllowed
    /\ logEpoch' = logEpoch + 1
    /\ LET m == RecoveredMeta(log) IN
       own' = [own EXCEPT ![o] = [status |-> "serving", epoch |-> logEpoch + 1, units |-> Recovered(log),
                                  storage |-> m.storage, layout |-> m.layout, written |-> 0]]
    /\ UNCHANGED <<log, chunks, history, crashes, checkpoints>>

(* A client's append, made durable by one log record. *)
ClientAppend(o) ==
    /\ Current(o)
    /\ Len(history) < MaxAppends
    /\ LET id == Len(history) + 1 IN
       /\ log' = Append(log, AppendRecord(logEpoch, id, Len(own[o].units) + 1))
       /\ history' = Append(history, id)
       /\ own' = [own EXCEPT ![o].units = Append(@, id)]
    /\ UNCHANGED <<logEpoch, chunks, crashes, checkpoints>>

(* Any log write by a fenced owner fails: it learns it was fenced and stops. *)
LogWriteFenced(o) ==
    /\ Serving(o)
    /\ own[o].epoch < logEpoch
    /\ own' = [own EXCEPT ![o] = Down]
    /\ UNCHANGED <<logEpoch, log, chunks, history, crashes, checkpoints>>

(* The chunk an owner writes into: the one its own epoch names. *)
TargetChunk(o) == own[o].epoch

(* The StorageWriter writes every unit beyond what LTS holds into the owner's chunk (no log write: *)
(* a fenced owner that does not know it yet does this too).                                        *)
WriteChunk(o) ==
    /\ Serving(o)
    /\ own[o].storage + own[o].written < Len(own[o].units)
    /\ LET c == TargetChunk(o)
           new == SubSeq(own[o].units, own[o].storage + own[o].written + 1, Len(own[o].units))
       IN /\ chunks' = [e \in DOMAIN chunks \cup {c} |-> IF e = c THEN ChunkUnits(c) \o new ELSE chunks[e]]
          /\ own' = [own EXCEPT ![o].written = Len(own[o].units) - own[o].storage]
    /\ UNCHANGED <<logEpoch, log, history, crashes, checkpoints>>

(* The new layout once the written units are committed: the owner's chunk grows, or joins. *)
FlushedLayout(o) ==
    LET layout == own[o].layout
        c == TargetChunk(o)
    IN IF layout # <<>> /\ layout[Len(layout)].chunk = c
       THEN [layout EXCEPT ![Len(layout)].len = @ + own[o].written]
       ELSE Append(layout, [chunk |-> c, len |-> own[o].written])

(* The StorageWriter commits what it wrote: one log record with the new layout. *)
CommitFlush(o) ==
    /\ Current(o)
    /\ own[o].written > 0
    /\ LET layout == FlushedLayout(o)
           storage == own[o].storage + own[o].written
       IN /\ log' = Append(log, FlushRecord(logEpoch, layout, storage))
          /\ own' = [own EXCEPT ![o].layout = layout, ![o].storage = storage, ![o].written = 0]
    /\ UNCHANGED <<logEpoch, chunks, history, crashes, checkpoints>>

(* Adoption (the StorageWriter's reconciliation, before its first chunk write): units an older      *)
(* owner wrote into its chunk but never recorded -- it was fenced, or crashed, before its flush      *)
(* record committed -- are compared with the unflushed units in memory, and a verified prefix of     *)
(* them is recorded by a flush naming that older chunk, without being written again.  A candidate    *)
(* chunk is the layout's last one (continued beyond the units the layout takes from it) or one the   *)
(* layout does not name (read from its start; the implementation finds it by the segment offset in  *)
(* its name, the spec by its units, which are unique ids).                                          *)
LastChunk(o) == IF own[o].layout = <<>> THEN 0 ELSE own[o].layout[Len(own[o].layout)].chunk   \* 0: none

(* The units of chunk c the layout already takes: counted from the chunk's start. *)
AdoptBase(o, c) == IF LastChunk(o) = c THEN own[o].layout[Len(own[o].layout)].len ELSE 0

AdoptCandidates(o) ==
    {c \in DOMAIN chunks :
        /\ c < own[o].epoch
        /\ \/ LastChunk(o) = c
           \/ \A k \in 1..Len(own[o].layout) : own[o].layout[k].chunk # c}

(* Chunk c holds n more units beyond what the layout takes from it, each equal to the unflushed *)
(* unit at its place.                                                                          *)
Verified(o, c, n) ==
    LET units == ChunkUnits(c)
        base == AdoptBase(o, c)
    IN /\ base + n <= Len(units)
       /\ \A i \in 1..n : units[base + i] = own[o].units[own[o].storage + i]

(* The layout once n units of chunk c are adopted: its last entry grows, or c joins. *)
AdoptedLayout(o, c, n) ==
    IF LastChunk(o) = c
    THEN [own[o].layout EXCEPT ![Len(own[o].layout)].len = @ + n]
    ELSE Append(own[o].layout, [chunk |-> c, len |-> n])

Adopt(o) ==
    /\ Current(o)
    /\ TargetChunk(o) \notin DOMAIN chunks
    /\ \E c \in AdoptCandidates(o), n \in 1..(Len(own[o].units) - own[o].storage) :
          /\ Verified(o, c, n)
          /\ LET layout == AdoptedLayout(o, c, n)
                 storage == own[o].storage + n
             IN /\ log' = Append(log, FlushRecord(logEpoch, layout, storage))
                /\ own' = [own EXCEPT ![o].layout = layout, ![o].storage = storage]
    /\ UNCHANGED <<logEpoch, chunks, history, crashes, checkpoints>>

(* A metadata checkpoint: a snapshot of the metadata, so recovery need not start at the beginning. *)
Checkpoint(o) ==
    /\ Current(o)
    /\ checkpoints < MaxCheckpoints
    /\ log' = Append(log, CheckpointRecord(logEpoch, Len(own[o].units), own[o].storage, own[o].layout))
    /\ checkpoints' = checkpoints + 1
    /\ UNCHANGED <<logEpoch, chunks, own, history, crashes>>

(* Truncate the log at a checkpoint every unit before which is in LTS (a log write, so fenced). *)
Truncate(o) ==
    /\ Current(o)
    /\ \E i \in 2..Len(log) :
          /\ log[i].kind = "checkpoint"
          /\ log[i].length <= own[o].storage
          /\ log' = SubSeq(log, i, Len(log))
    /\ UNCHANGED <<logEpoch, chunks, own, history, crashes, checkpoints>>

(* An owner's process dies: its memory is gone; the log and LTS remain. *)
Crash(o) ==
    /\ own[o].status # "down"
    /\ crashes < MaxCrashes
    /\ own' = [own EXCEPT ![o] = Down]
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<logEpoch, log, chunks, history, checkpoints>>

Next ==
    \E o \in Owners :
        \/ Start(o)
        \/ ClientAppend(o)
        \/ LogWriteFenced(o)
        \/ WriteChunk(o)
        \/ CommitFlush(o)
        \/ Adopt(o)
        \/ Checkpoint(o)
        \/ Truncate(o)
        \/ Crash(o)

Fairness == \A o \in Owners : WF_vars(Start(o))

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* Invariants. *)

TypeOK ==
    /\ logEpoch \in Nat
    /\ \A o \in Owners : own[o].status \in {"down", "serving"} /\ own[o].epoch <= logEpoch
    /\ crashes \in 0..MaxCrashes
    /\ Len(history) <= MaxAppends

(* Nothing acknowledged is lost: recovering now -- from what the log still holds and what LTS    *)
(* holds -- yields every append ever made durable, in order, and nothing else.                  *)
NoAcknowledgedAppendLost == Recovered(log) = history

(* After a fence, at most one owner's writes succeed: log records never go back in epoch. *)
OneWriterPerEpoch ==
    \A i \in 1..Len(log) :
        /\ log[i].epoch <= logEpoch
        /\ \A j \in i..Len(log) : log[i].epoch <= log[j].epoch

(* The current owner's memory is what recovery would rebuild. *)
CurrentOwnerAgreesWithRecovery ==
    \A o \in Owners : Current(o) =>
        /\ own[o].units = history
        /\ own[o].storage = RecoveredMeta(log).storage
        /\ own[o].layout = RecoveredMeta(log).layout

(* Truncation never removes an append whose unit is not in LTS: every position below the first  *)
(* record's checkpoint is covered by the committed storage length.                              *)
TruncationKeepsUnflushed ==
    log # <<>> /\ log[1].kind = "checkpoint" => log[1].length <= RecoveredMeta(log).storage

(* The committed layout covers exactly the storage length. *)
LayoutCoversStorage == LayoutLength(RecoveredMeta(log).layout) = RecoveredMeta(log).storage

-----------------------------------------------------------------------------
(* Liveness: some owner eventually serves with the current epoch, for good. *)

EventuallyServes == <>[]HasCurrentOwner

=============================================================================
