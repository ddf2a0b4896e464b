"""Training draft heads: conversations and the contamination check (``sources``), the target's features in
resumable shards (``features``), the training view (``dataset``), pluggable objectives (``objectives``; each head's
objective lives beside the head in ``methods/``), one accelerate loop (``loop``), grids of heads (``sweep``), the
data-scaling curve (``scaling``) and a saved head scored on a held-out split (``evaluate``). The commands
(``draftbench data build | merge | vocab``, ``draftbench train``) are in :mod:`harness.cli`."""
