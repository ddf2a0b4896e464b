"""Measurement: ``rundir`` (a run directory's files, atomic writes, the manifest's reader and schema), ``metrics``
(every metric defined once, formulas in docstrings), ``trackers`` (synchronised wall time, memory, energy), ``env``
(provenance), ``records`` (one measured turn: schema and durable store) and ``report`` (tidy tables, the paper table
and plots, rebuilt from records)."""
