"""EAGLE-1 and EAGLE-2: a one-layer draft head on the target's features (``head``), its published checkpoint format
(``checkpoint``), what the methods on it share (``draft``), the methods ``eagle1`` (static tree, ``eagle1``) and
``eagle2`` (dynamic tree, ``eagle2``, with :class:`DynamicTreeOptions`, the options every dynamic-tree method
extends) and the training objective ``eagle`` (``objective``).

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
