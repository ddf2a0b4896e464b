"""``python -m harness.train <objective> ...``: the ``train`` subcommand (used under ``accelerate launch``)."""

import sys

from harness.train.cli import main

sys.exit(main())
