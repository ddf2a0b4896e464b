"""Hydra: sequentially dependent draft heads, the method on them and their training.

Modules: ``head`` (the heads, :class:`HydraHeads`, and Hydra++'s prefix layer), ``checkpoint`` (their published
checkpoint format: load and save, strict key checks), ``hydra`` (the method ``hydra``, on Medusa's static trees) and
``objective`` (the training objective ``hydra``).

Paper: Hydra, Ankner et al., arXiv:2402.05109 (Hydra heads, Sec. 3; training objectives and Hydra++, Sec. 4).
Released code: github.com/zankner/Hydra.
"""

from methods.hydra import hydra, objective  # noqa: F401  (register hydra and its objective)
from methods.hydra.checkpoint import load_hydra_heads, save_hydra_heads
from methods.hydra.head import HydraHeads
from methods.hydra.hydra import Hydra

__all__ = ["Hydra", "HydraHeads", "load_hydra_heads", "save_hydra_heads"]
