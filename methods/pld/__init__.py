"""Prompt lookup decoding: the method ``pld`` (``pld``) and prompt lookup's n-gram matching (``lookup``), which
EAGLE-2's dynamic-tree methods also graft onto their trees (:class:`methods.eagle.treepolicies.LookupGraft`).

Paper: Saxena 2023, "Prompt Lookup Decoding" (github.com/apoorvumang/prompt-lookup-decoding).
"""

from methods.pld import pld  # noqa: F401  (register pld)
