--------------------------- MODULE StreamOrdering ---------------------------
(***************************************************************************)
(* One stream end to end: writers with retransmission, scaling epochs, and *)
(* a reader group with rebalancing, reader crashes, checkpoints and reset. *)
(*                                                                         *)
(* Theory of operation.                                                    *)
(*                                                                         *)
(* Key space.  [0, 1) is cut into Grid cells; a routing key is named by    *)
(* the cell its hash falls in (Keys \subseteq 0..Grid-1).  A segment owns  *)
(* the cells [lo, hi); every epoch's segments cover the cells exactly.     *)
(*                                                                         *)
(* Scaling (the controller), four atomic steps: CreateSuccessors (split    *)
(* one segment of the current epoch in two, or merge two adjacent ones),   *)
(* RecordEpoch (the new epoch: the current one without the predecessors,   *)
(* with the successors), SealPredecessors, ActivateEpoch (the next scale   *)
(* may begin).  The successors of a sealed segment are the next epoch's    *)
(* segments that overlap it; the predecessors of a segment, the previous   *)
(* epoch's that overlap it.                                                *)
(*                                                                         *)
(* Writers.  WriteEvent(w, k) numbers the event (writer id + event number  *)
(* make it idempotent) and routes it by the writer's own table, which maps *)
(* each cell to a segment.  AppendEvent(w, s): the segment store appends   *)
(* the writer's first in-flight event for s that s does not store yet,     *)
(* unless s is sealed.  AckEvent(w, s): acknowledgements reach the writer  *)
(* for every in-flight event for s that s stores.  SegmentSealed(w, s): an *)
(* append met a sealed segment; the writer learns what s stores            *)
(* (SetupAppend), drops it, routes the cells of s to its successors and    *)
(* resends the rest there, in order.  After a merge a writer may route     *)
(* some cells to the merged segment and others still to a sealed           *)
(* predecessor: routing is by cell, not by segment.                        *)
(*                                                                         *)
(* Idempotence is membership: the store holds each of a writer's events at *)
(* most once per segment and never refuses one it does not hold.  The      *)
(* implementation gets this from a fresh writer id per segment writer,     *)
(* whose numbers increase in the order it sends (a sealed segment's events *)
(* move to the successors' segment writers with new numbers), so its       *)
(* attribute check, "above the largest number stored", refuses exactly     *)
(* what the segment holds.  The spec numbers a writer's events once,       *)
(* globally, so that attribute check would be wrong here: after a merge,   *)
(* event 7 (one key) may reach the merged segment directly while event 6   *)
(* (another key) is still on its way through a sealed predecessor; resent, *)
(* 6 is not above 7, so an attribute check refuses it and then             *)
(* acknowledges it without its ever being stored (NoAcknowledgedEventLost  *)
(* catches that; the mutant StreamOrdering_attribute_is_largest_stored     *)
(* restores the old check).  Membership of the number among w's numbers    *)
(* stored in s is what the implementation's check amounts to and needs no  *)
(* per-segment numbering (no new variable).  AppendEvent takes in-flight   *)
(* order, where the implementation queues moved events behind those        *)
(* already sent to the successor: they carry other keys, and the other     *)
(* order is the behaviour in which those are stored before SegmentSealed.  *)
(*                                                                         *)
(* Reader group.  The shared state holds, per online reader, its segments  *)
(* with the offset recorded for each (`assigned`), the unassigned segments *)
(* with offsets, the future segments with the predecessors they still wait *)
(* for, and the checkpoints.  It changes only by the updates of the        *)
(* reference's section 6.2: AddReader; AcquireSegment (only a least loaded *)
(* reader acquires: the implementation's timers give it the first chance); *)
(* ReleaseSegment (a reader holding two segments more than another gives   *)
(* one up, at the offset recorded for it -- Pravega releases right after a *)
(* checkpoint, so that offset is one the application persisted);           *)
(* SegmentCompleted (a sealed segment read to its end: its successors      *)
(* become future segments, and unassigned at offset 0 once every           *)
(* predecessor has completed); CreateCheckpoint (the online readers owe it *)
(* their positions; it starts from the unassigned offsets and the ends of  *)
(* the completed predecessors that futures still wait beside, so that its  *)
(* cut covers the key space); CheckpointReader; ReaderOffline (a crash:    *)
(* the reader's segments return to the pool at their recorded offsets, and *)
(* a checkpoint it owed takes those offsets); Reset (a new generation      *)
(* starting from a completed checkpoint's cut).                            *)
(*                                                                         *)
(* Readers.  ReadNextEvent(r, s) returns the next event of a segment r     *)
(* holds.  A reader that owes a checkpoint returns it instead              *)
(* (SurfaceCheckpoint); on its next call (CheckpointReader) its            *)
(* application has persisted its state -- `saved`, the positions it would  *)
(* restart from -- and only then are the positions recorded in the group.  *)
(* A reader owing a checkpoint neither reads, acquires, releases nor       *)
(* completes.  A crashed reader may rejoin, holding nothing.               *)
(*                                                                         *)
(* Ghost state.  `reads` is the group's ledger since the last reset: the   *)
(* positions <<segment, offset>> delivered, in order.  `unsaved[r]` holds  *)
(* what reader r delivered that its application has not persisted (until  *)
(* its next CheckpointReader) -- in the segments it holds and in any it    *)
(* released: a crash voids exactly those (that work is lost, and the group *)
(* must hand those events out again).  A segment r completed leaves its    *)
(* set: completion hands no offset back, so what r delivered of it beyond  *)
(* its last checkpoint is not handed out again after a crash (Pravega's    *)
(* rule too; an application that needs it resets to a checkpoint).        *)
(* `origin` is the cut the group last started from.                        *)
(*                                                                         *)
(* Abstractions.  Events carry no payload and offsets count events.        *)
(* Connections, blocks and reconnects (a reconnect's resend of a stored    *)
(* event is an AppendEvent the store refuses), timers, load metrics and    *)
(* the state synchronizer's optimistic concurrency are abstracted into     *)
(* atomic steps.                                                           *)
(* One checkpoint is in progress at a time; resets happen between          *)
(* checkpoints and only to checkpoints; no retention, truncation or        *)
(* bounded reads.                                                          *)
(*                                                                         *)
(* Bounds.  Writers, Readers and Keys are small sets and Grid a small      *)
(* number; EventsPerWriter, MaxScales, MaxCheckpoints, MaxCrashes and      *)
(* MaxResets bound the environment's choices (the protocol's own steps are *)
(* never bounded).  Results hold only within the bounds of the             *)
(* configuration checked.                                                  *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS
    Writers,          \* writer ids
    Readers,          \* reader ids
    InitialReaders,   \* readers online at the start (the others join later)
    Grid,             \* cells of the key space
    Keys,             \* routing keys, each named by its cell
    InitialSplits,    \* interior boundaries of the first epoch's segments
    EventsPerWriter,  \* bound on events each writer writes
    MaxScales,        \* bound on scale operations
    MaxCheckpoints,   \* bound on checkpoints
    MaxCrashes,       \* bound on reader crashes
    MaxResets         \* bound on resets

ASSUME Grid \in Nat \ {0} /\ Keys \subseteq 0..(Grid - 1) /\ InitialSplits \subseteq 1..(Grid - 1)
ASSUME EventsPerWriter \in Nat /\ MaxScales \in Nat /\ MaxCheckpoints \in Nat /\ MaxResets \in Nat
ASSUME MaxCrashes \in Nat /\ InitialReaders \subseteq Readers

VARIABLES
    segs,        \* segment id -> [lo, hi, epoch]: cells [lo, hi), epoch of creation
    epochs,      \* epoch -> its segment ids (epochs are numbered from 1)
    scaling,     \* the scale in progress: [phase, preds, succs]
    scales,      \* scales started so far
    sealed,      \* sealed segment ids
    data,        \* segment id -> the events it stores, in order: [w, n, k]
    written,     \* writer -> events written so far (numbered 1..written[w])
    table,       \* writer -> (cell -> the segment it routes that cell's keys to)
    inflight,    \* writer -> unacknowledged events in number order: [n, k, seg]
    online,      \* readers in the group
    assigned,    \* reader -> (segment -> offset recorded in the group state)
    unassigned,  \* segment -> offset
    future,      \* successor -> predecessors it still waits for
    pos,         \* reader -> (segment -> offset read up to): the reader's memory
    atCkpt,      \* reader -> checkpoint it returned and has yet to record (0: none)
    saved,       \* reader -> (segment -> offset): what its application persisted
    ckpts,       \* checkpoints: [pending: readers that owe positions, cut: segment -> offset]
    crashes,     \* reader crashes so far
    resets,      \* resets so far
    reads,       \* ghost: <<segment, offset>> delivered since the last reset
    origin,      \* ghost: the cut the group last started from
    unsaved      \* ghost: reader -> positions it delivered that its application has not persisted

vars == <<segs, epochs, scaling, scales, sealed, data, written, table, inflight, online, assigned,
          unassigned, future, pos, atCkpt, saved, ckpts, crashes, resets, reads, origin, unsaved>>

-----------------------------------------------------------------------------
(* Maps from segment ids to offsets. *)

EmptyMap == [s \in {} |-> 0]
Put(f, s, v) == [x \in DOMAIN f \cup {s} |-> IF x = s THEN v ELSE f[x]]
Drop(f, s) == [x \in DOMAIN f \ {s} |-> f[x]]
Override(f, g) == [x \in DOMAIN f \cup DOMAIN g |-> IF x \in DOMAIN g THEN g[x] ELSE f[x]]

MinOf(S) == CHOOSE x \in S : \A y \in S : x <= y
MaxOf(S) == CHOOSE x \in S : \A y \in S : y <= x

-----------------------------------------------------------------------------
(* The key space, segments and epochs. *)

CellsOf(s) == segs[s].lo..(segs[s].hi - 1)
Cells(S) == UNION {CellsOf(s) : s \in S}
Covers(s, k) == segs[s].lo <= k /\ k < segs[s].hi
Overlap(s, t) == segs[s].lo < segs[t].hi /\ segs[t].lo < segs[s].hi

(* S covers every cell exactly once. *)
Partitions(S) == \A c \in 0..(Grid - 1) : Cardinality({s \in S : c \in CellsOf(s)}) = 1

LastEpoch == Len(epochs)
Current == epochs[LastEpoch]

LastEpochOf(s) == MaxOf({e \in DOMAIN epochs : s \in epochs[e]})
Successors(s) == {t \in epochs[LastEpochOf(s) + 1] : Overlap(s, t)}
Predecessors(t) == IF segs[t].epoch = 1 THEN {} ELSE {p \in epochs[segs[t].epoch - 1] : Overlap(p, t)}

(* The first epoch: segments between consecutive boundaries, in key order. *)
Bounds == {0, Grid} \cup InitialSplits
NthBound(i) == CHOOSE b \in Bounds : Cardinality({x \in Bounds : x < b}) = i
InitialCount == Cardinality(Bounds) - 1

(* Every segment id a behaviour can create (each scale creates at most two). *)
SegmentIds == 1..(InitialCount + 2 * MaxScales)
InitialSegments == [i \in 1..InitialCount |-> [lo |-> NthBound(i - 1), hi |-> NthBound(i), epoch |-> 1]]
InitialOwner(c) == CHOOSE i \in 1..InitialCount : NthBound(i - 1) <= c /\ c < NthBound(i)

Idle == [phase |-> "idle", preds |-> {}, succs |-> {}]

-----------------------------------------------------------------------------
(* Events and the reader group. *)

Event(p) == data[p[1]][p[2]]

(* The numbers of w's events that s stores: what the store's idempotence check consults. *)
StoredNumbers(s, w) == {data[s][i].n : i \in {j \in DOMAIN data[s] : data[s][j].w = w}}

(* The segments a writer routes to. *)
Routed(w) == {table[w][c] : c \in 0..(Grid - 1)}

Owned(r) == DOMAIN assigned[r]
Load(r) == Cardinality(Owned(r))

(* Guards test sets for emptiness rather than use \E: in an action TLC would count one successor *)
(* per witness of an \E, and the model's state graph must match TLC's edge for edge.            *)
Pending(r) == {i \in DOMAIN ckpts : r \in ckpts[i].pending} # {}
CheckpointInProgress == {i \in DOMAIN ckpts : ckpts[i].pending # {}} # {}

(* A reader that may change its assignment or read: online, owing no checkpoint. *)
Free(r) == r \in online /\ atCkpt[r] = 0 /\ ~Pending(r)

(* Segments the group holds (assigned or unassigned). *)
Held == DOMAIN unassigned \cup UNION {Owned(r) : r \in Readers}

(* Completed predecessors that a future segment still waits beside. *)
CompletedWaiting == UNION {Predecessors(t) \ future[t] : t \in DOMAIN future}

(* Position p = <<s, o>> lies after the cut c: beyond its offset, or in a later segment. *)
After(p, c) ==
    IF p[1] \in DOMAIN c THEN p[2] > c[p[1]]
    ELSE \E x \in DOMAIN c : Overlap(p[1], x) /\ segs[p[1]].epoch > segs[x].epoch

PositionsOf(s) == {<<s, o>> : o \in 1..Len(data[s])}
Positions == UNION {PositionsOf(s) : s \in DOMAIN data}

(* Nothing left to read: writers have nothing in flight, every segment the group holds is read *)
(* to its end and still open.                                                                  *)
Drained ==
    /\ \A w \in Writers : inflight[w] = <<>>
    /\ DOMAIN unassigned = {}
    /\ DOMAIN future = {}
    /\ \A r \in Readers : \A s \in DOMAIN pos[r] : pos[r][s] = Len(data[s]) /\ s \notin sealed

-----------------------------------------------------------------------------
(* Initial state. *)

Init ==
    /\ segs = InitialSegments
    /\ epochs = <<{i : i \in 1..InitialCount}>>
    /\ scaling = Idle
    /\ scales = 0
    /\ sealed = {}
    /\ data = [i \in 1..InitialCount |-> <<>>]
    /\ written = [w \in Writers |-> 0]
    /\ table = [w \in Writers |-> [c \in 0..(Grid - 1) |-> InitialOwner(c)]]
    /\ inflight = [w \in Writers |-> <<>>]
    /\ online = InitialReaders
    /\ assigned = [r \in Readers |-> EmptyMap]
    /\ unassigned = [s \in 1..InitialCount |-> 0]
    /\ future = EmptyMap
    /\ pos = [r \in Readers |-> EmptyMap]
    /\ atCkpt = [r \in Readers |-> 0]
    /\ saved = [r \in Readers |-> EmptyMap]
    /\ ckpts = <<>>
    /\ crashes = 0
    /\ resets = 0
    /\ reads = <<>>
    /\ origin = [s \in 1..InitialCount |-> 0]
    /\ unsaved = [r \in Readers |-> {}]

-----------------------------------------------------------------------------
(* The controller scales the stream. *)

WriterVars == <<written, table, inflight>>
GroupVars == <<online, assigned, unassigned, future, pos, atCkpt, saved, ckpts, crashes, resets, reads, origin,
               unsaved>>

(* New segments with the given ranges (in key order) for the epoch about to be recorded. *)
StartScale(preds, ranges) ==
    LET n == Len(segs) IN
    /\ segs' = segs \o [i \in 1..Len(ranges) |-> [lo |-> ranges[i][1], hi |-> ranges[i][2],
                                                   epoch |-> LastEpoch + 1]]
    /\ data' = data \o [i \in 1..Len(ranges) |-> <<>>]
    /\ scaling' = [phase |-> "created", preds |-> preds, succs |-> {n + i : i \in 1..Len(ranges)}]
    /\ scales' = scales + 1

CreateSuccessors ==
    /\ scaling.phase = "idle"
    /\ scales < MaxScales
    /\ \/ \E s \in Current, b \in 1..(Grid - 1) :
            /\ segs[s].lo < b /\ b < segs[s].hi
            /\ StartScale({s}, <<<<segs[s].lo, b>>, <<b, segs[s].hi>>>>)
       \/ \E s, t \in Current :
            /\ segs[s].hi = segs[t].lo
            /\ StartScale({s, t}, <<<<segs[s].lo, segs[t].hi>>>>)
    /\ UNCHANGED <<epochs, sealed, WriterVars, GroupVars>>

RecordEpoch ==
    /\ scaling.phase = "created"
    /\ epochs' = Append(epochs, (Current \ scaling.preds) \cup scaling.succs)
    /\ scaling' = [scaling EXCEPT !.phase = "recorded"]
    /\ UNCHANGED <<segs, scales, sealed, data, WriterVars, GroupVars>>

SealPredecessors ==
    /\ scaling.phase = "recorded"
    /\ sealed' = sealed \cup scaling.preds
    /\ scaling' = [scaling EXCEPT !.phase = "sealed"]
    /\ UNCHANGED <<segs, epochs, scales, data, WriterVars, GroupVars>>

ActivateEpoch ==
    /\ scaling.phase = "sealed"
    /\ scaling' = Idle
    /\ UNCHANGED <<segs, epochs, scales, sealed, data, WriterVars, GroupVars>>

-----------------------------------------------------------------------------
(* Writers. *)

StreamVars == <<segs, epochs, scaling, scales, sealed>>

WriteEvent(w, k) ==
    /\ written[w] < EventsPerWriter
    /\ written' = [written EXCEPT ![w] = @ + 1]
    /\ inflight' = [inflight EXCEPT ![w] = Append(@, [n |-> written[w] + 1, k |-> k, seg |-> table[w][k]])]
    /\ UNCHANGED <<StreamVars, data, table, GroupVars>>

(* Indexes of w's in-flight events for s that s does not store yet. *)
Unstored(w, s) ==
    {i \in DOMAIN inflight[w] : inflight[w][i].seg = s /\ inflight[w][i].n \notin StoredNumbers(s, w)}

AppendEvent(w, s) ==
    /\ s \in Routed(w)
    /\ s \notin sealed
    /\ Unstored(w, s) # {}
    /\ LET e == inflight[w][MinOf(Unstored(w, s))] IN
       data' = [data EXCEPT ![s] = Append(@, [w |-> w, n |-> e.n, k |-> e.k])]
    /\ UNCHANGED <<StreamVars, WriterVars, GroupVars>>

AckEvent(w, s) ==
    /\ s \in Routed(w)
    /\ {i \in DOMAIN inflight[w] : inflight[w][i].seg = s /\ inflight[w][i].n \in StoredNumbers(s, w)} # {}
    /\ inflight' = [inflight EXCEPT ![w] = SelectSeq(@, LAMBDA e : e.seg # s \/ e.n \notin StoredNumbers(s, w))]
    /\ UNCHANGED <<StreamVars, data, written, table, GroupVars>>

SegmentSealed(w, s) ==
    /\ s \in Routed(w)
    /\ s \in sealed
    /\ {i \in DOMAIN inflight[w] : inflight[w][i].seg = s} # {}
    /\ LET stored == StoredNumbers(s, w)
           next == Successors(s)
           kept == SelectSeq(inflight[w], LAMBDA e : e.seg # s \/ e.n \notin stored)
           route == [c \in 0..(Grid - 1) |->
                       IF table[w][c] = s THEN CHOOSE t \in next : Covers(t, c) ELSE table[w][c]]
       IN /\ table' = [table EXCEPT ![w] = route]
          /\ inflight' = [inflight EXCEPT ![w] =
                            [i \in DOMAIN kept |->
                               IF kept[i].seg = s THEN [kept[i] EXCEPT !.seg = route[kept[i].k]] ELSE kept[i]]]
    /\ UNCHANGED <<StreamVars, data, written, GroupVars>>

-----------------------------------------------------------------------------
(* The reader group. *)

(* A reader joins the group (a new reader, or a crashed one restarted), holding nothing. *)
AddReader(r) ==
    /\ r \notin online
    /\ online' = online \cup {r}
    /\ UNCHANGED <<StreamVars, data, WriterVars, assigned, unassigned, future, pos, atCkpt, saved, ckpts,
                   crashes, resets, reads, origin, unsaved>>

AcquireSegment(r, s) ==
    /\ Free(r)
    /\ s \in DOMAIN unassigned
    /\ \A q \in online : Load(r) <= Load(q)
    /\ assigned' = [assigned EXCEPT ![r] = Put(@, s, unassigned[s])]
    /\ pos' = [pos EXCEPT ![r] = Put(@, s, unassigned[s])]
    /\ saved' = [saved EXCEPT ![r] = Put(@, s, unassigned[s])]
    /\ unassigned' = Drop(unassigned, s)
    /\ UNCHANGED <<StreamVars, data, WriterVars, online, future, atCkpt, ckpts, crashes, resets, reads, origin,
                   unsaved>>

ReleaseSegment(r, s) ==
    /\ Free(r)
    /\ s \in Owned(r)
    /\ pos[r][s] = assigned[r][s]
    /\ {q \in online \ {r} : Load(q) + 2 <= Load(r)} # {}
    /\ unassigned' = Put(unassigned, s, assigned[r][s])
    /\ assigned' = [assigned EXCEPT ![r] = Drop(@, s)]
    /\ pos' = [pos EXCEPT ![r] = Drop(@, s)]
    /\ saved' = [saved EXCEPT ![r] = Drop(@, s)]
    /\ UNCHANGED <<StreamVars, data, WriterVars, online, future, atCkpt, ckpts, crashes, resets, reads, origin,
                   unsaved>>

ReadNextEvent(r, s) ==
    /\ Free(r)
    /\ s \in DOMAIN pos[r]
    /\ pos[r][s] < Len(data[s])
    /\ pos' = [pos EXCEPT ![r][s] = @ + 1]
    /\ reads' = Append(reads, <<s, pos[r][s] + 1>>)
    /\ unsaved' = [unsaved EXCEPT ![r] = @ \cup {<<s, pos[r][s] + 1>>}]
    /\ UNCHANGED <<StreamVars, data, WriterVars, online, assigned, unassigned, future, atCkpt, saved,
                   ckpts, crashes, resets, origin>>

(* A successor the group already holds is left alone (with every predecessor completed only once, *)
(* that cannot happen; the guard keeps a faulty completion from handing a segment out twice).     *)
SegmentCompleted(r, s) ==
    /\ Free(r)
    /\ s \in Owned(r)
    /\ s \in sealed
    /\ pos[r][s] = Len(data[s])
    /\ LET waiting == [t \in DOMAIN future \cup (Successors(s) \ Held) |->
                         (IF t \in DOMAIN future THEN future[t] ELSE Predecessors(t)) \ {s}]
           ready == {t \in DOMAIN waiting : waiting[t] = {}}
       IN /\ future' = [t \in DOMAIN waiting \ ready |-> waiting[t]]
          /\ unassigned' = Override(unassigned, [t \in ready |-> 0])
    /\ assigned' = [assigned EXCEPT ![r] = Drop(@, s)]
    /\ pos' = [pos EXCEPT ![r] = Drop(@, s)]
    /\ saved' = [saved EXCEPT ![r] = Drop(@, s)]
    /\ unsaved' = [unsaved EXCEPT ![r] = {p \in @ : p[1] # s}]
    /\ UNCHANGED <<StreamVars, data, WriterVars, online, atCkpt, ckpts, crashes, resets, reads, origin>>

CreateCheckpoint ==
    /\ Len(ckpts) < MaxCheckpoints
    /\ ~CheckpointInProgress
    /\ ckpts' = Append(ckpts, [pending |-> online,
                               cut |-> Override(unassigned, [p \in CompletedWaiting |-> Len(data[p])])])
    /\ UNCHANGED <<StreamVars, data, WriterVars, online, assigned, unassigned, future, pos, atCkpt, saved,
                   crashes, resets, reads, origin, unsaved>>

(* read_next_event returns the checkpoint instead of an event. *)
SurfaceCheckpoint(r) ==
    /\ r \in online
    /\ atCkpt[r] = 0
    /\ Pending(r)
    /\ atCkpt' = [atCkpt EXCEPT ![r] = CHOOSE i \in DOMAIN ckpts : r \in ckpts[i].pending]
    /\ UNCHANGED <<StreamVars, data, WriterVars, online, assigned, unassigned, future, pos, saved, ckpts,
                   crashes, resets, reads, origin, unsaved>>

(* The next read_next_event call: the application has persisted its state, and the reader records *)
(* its positions in the checkpoint (and as its recorded offsets).                                  *)
CheckpointReader(r) ==
    /\ r \in online
    /\ atCkpt[r] # 0
    /\ saved' = [saved EXCEPT ![r] = pos[r]]
    /\ ckpts' = [ckpts EXCEPT ![atCkpt[r]] = [pending |-> @.pending \ {r}, cut |-> Override(@.cut, pos[r])]]
    /\ assigned' = [assigned EXCEPT ![r] = pos[r]]
    /\ atCkpt' = [atCkpt EXCEPT ![r] = 0]
    /\ unsaved' = [unsaved EXCEPT ![r] = {}]
    /\ UNCHANGED <<StreamVars, data, WriterVars, online, unassigned, future, pos, crashes, resets, reads, origin>>

(* A reader crashes; the group learns it is offline. *)
ReaderOffline(r) ==
    /\ r \in online
    /\ crashes < MaxCrashes
    /\ online' = online \ {r}
    /\ unassigned' = Override(unassigned, assigned[r])
    /\ ckpts' = [i \in DOMAIN ckpts |->
                   IF r \in ckpts[i].pending
                   THEN [pending |-> ckpts[i].pending \ {r}, cut |-> Override(ckpts[i].cut, assigned[r])]
                   ELSE ckpts[i]]
    /\ reads' = SelectSeq(reads, LAMBDA p : p \notin unsaved[r])
    /\ unsaved' = [unsaved EXCEPT ![r] = {}]
    /\ assigned' = [assigned EXCEPT ![r] = EmptyMap]
    /\ pos' = [pos EXCEPT ![r] = EmptyMap]
    /\ saved' = [saved EXCEPT ![r] = EmptyMap]
    /\ atCkpt' = [atCkpt EXCEPT ![r] = 0]
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<StreamVars, data, WriterVars, future, resets, origin>>

(* The application restarts the group from a completed checkpoint. *)
Reset(i) ==
    /\ i \in DOMAIN ckpts
    /\ resets < MaxResets
    /\ ~CheckpointInProgress
    /\ unassigned' = ckpts[i].cut
    /\ future' = EmptyMap
    /\ assigned' = [r \in Readers |-> EmptyMap]
    /\ pos' = [r \in Readers |-> EmptyMap]
    /\ saved' = [r \in Readers |-> EmptyMap]
    /\ atCkpt' = [r \in Readers |-> 0]
    /\ reads' = <<>>
    /\ origin' = ckpts[i].cut
    /\ unsaved' = [r \in Readers |-> {}]
    /\ resets' = resets + 1
    /\ UNCHANGED <<StreamVars, data, WriterVars, online, ckpts, crashes>>

-----------------------------------------------------------------------------

Next ==
    \/ CreateSuccessors
    \/ RecordEpoch
    \/ SealPredecessors
    \/ ActivateEpoch
    \/ \E w \in Writers :
          \/ \E k \in Keys : WriteEvent(w, k)
          \/ \E s \in SegmentIds : AppendEvent(w, s)
          \/ \E s \in SegmentIds : AckEvent(w, s)
          \/ \E s \in SegmentIds : SegmentSealed(w, s)
    \/ \E r \in Readers :
          \/ AddReader(r)
          \/ \E s \in SegmentIds : AcquireSegment(r, s)
          \/ \E s \in SegmentIds : ReleaseSegment(r, s)
          \/ \E s \in SegmentIds : ReadNextEvent(r, s)
          \/ \E s \in SegmentIds : SegmentCompleted(r, s)
          \/ SurfaceCheckpoint(r)
          \/ CheckpointReader(r)
          \/ ReaderOffline(r)
    \/ CreateCheckpoint
    \/ \E i \in 1..MaxCheckpoints : Reset(i)

(* Every step of the protocol that is not the environment's choice is taken eventually. *)
Fairness ==
    /\ WF_vars(RecordEpoch) /\ WF_vars(SealPredecessors) /\ WF_vars(ActivateEpoch)
    /\ \A w \in Writers :
          /\ WF_vars(\E s \in SegmentIds : AppendEvent(w, s))
          /\ WF_vars(\E s \in SegmentIds : AckEvent(w, s))
          /\ WF_vars(\E s \in SegmentIds : SegmentSealed(w, s))
    /\ \A r \in Readers :
          /\ WF_vars(AddReader(r))
          /\ WF_vars(\E s \in SegmentIds : AcquireSegment(r, s))
          /\ WF_vars(\E s \in SegmentIds : ReadNextEvent(r, s))
          /\ WF_vars(\E s \in SegmentIds : SegmentCompleted(r, s))
          /\ WF_vars(SurfaceCheckpoint(r))
          /\ WF_vars(CheckpointReader(r))

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* Invariants. *)

TypeOK ==
    /\ scaling.phase \in {"idle", "created", "recorded", "sealed"}
    /\ sealed \subseteq DOMAIN segs
    /\ DOMAIN data = DOMAIN segs
    /\ online \subseteq Readers
    /\ \A w \in Writers : written[w] \in 0..EventsPerWriter
    /\ \A r \in Readers : DOMAIN pos[r] = Owned(r) /\ DOMAIN saved[r] = Owned(r)
    /\ \A r \in Readers \ online : Owned(r) = {} /\ atCkpt[r] = 0
    /\ crashes \in 0..MaxCrashes /\ resets \in 0..MaxResets /\ Len(ckpts) <= MaxCheckpoints

(* Every epoch covers the key space exactly; only segments of past epochs are sealed. *)
EpochsCoverKeySpace ==
    /\ \A e \in DOMAIN epochs : Partitions(epochs[e])
    /\ sealed \cap Current = {}

(* A scale's successors cover exactly the cells of the predecessors it seals. *)
SuccessorsCoverPredecessors ==
    /\ \A e \in 2..LastEpoch : Cells(epochs[e - 1] \ epochs[e]) = Cells(epochs[e] \ epochs[e - 1])
    /\ scaling.phase # "idle" => Cells(scaling.preds) = Cells(scaling.succs)

(* A writer routes every cell to a segment that covers it, and each in-flight event to its key's *)
(* segment in the writer's table.                                                                *)
WritersRouteByKey ==
    \A w \in Writers :
        /\ \A c \in 0..(Grid - 1) : Covers(table[w][c], c)
        /\ \A i \in DOMAIN inflight[w] : inflight[w][i].seg = table[w][inflight[w][i].k]

(* Idempotence: no event is stored twice, in one segment or across a seal. *)
EventsStoredOnce == \A p, q \in Positions : p # q => Event(p) # Event(q)

(* Acknowledged => stored: every event a writer wrote and no longer has in flight (acknowledged) *)
(* is stored in some segment.  Stated on `data` itself, not through the store's check.          *)
NoAcknowledgedEventLost ==
    \A w \in Writers : \A n \in 1..written[w] :
        {i \in DOMAIN inflight[w] : inflight[w][i].n = n} = {} =>
            \E p \in Positions : Event(p).w = w /\ Event(p).n = n

(* Each segment has one holder: one reader, the unassigned pool, or the futures. *)
OneHolderPerSegment ==
    /\ \A r, q \in Readers : r # q => Owned(r) \cap Owned(q) = {}
    /\ \A r \in Readers : Owned(r) \cap (DOMAIN unassigned \cup DOMAIN future) = {}
    /\ DOMAIN unassigned \cap DOMAIN future = {}

(* A completed checkpoint's cut covers the key space, within what the segments hold. *)
CheckpointCutsCoverKeySpace ==
    \A i \in DOMAIN ckpts :
        ckpts[i].pending = {} =>
            /\ Partitions(DOMAIN ckpts[i].cut)
            /\ \A s \in DOMAIN ckpts[i].cut : ckpts[i].cut[s] <= Len(data[s])

(* Per routing key, the group reads events in the order they were written: within a segment in *)
(* offset order, across a scale predecessors first; a writer's events in its numbering order.   *)
PerKeyOrder ==
    \A i, j \in DOMAIN reads :
        (i < j /\ Event(reads[i]).k = Event(reads[j]).k) =>
            /\ IF reads[i][1] = reads[j][1] THEN reads[i][2] < reads[j][2]
               ELSE segs[reads[i][1]].epoch < segs[reads[j][1]].epoch
            /\ Event(reads[i]).w = Event(reads[j]).w => Event(reads[i]).n < Event(reads[j]).n

(* No event is delivered twice between resets (what a crash voids is delivered again). *)
NoDuplicateReads == \A i, j \in DOMAIN reads : i < j => Event(reads[i]) # Event(reads[j])

(* Since the last reset (or the start), the group delivered only events after the cut it started *)
(* from; once nothing is left to read, it delivered every one of them.                          *)
ExactlyOnceAfterReset ==
    /\ \A i \in DOMAIN reads : After(reads[i], origin)
    /\ Drained => \A p \in Positions : After(p, origin) => \E i \in DOMAIN reads : reads[i] = p

-----------------------------------------------------------------------------
(* Liveness: a live reader group eventually reads every event and stays caught up. *)

EventuallyReadsEverything == <>[]Drained

=============================================================================
