"""Built-in decoding methods. Every module or package here registers itself with ``@register_method`` on import.

Adding a method: 1. write ``methods/<name>.py`` with a ``Method`` (or ``SpeculativeMethod``) subclass decorated by
``@register_method("<name>")``; 2. optionally a preset in ``harness/run/presets/``; 3. its own tests in ``tests/``
(the losslessness tests already cover every registered method, built by ``Method.example``: a method with learned
draft parts overrides it to build them randomly instead of loading a checkpoint).

One layout: the module that registers the method ``<name>`` is named ``<name>``. A method with a structure of its
own becomes a package ``methods/<name>/`` holding ``<name>.py`` and the structure, named for what it is
(``sam/automaton``, ``suffix/suffixtree``, ``rest/datastore``, ``token_recycling/adjacency``,
``layer_skip/layersearch``, ``pld/lookup``; ``rest/build`` and ``sam/build`` add the ``draftbench data`` commands that
build theirs, :func:`harness.registry.register_data_command`). A method with a draft head is a package with the same
file for the same role: ``head`` (the head, an ``nn.Module``), ``checkpoint`` (its published checkpoint format: load
and save, strict key checks), the method module(s) named for the method(s), ``objective`` (the training objective),
and ``draft`` where several methods share the head's plumbing: ``eagle`` (``eagle1``, ``eagle2``, ``draft``,
``treepolicies``), ``eagle3`` (``eagle3``), ``jakiro`` (``jakiro``, ``jakiro_star``, ``draft``, ``moe``), ``medusa``
(``medusa``), ``hydra`` (``hydra``). Flat modules: ``vanilla``, ``sps``, ``lookahead``.

Heads trained for the embedded targets are shipped in ``methods/heads/<target>/<kind>`` (:data:`SHIPPED_HEADS`).
"""

import importlib
import pkgutil
from pathlib import Path

SHIPPED_HEADS = Path(__file__).resolve().parent / "heads"

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
