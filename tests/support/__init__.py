"""Support modules of the tests (helpers, tiny in-process models, scripts the tests start as subprocesses); no tests
here."""
