"""Running methods over suites: ``config`` (typed run configuration and presets in ``presets/``), ``suites``
(suite definitions, loading with checksums, scoring), ``runner`` (the one run loop, resume, data parallel), ``sweep``
(grids of method options), ``chat`` (conversation templates in ``templates/``), ``shipped`` (a shipped name or a
file), and the paper tables: ``published`` (tables as data), ``reproduce`` (run a table's protocol) and ``against``
(measured next to reported)."""
