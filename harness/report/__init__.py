"""The report, the measurements presented: ``tables`` (tidy tables from records), ``context`` (the tables of
context-length buckets and the crossover), ``markdown`` (the paper table and the summary's sections), ``plots``,
``formatting`` (n/a, numbers, CIs, Markdown rows), ``report`` (rebuilds a run's tables, plots and pages),
``ablation`` (knob columns, the ablation table and plots), ``html`` (the self-contained ``report.html``),
``referee`` (an engine's entry held against the harness's own), ``precision`` (the precision matrix: target x
head precision), ``load`` (the report of a run's load levels) and
``exports`` (per-request acceptance records in engines' field names, and back)."""
