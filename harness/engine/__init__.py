"""The speculative maths and the one verification engine every method runs on.

``method`` (the contract every decoding method implements), ``sampling`` (temperature / top-p / top-k), ``tree``
(draft trees, masks, static trees, dynamic-tree selection, grafting a chain onto a tree), ``verify`` (greedy and
lossless speculative-sampling acceptance), ``kv`` (target cache compaction), ``speculative`` (the loop: propose, one
target forward, verify, compact, accept), ``speculationstop`` (the loop's policy of speculation off for the rest of a
turn), ``runtime`` (the one seam for target forwards: eager or compiled), ``compilecache`` (where compiled graphs are
kept across runs and which of them a run may load), ``hostio`` (small host-device transfers
without stalling the queue), ``draftcache`` (a self-drafting method's own cache), ``draftvocab`` (reduced draft
vocabulary), ``checkpoints`` (reading draft-head checkpoints with strict key checks) and ``autotune`` (tree sizes
from measured costs).

A structure that serves one method's drafting lives beside that method in ``methods/``.
"""
