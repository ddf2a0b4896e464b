"""Training draft heads: conversations and the contamination check (``sources``), the target's features in
resumable shards (``features``), the training view (``dataset``), pluggable objectives (``objectives``; each head's
objective lives beside the head in ``methods/``), one accelerate loop (``loop``), grids of heads (``sweep``), the
data-scaling curve (``scaling``), a saved head scored on a held-out split (``evaluate``) and self-distillation's
generation stage (``distill``: the target's own answers). The commands (``draftbench data build | merge | vocab``,
``draftbench train``) are in :mod:`harness.cli`; ``__main__`` is ``python -m harness.train`` (accelerate's entry
point). REST's datastore, built from a corpus too, is REST's own (``draftbench data datastore``, registered by the
plugin)."""
