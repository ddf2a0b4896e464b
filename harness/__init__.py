"""draftbench harness: the shared core every decoding method and suite runs on.

The folders are the architecture. The layers, lowest first (``LAYERS`` in ``tests/test_architecture.py``, which
enforces over the import graph that a module imports only from its own layer or a lower one):

    sandbox, schema         the fenced runner for untrusted code (HumanEval completions); the one validator of
                            plain data against dataclass annotations and its error type, InputError (both standard
                            library only; every layer reads options, configurations and tables with the validator)
    measure/                what is counted and derived: run directory (its files, atomic writes, the manifest),
                            metrics (every formula once), trackers (time, memory, energy), provenance, records (the
                            schema of one measured turn and its durable store), host-sync counting
    report/                 the measurements presented: tables, plots, Markdown and the report, ablations, the HTML
                            report, the referee and load tables, exports in engines' field names
    gate/                   baselines and the regression gate (two runs, baselines or exports compared cell by cell)
    models                  loading target models (the embedded default, Hugging Face ids, local folders)
    engine/                 the speculative maths and the one verification engine every method runs on
    registry                plugin registries (methods, scorers, suite folders, data commands) and plugin loading
    backends/               engines other than the harness's own (vLLM in its own venv, through a worker process)
                            behind one contract: a method entry's turns in, the same per-turn records out; not to
                            be confused with engine/, the verification engine of the ``harness`` engine
    run/                    running suites: configuration and presets, suites, the runner, sweeps, chat templates
    published/              paper tables: tables (the format), reproduce (a table's protocol as runs), dryrun, against
                            (measured next to reported)
    train/                  training draft heads: sources, features, dataset, objectives, loop, sweeps
    cli/, gpucheck          the ``draftbench`` command (a module per command) and the GPU check

The core never imports a plugin (``methods``, ``suites``, entry points): the registries load them by name
(:func:`harness.registry.load_plugins`). Plugins import the core; there are no import cycles, and no module imports
another module's private (``_``-prefixed) names.
"""

__version__ = "0.1.0"
