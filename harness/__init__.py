"""draftbench harness: the shared core every decoding method and suite runs on.

Layers (a module only imports the ones above it):
    registry, sampling, metrics          pure, no model
    models, method, trackers             target loading, the method contract, measurement
    tree, verify, kv, engine             the speculative maths and the one verification engine
    records, config, runner, report      running suites and turning records into tables and plots
"""

__version__ = "0.1.0"
