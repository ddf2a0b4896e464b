"""draftbench harness: the shared core every decoding method and suite runs on.

The folders are the architecture; a module imports only from its own layer or the layers above it in this list
(``tests/test_architecture.py`` enforces it over the import graph):

    registry, sandbox       plugin registries and plugin loading; the fenced runner for untrusted code (stdlib only)
    schema                  the one validator of plain data against dataclass annotations and its error type,
                            InputError (stdlib only; every layer reads options, configurations and tables with it)
    measure/                metrics (every formula once), trackers (time, memory, energy), provenance, records
                            (the schema of one measured turn and its durable store), report (tables and plots)
    models                  loading target models (the embedded default, Hugging Face ids, local folders)
    engine/                 the speculative maths and the one verification engine: sampling, tree, verify, kv,
                            method (the contract), speculative (the loop), draftcache, draftvocab, checkpoints,
                            autotune
    run/                    running suites: config and presets, suites (definitions, loading, scoring), runner
    train/                  training draft heads: sources, features, dataset, objectives, loop, cli
    cli                     the ``draftbench`` command

The core never imports a plugin (``methods``, ``suites``, entry points): the registries load them by name
(:func:`harness.registry.load_plugins`). Plugins import the core; there are no import cycles, and no module imports
another module's private (``_``-prefixed) names.
"""

__version__ = "0.1.0"
