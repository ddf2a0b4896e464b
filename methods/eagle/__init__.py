"""EAGLE-1 and EAGLE-2: a one-layer draft head on the target's features, the methods on it and its training.

Modules: ``head`` (the head, :class:`EagleHead`), ``checkpoint`` (its published checkpoint format: load and save,
strict key checks), ``draft`` (what the methods on the head share, :class:`EagleMethodBase`), ``eagle1`` (the method
``eagle1``, static tree), ``eagle2`` (the method ``eagle2``, dynamic tree, with :class:`DynamicTreeOptions`, the
options every dynamic-tree method extends), ``treepolicies`` (the per-step policies a dynamic tree can hold: a
grafted prompt-lookup chain, adaptive tree sizes, backing off to the chain alone or no draft) and ``objective`` (the
training objective ``eagle``).

Papers: EAGLE, Li et al., arXiv:2401.15077 (the head, Sec. 3.1; training, Sec. 3.2; static tree, Sec. 3.3);
EAGLE-2, Li et al., arXiv:2406.16858 (context-aware dynamic draft tree, Sec. 4). Released code:
github.com/SafeAILab/EAGLE (``eagle/model/cnets.py``, ``eagle/train/main.py``).
"""

from methods.eagle import eagle1, eagle2, objective  # noqa: F401  (register eagle1, eagle2 and the eagle objective)
from methods.eagle.checkpoint import load_eagle_head, save_eagle_head
from methods.eagle.draft import EagleMethodBase
from methods.eagle.eagle1 import Eagle1
from methods.eagle.eagle2 import DynamicTreeOptions, Eagle2
from methods.eagle.head import EagleHead

__all__ = ["DynamicTreeOptions", "Eagle1", "Eagle2", "EagleHead", "EagleMethodBase", "load_eagle_head",
           "save_eagle_head"]
