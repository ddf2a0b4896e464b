"""Published tables, the paper-tables wing: ``tables`` (a paper's or leaderboard's table as validated YAML data),
``reproduce`` (a table's protocol planned as ordinary runs, and run), ``dryrun`` (what a reproduction would load:
sizes, GPU memory, generations) and ``against`` (a run's records measured next to a table's reported numbers)."""
