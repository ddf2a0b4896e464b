"""The gate: ``baseline`` (committed baselines: a run, a baseline or an export read back as the same tables, saved
with provenance), ``compare`` (two sides compared cell by cell, the regression gate's thresholds and verdicts) and
``formats`` (the comparison as a terminal table, Markdown, JSON and an HTML page)."""
