----------------------------- MODULE LargeEvents -----------------------------
(***************************************************************************)
(* Large events (PDP-43A): a transient segment per large event, chunks     *)
(* written into it with conditional appends across reconnects, a merge     *)
(* that makes the whole event appear in the parent segment at once, abort, *)
(* deletion on disconnect and idle expiry -- racing the same application's *)
(* ordinary events for the same routing key.                               *)
(*                                                                         *)
(* Theory of operation.  One parent segment (the segment the routing key   *)
(* maps to) and one application.  The application writes ordinary events   *)
(* through its ordinary writer, whose appends reach the parent in order    *)
(* (`pending`), and streams large events, each through its own EventWriter *)
(* (several may be open at once).  A large event is the client's framing   *)
(* header (part 0) followed by its chunks (parts 1..Parts[w]).  An event   *)
(* of at most InlineMax chunks (under 8 MiB) never gets a transient        *)
(* segment: its commit is one plain append through the ordinary writer.  A *)
(* larger one creates a transient segment for the parent and sends its     *)
(* parts as conditional appends -- part k expects the transient segment to *)
(* hold exactly k parts -- pipelined on a connection.  The connection may  *)
(* drop: requests already on their way may still be applied later, the     *)
(* rest are lost, and replies are lost.  The writer reconnects and resends *)
(* every part not yet acknowledged; the offset check turns a resend of a   *)
(* part that is already there into a harmless failure, which tells the     *)
(* writer the part is stored (on one connection nothing before it can be   *)
(* missing). The application's `commit` blocks it (no ordinary writes      *)
(* meanwhile) until every part is acknowledged and the ordinary writer is  *)
(* flushed, then merges the transient segment into the parent: one atomic  *)
(* concatenation. `close` without `commit` aborts: the writer deletes its  *)
(* transient segment.  The segment store also deletes a transient segment  *)
(* whose writer's connection is down (the writer went away) and, by the    *)
(* idle expiry sweep, any transient segment at any time (idleness is       *)
(* timing, which the spec does not model).  A request for a deleted        *)
(* transient segment fails, and so does the large event (a retryable error *)
(* to the application).                                                    *)
(*                                                                         *)
(* Abstracted away: bytes (a part is one unit; sizes only decide the       *)
(* inline path); how the header learns the event's length (the invariant   *)
(* is the same whether the client writes it first or the merge carries     *)
(* it); retransmission of ordinary events (StreamOrdering's concern: here  *)
(* they simply arrive in order); sealing of the parent by scaling (a large *)
(* append across a seal fails, out of scope as in the PDP); transient      *)
(* segments' attributes; readers, which see prefixes of the parent -- so   *)
(* every invariant over the parent is one over what readers may see.       *)
(* Results hold only within the bounds of the configuration checked:       *)
(* Parts, InlineMax, NumOrdinary and MaxDisconnects.                       *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS
    Parts,           \* EventWriter id (1..n) -> the number of chunks of its large event
    InlineMax,       \* events of at most this many chunks commit as one plain append
    NumOrdinary,     \* ordinary events the application writes
    MaxDisconnects   \* bound on connection drops

Writers == DOMAIN Parts

ASSUME \A w \in Writers : Parts[w] \in Nat \ {0}
ASSUME InlineMax \in Nat /\ NumOrdinary \in Nat /\ MaxDisconnects \in Nat

VARIABLES
    parent,       \* the parent segment: items in order (what readers see)
    pending,      \* the ordinary writer's appends not yet in the parent, in order (blocks of items)
    issued,       \* ghost: the application's ordinary writes and large commits, in call order
    ew,           \* EventWriter -> [phase, sent, acked, conn, up]
    tseg,         \* EventWriter -> its transient segment: [state, data]
    inflight,     \* EventWriter -> conditional appends on their way: [part, conn], in send order
    disconnects   \* connection drops so far

vars == <<parent, pending, issued, ew, tseg, inflight, disconnects>>

-----------------------------------------------------------------------------
(* Items and events. *)

Item(kind, ev, part) == [kind |-> kind, ev |-> ev, part |-> part]

(* A large event as readers must see it: its header, then its chunks in order. *)
Items(w) == Parts[w] + 1
Framed(w) == [i \in 1..Items(w) |-> Item("large", w, i - 1)]

Inline(w) == Parts[w] <= InlineMax

Live(w) == ew[w].phase \in {"open", "committing"}
Dead == {"aborted", "failed", "abandoned"}

(* The application's thread is inside a large event's commit. *)
Blocked == \E w \in Writers : ew[w].phase = "committing"

OrdinaryIssued == Cardinality({i \in DOMAIN issued : issued[i].kind = "small"})

Deleted == [state |-> "deleted", data |-> <<>>]

(* The position of the oldest request of connection c among w's requests on their way. *)
Oldest(w, c) == CHOOSE i \in DOMAIN inflight[w] :
                    /\ inflight[w][i].conn = c
                    /\ \A j \in 1..(i - 1) : inflight[w][j].conn # c

Without(s, i) == [j \in 1..(Len(s) - 1) |-> IF j < i THEN s[j] ELSE s[j + 1]]

(* The segment store's conditional append: accepted only at the expected offset. *)
Accepts(w, r) == tseg[w].state = "active" /\ Len(tseg[w].data) = r.part

-----------------------------------------------------------------------------
(* Actions. *)

Init ==
    /\ parent = <<>>
    /\ pending = <<>>
    /\ issued = <<>>
    /\ ew = [w \in Writers |-> [phase |-> "open", sent |-> 0, acked |-> 0, conn |-> 0, up |-> TRUE]]
    /\ tseg = [w \in Writers |-> [state |-> "none", data |-> <<>>]]
    /\ inflight = [w \in Writers |-> <<>>]
    /\ disconnects = 0

(* The application writes an ordinary event (not while it is blocked in a commit). *)
WriteOrdinary ==
    /\ OrdinaryIssued < NumOrdinary
    /\ ~Blocked
    /\ LET e == OrdinaryIssued + 1 IN
       /\ pending' = Append(pending, <<Item("small", e, 0)>>)
       /\ issued' = Append(issued, [kind |-> "small", ev |-> e])
    /\ UNCHANGED <<parent, ew, tseg, inflight, disconnects>>

(* The ordinary writer's oldest append reaches the parent. *)
DeliverOrdinary ==
    /\ pending # <<>>
    /\ parent' = parent \o Head(pending)
    /\ pending' = Tail(pending)
    /\ UNCHANGED <<issued, ew, tseg, inflight, disconnects>>

(* The EventWriter's data outgrew the inline limit: it creates a transient segment. *)
CreateTransient(w) ==
    /\ ~Inline(w)
    /\ ew[w].phase = "open"
    /\ ew[w].up
    /\ tseg[w].state = "none"
    /\ tseg' = [tseg EXCEPT ![w] = [state |-> "active", data |-> <<>>]]
    /\ UNCHANGED <<parent, pending, issued, ew, inflight, disconnects>>

(* The writer sends its next part as a conditional append on its current connection. *)
SendChunk(w) ==
    /\ Live(w)
    /\ ~Inline(w)
    /\ tseg[w].state # "none"
    /\ ew[w].up
    /\ ew[w].sent < Items(w)
    /\ inflight' = [inflight EXCEPT ![w] = Append(@, [part |-> ew[w].sent, conn |-> ew[w].conn])]
    /\ ew' = [ew EXCEPT ![w].sent = @ + 1]
    /\ UNCHANGED <<parent, pending, issued, tseg, disconnects>>

(* The segment store handles the oldest request of connection c (connections are handled *)
(* independently, so a stale connection's requests may interleave with a new one's).  The *)
(* reply reaches the writer only on its current, live connection.                          *)
AppendChunk(w, c) ==
    /\ c \in {inflight[w][i].conn : i \in DOMAIN inflight[w]}
    /\ LET i == Oldest(w, c)
           r == inflight[w][i]
           heard == r.conn = ew[w].conn /\ ew[w].up /\ Live(w)
       IN /\ inflight' = [inflight EXCEPT ![w] = Without(@, i)]
          /\ tseg' = IF Accepts(w, r)
                     THEN [tseg EXCEPT ![w].data = Append(@, Item("large", w, r.part))]
                     ELSE tseg
          /\ ew' = IF ~heard THEN ew
                   ELSE IF tseg[w].state = "active"
                        THEN [ew EXCEPT ![w].acked = r.part + 1]   \* stored, now or before
                        ELSE [ew EXCEPT ![w].phase = "failed"]     \* the transient segment is gone
    /\ UNCHANGED <<parent, pending, issued, disconnects>>

(* The writer's connection drops: of the requests it still had on their way, the first     *)
(* `kept` reached the segment store (and may yet be applied); the rest are lost.           *)
Disconnect(w, kept) ==
    /\ Live(w)
    /\ ew[w].up
    /\ tseg[w].state # "none"
    /\ disconnects < MaxDisconnects
    /\ LET current == {i \in DOMAIN inflight[w] : inflight[w][i].conn = ew[w].conn}
       IN /\ kept \in 0..Cardinality(current)
          /\ inflight' = [inflight EXCEPT ![w] = SubSeq(@, 1, Len(@) - Cardinality(current) + kept)]
    /\ ew' = [ew EXCEPT ![w].up = FALSE]
    /\ disconnects' = disconnects + 1
    /\ UNCHANGED <<parent, pending, issued, tseg>>

(* The writer reconnects and resends everything not yet acknowledged. *)
Reconnect(w) ==
    /\ Live(w)
    /\ ~ew[w].up
    /\ ew' = [ew EXCEPT ![w].up = TRUE, ![w].conn = @ + 1, ![w].sent = ew[w].acked]
    /\ UNCHANGED <<parent, pending, issued, tseg, inflight, disconnects>>

(* The application commits.  An inline event is one plain append through the ordinary     *)
(* writer; a larger one waits for its parts and the ordinary writer, then merges.          *)
Commit(w) ==
    /\ ew[w].phase = "open"
    /\ ~Blocked
    /\ issued' = Append(issued, [kind |-> "large", ev |-> w])
    /\ IF Inline(w)
       THEN /\ pending' = Append(pending, Framed(w))
            /\ ew' = [ew EXCEPT ![w].phase = "committed"]
       ELSE /\ tseg[w].state # "none"
            /\ ew' = [ew EXCEPT ![w].phase = "committing"]
            /\ UNCHANGED pending
    /\ UNCHANGED <<parent, tseg, inflight, disconnects>>

AllAcked(w) == ew[w].acked = Items(w)
Flushed == pending = <<>>

(* MergeSegments(transient -> parent): the whole event appears at once, or, if the transient *)
(* segment is gone, the commit fails and nothing appears.                                    *)
Merge(w) ==
    /\ ew[w].phase = "committing"
    /\ ew[w].up
    /\ AllAcked(w)
    /\ Flushed
    /\ IF tseg[w].state = "active"
       THEN /\ parent' = parent \o tseg[w].data
            /\ tseg' = [tseg EXCEPT ![w] = [state |-> "merged", data |-> <<>>]]
            /\ ew' = [ew EXCEPT ![w].phase = "committed"]
       ELSE /\ ew' = [ew EXCEPT ![w].phase = "failed"]
            /\ UNCHANGED <<parent, tseg>>
    /\ UNCHANGED <<pending, issued, inflight, disconnects>>

(* `close` without `commit`: the writer deletes its transient segment. *)
Abort(w) ==
    /\ ew[w].phase = "open"
    /\ ew' = [ew EXCEPT ![w].phase = "aborted"]
    /\ tseg' = IF tseg[w].state = "active" THEN [tseg EXCEPT ![w] = Deleted] ELSE tseg
    /\ UNCHANGED <<parent, pending, issued, inflight, disconnects>>

(* The EventWriter is dropped without `close`, or its process dies: its connection closes. *)
Abandon(w) ==
    /\ ew[w].phase = "open"
    /\ ew' = [ew EXCEPT ![w].phase = "abandoned", ![w].up = FALSE]
    /\ UNCHANGED <<parent, pending, issued, tseg, inflight, disconnects>>

(* The segment store deletes the transient segment of a writer whose connection is down. *)
DeleteOnDisconnect(w) ==
    /\ ~ew[w].up
    /\ tseg[w].state = "active"
    /\ tseg' = [tseg EXCEPT ![w] = Deleted]
    /\ UNCHANGED <<parent, pending, issued, ew, inflight, disconnects>>

(* The idle-expiry sweep deletes a transient segment. *)
Expire(w) ==
    /\ tseg[w].state = "active"
    /\ tseg' = [tseg EXCEPT ![w] = Deleted]
    /\ UNCHANGED <<parent, pending, issued, ew, inflight, disconnects>>

Next ==
    \/ WriteOrdinary
    \/ DeliverOrdinary
    \/ \E w \in Writers :
          \/ CreateTransient(w)
          \/ SendChunk(w)
          \/ \E c \in 0..MaxDisconnects : AppendChunk(w, c)
          \/ \E kept \in 0..Items(w) : Disconnect(w, kept)
          \/ Reconnect(w)
          \/ Commit(w)
          \/ Merge(w)
          \/ Abort(w)
          \/ Abandon(w)
          \/ DeleteOnDisconnect(w)
          \/ Expire(w)

(* Weak fairness on the writer's and the segment store's progress, not on the application's *)
(* choices (write, commit, abort, abandon) nor on faults.  Every action here can happen only *)
(* finitely often, so one fairness condition per writer over all of them is as strong as one *)
(* per action, and TLC checks it in a fraction of the time.                                 *)
Fairness ==
    /\ WF_vars(DeliverOrdinary)
    /\ \A w \in Writers :
          WF_vars(\/ SendChunk(w)
                  \/ \E c \in 0..MaxDisconnects : AppendChunk(w, c)
                  \/ Reconnect(w)
                  \/ Merge(w)
                  \/ ew[w].phase \in Dead /\ Expire(w))

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* Invariants. *)

TypeOK ==
    /\ \A w \in Writers :
          /\ ew[w].phase \in {"open", "committing", "committed"} \cup Dead
          /\ ew[w].acked <= ew[w].sent \/ ~ew[w].up
          /\ ew[w].sent <= Items(w)
          /\ tseg[w].state \in {"none", "active", "merged", "deleted"}
          /\ ew[w].conn <= disconnects
    /\ disconnects \in 0..MaxDisconnects

(* The parent is a sequence of whole events: a large event's header is followed by exactly *)
(* its chunks, in order, with nothing in between.                                           *)
RECURSIVE Whole(_)
Whole(s) ==
    IF s = <<>> THEN TRUE
    ELSE IF Head(s).kind = "small" THEN Whole(Tail(s))
    ELSE LET n == Items(Head(s).ev)
         IN /\ Len(s) >= n
            /\ SubSeq(s, 1, n) = Framed(Head(s).ev)
            /\ Whole(SubSeq(s, n + 1, Len(s)))

HasHeader(w) == \E i \in DOMAIN parent : parent[i] = Item("large", w, 0)

(* Readers see a large event entirely or not at all, never interleaved with other events: *)
(* the parent holds whole events only, and a merged event is in it.                      *)
WholeEvents ==
    /\ Whole(parent)
    /\ \A w \in Writers : tseg[w].state = "merged" => HasHeader(w)

(* Every event is in the parent at most once. *)
EachEventOnce ==
    \A i, j \in DOMAIN parent :
        i < j /\ parent[i].part = 0 /\ parent[j].part = 0 =>
            <<parent[i].kind, parent[i].ev>> # <<parent[j].kind, parent[j].ev>>

(* An aborted, failed or abandoned large event leaves no trace: nothing of it in the parent *)
(* or on its way there, and its transient segment was never merged.                        *)
NoTraceOfDead ==
    \A w \in Writers : ew[w].phase \in Dead =>
        /\ \A i \in DOMAIN parent : parent[i].ev # w \/ parent[i].kind # "large"
        /\ tseg[w].state # "merged"

(* A transient segment only ever holds a prefix of its event: no part twice, none skipped. *)
TransientHoldsPrefix ==
    \A w \in Writers : tseg[w].data = SubSeq(Framed(w), 1, Len(tseg[w].data))

(* The application's events appear in the parent in the order it wrote or committed them: *)
(* the events that start in the parent (ordinary items and large headers), in order, are a  *)
(* subsequence of the calls.                                                               *)
EventsOf(s) == LET starts == SelectSeq(s, LAMBDA x : x.part = 0)
               IN [i \in DOMAIN starts |-> [kind |-> starts[i].kind, ev |-> starts[i].ev]]

RECURSIVE IsSubsequence(_, _)
IsSubsequence(a, b) ==
    IF a = <<>> THEN TRUE
    ELSE IF b = <<>> THEN FALSE
    ELSE IF Head(a) = Head(b) THEN IsSubsequence(Tail(a), Tail(b))
    ELSE IsSubsequence(a, Tail(b))

OrderFollowsCalls == IsSubsequence(EventsOf(parent), issued)

(* A large event reported committed to the application appears in its stream: its header is in *)
(* the parent -- or, inline, it is in the ordinary writer's ordered pipeline, which delivers it *)
(* (DeliverOrdinary; StreamOrdering checks that pipeline's retransmission).                    *)
CommittedEventsAppear ==
    \A w \in Writers : ew[w].phase = "committed" =>
        HasHeader(w) \/ \E i \in DOMAIN pending : pending[i] = Framed(w)

-----------------------------------------------------------------------------
(* Liveness. *)

(* Every commit ends: the event is merged, or the commit fails (its transient segment is gone). *)
CommitsEnd == <>[](\A w \in Writers : ew[w].phase # "committing")

(* A dead writer's transient segment is eventually deleted (by the expiry sweep if nothing else). *)
LeftoversDeleted == <>[](\A w \in Writers : ew[w].phase \in Dead => tseg[w].state # "active")

(* Every ordinary append eventually reaches the parent. *)
OrdinaryDelivered == <>[](pending = <<>>)

=============================================================================
