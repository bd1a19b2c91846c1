---------------------------- MODULE LargeEventsMC ----------------------------
(* Event sizes for the model-checking configurations of LargeEvents.        *)
EXTENDS LargeEvents

(* Writer 1's event fits under the inline limit (a plain append); writer 2's needs a *)
(* transient segment.                                                              *)
InlineAndTransient == <<1, 2>>

(* One large event through a transient segment (with InlineMax = 0, a one-chunk event too). *)
OneChunk == <<1>>

(* One large event through a transient segment. *)
OneTransient == <<2>>

(* Two large events through transient segments, open at once. *)
TwoTransient == <<2, 2>>
=============================================================================
