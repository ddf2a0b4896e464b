"""Running methods over suites: ``config`` (typed run configuration and presets in ``presets/``), ``suites``
(suite definitions, loading with checksums, scoring), ``runner`` (the one run loop, resume, data parallel),
``entries`` (the one door for a turn: a run's method entries planned and checked once, each asked for its turns
the same way whatever engine runs it, and a turn's token budget),
``manifest`` (a new run directory, its manifest, what resuming reads and checks), ``progress`` (the run's progress
lines, compile seconds of the last run), ``sweep`` (grids of method options), ``chat`` (chat templates in
``templates/``), ``shipped`` (files named by a shipped name or a path), ``context`` (suites built at target input
lengths from real documents) and ``load`` (load levels: many requests in flight on a served engine; their report is
:mod:`harness.report.load`). Paper tables are their own wing, :mod:`harness.published`."""
