"""Self-speculative decoding by layer skipping: the method ``layer_skip`` (``layer_skip``) and SWIFT's on-the-fly
search of the skipped layer set (``layersearch``: candidate sets, their matchness, the Bayesian proposals).

Papers: Draft & Verify, Zhang et al., arXiv:2309.08168; SWIFT, Xia et al., arXiv:2410.06916 (Sec. 4.1, context-based
layer set optimization); LayerSkip, Elhoushi et al., arXiv:2404.16710.
"""

from methods.layer_skip import layer_skip  # noqa: F401  (register layer_skip)
