--------------------------- MODULE TransactionsMC ---------------------------
(* Layouts and fenced requests for the model-checking configurations of     *)
(* Transactions (a .cfg file cannot spell sequences of sets or records).    *)
EXTENDS Transactions

(* One segment owning both keys, then a split into one segment per key. *)
SplitLayouts == << <<{"k1", "k2"}>>, <<{"k1"}, {"k2"}>> >>

(* One key; the stream scales once, its segment replaced by a new one. *)
Rescale == << <<{"k1"}>>, <<{"k1"}>> >>

(* One key, one segment, no scaling. *)
OneSegment == << <<{"k1"}>> >>

(* Two keys, a segment each, no scaling. *)
TwoSegments == << <<{"k1"}, {"k2"}>> >>

NoFencedRequests == {}

(* A Spark driver's fenced multi-commits: batch 1 by transaction 1; the same batch replayed with  *)
(* transaction 2 by a driver that crashed after committing it; batch 2 by both transactions at   *)
(* once.  With retries of each, every order of these is explored: a fence with two values.       *)
SparkReplay ==
    { [txns |-> {1}, key |-> "q", value |-> 1],
      [txns |-> {2}, key |-> "q", value |-> 1],
      [txns |-> {1, 2}, key |-> "q", value |-> 2] }
=============================================================================
