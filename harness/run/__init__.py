"""Running methods over suites: ``config`` (typed run configuration and presets in ``presets/``), ``suites``
(suite definitions, loading with checksums, scoring), ``runner`` (the one run loop, resume, data parallel),
``progress`` (the run's progress lines, compile seconds of the last run), ``sweep`` (grids of method options),
``chat`` (chat templates in ``templates/``) and ``shipped`` (files named by a shipped name or a path). Paper tables
are their own wing, :mod:`harness.published`."""
