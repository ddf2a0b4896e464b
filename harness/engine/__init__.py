"""The speculative maths and the one verification engine every method runs on.

``method`` (the contract every decoding method implements), ``sampling`` (temperature / top-p / top-k), ``tree``
(draft trees, masks, static trees, dynamic-tree selection), ``verify`` (greedy and lossless speculative-sampling
acceptance), ``kv`` (target cache compaction), ``speculative`` (the loop: propose, one target forward, verify,
compact, accept), ``draftcache`` (a self-drafting method's own cache), ``draftvocab`` (reduced draft vocabulary),
``checkpoints`` (reading draft-head checkpoints with strict key checks), ``autotune`` (timed tree sizes) and
``treepolicies`` (per-step policies a tree method can hold: a grafted prompt-lookup chain, adaptive tree sizes).
"""
