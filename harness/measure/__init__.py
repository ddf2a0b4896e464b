"""Measurement, what is counted and derived: ``rundir`` (a run directory's files, atomic writes, the manifest's reader
and schema), ``metrics`` (every metric defined once, formulas in docstrings), ``trackers`` (synchronised wall time,
memory, energy), ``env`` (provenance), ``records`` (one measured turn: schema and durable store) and ``syncs``
(host-device round trips per step). Their presentation is :mod:`harness.report`, the gate :mod:`harness.gate`."""
