"""The built-in benchmark suites: one YAML definition per suite in this folder (the fields are described in
:mod:`harness.run.suites`), bundled questions in ``data/``, and the quality scorers the definitions name
(:mod:`suites.scoring`). Importing the package registers both with :mod:`harness.registry`.
"""

from pathlib import Path

from harness.registry import register_suite_dir

register_suite_dir(Path(__file__).resolve().parent)

from suites import scoring  # noqa: E402,F401  (registers the scorers)
