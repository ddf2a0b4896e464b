"""EAGLE-3: a draft head that fuses three feature levels of the target and scores its own reduced vocabulary, the
method on it and its training.

Modules: ``head`` (the head, :class:`Eagle3Head`), ``checkpoint`` (its published checkpoint format: load and save,
strict key checks), ``eagle3`` (the method ``eagle3``, on EAGLE-2's dynamic tree) and ``objective`` (the training
objective ``eagle3``, with the training-time test).

Paper: EAGLE-3, Li et al., arXiv:2503.01840 (multi-layer feature fusion and the training-time test, Sec. 3).
Released code: github.com/SafeAILab/EAGLE (``eagle/model/cnets.py``, ``eagle/traineagle3/``). The tree is EAGLE-2's
(arXiv:2406.16858), shared with :mod:`methods.eagle`.
"""

from methods.eagle3 import eagle3, objective  # noqa: F401  (register eagle3 and the eagle3 objective)
from methods.eagle3.checkpoint import load_eagle3_head, save_eagle3_head
from methods.eagle3.eagle3 import Eagle3
from methods.eagle3.head import Eagle3Head

__all__ = ["Eagle3", "Eagle3Head", "load_eagle3_head", "save_eagle3_head"]
