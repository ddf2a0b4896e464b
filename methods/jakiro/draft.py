"""What ``jakiro`` and ``jakiro_star`` share: forwards of a :class:`methods.jakiro.head.JakiroHead` on the stable
draft KV and on tree continuations that ask for the extra outputs (contrast, per-expert features), and the checks
of the expert options against a checkpoint.
"""

from __future__ import annotations

import torch

from harness.engine.checkpoints import CheckpointError
from harness.engine.draftcache import DraftCache, DraftKV
from methods.jakiro.head import JakiroHead, JakiroOutputs


class MoEDraft:
    """Forwards of a :class:`JakiroHead` on the stable KV and on tree continuations, asking for extra outputs."""

    head: JakiroHead
    cache: DraftCache

    def describe(self) -> dict:
        """The options with the expert counts in effect: ``num_experts`` / ``experts_per_tok`` null (= the
        checkpoint's) are recorded as the checkpoint's N and K, so a sweep over heads gets an ``opt.num_experts``
        column from the head itself, never from a folder name or label."""
        described = super().describe()
        described["options"] = {**described["options"], "num_experts": self.head.moe.num_experts,
                                "experts_per_tok": self.options.experts_per_tok or self.head.config.num_experts_per_tok}
        return described

    def stable_outputs(self, root: int, contrast: bool = False, experts: bool = False) -> JakiroOutputs:
        """Run the positions committed since the last cycle (the last paired with ``root``) into the stable KV; the
        outputs of the last position only (``mixture [1, H]`` etc.)."""
        feats, tokens, pos = self.cache.pending(root)  # [n, H], [n], [n]
        out, kv = self.head.forward_outputs(feats[None].to(self.target.dtype), tokens[None], pos[None], self.cache.kv,
                                            self.cache.pending_mask(feats.device), contrast=contrast, experts=experts,
                                            last_only=True)
        self.cache.advance(kv)
        self.count_draft_forward()
        return out.unbatch()

    def tree_outputs(self, features: torch.Tensor, tokens: torch.Tensor, position: torch.Tensor, kv: DraftKV,
                     tree_cols: torch.Tensor, contrast: bool = False,
                     experts: bool = False) -> tuple[JakiroOutputs, DraftKV]:
        """One draft forward over tree nodes (as :meth:`methods.eagle.draft.EagleMethodBase.tree_forward`) with the
        outputs asked for."""
        stable = self.cache.stable_columns(tokens.shape[0], tokens.device)
        out, kv = self.head.forward_outputs(features[None], tokens[None], position[None], kv,
                                            torch.cat([stable, tree_cols], 1), contrast=contrast, experts=experts)
        self.count_draft_forward()
        return out.unbatch(), kv


def on_off(value, field: str) -> str:
    """Option values ``on``/``off`` (YAML may deliver them as booleans)."""
    if value is True or value == "on":
        return "on"
    if value is False or value == "off":
        return "off"
    raise ValueError(f"{field} must be 'on' or 'off', got {value!r}")


def check_experts(options, head: JakiroHead) -> None:
    """Options num_experts / experts_per_tok against the checkpoint: N must match; K may be lowered or raised
    (None restores the checkpoint's K, so a head shared by several methods never keeps another's setting)."""
    N = head.moe.num_experts
    if options.num_experts is not None and options.num_experts != N:
        raise CheckpointError(f"option num_experts={options.num_experts} but the checkpoint has num_local_experts={N}")
    if options.experts_per_tok is not None and not 1 <= options.experts_per_tok <= N:
        raise ValueError(f"option experts_per_tok must be in [1, {N}] (num_local_experts of the checkpoint), "
                         f"got {options.experts_per_tok}")
    head.moe.experts_per_tok = options.experts_per_tok or head.config.num_experts_per_tok
