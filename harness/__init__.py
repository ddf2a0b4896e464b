"""draftbench harness: the shared core every decoding method and suite runs on.

The folders are the architecture. The layers, lowest first (``LAYERS`` in ``tests/test_architecture.py``, which
enforces over the import graph that a module imports only from its own layer or a lower one):

    sandbox                 the fenced runner for untrusted code (stdlib only)
    measure/                run directory (its files, atomic writes, the manifest), metrics (every formula once),
                            trackers (time, memory, energy), provenance, records (the schema of one measured turn and
                            its durable store), report (tables and plots), compare and baseline (regression gate)
    models                  loading target models (the embedded default, Hugging Face ids, local folders)
    engine/                 the speculative maths and the one verification engine: sampling, tree, verify, kv,
                            method (the contract), speculative (the loop), draftcache, draftvocab, checkpoints,
                            autotune
    registry                plugin registries and plugin loading
    run/                    running suites: config and presets, suites (definitions, loading, scoring), runner,
                            sweep, chat templates
    published/              paper tables: tables (the format), reproduce (a table's protocol as runs), dryrun, against
                            (measured next to reported)
    train/                  training draft heads: sources, features, dataset, objectives, loop, sweep
    cli/, gpucheck          the ``draftbench`` command (a module per command) and the GPU check

The core never imports a plugin (``methods``, ``suites``, entry points): the registries load them by name
(:func:`harness.registry.load_plugins`). Plugins import the core; there are no import cycles, and no module imports
another module's private (``_``-prefixed) names.
"""

__version__ = "0.1.0"
