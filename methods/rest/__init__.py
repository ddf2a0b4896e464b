"""REST: the method ``rest`` (``rest``), its datastore (``datastore``: a token corpus with a suffix array, retrieval
and the trie of continuations) and ``draftbench data datastore``, which builds the datastore once from a corpus
(``build``).

Paper: REST, He et al., arXiv:2311.08252 (datastore, retrieval and draft trie, Sec. 3). Released code:
github.com/FasterDecoding/REST.
"""

from methods.rest import build, rest  # noqa: F401  (register rest and the data command datastore)
