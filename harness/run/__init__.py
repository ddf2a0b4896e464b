"""Running methods over suites: ``config`` (typed run configuration and presets in ``presets/``), ``suites``
(suite definitions, loading with checksums, scoring) and ``runner`` (the one run loop, resume, data parallel)."""
