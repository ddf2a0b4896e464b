"""Built-in decoding methods. Every module here registers itself with ``@register_method`` on import.

Adding a method: 1. write ``methods/<name>.py`` with a ``Method`` (or ``SpeculativeMethod``) subclass decorated by
``@register_method("<name>")``; 2. add its test in ``tests/``; 3. optionally a preset in ``presets/``.
"""

import importlib
import pkgutil

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
