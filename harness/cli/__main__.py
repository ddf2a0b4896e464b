"""``python -m harness.cli ...`` (e.g. under ``accelerate launch``): the ``draftbench`` command."""

import sys

from harness.cli import main

sys.exit(main())
