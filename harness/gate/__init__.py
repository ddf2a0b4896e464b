"""The gate: ``baseline`` (committed baselines: a run, a baseline or an export read back as the same tables, saved
with provenance) and ``compare`` (two sides compared cell by cell, the regression gate's thresholds and verdicts)."""
