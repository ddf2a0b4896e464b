"""``python -m harness.train <objective> ...``: the ``train`` subcommand (used under ``accelerate launch``); an entry
point, so it sits with the command line in the layer order (``tests/test_architecture.py``)."""

import sys

from harness.cli.train import main

sys.exit(main())
