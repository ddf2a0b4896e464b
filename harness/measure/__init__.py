"""Measurement: ``metrics`` (every metric defined once, formulas in docstrings), ``trackers`` (synchronised wall
time, memory, energy), ``env`` (provenance), ``records`` (one measured turn: schema and durable store), ``report``
(tidy tables, the paper table and plots, rebuilt from records), ``ablation`` (knob columns, the ablation table and
plots), ``html`` and ``browser`` (the self-contained ``report.html`` and a headless-Chromium check of it), ``syncs``
(host-device round trips per step), ``baseline`` and ``compare`` (committed baselines and the regression gate)."""
