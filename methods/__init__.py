"""Built-in decoding methods. Every module or package here registers itself with ``@register_method`` on import.

Adding a method: 1. write ``methods/<name>.py`` with a ``Method`` (or ``SpeculativeMethod``) subclass decorated by
``@register_method("<name>")``; 2. optionally a preset in ``harness/run/presets/``; 3. its own tests in ``tests/``
(the losslessness tests already cover every registered method, built by ``Method.example``: a method with learned
draft parts overrides it to build them randomly instead of loading a checkpoint). A method that grows a draft head, a
checkpoint
format and a training objective becomes a package along those seams (``methods/eagle/``: ``head``, ``checkpoint``,
``draft``, ``eagle1``, ``eagle2``, ``objective``).

Heads trained for the embedded targets are shipped in ``methods/heads/<target>/<kind>`` (:data:`SHIPPED_HEADS`).
"""

import importlib
import pkgutil
from pathlib import Path

SHIPPED_HEADS = Path(__file__).resolve().parent / "heads"

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
