--------------------------- MODULE ExactlyOnceSink ---------------------------
(***************************************************************************)
(* Spark's micro-batch two-phase commit into a millstream output stream:   *)
(* the offset log, per-task store transactions, the driver's fenced commit *)
(* and the commit log, with crashes of the driver and of tasks at every    *)
(* step and the replay of a batch.                                         *)
(*                                                                         *)
(* Theory of operation.  The input is the events 1..NumEvents of a source  *)
(* stream; a batch is an offset range.  The driver plans batch b by        *)
(* choosing its end offset and writing it to Spark's offset log            *)
(* (`offsets/b`) before anything runs.  Each of the batch's Partitions     *)
(* tasks begins a store transaction, writes its rows into it (the events   *)
(* of the batch that belong to its partition), and reports a commit        *)
(* message -- the transaction id -- to the driver.  When every task has    *)
(* reported, the driver calls the store's fenced multi-commit with the     *)
(* fence (query id, b): atomically, if the fence recorded for the query is *)
(* below b, every listed transaction is committed (its rows appear in the  *)
(* output stream at once) and b is recorded; otherwise every listed        *)
(* transaction is aborted and the store answers "already committed".       *)
(* Either way the driver then writes Spark's commit log (`commits/b`).  A  *)
(* listed transaction that is no longer open (its lease expired) makes the *)
(* store reject the commit, changing nothing; the driver then aborts the   *)
(* batch.                                                                  *)
(*                                                                         *)
(* A task may die before it reports; its transaction is orphaned and Spark *)
(* retries the task (a new attempt, a new transaction) or fails the job:   *)
(* `abort` lists the reported transactions (a failed task's slot is None)  *)
(* and the query stops.  The driver may die at any step; its tasks die     *)
(* with it and never reach `abort`.  A restarted query reads the two logs: *)
(* if `offsets/b` exists without `commits/b` it re-runs batch b with the   *)
(* same id and the same offsets, in new tasks with new transactions.  The  *)
(* store's lease expires open transactions: an orphan's in due course, a   *)
(* live one's only when the lease was too short (a fault).                 *)
(*                                                                         *)
(* Abstracted away: the query id (one query, so the fence is one number);  *)
(* which events a partition gets (here: event e goes to partition ((e - 1) *)
(* % Partitions) + 1); speculative task attempts (Spark's output commit    *)
(* coordinator lets one attempt per partition report); the source's        *)
(* `commit(end)` retention hint; no-data batches; the content of an        *)
(* event's effect (the output row of event e is e).  Batch ids start at 1  *)
(* (Spark's at 0).  Every store call is atomic, as the store's are.        *)
(* Results hold only within the bounds of the configuration checked:       *)
(* NumEvents, Partitions, and MaxFaults (driver crashes + task crashes +   *)
(* expiries of a transaction some live task or driver still holds).        *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS
    NumEvents,     \* the input: events 1..NumEvents
    Partitions,    \* tasks per batch
    MaxFaults      \* bound on driver crashes, task crashes and premature lease expiries

ASSUME NumEvents \in Nat /\ Partitions \in Nat \ {0} /\ MaxFaults \in Nat

VARIABLES
    offsets,   \* Spark's offset log: offsets[b] is the end offset of batch b
    commits,   \* Spark's commit log: batches 1..commits are in it
    driver,    \* "down" | "idle" | "running" | "committed" | "aborting"
    batch,     \* the batch the driver is running or committing (0 if none)
    tasks,     \* partition -> the current task attempt: [phase, txn]
    txns,      \* store transactions by id: [status, batch, rows]
    fence,     \* the store's recorded fence for the query: the highest batch committed
    output,    \* the output stream: rows in the order they became visible
    faults     \* faults so far

vars == <<offsets, commits, driver, batch, tasks, txns, fence, output, faults>>

Partition == 1..Partitions

-----------------------------------------------------------------------------
(* Batches and rows. *)

LastEnd == IF offsets = <<>> THEN 0 ELSE offsets[Len(offsets)]

(* The first and last offsets of batch b (1-based; batch b covers BatchStart(b)+1..End(b)). *)
BatchStart(b) == IF b = 1 THEN 0 ELSE offsets[b - 1]
End(b) == IF b = 0 THEN 0 ELSE offsets[b]

(* The rows partition p writes for batch b: that batch's events routed to p, in offset order. *)
Rows(b, p) ==
    SelectSeq([i \in 1..(End(b) - BatchStart(b)) |-> BatchStart(b) + i],
              LAMBDA e : ((e - 1) % Partitions) + 1 = p)

IdleTask == [phase |-> "idle", txn |-> 0]
IdleTasks == [p \in Partition |-> IdleTask]

(* A transaction some live task attempt or the live driver still holds. *)
Held(t) ==
    /\ driver # "down"
    /\ \E p \in Partition : tasks[p].txn = t /\ tasks[p].phase \in {"begun", "written", "done"}

(* The reported transactions of the batch, in partition order (the commit messages). *)
Listed == {tasks[p].txn : p \in Partition}

(* The rows of the listed transactions, in partition order. *)
ListedRows ==
    LET f[i \in 0..Partitions] == IF i = 0 THEN <<>> ELSE f[i - 1] \o txns[tasks[i].txn].rows
    IN f[Partitions]

(* The store admits a fenced commit of batch b only above the recorded fence. *)
FenceAdmits(b) == fence < b

AbortTxns(ids) ==
    [t \in DOMAIN txns |-> IF t \in ids /\ txns[t].status = "open"
                           THEN [txns[t] EXCEPT !.status = "aborted"] ELSE txns[t]]

-----------------------------------------------------------------------------
(* Actions. *)

Init ==
    /\ offsets = <<>>
    /\ commits = 0
    /\ driver = "down"
    /\ batch = 0
    /\ tasks = IdleTasks
    /\ txns = <<>>
    /\ fence = 0
    /\ output = <<>>
    /\ faults = 0

(* The query starts (or restarts) from its checkpoint: a batch in the offset log without a  *)
(* commit-log entry is re-run with the same id and offsets; otherwise the next is planned.  *)
DriverStart ==
    /\ driver = "down"
    /\ IF Len(offsets) > commits
       THEN driver' = "running" /\ batch' = Len(offsets)
       ELSE driver' = "idle" /\ batch' = 0
    /\ UNCHANGED <<offsets, commits, tasks, txns, fence, output, faults>>

(* The driver picks the next batch's end offset and writes offsets/b before it runs. *)
PlanBatch(e) ==
    /\ driver = "idle"
    /\ e \in LastEnd + 1..NumEvents
    /\ offsets' = Append(offsets, e)
    /\ driver' = "running"
    /\ batch' = Len(offsets) + 1
    /\ UNCHANGED <<commits, tasks, txns, fence, output, faults>>

(* A task attempt begins its store transaction. *)
TaskBegin(p) ==
    /\ driver = "running"
    /\ tasks[p].phase = "idle"
    /\ txns' = Append(txns, [status |-> "open", batch |-> batch, rows |-> <<>>])
    /\ tasks' = [tasks EXCEPT ![p] = [phase |-> "begun", txn |-> Len(txns) + 1]]
    /\ UNCHANGED <<offsets, commits, driver, batch, fence, output, faults>>

(* The task writes its rows into its transaction and flushes them.  If the lease expired   *)
(* meanwhile the write fails and so does the task.                                         *)
TaskWrite(p) ==
    /\ driver = "running"
    /\ tasks[p].phase = "begun"
    /\ IF txns[tasks[p].txn].status = "open"
       THEN /\ txns' = [txns EXCEPT ![tasks[p].txn].rows = Rows(batch, p)]
            /\ tasks' = [tasks EXCEPT ![p].phase = "written"]
       ELSE /\ tasks' = [tasks EXCEPT ![p].phase = "failed"]
            /\ UNCHANGED txns
    /\ UNCHANGED <<offsets, commits, driver, batch, fence, output, faults>>

(* The task returns its commit message (transaction id, query id, batch id) to the driver. *)
TaskReport(p) ==
    /\ driver = "running"
    /\ tasks[p].phase = "written"
    /\ tasks' = [tasks EXCEPT ![p].phase = "done"]
    /\ UNCHANGED <<offsets, commits, driver, batch, txns, fence, output, faults>>

(* A task attempt dies before reporting: its transaction is orphaned. *)
TaskCrash(p) ==
    /\ driver = "running"
    /\ tasks[p].phase \in {"begun", "written"}
    /\ faults < MaxFaults
    /\ tasks' = [tasks EXCEPT ![p].phase = "failed"]
    /\ faults' = faults + 1
    /\ UNCHANGED <<offsets, commits, driver, batch, txns, fence, output>>

(* Spark retries a failed task: a new attempt. *)
TaskRetry(p) ==
    /\ driver = "running"
    /\ tasks[p].phase = "failed"
    /\ tasks' = [tasks EXCEPT ![p] = IdleTask]
    /\ UNCHANGED <<offsets, commits, driver, batch, txns, fence, output, faults>>

(* The job has failed: a task failed (and Spark gives up on it), or the store rejected the *)
(* commit.  (Compared with TRUE so that TLC evaluates it as one condition rather than       *)
(* enumerating its disjuncts and quantifier as separate successors.)                       *)
JobFailed == driver = "aborting" \/ (driver = "running" /\ \E p \in Partition : tasks[p].phase = "failed")

(* `abort` aborts the reported transactions (failed tasks' slots are None); the query stops. *)
AbortBatch ==
    /\ JobFailed = TRUE
    /\ txns' = AbortTxns({tasks[p].txn : p \in {q \in Partition : tasks[q].phase = "done"}})
    /\ driver' = "down"
    /\ batch' = 0
    /\ tasks' = IdleTasks
    /\ UNCHANGED <<offsets, commits, fence, output, faults>>

(* The driver's sink commit: the store's fenced multi-commit, atomic. *)
CommitBatch ==
    /\ driver = "running"
    /\ \A p \in Partition : tasks[p].phase = "done"
    /\ IF FenceAdmits(batch)
       THEN IF \A t \in Listed : txns[t].status = "open"
            THEN /\ txns' = [t \in DOMAIN txns |-> IF t \in Listed
                                                   THEN [txns[t] EXCEPT !.status = "committed"]
                                                   ELSE txns[t]]
                 /\ output' = output \o ListedRows
                 /\ fence' = batch
                 /\ driver' = "committed"
            ELSE /\ driver' = "aborting"
                 /\ UNCHANGED <<txns, output, fence>>
       ELSE /\ txns' = AbortTxns(Listed)
            /\ driver' = "committed"
            /\ UNCHANGED <<output, fence>>
    /\ UNCHANGED <<offsets, commits, batch, tasks, faults>>

(* Spark writes commits/b; the next batch may be planned. *)
WriteCommitLog ==
    /\ driver = "committed"
    /\ commits' = batch
    /\ driver' = "idle"
    /\ batch' = 0
    /\ tasks' = IdleTasks
    /\ UNCHANGED <<offsets, txns, fence, output, faults>>

(* The driver dies, and its tasks with it; the checkpoint and the store remain. *)
DriverCrash ==
    /\ driver # "down"
    /\ faults < MaxFaults
    /\ driver' = "down"
    /\ batch' = 0
    /\ tasks' = IdleTasks
    /\ faults' = faults + 1
    /\ UNCHANGED <<offsets, commits, txns, fence, output>>

(* The store's lease expires an open transaction.  Expiring one that a live task or driver *)
(* still holds (a lease shorter than the batch) is a fault.                                *)
LeaseExpires(t) ==
    /\ txns[t].status = "open"
    /\ IF Held(t) THEN faults < MaxFaults ELSE TRUE
    /\ txns' = [txns EXCEPT ![t].status = "aborted"]
    /\ faults' = IF Held(t) THEN faults + 1 ELSE faults
    /\ UNCHANGED <<offsets, commits, driver, batch, tasks, fence, output>>

ExpireTransaction == \E t \in DOMAIN txns : LeaseExpires(t)

Next ==
    \/ DriverStart
    \/ \E e \in 1..NumEvents : PlanBatch(e)
    \/ \E p \in Partition :
          \/ TaskBegin(p)
          \/ TaskWrite(p)
          \/ TaskReport(p)
          \/ TaskCrash(p)
          \/ TaskRetry(p)
    \/ AbortBatch
    \/ CommitBatch
    \/ WriteCommitLog
    \/ DriverCrash
    \/ ExpireTransaction

(* An orphan's lease expires in due course. *)
ExpireOrphan == \E t \in DOMAIN txns : ~Held(t) /\ LeaseExpires(t)

Fairness ==
    /\ WF_vars(DriverStart)
    /\ WF_vars(\E e \in 1..NumEvents : PlanBatch(e))
    /\ \A p \in Partition :
          WF_vars(TaskBegin(p)) /\ WF_vars(TaskWrite(p)) /\ WF_vars(TaskReport(p)) /\ WF_vars(TaskRetry(p))
    /\ WF_vars(AbortBatch)
    /\ WF_vars(CommitBatch)
    /\ WF_vars(WriteCommitLog)
    /\ WF_vars(ExpireOrphan)

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* Invariants. *)

TypeOK ==
    /\ commits \in Nat /\ commits <= Len(offsets)
    /\ driver \in {"down", "idle", "running", "committed", "aborting"}
    /\ batch \in 0..Len(offsets)
    /\ \A p \in Partition :
          /\ tasks[p].phase \in {"idle", "begun", "written", "done", "failed"}
          /\ tasks[p].txn \in 0..Len(txns)
    /\ \A t \in DOMAIN txns : txns[t].status \in {"open", "committed", "aborted"}
    /\ faults \in 0..MaxFaults

EventsIn(s) == {s[i] : i \in DOMAIN s}

(* Every input event of a committed batch is in the output exactly once, and nothing else *)
(* is: the output is a permutation of the events of batches 1..fence.                      *)
ExactlyOnce ==
    /\ Len(output) = End(fence)
    /\ EventsIn(output) = 1..End(fence)

(* No output from an uncommitted batch is visible: the output is exactly the rows of the   *)
(* committed transactions, and every committed transaction belongs to a batch the store    *)
(* recorded as committed.  Open and aborted transactions show nothing.                     *)
NothingVisibleUncommitted ==
    LET committed == {t \in DOMAIN txns : txns[t].status = "committed"}
        RECURSIVE Total(_)
        Total(ids) == IF ids = {} THEN 0
                      ELSE LET t == CHOOSE x \in ids : TRUE IN Len(txns[t].rows) + Total(ids \ {t})
    IN /\ \A t \in committed : txns[t].batch <= fence
       /\ Len(output) = Total(committed)

(* Spark's checkpoint and the store agree: the commit log never runs ahead of the store's *)
(* fence, and the fence never runs ahead of the offset log or past the one batch in flight. *)
CheckpointAgreesWithStore ==
    /\ commits <= fence
    /\ fence <= commits + 1
    /\ fence <= Len(offsets)

-----------------------------------------------------------------------------
(* Liveness. *)

(* The query eventually delivers every input event and its commit log catches up. *)
EveryEventDelivered == <>[](LastEnd = NumEvents /\ commits = Len(offsets) /\ Len(output) = NumEvents)

(* No transaction stays open for ever: orphans' leases expire. *)
TransactionsEventuallyClosed == <>[](\A t \in DOMAIN txns : txns[t].status # "open")

=============================================================================
