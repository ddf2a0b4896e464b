"""Measurement: ``rundir`` (a run directory's files, atomic writes, the manifest's reader and schema), ``metrics``
(every metric defined once, formulas in docstrings), ``trackers`` (synchronised wall time, memory, energy), ``env``
(provenance), ``records`` (one measured turn: schema and durable store), ``tables`` (tidy tables from records),
``markdown`` (the paper table and the summary's sections), ``plots``, ``formatting`` (n/a, numbers, CIs, Markdown
rows), ``report`` (rebuilds a run's tables, plots and pages), ``ablation`` (knob columns, the ablation table and
plots), ``html`` (the self-contained ``report.html``), ``syncs`` (host-device round trips per step), ``referee``
(an engine's entry held against the harness's own), ``load`` (the report of a run's load levels) and ``exports``
(per-request acceptance records in engines' field names, and back)."""
