---------------------------- MODULE Transactions ----------------------------
(***************************************************************************)
(* Stream transactions: writers, transactions with leases, commit, abort   *)
(* and expiry, the controller's commit workflow (merge in commit order,    *)
(* rolling across scaling), controller crashes, and the fenced             *)
(* multi-commit that the exactly-once Spark sink relies on.                *)
(*                                                                         *)
(* Theory of operation.  A stream is a sequence of epochs; each epoch      *)
(* splits the routing keys into segments (a layout from `Layouts`), and    *)
(* readers read a routing key's segments epoch by epoch, a successor only  *)
(* once its predecessor is sealed.  `Begin` opens a transaction in the     *)
(* active epoch with one hidden transaction segment per segment of that    *)
(* epoch (the implementation puts it on its parent's container); a write   *)
(* routes by key into one of them, durable but invisible.  `Commit` (or a  *)
(* fenced multi-commit) durably marks the transaction COMMITTING and gives *)
(* it the next commit order; `Abort` or lease expiry marks it ABORTING and *)
(* `FinishAbort` deletes its segments.  The controller commits one         *)
(* transaction at a time, lowest commit order first: `StartCommit` records *)
(* the commit in the stream's durable state (which excludes scaling) and   *)
(* picks the target epoch -- the active one if it has the transaction's    *)
(* layout, otherwise a new *duplicate of the transaction's epoch* (a       *)
(* rolling transaction); `MergeTxnSegment(i)` seals and concatenates one   *)
(* transaction segment onto its target segment in one segment-store step;  *)
(* `FinishCommit` marks it COMMITTED and, after a roll, seals the          *)
(* duplicate and the old active epoch and makes a duplicate of the active  *)
(* epoch the new active one.  Readers therefore meet a rolled transaction  *)
(* after everything written to the old active epoch and before everything  *)
(* written after the commit.                                               *)
(*                                                                         *)
(* The controller's state is durable (it lives in a system segment): a     *)
(* crash loses only the fenced requests in flight, and a restarted         *)
(* controller resumes the workflow from `workflow`, `txn` and `epochs`.    *)
(*                                                                         *)
(* The fenced multi-commit `commit_transactions(txns, fence = (key,        *)
(* value))`: the controller reads the value recorded for `key` as it       *)
(* receives the request (again with `ReadFence` if it changed since), then *)
(* writes its decision with one conditional metadata write that succeeds   *)
(* only if the value read is still the recorded one                        *)
(* (`DecideFencedCommit`): if the value read is not lower than the         *)
(* request's, it aborts the request's open transactions and reports        *)
(* "already committed"; if some listed transaction is not open it rejects  *)
(* the request and changes nothing; otherwise it marks every listed        *)
(* transaction COMMITTING (consecutive commit orders) and records key ->   *)
(* value.  A caller whose request or reply is lost sends it again.         *)
(*                                                                         *)
(* Abstractions.  Readers are the per-key content of the stream            *)
(* (`StreamOf(k)`, what every reader of k reads, in order) and its         *)
(* readable prefix; reader groups, checkpoints and positions belong to     *)
(* StreamOrdering.  One non-transactional writer, atomic appends (its      *)
(* retries and idempotence belong to StreamOrdering).  A scale is one      *)
(* atomic step from one layout to the next; a roll's sealing is one step.  *)
(* Time is an abstract tick; the client stops writing to a transaction     *)
(* once it asked to commit or abort it.  Transactions commit one at a time *)
(* (the implementation may batch transactions of one epoch as long as each *)
(* segment receives them in commit order).  Events carry their source,     *)
(* key and a per-source number instead of bytes.  Visibility across keys  *)
(* is not one instant (as in Pravega): a key sees a transaction all or     *)
(* nothing, only once its commit is decided, and every started commit      *)
(* completes.                                                              *)
(*                                                                         *)
(* Bounds (constants): NumTxns transactions, MaxTxnEvents events each,     *)
(* MaxPlainEvents plain events, Len(Layouts) - 1 scales, MaxTime ticks,    *)
(* MaxCrashes controller crashes, MaxFencedRequests fenced requests drawn  *)
(* from FencedRequests.  Results hold only within the bounds of the        *)
(* configuration checked.                                                  *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS
    Keys,               \* routing keys
    Layouts,            \* sequence of layouts (sequences of disjoint key sets covering Keys); epoch 1 has
                        \* Layouts[1] and each Scale moves the stream to the next layout
    NumTxns,            \* transactions are 1..NumTxns
    MaxTxnEvents,       \* bound on the events written into one transaction
    MaxPlainEvents,     \* bound on the events of the non-transactional writer
    Lease,              \* a lease's length in ticks
    MaxTime,            \* bound on ticks
    MaxCrashes,         \* bound on controller crashes
    FencedRequests,     \* the fenced multi-commits a caller may send: [txns, key, value]
    MaxFencedRequests   \* bound on fenced multi-commits sent (retries included)

Txns == 1..NumTxns
(* Segment positions: 1..the number of segments of the widest layout. *)
Positions == 1..(CHOOSE n \in {Len(Layouts[l]) : l \in DOMAIN Layouts} :
                    \A l \in DOMAIN Layouts : Len(Layouts[l]) <= n)
FenceKeys == {r.key : r \in FencedRequests}

(* The source of an event of the non-transactional writer (transactions are 1..NumTxns). *)
PlainWriter == 0

ASSUME Len(Layouts) >= 1
ASSUME \A l \in 1..Len(Layouts) :
           /\ UNION {Layouts[l][i] : i \in 1..Len(Layouts[l])} = Keys
           /\ \A i, j \in 1..Len(Layouts[l]) : i # j => Layouts[l][i] \cap Layouts[l][j] = {}
ASSUME NumTxns \in Nat /\ MaxTxnEvents \in Nat /\ MaxPlainEvents \in Nat
ASSUME Lease \in Nat \ {0} /\ MaxTime \in Nat /\ MaxCrashes \in Nat /\ MaxFencedRequests \in Nat
ASSUME \A r \in FencedRequests : r.txns \subseteq Txns /\ r.txns # {} /\ r.value \in Nat \ {0}

VARIABLES
    controller,   \* "up" | "down"
    crashes,      \* controller crashes so far
    clock,        \* abstract time, in ticks
    epochs,       \* the stream: sequence of [layout, sealed, segs: one event sequence per position]
    active,       \* the active epoch: where writers write
    txn,          \* transaction -> its durable record and (ghost) what it wrote, see NoTxn
    workflow,     \* the commit in progress (durable stream state): [txn, target epoch]; txn 0 = none
    plain,        \* events written by the non-transactional writer so far
    recorded,     \* fence key -> the highest value recorded (durable)
    inbox,        \* fenced requests the controller received and has not answered (lost on a crash)
    sent,         \* fenced requests sent so far
    fenceLog      \* ghost: every fenced request answered, in order, with its outcome

vars == <<controller, crashes, clock, epochs, active, txn, workflow, plain, recorded, inbox, sent, fenceLog>>

-----------------------------------------------------------------------------
(* Lifecycle, layouts and what readers see. *)

Statuses == {"none", "open", "committing", "committed", "aborting", "aborted"}

(* The lifecycle table: the only status changes any action makes. *)
Lifecycle == {<<"none", "open">>, <<"open", "committing">>, <<"committing", "committed">>,
              <<"open", "aborting">>, <<"aborting", "aborted">>}

(* A transaction's record.  `tsegs` holds its transaction segments, one per position of its *)
(* epoch's layout; after a merge or a deletion the contents stay as a ghost of what it wrote.  *)
(* `opened` is the time it began and `deadline` the time its lease lapses (the controller     *)
(* records both; a ping moves the deadline).                                                 *)
(* `order` is its commit order (0 until it commits); `merged` the positions merged so far;     *)
(* `plainBefore` / `plainAfter` (ghosts) count the plain events written when its commit was   *)
(* requested and when it completed.                                                          *)
NoTxn == [status |-> "none", epoch |-> 0, order |-> 0, opened |-> 0, deadline |-> 0, tsegs |-> <<>>,
          merged |-> {}, plainBefore |-> 0, plainAfter |-> 0]

Idle == [txn |-> 0, target |-> 0]

NewEpoch(l) == [layout |-> l, sealed |-> FALSE, segs |-> [i \in 1..Len(Layouts[l]) |-> <<>>]]

LayoutOf(e) == epochs[e].layout

(* The position of the segment that owns key k in layout l. *)
PosOf(l, k) == CHOOSE i \in 1..Len(Layouts[l]) : k \in Layouts[l][i]

Event(src, k, n) == [src |-> src, key |-> k, n |-> n]

KeyFilter(s, k) == SelectSeq(s, LAMBDA e : e.key = k)

RECURSIVE Concat(_)
Concat(ss) == IF ss = <<>> THEN <<>> ELSE Head(ss) \o Concat(Tail(ss))

(* The events of key k every reader reads, in order: epoch by epoch, the segment that owns k. *)
StreamUpTo(k, n) == Concat([e \in 1..n |-> KeyFilter(epochs[e].segs[PosOf(LayoutOf(e), k)], k)])
StreamOf(k) == StreamUpTo(k, Len(epochs))

(* What readers can read now: up to the first epoch that is not sealed, the active one (see *)
(* EpochsSealedInOrder).                                                                   *)
Readable(k) == StreamUpTo(k, active)

Written(t) == LET ts == txn[t].tsegs IN Concat([i \in DOMAIN ts |-> ts[i]])
WrittenCount(t) == Len(Written(t))

CommitQueue == {t \in Txns : txn[t].status = "committing"}
NextOrder == 1 + Cardinality({t \in Txns : txn[t].order > 0})

RemoveAt(s, i) == SubSeq(s, 1, i - 1) \o SubSeq(s, i + 1, Len(s))

-----------------------------------------------------------------------------
Init ==
    /\ controller = "up"
    /\ crashes = 0
    /\ clock = 0
    /\ epochs = <<NewEpoch(1)>>
    /\ active = 1
    /\ txn = [t \in Txns |-> NoTxn]
    /\ workflow = Idle
    /\ plain = 0
    /\ recorded = [k \in FenceKeys |-> 0]
    /\ inbox = <<>>
    /\ sent = 0
    /\ fenceLog = <<>>

(* A client opens a transaction: one transaction segment per segment of the active epoch. *)
Begin(t) ==
    /\ controller = "up"
    /\ txn[t].status = "none"
    /\ txn' = [txn EXCEPT ![t].status = "open", ![t].epoch = active, ![t].opened = clock,
                          ![t].deadline = clock + Lease,
                          ![t].tsegs = [i \in 1..Len(Layouts[LayoutOf(active)]) |-> <<>>]]
    /\ UNCHANGED <<controller, crashes, clock, epochs, active, workflow, plain, recorded, inbox, sent, fenceLog>>

(* The client writes an event into an open transaction: durable in the transaction segment that *)
(* owns its key in the transaction's epoch, invisible to readers.                                *)
WriteEvent(t, k) ==
    /\ txn[t].status = "open"
    /\ WrittenCount(t) < MaxTxnEvents
    /\ LET i == PosOf(LayoutOf(txn[t].epoch), k) IN
       txn' = [txn EXCEPT ![t].tsegs[i] = Append(@, Event(t, k, WrittenCount(t) + 1))]
    /\ UNCHANGED <<controller, crashes, clock, epochs, active, workflow, plain, recorded, inbox, sent, fenceLog>>

(* The client renews the lease of an open transaction whose lease has not lapsed. *)
Ping(t) ==
    /\ controller = "up"
    /\ txn[t].status = "open"
    /\ clock < txn[t].deadline
    /\ txn[t].deadline < clock + Lease
    /\ txn' = [txn EXCEPT ![t].deadline = clock + Lease]
    /\ UNCHANGED <<controller, crashes, clock, epochs, active, workflow, plain, recorded, inbox, sent, fenceLog>>

Tick ==
    /\ clock < MaxTime
    /\ clock' = clock + 1
    /\ UNCHANGED <<controller, crashes, epochs, active, txn, workflow, plain, recorded, inbox, sent, fenceLog>>

(* The controller aborts an open transaction whose lease lapsed. *)
ExpireLease(t) ==
    /\ controller = "up"
    /\ txn[t].status = "open"
    /\ clock >= txn[t].deadline
    /\ txn' = [txn EXCEPT ![t].status = "aborting"]
    /\ UNCHANGED <<controller, crashes, clock, epochs, active, workflow, plain, recorded, inbox, sent, fenceLog>>

(* The client commits: durably COMMITTING with the next commit order; the workflow does the rest. *)
Commit(t) ==
    /\ controller = "up"
    /\ txn[t].status = "open"
    /\ txn' = [txn EXCEPT ![t].status = "committing", ![t].order = NextOrder, ![t].plainBefore = plain]
    /\ UNCHANGED <<controller, crashes, clock, epochs, active, workflow, plain, recorded, inbox, sent, fenceLog>>

Abort(t) ==
    /\ controller = "up"
    /\ txn[t].status = "open"
    /\ txn' = [txn EXCEPT ![t].status = "aborting"]
    /\ UNCHANGED <<controller, crashes, clock, epochs, active, workflow, plain, recorded, inbox, sent, fenceLog>>

(* The abort workflow deletes the transaction segments (their contents stay as a ghost). *)
FinishAbort(t) ==
    /\ controller = "up"
    /\ txn[t].status = "aborting"
    /\ txn' = [txn EXCEPT ![t].status = "aborted"]
    /\ UNCHANGED <<controller, crashes, clock, epochs, active, workflow, plain, recorded, inbox, sent, fenceLog>>

(* The commit workflow starts on the committing transaction with the lowest commit order; it *)
(* merges into the active epoch if that has the transaction's layout, otherwise into a new    *)
(* duplicate of the transaction's epoch (a rolling transaction).                              *)
StartCommit(t) ==
    /\ controller = "up"
    /\ workflow.txn = 0
    /\ txn[t].status = "committing"
    /\ \A u \in CommitQueue : txn[t].order <= txn[u].order
    /\ LET l == LayoutOf(txn[t].epoch) IN
       IF l = LayoutOf(active)
       THEN /\ workflow' = [txn |-> t, target |-> active]
            /\ UNCHANGED epochs
       ELSE /\ epochs' = Append(epochs, NewEpoch(l))
            /\ workflow' = [txn |-> t, target |-> Len(epochs) + 1]
    /\ UNCHANGED <<controller, crashes, clock, active, txn, plain, recorded, inbox, sent, fenceLog>>

(* One transaction segment is sealed and concatenated onto its target segment: one segment-store *)
(* operation, so readers see all of it or none of it.                                           *)
MergeTxnSegment(i) ==
    /\ controller = "up"
    /\ workflow.txn # 0
    /\ i \in DOMAIN txn[workflow.txn].tsegs
    /\ i \notin txn[workflow.txn].merged
    /\ ~epochs[workflow.target].sealed
    /\ epochs' = [epochs EXCEPT ![workflow.target].segs[i] = @ \o txn[workflow.txn].tsegs[i]]
    /\ txn' = [txn EXCEPT ![workflow.txn].merged = @ \cup {i}]
    /\ UNCHANGED <<controller, crashes, clock, active, workflow, plain, recorded, inbox, sent, fenceLog>>

(* Every segment merged: COMMITTED.  After a roll, the duplicate and the old active epoch are *)
(* sealed and a duplicate of the active epoch becomes the active one.                         *)
FinishCommit ==
    /\ controller = "up"
    /\ workflow.txn # 0
    /\ txn[workflow.txn].merged = DOMAIN txn[workflow.txn].tsegs
    /\ txn' = [txn EXCEPT ![workflow.txn].status = "committed", ![workflow.txn].plainAfter = plain]
    /\ workflow' = Idle
    /\ IF workflow.target = active
       THEN UNCHANGED <<epochs, active>>
       ELSE /\ epochs' = Append([epochs EXCEPT ![workflow.target].sealed = TRUE, ![active].sealed = TRUE],
                                NewEpoch(LayoutOf(active)))
            /\ active' = Len(epochs) + 1
    /\ UNCHANGED <<controller, crashes, clock, plain, recorded, inbox, sent, fenceLog>>

(* The stream scales to the next layout: the active epoch is sealed, a new one begins.  Not while *)
(* a commit is in progress (the stream's state admits one of the two at a time).                 *)
Scale ==
    /\ controller = "up"
    /\ workflow.txn = 0
    /\ LayoutOf(active) < Len(Layouts)
    /\ epochs' = Append([epochs EXCEPT ![active].sealed = TRUE], NewEpoch(LayoutOf(active) + 1))
    /\ active' = Len(epochs) + 1
    /\ UNCHANGED <<controller, crashes, clock, txn, workflow, plain, recorded, inbox, sent, fenceLog>>

(* The non-transactional writer appends an event to the active segment that owns its key. *)
WritePlainEvent(k) ==
    /\ plain < MaxPlainEvents
    /\ LET i == PosOf(LayoutOf(active), k) IN
       epochs' = [epochs EXCEPT ![active].segs[i] = Append(@, Event(PlainWriter, k, plain + 1))]
    /\ plain' = plain + 1
    /\ UNCHANGED <<controller, crashes, clock, active, txn, workflow, recorded, inbox, sent, fenceLog>>

(* The controller's process dies: the requests it had not answered are lost; its durable state *)
(* (transactions, stream, workflow, recorded fence values) remains.                            *)
CrashController ==
    /\ controller = "up"
    /\ crashes < MaxCrashes
    /\ controller' = "down"
    /\ crashes' = crashes + 1
    /\ inbox' = <<>>
    /\ UNCHANGED <<clock, epochs, active, txn, workflow, plain, recorded, sent, fenceLog>>

(* A controller starts again from its durable state. *)
RestartController ==
    /\ controller = "down"
    /\ controller' = "up"
    /\ UNCHANGED <<crashes, clock, epochs, active, txn, workflow, plain, recorded, inbox, sent, fenceLog>>

(* A caller sends a fenced multi-commit (a first attempt or a retry); the controller receives it *)
(* and reads the value recorded for its key.                                                    *)
RequestFencedCommit(r) ==
    /\ controller = "up"
    /\ sent < MaxFencedRequests
    /\ inbox' = Append(inbox, [txns |-> r.txns, key |-> r.key, value |-> r.value, seen |-> recorded[r.key]])
    /\ sent' = sent + 1
    /\ UNCHANGED <<controller, crashes, clock, epochs, active, txn, workflow, plain, recorded, fenceLog>>

(* The recorded value changed since the controller read it (its conditional write would fail): *)
(* it reads the value again.                                                                   *)
ReadFence(i) ==
    /\ controller = "up"
    /\ i \in DOMAIN inbox
    /\ inbox[i].seen # recorded[inbox[i].key]
    /\ inbox' = [inbox EXCEPT ![i].seen = recorded[inbox[i].key]]
    /\ UNCHANGED <<controller, crashes, clock, epochs, active, txn, workflow, plain, recorded, sent, fenceLog>>

FenceOutcome(q) ==
    IF q.value <= q.seen THEN "already_committed"
    ELSE IF \A t \in q.txns : txn[t].status = "open" THEN "committed"
    ELSE "rejected"

(* The decision, written with one conditional metadata write: it applies only if the value read *)
(* is still the recorded one, so the check and the record are one atomic step.                  *)
DecideFencedCommit(i) ==
    /\ controller = "up"
    /\ i \in DOMAIN inbox
    /\ inbox[i].seen = recorded[inbox[i].key]
    /\ LET q == inbox[i]
           outcome == FenceOutcome(q)
       IN /\ txn' = [t \in Txns |->
                       IF t \notin q.txns \/ txn[t].status # "open" THEN txn[t]
                       ELSE IF outcome = "committed"
                            THEN [txn[t] EXCEPT !.status = "committing",
                                                !.order = NextOrder + Cardinality({u \in q.txns : u < t}),
                                                !.plainBefore = plain]
                       ELSE IF outcome = "already_committed"
                            THEN [txn[t] EXCEPT !.status = "aborting"]
                       ELSE txn[t]]
          /\ recorded' = IF outcome = "committed" THEN [recorded EXCEPT ![q.key] = q.value] ELSE recorded
          /\ inbox' = RemoveAt(inbox, i)
          /\ fenceLog' = Append(fenceLog, [txns |-> q.txns, key |-> q.key, value |-> q.value,
                                           outcome |-> outcome])
    /\ UNCHANGED <<controller, crashes, clock, epochs, active, workflow, plain, sent>>

Next ==
    \/ \E t \in Txns :
          \/ Begin(t)
          \/ \E k \in Keys : WriteEvent(t, k)
          \/ Ping(t)
          \/ ExpireLease(t)
          \/ Commit(t)
          \/ Abort(t)
          \/ FinishAbort(t)
          \/ StartCommit(t)
    \/ \E i \in Positions : MergeTxnSegment(i)
    \/ FinishCommit
    \/ Scale
    \/ Tick
    \/ \E k \in Keys : WritePlainEvent(k)
    \/ CrashController
    \/ RestartController
    \/ \E r \in FencedRequests : RequestFencedCommit(r)
    \/ \E i \in 1..MaxFencedRequests : ReadFence(i) \/ DecideFencedCommit(i)

(* The controller's workflows: every step that finishes a commit or an abort. *)
Workflows ==
    \/ \E t \in Txns : StartCommit(t) \/ FinishAbort(t)
    \/ \E i \in Positions : MergeTxnSegment(i)
    \/ FinishCommit

(* A crashed controller restarts, and a running one works on its workflows while it has work. *)
Fairness == WF_vars(RestartController) /\ WF_vars(Workflows)

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* Invariants. *)

TypeOK ==
    /\ controller \in {"up", "down"}
    /\ crashes \in 0..MaxCrashes
    /\ clock \in 0..MaxTime
    /\ active \in DOMAIN epochs /\ ~epochs[active].sealed
    /\ \A t \in Txns : txn[t].status \in Statuses /\ txn[t].merged \subseteq DOMAIN txn[t].tsegs
    /\ workflow.txn \in Txns \cup {0}
    /\ plain \in 0..MaxPlainEvents
    /\ sent \in 0..MaxFencedRequests
    /\ \A i \in DOMAIN fenceLog : fenceLog[i].outcome \in {"committed", "already_committed", "rejected"}

Visible(t) == {e \in 1..Len(epochs) : \E i \in DOMAIN epochs[e].segs :
                                         \E j \in DOMAIN epochs[e].segs[i] : epochs[e].segs[i][j].src = t}

(* Readers never see an event of a transaction that is not committing or committed ("aborted read"). *)
NoAbortedRead ==
    \A t \in Txns : Visible(t) # {} => txn[t].status \in {"committing", "committed"}

(* A transaction's events appear all or nothing ("partial transaction read"): in every segment    *)
(* exactly one transaction segment's contents, contiguous; for every key exactly the events it   *)
(* wrote with that key, in order, or none; all of them once it is committed.                     *)
NoPartialTransactionRead ==
    /\ \A e \in 1..Len(epochs), i \in Positions, t \in Txns :
          i \in DOMAIN epochs[e].segs =>
             LET s == epochs[e].segs[i]
                 at == {j \in DOMAIN s : s[j].src = t}
             IN at # {} =>
                /\ i \in txn[t].merged
                /\ \E a \in at : /\ a + Cardinality(at) - 1 <= Len(s)
                                /\ SubSeq(s, a, a + Cardinality(at) - 1) = txn[t].tsegs[i]
    /\ \A t \in Txns, k \in Keys :
          LET seen == SelectSeq(StreamOf(k), LAMBDA ev : ev.src = t) IN
          \/ seen = <<>> /\ txn[t].status # "committed"
          \/ seen = KeyFilter(Written(t), k)

(* Per routing key, transactions appear in commit order. *)
CommitOrderPerKey ==
    \A k \in Keys : LET s == StreamOf(k) IN
       \A a, b \in DOMAIN s : a < b /\ s[a].src \in Txns /\ s[b].src \in Txns =>
           txn[s[a].src].order <= txn[s[b].src].order

(* Per routing key, a committed transaction's events come after every plain event written before *)
(* its commit was requested and before every plain event written after the commit completed; the *)
(* plain writer's events stay in the order written.                                              *)
CommitBetweenPlainWrites ==
    \A k \in Keys : LET s == StreamOf(k) IN
       \A a, b \in DOMAIN s : a < b =>
          /\ s[a].src \in Txns /\ s[b].src = PlainWriter => s[b].n > txn[s[a].src].plainBefore
          /\ s[a].src = PlainWriter /\ s[b].src \in Txns /\ txn[s[b].src].status = "committed" =>
                s[a].n <= txn[s[b].src].plainAfter
          /\ s[a].src = PlainWriter /\ s[b].src = PlainWriter => s[a].n < s[b].n

(* Every event sits in a segment that owns its key. *)
EventsInTheirKeySegment ==
    \A e \in 1..Len(epochs), i \in Positions :
       i \in DOMAIN epochs[e].segs =>
          \A j \in DOMAIN epochs[e].segs[i] : epochs[e].segs[i][j].key \in Layouts[LayoutOf(e)][i]

(* No transaction is both committed and aborted: nothing of an aborting or aborted transaction is *)
(* merged, and no transaction a fenced multi-commit committed is ever aborted.                     *)
NotBothCommittedAndAborted ==
    /\ \A t \in Txns : txn[t].status \in {"aborting", "aborted"} => txn[t].merged = {}
    /\ \A t \in Txns : txn[t].status \in {"none", "open"} => txn[t].merged = {} /\ txn[t].order = 0
    /\ \A i \in DOMAIN fenceLog : fenceLog[i].outcome = "committed" =>
          \A t \in fenceLog[i].txns : txn[t].status \in {"committing", "committed"}

(* A fenced multi-commit for a value already recorded (by an earlier request for the same key) *)
(* commits nothing; the recorded value is the highest value committed.                          *)
AlreadyRecordedCommitsNothing ==
    /\ \A i, j \in DOMAIN fenceLog :
          (/\ i < j
           /\ fenceLog[i].key = fenceLog[j].key
           /\ fenceLog[i].outcome = "committed"
           /\ fenceLog[j].value <= fenceLog[i].value) => fenceLog[j].outcome # "committed"
    /\ \A k \in FenceKeys :
          LET values == {fenceLog[i].value : i \in {j \in DOMAIN fenceLog :
                                                       fenceLog[j].key = k /\ fenceLog[j].outcome = "committed"}}
          IN recorded[k] = IF values = {} THEN 0 ELSE CHOOSE v \in values : \A w \in values : w <= v

(* Readers never read beyond the active epoch: every epoch before it is sealed, and the only   *)
(* epoch after it is the duplicate a rolling commit is merging into.                           *)
EpochsSealedInOrder ==
    /\ \A e \in 1..Len(epochs) : epochs[e].sealed <=> e < active
    /\ Len(epochs) > active => Len(epochs) = active + 1 /\ workflow.target = Len(epochs)

-----------------------------------------------------------------------------
(* Properties. *)

(* Every status change is one the lifecycle table allows. *)
LifecycleRespected ==
    [][\A t \in Txns : txn'[t].status = txn[t].status \/ <<txn[t].status, txn'[t].status>> \in Lifecycle]_vars

(* A commit that started eventually completes; so does an abort. *)
CommitCompletes == \A t \in Txns : txn[t].status = "committing" ~> txn[t].status = "committed"
AbortCompletes == \A t \in Txns : txn[t].status = "aborting" ~> txn[t].status = "aborted"

=============================================================================
