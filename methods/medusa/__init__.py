"""Medusa-1: heads on the target's last feature, the method on them and their training.

Modules: ``head`` (the heads, :class:`MedusaHeads`, and their residual block), ``checkpoint`` (their published
checkpoint format: load and save, strict key checks), ``medusa`` (the method ``medusa``, static trees) and
``objective`` (the training objective ``medusa``).

Paper: Medusa, Cai et al., arXiv:2401.10774 (heads, Sec. 2.1.1; tree attention, Sec. 2.1.2; Medusa-1 training,
Sec. 2.2.1; typical acceptance, Sec. 2.3.1). Released code: github.com/FasterDecoding/Medusa.
"""

from methods.medusa import medusa, objective  # noqa: F401  (register medusa and its objective)
from methods.medusa.checkpoint import load_medusa_heads, save_medusa_heads
from methods.medusa.head import MedusaHeads
from methods.medusa.medusa import Medusa

__all__ = ["Medusa", "MedusaHeads", "load_medusa_heads", "save_medusa_heads"]
