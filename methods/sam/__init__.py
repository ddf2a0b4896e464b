"""SAM-Decoding: the method ``sam`` (``sam``), its suffix automata (``automaton``: the dynamic one over the context,
built online, and the static one over a corpus, frozen into arrays) and ``draftbench data static-sam``, which builds
the static automaton once over REST's datastore (``build``).

Paper: SAM-Decoding, Hu et al., arXiv:2411.10666 (suffix automata and drafting, Sec. 3). Released code:
github.com/hyx1999/SAM-Decoding.
"""

from methods.sam import build, sam  # noqa: F401  (register sam and the data command static-sam)
