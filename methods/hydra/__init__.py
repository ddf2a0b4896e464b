"""Hydra: sequentially dependent draft heads (``heads``, with their published checkpoint format), the method
``hydra`` (``drafting``, on Medusa's static trees) and the training objective ``hydra`` (``objective``).

Paper: Hydra, Ankner et al., arXiv:2402.05109 (Hydra heads, Sec. 3; training objectives and Hydra++, Sec. 4).
Released code: github.com/zankner/Hydra.
"""

from methods.hydra import drafting, objective  # noqa: F401  (register hydra and its objective)
from methods.hydra.drafting import Hydra
from methods.hydra.heads import HydraHeads, load_hydra_heads, save_hydra_heads

__all__ = ["Hydra", "HydraHeads", "load_hydra_heads", "save_hydra_heads"]
