------------------------------- MODULE Cluster -------------------------------
(***************************************************************************)
(* A millstream cluster: hosts with ZooKeeper sessions, an assigner that   *)
(* writes the container -> host map, a replicated Tier-1 log per container *)
(* (a JetStream stream) fenced by conditional appends, a shared Tier-2     *)
(* directory whose chunks carry the owner's epoch, and truncation.         *)
(*                                                                         *)
(* Theory of operation.  A host is "live" (running, its ZooKeeper session  *)
(* valid), "expired" (running, but ZooKeeper expired its session: a zombie *)
(* that still believes it owns its containers until it touches Tier-1) or  *)
(* "down".  The elected assigner gives a container whose host has no live  *)
(* session to a host that has one; the election and the map's versioned   *)
(* write are ZooKeeper's (a deposed assigner's write fails on the         *)
(* version), so one atomic Assign stands for them.  A live host starts a   *)
(* container assigned to it by opening its Tier-1 log: it reads the log,   *)
(* appends an epoch record conditioned on the last sequence it read (the   *)
(* expected-last-sequence check), waits for a quorum to hold it, recovers  *)
(* and serves.  Every later log write of every host is conditioned the    *)
(* same way on the last sequence that host wrote or read, so a zombie's    *)
(* next write after a new owner's epoch record is refused: it stops.       *)
(*                                                                         *)
(* Tier-1 is modelled by its contract, not its mechanics (the replication  *)
(* is JetStream's Raft, not ours): accepted records form a log whose       *)
(* prefix of "committed" records is held by a quorum of replicas; a write  *)
(* is accepted and committed only while a quorum of replicas is up; the    *)
(* loss of a replica server may lose the uncommitted suffix (the worst     *)
(* case: it always does); the committed prefix survives any losses that    *)
(* leave a quorum, and the servers come back with their stores.  A host    *)
(* acknowledges an append only once the log has committed its record.      *)
(*                                                                         *)
(* Tier-2 is one function per container from epoch to the units of that   *)
(* epoch's chunk.  A chunk becomes visible only through a flush record     *)
(* (the layout) appended to the log -- a conditional append, so a fenced   *)
(* owner can write into its chunk but never make it visible.  A flush      *)
(* record is also the metadata checkpoint: truncation purges the log below *)
(* a committed flush record that covers every unit before it.  A purge is  *)
(* not conditional in JetStream, so any host that believes it serves may   *)
(* purge at any such record.                                               *)
(*                                                                         *)
(* One segment per container; each append is one unit, labelled with its   *)
(* id; a host has at most one append in flight per container.  Each action *)
(* is atomic.  Results hold only within the bounds of the configuration.   *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS
    Hosts,             \* segment store hosts
    Containers,        \* segment containers
    Replicas,          \* Tier-1 replicas of each container's log (JetStream's R)
    MaxAppends,        \* bound on client appends, over all containers
    MaxCrashes,        \* bound on host crashes
    MaxExpiries,       \* bound on sessions expiring under a running host (zombies)
    MaxReplicaLosses   \* bound on Tier-1 replica servers lost

ASSUME /\ Replicas \in Nat \ {0} /\ MaxAppends \in Nat /\ MaxCrashes \in Nat
       /\ MaxExpiries \in Nat /\ MaxReplicaLosses \in Nat

NoHost == "none"

VARIABLES
    hosts,          \* host -> "live", "expired" (a zombie) or "down"
    assignment,     \* container -> host (or NoHost): the map the assigner writes in ZooKeeper
    log,            \* container -> the Tier-1 records accepted and not yet purged, in order
    base,           \* container -> how many records were purged (record i has sequence base + i)
    committed,      \* container -> how many of log's records a quorum of replicas holds
    replicasDown,   \* Tier-1 replica servers down now
    chunks,         \* container -> (epoch -> the units that epoch's Tier-2 chunk holds)
    own,            \* host -> container -> what the host holds in memory for it
    history,        \* ghost: container -> the ids of acknowledged appends, in order
    appends,        \* appends made so far (the next id is appends + 1)
    crashes,        \* host crashes so far
    expiries,       \* session expiries under a running host so far
    losses          \* replica losses so far

vars == <<hosts, assignment, log, base, committed, replicasDown, chunks, own, history, appends, crashes,
          expiries, losses>>

Quorum == Replicas \div 2 + 1
Tier1Available == Replicas - replicasDown >= Quorum

-----------------------------------------------------------------------------
(* Records, recovery. *)

(* A layout is a sequence of [chunk |-> epoch, len |-> units counted from the chunk's start]. *)
NoRecord == [kind |-> "none", epoch |-> 0, host |-> NoHost, id |-> 0, off |-> 0, length |-> 0,
             storage |-> 0, layout |-> <<>>]
EpochRecord(e, h) == [NoRecord EXCEPT !.kind = "epoch", !.epoch = e, !.host = h]
AppendRecord(e, h, i, o) == [NoRecord EXCEPT !.kind = "append", !.epoch = e, !.host = h, !.id = i, !.off = o]
(* A flush record commits a layout and is the metadata checkpoint: length, storage, layout. *)
FlushRecord(e, h, n, s, l) ==
    [NoRecord EXCEPT !.kind = "flush", !.epoch = e, !.host = h, !.length = n, !.storage = s, !.layout = l]

LastSeq(c) == base[c] + Len(log[c])
CommittedLog(c) == SubSeq(log[c], 1, committed[c])
Uncommitted(c) == committed[c] < Len(log[c])

(* The epoch of the last record: a starting owner takes the next one. *)
LastEpoch(c) == IF log[c] = <<>> THEN 0 ELSE log[c][Len(log[c])].epoch

EmptyMeta == [length |-> 0, storage |-> 0, layout |-> <<>>]

ApplyRecord(m, r) ==
    CASE r.kind = "append" -> [m EXCEPT !.length = r.off]
      [] r.kind = "flush" -> [m EXCEPT !.storage = r.storage, !.layout = r.layout]
      [] r.kind = "epoch" -> m

RECURSIVE FoldRecords(_, _)
FoldRecords(m, rs) == IF rs = <<>> THEN m ELSE FoldRecords(ApplyRecord(m, Head(rs)), Tail(rs))

(* The metadata a recovering owner rebuilds from the committed log: from the first record, which *)
(* is a flush record (a checkpoint) once the log was purged.                                     *)
RecoveredMeta(l) ==
    IF l # <<>> /\ l[1].kind = "flush"
    THEN FoldRecords([length |-> l[1].length, storage |-> l[1].storage, layout |-> l[1].layout], Tail(l))
    ELSE FoldRecords(EmptyMeta, l)

ChunkUnits(c, e) == IF e \in DOMAIN chunks[c] THEN chunks[c][e] ELSE <<>>

(* The unit at position p of container c's segment in Tier 2, per layout; 0 if Tier 2 lacks it. *)
RECURSIVE LtsUnit(_, _, _)
LtsUnit(c, layout, p) ==
    IF layout = <<>> THEN 0
    ELSE IF p <= Head(layout).len
         THEN IF p <= Len(ChunkUnits(c, Head(layout).chunk)) THEN ChunkUnits(c, Head(layout).chunk)[p] ELSE 0
         ELSE LtsUnit(c, Tail(layout), p - Head(layout).len)

(* The unit at position p from a committed append record; 0 if none. *)
LogUnit(l, p) ==
    LET found == {i \in 1..Len(l) : l[i].kind = "append" /\ l[i].off = p}
    IN IF found = {} THEN 0 ELSE l[CHOOSE i \in found : TRUE].id

(* What a recovering owner reads as container c's segment: Tier 2 up to the storage length, then *)
(* the committed log.                                                                             *)
Recovered(c) ==
    LET l == CommittedLog(c)
        m == RecoveredMeta(l)
    IN [p \in 1..m.length |-> IF p <= m.storage THEN LtsUnit(c, m.layout, p) ELSE LogUnit(l, p)]

LayoutLength(layout) == LET RECURSIVE S(_) S(x) == IF x = <<>> THEN 0 ELSE Head(x).len + S(Tail(x)) IN S(layout)

Range(s) == {s[i] : i \in DOMAIN s}

-----------------------------------------------------------------------------
(* Hosts' memory. *)

(* status, epoch, seq (the last sequence this host wrote or read: its next append's expected last *)
(* sequence), opened (the sequence of its epoch record), the segment's units (the last one may be  *)
(* in flight), acked (how many are acknowledged: what readers may see), the committed storage    *)
(* length and layout, and the units written into its chunk beyond the storage length.             *)
Idle == [status |-> "idle", epoch |-> 0, seq |-> 0, opened |-> 0, units |-> <<>>, acked |-> 0,
         storage |-> 0, layout |-> <<>>, written |-> 0]

Serving(h, c) == own[h][c].status = "serving"
(* Its next conditional log write succeeds: the log ends with the record it wrote (or read) last. *)
(* The condition is the last sequence and the last record's id, which carries the writer's epoch *)
(* (JetStream's expected-last-sequence and expected-last-msg-id): a sequence alone may be reused *)
(* by another writer once a lost replica took this host's unacknowledged record with it.         *)
ExpectsLast(h, c) == own[h][c].seq = LastSeq(c) /\ LastEpoch(c) = own[h][c].epoch
Current(h, c) == Serving(h, c) /\ ExpectsLast(h, c)
InFlight(h, c) == own[h][c].acked < Len(own[h][c].units)

Init ==
    /\ hosts = [h \in Hosts |-> "live"]
    /\ assignment = [c \in Containers |-> NoHost]
    /\ log = [c \in Containers |-> <<>>]
    /\ base = [c \in Containers |-> 0]
    /\ committed = [c \in Containers |-> 0]
    /\ replicasDown = 0
    /\ chunks = [c \in Containers |-> [e \in {} |-> <<>>]]
    /\ own = [h \in Hosts |-> [c \in Containers |-> Idle]]
    /\ history = [c \in Containers |-> <<>>]
    /\ appends = 0
    /\ crashes = 0
    /\ expiries = 0
    /\ losses = 0

-----------------------------------------------------------------------------
(* ZooKeeper: sessions and the assignment. *)

(* The elected assigner gives a container whose host has no live session to a host that has one. *)
Assign(c, h) ==
    /\ IF assignment[c] = NoHost THEN TRUE ELSE hosts[assignment[c]] # "live"
    /\ hosts[h] = "live"
    /\ assignment' = [assignment EXCEPT ![c] = h]
    /\ UNCHANGED <<hosts, log, base, committed, replicasDown, chunks, own, history, appends, crashes,
                   expiries, losses>>

(* ZooKeeper expires the session of a host that still runs: a zombie, until it notices. *)
SessionExpires(h) ==
    /\ hosts[h] = "live"
    /\ expiries < MaxExpiries
    /\ hosts' = [hosts EXCEPT ![h] = "expired"]
    /\ expiries' = expiries + 1
    /\ UNCHANGED <<assignment, log, base, committed, replicasDown, chunks, own, history, appends, crashes,
                   losses>>

(* The zombie learns its session expired: it stops every container and registers anew. *)
Reconnect(h) ==
    /\ hosts[h] = "expired"
    /\ hosts' = [hosts EXCEPT ![h] = "live"]
    /\ own' = [own EXCEPT ![h] = [c \in Containers |-> Idle]]
    /\ UNCHANGED <<assignment, log, base, committed, replicasDown, chunks, history, appends, crashes,
                   expiries, losses>>

(* A host's process dies; its session expires (the session timeout is a wait in which it does nothing). *)
Crash(h) ==
    /\ hosts[h] # "down"
    /\ crashes < MaxCrashes
    /\ hosts' = [hosts EXCEPT ![h] = "down"]
    /\ own' = [own EXCEPT ![h] = [c \in Containers |-> Idle]]
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<assignment, log, base, committed, replicasDown, chunks, history, appends, expiries,
                   losses>>

(* A crashed host comes back with a new session. *)
Restart(h) ==
    /\ hosts[h] = "down"
    /\ hosts' = [hosts EXCEPT ![h] = "live"]
    /\ UNCHANGED <<assignment, log, base, committed, replicasDown, chunks, own, history, appends, crashes,
                   expiries, losses>>

-----------------------------------------------------------------------------
(* Tier 1: quorum commit and replica servers. *)

(* A quorum of replicas holds every accepted record. *)
QuorumCommit(c) ==
    /\ Tier1Available
    /\ Uncommitted(c)
    /\ committed' = [committed EXCEPT ![c] = Len(log[c])]
    /\ UNCHANGED <<hosts, assignment, log, base, replicasDown, chunks, own, history, appends, crashes,
                   expiries, losses>>

(* A replica server is lost: the uncommitted suffix of every log may go with it (here it always does). *)
LoseReplica ==
    /\ replicasDown < Replicas
    /\ losses < MaxReplicaLosses
    /\ replicasDown' = replicasDown + 1
    /\ losses' = losses + 1
    /\ log' = [c \in Containers |-> CommittedLog(c)]
    /\ UNCHANGED <<hosts, assignment, base, committed, chunks, own, history, appends, crashes, expiries>>

(* A replica server comes back with its store and catches up. *)
RestoreReplica ==
    /\ replicasDown > 0
    /\ replicasDown' = replicasDown - 1
    /\ UNCHANGED <<hosts, assignment, log, base, committed, chunks, own, history, appends, crashes,
                   expiries, losses>>

-----------------------------------------------------------------------------
(* A host's containers. *)

(* A live host starts a container assigned to it: it reads the committed log, appends an epoch    *)
(* record conditioned on the last sequence it read (refused while records it has not read are     *)
(* pending), waits for a quorum to hold it (fencing every older owner), recovers and serves.      *)
Start(h, c) ==
    /\ hosts[h] = "live"
    /\ assignment[c] = h
    /\ own[h][c].status = "idle"
    /\ Tier1Available
    /\ ~Uncommitted(c)
    /\ LET e == LastEpoch(c) + 1
           m == RecoveredMeta(CommittedLog(c))
           units == Recovered(c)
       IN /\ log' = [log EXCEPT ![c] = Append(@, EpochRecord(e, h))]
          /\ committed' = [committed EXCEPT ![c] = Len(log[c]) + 1]
          /\ own' = [own EXCEPT ![h][c] = [status |-> "serving", epoch |-> e, seq |-> LastSeq(c) + 1,
                                           opened |-> LastSeq(c) + 1, units |-> units, acked |-> Len(units),
                                           storage |-> m.storage, layout |-> m.layout, written |-> 0]]
    /\ UNCHANGED <<hosts, assignment, base, replicasDown, chunks, history, appends, crashes, expiries,
                   losses>>

(* A client's append: one conditional append of a record, not yet acknowledged. *)
ClientAppend(h, c) ==
    /\ Current(h, c)
    /\ ~InFlight(h, c)
    /\ Tier1Available
    /\ appends < MaxAppends
    /\ LET id == appends + 1 IN
       /\ log' = [log EXCEPT ![c] = Append(@, AppendRecord(own[h][c].epoch, h, id, Len(own[h][c].units) + 1))]
       /\ own' = [own EXCEPT ![h][c].units = Append(@, id), ![h][c].seq = @ + 1]
       /\ appends' = id
    /\ UNCHANGED <<hosts, assignment, base, committed, replicasDown, chunks, history, crashes, expiries,
                   losses>>

(* The append is acknowledged once a quorum holds its record. *)
Acknowledge(h, c) ==
    /\ Serving(h, c)
    /\ InFlight(h, c)
    /\ LET id == own[h][c].units[Len(own[h][c].units)] IN
       /\ \E i \in 1..committed[c] : log[c][i].kind = "append" /\ log[c][i].id = id
       /\ own' = [own EXCEPT ![h][c].acked = Len(own[h][c].units)]
       /\ history' = [history EXCEPT ![c] = Append(@, id)]
    /\ UNCHANGED <<hosts, assignment, log, base, committed, replicasDown, chunks, appends, crashes,
                   expiries, losses>>

(* A conditional log write of a fenced host (or one whose own record was lost) is refused: it stops. *)
LogWriteFenced(h, c) ==
    /\ Serving(h, c)
    /\ ~ExpectsLast(h, c)
    /\ Tier1Available
    /\ own' = [own EXCEPT ![h][c] = Idle]
    /\ UNCHANGED <<hosts, assignment, log, base, committed, replicasDown, chunks, history, appends, crashes,
                   expiries, losses>>

(* The StorageWriter writes every acknowledged unit beyond what Tier 2 holds into the host's own *)
(* chunk, named by its epoch (no log write: a zombie does this too).                             *)
TargetChunk(h, c) == own[h][c].epoch

WriteChunk(h, c) ==
    /\ Serving(h, c)
    /\ own[h][c].storage + own[h][c].written < own[h][c].acked
    /\ LET me == own[h][c]
           e == TargetChunk(h, c)
           new == SubSeq(me.units, me.storage + me.written + 1, me.acked)
       IN /\ chunks' = [chunks EXCEPT ![c] = [x \in DOMAIN chunks[c] \cup {e} |->
                                                IF x = e THEN ChunkUnits(c, e) \o new ELSE chunks[c][x]]]
          /\ own' = [own EXCEPT ![h][c].written = me.acked - me.storage]
    /\ UNCHANGED <<hosts, assignment, log, base, committed, replicasDown, history, appends, crashes,
                   expiries, losses>>

(* The new layout once the written units are committed: the host's chunk grows, or joins. *)
FlushedLayout(h, c) ==
    LET layout == own[h][c].layout
        e == TargetChunk(h, c)
    IN IF layout # <<>> /\ layout[Len(layout)].chunk = e
       THEN [layout EXCEPT ![Len(layout)].len = @ + own[h][c].written]
       ELSE Append(layout, [chunk |-> e, len |-> own[h][c].written])

(* The StorageWriter makes its chunk visible: a conditional append of a flush record. *)
CommitFlush(h, c) ==
    /\ Current(h, c)
    /\ own[h][c].written > 0
    /\ Tier1Available
    /\ LET me == own[h][c]
           layout == FlushedLayout(h, c)
           storage == me.storage + me.written
       IN /\ log' = [log EXCEPT ![c] = Append(@, FlushRecord(me.epoch, h, Len(me.units), storage, layout))]
          /\ own' = [own EXCEPT ![h][c] = [me EXCEPT !.layout = layout, !.storage = storage, !.written = 0,
                                                     !.seq = @ + 1]]
    /\ UNCHANGED <<hosts, assignment, base, committed, replicasDown, chunks, history, appends, crashes,
                   expiries, losses>>

(* Purge the log below a committed flush record that covers every unit before it. *)
TruncationPoints(c) ==
    {i \in 2..committed[c] : log[c][i].kind = "flush" /\ log[c][i].length <= log[c][i].storage}

Truncate(h, c) ==
    /\ Serving(h, c)
    /\ Tier1Available
    /\ \E i \in TruncationPoints(c) :
          /\ log' = [log EXCEPT ![c] = SubSeq(@, i, Len(@))]
          /\ base' = [base EXCEPT ![c] = @ + i - 1]
          /\ committed' = [committed EXCEPT ![c] = @ - (i - 1)]
    /\ UNCHANGED <<hosts, assignment, replicasDown, chunks, own, history, appends, crashes, expiries, losses>>

Next ==
    \/ \E c \in Containers, h \in Hosts : Assign(c, h)
    \/ \E h \in Hosts : SessionExpires(h) \/ Reconnect(h) \/ Crash(h) \/ Restart(h)
    \/ \E c \in Containers : QuorumCommit(c)
    \/ LoseReplica
    \/ RestoreReplica
    \/ \E h \in Hosts, c \in Containers :
          \/ Start(h, c)
          \/ ClientAppend(h, c)
          \/ Acknowledge(h, c)
          \/ LogWriteFenced(h, c)
          \/ WriteChunk(h, c)
          \/ CommitFlush(h, c)
          \/ Truncate(h, c)

(* Fairness: the environment's healing steps and a host's own progress, never a fault. *)
Fairness ==
    /\ WF_vars(RestoreReplica)
    /\ \A c \in Containers : WF_vars(QuorumCommit(c)) /\ WF_vars(\E h \in Hosts : Assign(c, h))
    /\ \A h \in Hosts :
          /\ WF_vars(Restart(h))
          /\ WF_vars(Reconnect(h))
          /\ \A c \in Containers : WF_vars(Start(h, c)) /\ WF_vars(LogWriteFenced(h, c))

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* Invariants. *)

TypeOK ==
    /\ \A h \in Hosts : hosts[h] \in {"live", "expired", "down"}
    /\ \A c \in Containers :
          /\ assignment[c] \in Hosts \cup {NoHost}
          /\ committed[c] \in 0..Len(log[c])
          /\ \A h \in Hosts : own[h][c].status \in {"idle", "serving"} /\ own[h][c].acked <= Len(own[h][c].units)
    /\ replicasDown \in 0..Replicas
    /\ appends \in 0..MaxAppends

(* At most one host's writes are accepted per container epoch, and epochs never go back in the log. *)
OneWriterPerEpoch ==
    \A c \in Containers : \A i, j \in 1..Len(log[c]) :
        /\ log[c][i].epoch = log[c][j].epoch => log[c][i].host = log[c][j].host
        /\ i <= j => log[c][i].epoch <= log[c][j].epoch

(* Fencing: once a host serves a container, every record accepted after its epoch record is its *)
(* own or of a newer epoch -- no older owner's write is accepted once the new owner serves.      *)
FencedBeforeServing ==
    \A h \in Hosts, c \in Containers : Serving(h, c) =>
        \A i \in 1..Len(log[c]) : base[c] + i > own[h][c].opened =>
            log[c][i].host = h \/ log[c][i].epoch > own[h][c].epoch

(* No acknowledged append is lost: recovering now -- from the committed log and Tier 2 -- yields    *)
(* every acknowledged append, each once, in the order appended (ids grow), and nothing unwritten.   *)
NoAcknowledgedAppendLost ==
    \A c \in Containers :
        LET r == Recovered(c) IN
        /\ Range(history[c]) \subseteq Range(r)
        /\ \A p \in 1..Len(r) : r[p] # 0 /\ (p > 1 => r[p - 1] < r[p])

(* A reader never sees data that is later lost: what any host that believes it serves would give a *)
(* reader (its acknowledged units) is a prefix of what recovery yields -- and that, by the         *)
(* invariant above, keeps every acknowledged unit.                                                  *)
ReadersSeeOnlyDurable ==
    \A h \in Hosts, c \in Containers : Serving(h, c) =>
        LET r == Recovered(c) IN
        own[h][c].acked <= Len(r) /\ SubSeq(own[h][c].units, 1, own[h][c].acked) = SubSeq(r, 1, own[h][c].acked)

(* The committed layout covers exactly the storage length. *)
LayoutCoversStorage ==
    \A c \in Containers : LayoutLength(RecoveredMeta(CommittedLog(c)).layout) = RecoveredMeta(CommittedLog(c)).storage

-----------------------------------------------------------------------------
(* Liveness: with a quorum of replicas back and ZooKeeper up, every container is eventually served, *)
(* for good, by the host the map names, with the log's current sequence.                           *)

Served(c) == assignment[c] # NoHost /\ Current(assignment[c], c)

EveryContainerServed == \A c \in Containers : <>[]Served(c)

=============================================================================
