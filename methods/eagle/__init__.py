"""EAGLE-1 and EAGLE-2: a one-layer draft head on the target's features (``head``), its published checkpoint format
(``checkpoint``), the methods ``eagle1`` (static tree) and ``eagle2`` (dynamic tree) (``drafting``) and the training
objective ``eagle`` (``objective``).

Papers: EAGLE, Li et al., arXiv:2401.15077 (the head, Sec. 3.1; training, Sec. 3.2; static tree, Sec. 3.3);
EAGLE-2, Li et al., arXiv:2406.16858 (context-aware dynamic draft tree, Sec. 4). Released code:
github.com/SafeAILab/EAGLE (``eagle/model/cnets.py``, ``eagle/train/main.py``).
"""

from methods.eagle import drafting, objective  # noqa: F401  (register eagle1, eagle2 and the eagle objective)
from methods.eagle.checkpoint import load_eagle_head, save_eagle_head
from methods.eagle.drafting import Eagle1, Eagle2, EagleMethodBase
from methods.eagle.head import EagleHead

__all__ = ["Eagle1", "Eagle2", "EagleHead", "EagleMethodBase", "load_eagle_head", "save_eagle_head"]
