---------------------------- MODULE StableWriter ----------------------------
(***************************************************************************)
(* Exactly once across writer process restarts, without transactions: a    *)
(* writer with a stable, user-chosen id and an application-supplied,       *)
(* increasing sequence per event (its source offset), on a stream that     *)
(* scales.                                                                 *)
(*                                                                         *)
(* Theory of operation.                                                    *)
(*                                                                         *)
(* The application reads a source (`source[w]`: the routing key of the    *)
(* event at each offset, a ghost that stands for a replayable log) and     *)
(* writes its events in order, each with its offset as the sequence.  The  *)
(* stream is StreamOrdering's: Grid cells, segments owning cell ranges,    *)
(* scaling in four steps.  For a writer with a stable id the segment store *)
(* keeps, per segment, the last sequence it stored for that id (`Last`,    *)
(* the writer-id attribute, stored atomically with the data) and stores an *)
(* event only above it (the attribute's compare-and-set); a store's refusal *)
(* of an event at or below it is an acknowledgement (`AckEvent`): the      *)
(* segment holds that sequence already.  So per segment a writer's events  *)
(* are stored in sequence order and what is stored is a prefix of what was *)
(* sent there.                                                             *)
(*                                                                         *)
(* The process may die (`WriterCrash`) with events in flight; the requests *)
(* it had sent may still reach the store afterwards (`ZombieAppend`: a     *)
(* zombie's pipeline, only ever above `Last`).  The application restarts   *)
(* it (`WriterRestart`) and replays its source from an earlier offset: any *)
(* offset at or before its first event that was not yet acknowledged.  On  *)
(* its start the writer learns, for every cell, the DEDUPLICATION FLOOR:   *)
(* the largest sequence stored over every segment that ever owned the cell *)
(* (the cell's chain of segments, across every epoch) -- reading a         *)
(* predecessor's only once it is sealed, so the floor cannot grow under    *)
(* it.  A replayed event at or below its key's floor is a duplicate:       *)
(* dropped, and reported to the application as such.  The rest go out as  *)
(* before.                                                                 *)
(*                                                                         *)
(* Why the floor over the key's chain is exactly right.  A key's events    *)
(* go to the segment owning its cell; when that segment is sealed the      *)
(* unacknowledged ones move to the successor owning the cell, ahead of     *)
(* newer ones; so along the chain the key's events are stored in sequence  *)
(* order.  Let n be a replayed event of key k and m = Last(s) the largest  *)
(* sequence stored in a segment s of k's chain.  If n <= m then n is       *)
(* stored: the application wrote n before m; n was routed to a segment of  *)
(* k's chain, and either stored there, or moved along the chain until it   *)
(* reached s (the chain is a line and s is on it) -- and s's sends are in  *)
(* sequence order, so n went out before m and the prefix stored up to m    *)
(* includes n.  Three rules make that last step true:                     *)
(*   - the HOLD: a segment writer sends an event only when no event with a *)
(*     lower sequence is still unacknowledged on an older segment that     *)
(*     overlaps it (after a merge a successor would otherwise store 7,     *)
(*     moved from one predecessor, before 6 arrives from the other -- and  *)
(*     6 would then be refused as stored: acknowledged and lost);          *)
(*   - a predecessor's Last is read only once it is sealed (else a zombie  *)
(*     may still store there what the new process stores in a successor),  *)
(*     and when a segment the new process writes to is sealed, its final   *)
(*     Last raises the floor of its cells (a zombie may have stored there, *)
(*     after the start, events the new process has yet to replay, and      *)
(*     their keys now go to successors that hold nothing of them);         *)
(*   - the floor is per cell, not per current segment: over the current    *)
(*     segment only, events stored in a predecessor are stored again; over *)
(*     every predecessor of the current segment, an event of one key is    *)
(*     dropped because a higher sequence of another key was stored in a    *)
(*     segment this key never lived in -- and lost.                        *)
(* Conversely an event above every Last of its chain is in no segment of   *)
(* the chain, so sending it stores it once.  Each rule has a mutant.       *)
(*                                                                         *)
(* The implementation (`impl/client/_writer.py`'s sequenced writer): the   *)
(* stable id "ingest-7" maps to one wire writer id per segment (a UUID 5   *)
(* of the name and the segment), the wire's event number is the sequence   *)
(* (a block carries the sequence of its last event), `AppendSetup` answers *)
(* `Last` of the current segment, and the writer reads the attribute of    *)
(* each predecessor in its keys' chains from the controller's history.     *)
(*                                                                         *)
(* Abstractions.  An event's sequence is its source offset (gaps would     *)
(* change nothing: the store only compares).  Events carry no payload.     *)
(* Connections, blocks and reconnects are atomic steps (a reconnect's      *)
(* resend of a stored event is an AppendEvent the store refuses, that is   *)
(* an AckEvent).  Segment stores never lose acknowledged data here         *)
(* (DurableLog and ContainerFailover check that).  No readers: what a     *)
(* reader sees of a key is its chain's events in chain order.  Retention   *)
(* is out of scope: a predecessor must still exist for its floor.          *)
(*                                                                         *)
(* Bounds: Events (source length per writer), MaxScales, MaxCrashes.       *)
(* Results hold only within the bounds of the configuration checked.       *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS
    Writers,          \* stable writer ids
    Grid,             \* cells of the key space
    Keys,             \* routing keys, each named by its cell
    InitialSplits,    \* interior boundaries of the first epoch's segments
    Events,           \* the length of each writer's source
    MaxScales,        \* bound on scale operations
    MaxCrashes        \* bound on writer process crashes

ASSUME Grid \in Nat \ {0} /\ Keys \subseteq 0..(Grid - 1) /\ InitialSplits \subseteq 1..(Grid - 1)
ASSUME Events \in Nat /\ MaxScales \in Nat /\ MaxCrashes \in Nat

VARIABLES
    segs,        \* segment id -> [lo, hi, epoch]: cells [lo, hi), epoch of creation
    epochs,      \* epoch -> its segment ids
    scaling,     \* the scale in progress: [phase, preds, succs]
    scales,      \* scales started so far
    sealed,      \* sealed segment ids
    data,        \* segment id -> the events it stores, in order: [w, n, k]
    source,      \* ghost: writer -> the routing key of each source offset read so far
    written,     \* writer -> the offset its process has written up to
    table,       \* writer -> (cell -> the segment it routes that cell's keys to)
    inflight,    \* writer -> unacknowledged events in sequence order: [n, k, seg]
    floor,       \* writer -> (cell -> the deduplication floor learnt when its process started)
    alive,       \* writers whose process runs
    zombie,      \* writer -> events its dead processes had sent: [n, k, seg, g] (g: which crash)
    crashes      \* writer process crashes so far

vars == <<segs, epochs, scaling, scales, sealed, data, source, written, table, inflight, floor, alive,
          zombie, crashes>>

-----------------------------------------------------------------------------
(* The key space, segments and epochs (as in StreamOrdering). *)

MinOf(S) == CHOOSE x \in S : \A y \in S : x <= y
MaxOf(S) == CHOOSE x \in S : \A y \in S : y <= x

CellsOf(s) == segs[s].lo..(segs[s].hi - 1)
Cells(S) == UNION {CellsOf(s) : s \in S}
Covers(s, k) == segs[s].lo <= k /\ k < segs[s].hi
Overlap(s, t) == segs[s].lo < segs[t].hi /\ segs[t].lo < segs[s].hi

Partitions(S) == \A c \in 0..(Grid - 1) : Cardinality({s \in S : c \in CellsOf(s)}) = 1

LastEpoch == Len(epochs)
Current == epochs[LastEpoch]

LastEpochOf(s) == MaxOf({e \in DOMAIN epochs : s \in epochs[e]})
Successors(s) == {t \in epochs[LastEpochOf(s) + 1] : Overlap(s, t)}

Bounds == {0, Grid} \cup InitialSplits
NthBound(i) == CHOOSE b \in Bounds : Cardinality({x \in Bounds : x < b}) = i
InitialCount == Cardinality(Bounds) - 1

SegmentIds == 1..(InitialCount + 2 * MaxScales)
InitialSegments == [i \in 1..InitialCount |-> [lo |-> NthBound(i - 1), hi |-> NthBound(i), epoch |-> 1]]
InitialOwner(c) == CHOOSE i \in 1..InitialCount : NthBound(i - 1) <= c /\ c < NthBound(i)
CurrentOwner(c) == CHOOSE s \in Current : Covers(s, c)

Idle == [phase |-> "idle", preds |-> {}, succs |-> {}]

-----------------------------------------------------------------------------
(* What the store keeps for a writer, and what the writer knows. *)

(* The writer-id attribute: the last (largest) sequence s stores for w (0: none). *)
Last(s, w) == MaxOf({0} \cup {data[s][i].n : i \in {j \in DOMAIN data[s] : data[s][j].w = w}})

(* The segments that ever owned cell c: its chain across every epoch. *)
ChainOf(c) == {s \in DOMAIN segs : Covers(s, c)}

(* The deduplication floor of cell c: the largest sequence stored over its chain. *)
FloorOf(w, c) == MaxOf({Last(s, w) : s \in ChainOf(c)})

Routed(w) == {table[w][c] : c \in 0..(Grid - 1)}

Older(f, s) == Overlap(f, s) /\ segs[f].epoch < segs[s].epoch

(* Indexes of w's in-flight events for s that s does not hold yet (above its Last). *)
Unstored(w, s) == {i \in DOMAIN inflight[w] : inflight[w][i].seg = s /\ inflight[w][i].n > Last(s, w)}

(* The hold: an event for s waits while an event with a lower sequence is unacknowledged on an *)
(* older segment that overlaps s (it may yet move to s).                                       *)
Held(w, s, n) == {i \in DOMAIN inflight[w] : inflight[w][i].n < n /\ Older(inflight[w][i].seg, s)} # {}

(* The offset the application resumes from at the latest after a crash: just before its first *)
(* unacknowledged event (everything before it was acknowledged or dropped as a duplicate).     *)
Resume(w) == IF inflight[w] = <<>> THEN written[w] ELSE inflight[w][1].n - 1

(* A dead process's zombie events for s of crash g, and the lowest of them. *)
ZombieFor(w, s, g) == {z \in zombie[w] : z.seg = s /\ z.g = g}
ZombieHeld(w, z) == {f \in zombie[w] : f.g = z.g /\ f.n < z.n /\ Older(f.seg, z.seg)} # {}

-----------------------------------------------------------------------------
(* Initial state. *)

Init ==
    /\ segs = InitialSegments
    /\ epochs = <<{i : i \in 1..InitialCount}>>
    /\ scaling = Idle
    /\ scales = 0
    /\ sealed = {}
    /\ data = [i \in 1..InitialCount |-> <<>>]
    /\ source = [w \in Writers |-> <<>>]
    /\ written = [w \in Writers |-> 0]
    /\ table = [w \in Writers |-> [c \in 0..(Grid - 1) |-> InitialOwner(c)]]
    /\ inflight = [w \in Writers |-> <<>>]
    /\ floor = [w \in Writers |-> [c \in 0..(Grid - 1) |-> 0]]
    /\ alive = Writers
    /\ zombie = [w \in Writers |-> {}]
    /\ crashes = 0

-----------------------------------------------------------------------------
(* The controller scales the stream (as in StreamOrdering). *)

WriterVars == <<source, written, table, inflight, floor, alive, zombie, crashes>>

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
    /\ UNCHANGED <<epochs, sealed, WriterVars>>

RecordEpoch ==
    /\ scaling.phase = "created"
    /\ epochs' = Append(epochs, (Current \ scaling.preds) \cup scaling.succs)
    /\ scaling' = [scaling EXCEPT !.phase = "recorded"]
    /\ UNCHANGED <<segs, scales, sealed, data, WriterVars>>

SealPredecessors ==
    /\ scaling.phase = "recorded"
    /\ sealed' = sealed \cup scaling.preds
    /\ scaling' = [scaling EXCEPT !.phase = "sealed"]
    /\ UNCHANGED <<segs, epochs, scales, data, WriterVars>>

ActivateEpoch ==
    /\ scaling.phase = "sealed"
    /\ scaling' = Idle
    /\ UNCHANGED <<segs, epochs, scales, sealed, data, WriterVars>>

-----------------------------------------------------------------------------
(* The writer. *)

StreamVars == <<segs, epochs, scaling, scales, sealed>>

(* The application hands the writer the event at its next source offset (a replay writes the *)
(* key the source holds there).  At or below its key's floor it is a duplicate: dropped and  *)
(* reported as such; else it goes in flight, routed by the writer's table.                  *)
WriteEvent(w, k) ==
    /\ w \in alive
    /\ written[w] < Events
    /\ LET n == written[w] + 1 IN
       /\ n <= Len(source[w]) => k = source[w][n]
       /\ source' = IF n <= Len(source[w]) THEN source ELSE [source EXCEPT ![w] = Append(@, k)]
       /\ written' = [written EXCEPT ![w] = n]
       /\ inflight' = IF n <= floor[w][k] THEN inflight
                      ELSE [inflight EXCEPT ![w] = Append(@, [n |-> n, k |-> k, seg |-> table[w][k]])]
    /\ UNCHANGED <<StreamVars, data, table, floor, alive, zombie, crashes>>

(* The store appends the writer's lowest in-flight event for s that s does not hold, unless s *)
(* is sealed or the event is held.                                                          *)
AppendEvent(w, s) ==
    /\ w \in alive
    /\ s \in Routed(w)
    /\ s \notin sealed
    /\ Unstored(w, s) # {}
    /\ LET e == inflight[w][MinOf(Unstored(w, s))] IN
       /\ ~Held(w, s, e.n)
       /\ data' = [data EXCEPT ![s] = Append(@, [w |-> w, n |-> e.n, k |-> e.k])]
    /\ UNCHANGED <<StreamVars, WriterVars>>

(* Acknowledgements (DataAppended, or AppendSetup's Last after a refusal) reach the writer for *)
(* every in-flight event for s at or below s's Last.                                          *)
AckEvent(w, s) ==
    /\ w \in alive
    /\ s \in Routed(w)
    /\ {i \in DOMAIN inflight[w] : inflight[w][i].seg = s /\ inflight[w][i].n <= Last(s, w)} # {}
    /\ inflight' = [inflight EXCEPT ![w] = SelectSeq(@, LAMBDA e : e.seg # s \/ e.n > Last(s, w))]
    /\ UNCHANGED <<StreamVars, data, source, written, table, floor, alive, zombie, crashes>>

(* An append met a sealed segment: the writer learns s's Last -- final now -- drops what s holds, *)
(* raises the floor of s's cells to it (a dead process's requests may have stored there, after   *)
(* this process started, events it has yet to replay: their keys go to the successors now,      *)
(* where no compare-and-set would catch them), routes the cells of s to its successors and      *)
(* moves the rest there, keeping sequence order.                                                *)
SegmentSealed(w, s) ==
    /\ w \in alive
    /\ s \in Routed(w)
    /\ s \in sealed
    /\ {i \in DOMAIN inflight[w] : inflight[w][i].seg = s} # {}
    /\ LET next == Successors(s)
           kept == SelectSeq(inflight[w], LAMBDA e : e.seg # s \/ e.n > Last(s, w))
           route == [c \in 0..(Grid - 1) |->
                       IF table[w][c] = s THEN CHOOSE t \in next : Covers(t, c) ELSE table[w][c]]
       IN /\ table' = [table EXCEPT ![w] = route]
          /\ inflight' = [inflight EXCEPT ![w] =
                            [i \in DOMAIN kept |->
                               IF kept[i].seg = s THEN [kept[i] EXCEPT !.seg = route[kept[i].k]] ELSE kept[i]]]
          /\ floor' = [floor EXCEPT ![w] = [c \in 0..(Grid - 1) |->
                          IF table[w][c] = s THEN MaxOf({floor[w][c], Last(s, w)}) ELSE floor[w][c]]]
    /\ UNCHANGED <<StreamVars, data, source, written, alive, zombie, crashes>>

(* The writer's process dies.  What it had in flight may still reach the store (zombie); the *)
(* application will resume at the latest from just before its first unacknowledged event.   *)
WriterCrash(w) ==
    /\ w \in alive
    /\ crashes < MaxCrashes
    /\ alive' = alive \ {w}
    /\ zombie' = [zombie EXCEPT ![w] = @ \cup {[n |-> inflight[w][i].n, k |-> inflight[w][i].k,
                                                seg |-> inflight[w][i].seg, g |-> crashes + 1]
                                               : i \in DOMAIN inflight[w]}]
    /\ written' = [written EXCEPT ![w] = Resume(w)]
    /\ inflight' = [inflight EXCEPT ![w] = <<>>]
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<StreamVars, data, source, table, floor>>

(* A request a dead process had sent reaches the store: its lowest for s of that process, above *)
(* s's Last and not held (it was sent, so the hold let it go).                                 *)
ZombieAppend(w, s, g) ==
    /\ s \notin sealed
    /\ ZombieFor(w, s, g) # {}
    /\ LET z == CHOOSE x \in ZombieFor(w, s, g) : \A y \in ZombieFor(w, s, g) : x.n <= y.n IN
       /\ z.n > Last(s, w)
       /\ ~ZombieHeld(w, z)
       /\ data' = [data EXCEPT ![s] = Append(@, [w |-> w, n |-> z.n, k |-> z.k])]
       /\ zombie' = [zombie EXCEPT ![w] = @ \ {z}]
    /\ UNCHANGED <<StreamVars, source, written, table, inflight, floor, alive, crashes>>

(* The application starts the writer again with the same id and replays its source from offset *)
(* j + 1.  The writer routes by the current epoch and learns each cell's floor -- once every    *)
(* segment outside the current epoch is sealed (a predecessor's Last is final only then).       *)
WriterRestart(w, j) ==
    /\ w \notin alive
    /\ DOMAIN segs \ Current \subseteq sealed
    /\ j \in 0..written[w]
    /\ alive' = alive \cup {w}
    /\ written' = [written EXCEPT ![w] = j]
    /\ table' = [table EXCEPT ![w] = [c \in 0..(Grid - 1) |-> CurrentOwner(c)]]
    /\ floor' = [floor EXCEPT ![w] = [c \in 0..(Grid - 1) |-> FloorOf(w, c)]]
    /\ UNCHANGED <<StreamVars, data, source, inflight, zombie, crashes>>

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
          \/ WriterCrash(w)
          \/ \E s \in SegmentIds, g \in 1..MaxCrashes : ZombieAppend(w, s, g)
          \/ \E j \in 0..Events : WriterRestart(w, j)

(* The protocol's own steps are taken eventually; the application's (writing, restarting a dead *)
(* process) and faults (crashes, zombie requests) are not.                                     *)
Fairness ==
    /\ WF_vars(RecordEpoch) /\ WF_vars(SealPredecessors) /\ WF_vars(ActivateEpoch)
    /\ \A w \in Writers :
          /\ WF_vars(\E s \in SegmentIds : AppendEvent(w, s))
          /\ WF_vars(\E s \in SegmentIds : AckEvent(w, s))
          /\ WF_vars(\E s \in SegmentIds : SegmentSealed(w, s))

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* Invariants. *)

TypeOK ==
    /\ scaling.phase \in {"idle", "created", "recorded", "sealed"}
    /\ sealed \subseteq DOMAIN segs
    /\ DOMAIN data = DOMAIN segs
    /\ alive \subseteq Writers
    /\ crashes \in 0..MaxCrashes
    /\ \A w \in Writers :
          /\ written[w] \in 0..Len(source[w]) /\ Len(source[w]) <= Events
          /\ w \notin alive => inflight[w] = <<>>

(* A writer routes every cell to a segment that covers it, and each in-flight event to its key's *)
(* segment in its table; in-flight events are in sequence order.                                 *)
WritersRouteByKey ==
    \A w \in Writers :
        /\ \A c \in 0..(Grid - 1) : Covers(table[w][c], c)
        /\ \A i \in DOMAIN inflight[w] : inflight[w][i].seg = table[w][inflight[w][i].k]
        /\ \A i, j \in DOMAIN inflight[w] : i < j => inflight[w][i].n < inflight[w][j].n

Positions == UNION {{<<s, i>> : i \in DOMAIN data[s]} : s \in DOMAIN data}
At(p) == data[p[1]][p[2]]

(* Exactly once: no event (writer, sequence) is stored twice, in one segment or across the stream. *)
EventsStoredOnce == \A p, q \in Positions : p # q => At(p).w # At(q).w \/ At(p).n # At(q).n

(* Every stored event is the source's: its key is the one at its offset. *)
StoredAsWritten == \A p \in Positions : At(p).n <= Len(source[At(p).w]) /\ At(p).k = source[At(p).w][At(p).n]

(* Nothing the application was told is lost: every offset its writer has passed that is not in *)
(* flight -- acknowledged, dropped as a duplicate, or before the offset it resumed from -- is   *)
(* stored.                                                                                     *)
NoAcknowledgedEventLost ==
    \A w \in Writers : \A n \in 1..written[w] :
        {i \in DOMAIN inflight[w] : inflight[w][i].n = n} = {} =>
            \E p \in Positions : At(p).w = w /\ At(p).n = n

(* Per routing key, what readers see -- the key's events along its chain, a segment after the *)
(* segments of older epochs -- is in sequence order.                                           *)
PerKeyOrder ==
    \A p, q \in Positions :
        (/\ At(p).w = At(q).w /\ At(p).k = At(q).k
         /\ IF p[1] = q[1] THEN p[2] < q[2] ELSE segs[p[1]].epoch < segs[q[1]].epoch)
        => At(p).n < At(q).n

-----------------------------------------------------------------------------
(* Liveness: a running writer's events all become durable. *)

EventuallyDurable == <>[](\A w \in alive : inflight[w] = <<>>)

=============================================================================
