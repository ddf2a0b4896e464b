"""SuffixDecoding: the method ``suffix`` (``suffix``) and its suffix trees with frequency counts and the greedy
speculation tree grown from a match (``suffixtree``).

Paper: SuffixDecoding, Oliaro et al., arXiv:2411.04975 (Sec. 3-4). Released code:
github.com/snowflakedb/ArcticInference.
"""

from methods.suffix import suffix  # noqa: F401  (register suffix)
