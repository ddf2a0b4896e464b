"""Jakiro and Jakiro*: EAGLE draft heads whose MLP is a mixture of experts, their published checkpoint formats, the
methods ``jakiro`` (EAGLE-2 dynamic tree, hybrid autoregressive/parallel decoding) and ``jakiro_star`` (EAGLE-1
static tree, per-expert sampling), and the training objective ``jakiro``.

Paper: Jakiro, arXiv:2502.06282 (decoupled MoE draft head; hybrid autoregressive/parallel decoding with a
contrastive output). Released code: github.com/haiduo/Jakiro (``jakiro/model/cnets.py``, ``jakiro_star/``,
``jakiro/train/main.py``); where the code and the paper differ, the code is followed and the option names say so.

Modules: ``moe`` (router maths, experts), ``head`` (the head, :class:`JakiroHead`), ``checkpoint`` (its published
checkpoint formats: load and save, strict key checks), ``draft`` (what the two methods share), ``jakiro`` (the method
``jakiro``), ``jakiro_star`` (the method ``jakiro_star``) and ``objective`` (the training objective ``jakiro``).

The head (:class:`JakiroHead`) is :class:`methods.eagle.EagleHead` with ``layers.0.mlp`` replaced by
``layers.0.mlp_moe`` (:class:`JakiroMoE`). With ``u = post_attention_layernorm(h)`` and ``h = x + Attn(x)``:

- router logits ``r = gate(u)``: N + 2 of them for Jakiro (N for Jakiro*, which has no contrast);
- the K selected experts are the top-K of ``r[:N]``, weighted by the softmax over their own logits
  (:func:`select_experts`; the released N > 2 code weights them by ``softmax(r[:2])`` whatever was picked, a bug);
- mixture ``M = h + sum_j w_j e_{s_j}(u)``;
- contrast ``C = h + v_hi e_hi - v_lo e_lo`` with ``v = softmax(r[N:N+2])`` (:func:`contrast_coefficients`);
- expert features ``h + e_{s_j}(u)`` (unweighted, as Jakiro* uses them at inference).

Training and inference run the same module: :meth:`JakiroHead.forward_outputs` computes what its arguments ask
for (``contrast``, ``experts``, ``last_only``); the plain ``forward`` returns M, so EAGLE's machinery (stable KV,
unrolled accuracy) works unchanged.

The checkpoint format is described in :mod:`methods.jakiro.checkpoint`.
"""

from methods.jakiro import jakiro, jakiro_star, objective  # noqa: F401  (register jakiro, jakiro_star and the objective)
from methods.jakiro.checkpoint import load_jakiro_head, save_jakiro_head
from methods.jakiro.head import JakiroHead
from methods.jakiro.jakiro import Jakiro
from methods.jakiro.jakiro_star import JakiroStar
from methods.jakiro.moe import (
           JakiroMoE,
           contrast_coefficients,
           contrast_pair,
           select_experts,
)

__all__ = ["Jakiro", "JakiroHead", "JakiroMoE", "JakiroStar", "contrast_coefficients", "contrast_pair",
           "load_jakiro_head", "save_jakiro_head", "select_experts"]
