"""Medusa-1: heads on the target's last feature (``heads``, with their published checkpoint format), the method
``medusa`` (``drafting``) and the training objective ``medusa`` (``objective``).

Paper: Medusa, Cai et al., arXiv:2401.10774 (heads, Sec. 2.1.1; tree attention, Sec. 2.1.2; Medusa-1 training,
Sec. 2.2.1; typical acceptance, Sec. 2.3.1). Released code: github.com/FasterDecoding/Medusa.
"""

from methods.medusa import drafting, objective  # noqa: F401  (register medusa and its objective)
from methods.medusa.drafting import Medusa
from methods.medusa.heads import MedusaHeads, load_medusa_heads, save_medusa_heads

__all__ = ["Medusa", "MedusaHeads", "load_medusa_heads", "save_medusa_heads"]
