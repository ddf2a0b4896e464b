"""Published tables, the paper-tables wing: ``tables`` (a paper's or leaderboard's table as validated YAML data),
``reproduce`` (plan a table's protocol as ordinary runs, the ``--dry-run`` arithmetic, run them) and ``against``
(a run's records measured next to a table's reported numbers)."""
