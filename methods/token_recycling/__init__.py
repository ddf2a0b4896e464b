"""Token Recycling: the method ``token_recycling`` (``token_recycling``) and its adjacency matrix of recycled
successor candidates with the breadth-first fill of a static tree from it (``adjacency``).

Paper: Token Recycling, Luo et al., arXiv:2408.08696 (Sec. 3).
"""

from methods.token_recycling import token_recycling  # noqa: F401  (register token_recycling)
