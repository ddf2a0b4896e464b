"""Measurement, what is counted and derived: ``rundir`` (a run directory's files, atomic writes, the manifest's reader
and schema), the metrics, every one defined once with its formula in its docstring (``metrics``: throughput,
speed-ups and their CIs, memory, quality, losslessness and divergence, load levels; ``acceptance``: τ and acceptance;
``headroom``: headroom, time, energy and cost; ``noise``: run-to-run noise, prediction bands), ``trackers``
(synchronised wall time, memory, energy), ``env`` (provenance), ``records`` (one measured turn: schema and durable
store) and ``syncs`` (host-device round trips per step) and ``validity`` (the checks a run's speed numbers
must pass to mean what they say). Their presentation is :mod:`harness.report`, the gate
:mod:`harness.gate`."""
