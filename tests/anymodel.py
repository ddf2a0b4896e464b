"""Tiny random causal LMs of several architectures, and every tree method on them with random draft heads.

Used by the sliding-window / any-architecture tests and by ``tools/gpu_check.py --dry``. Nothing is downloaded:
each model is built from a config (2 layers, hidden 32, vocabulary 64) with a fixed seed.
"""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    OPTConfig,
    Qwen2Config,
)

from harness.models import Target, target_from_model

VOCAB, HIDDEN = 64, 32
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=256, bos_token_id=1, eos_token_id=None, pad_token_id=0)
GQA = dict(intermediate_size=2 * HIDDEN, num_key_value_heads=2)
MIXED = ["sliding_attention", "full_attention"]


def config_for(arch: str, window: int | None = None):
    """The tiny config of ``arch``; ``window`` sets the sliding window of the architectures that have one."""
    if arch == "llama":
        return LlamaConfig(**COMMON, **GQA)
    if arch == "mistral":
        return MistralConfig(**COMMON, **GQA, sliding_window=window)
    if arch == "qwen2":  # layer 0 full, layer 1 sliding (max_window_layers=1)
        return Qwen2Config(**COMMON, **GQA, use_sliding_window=window is not None, sliding_window=window,
                           max_window_layers=1)
    if arch == "gemma2":
        return Gemma2Config(**COMMON, **GQA, head_dim=8, sliding_window=window or 4096, layer_types=MIXED)
    if arch == "gemma3":
        return Gemma3TextConfig(**COMMON, **GQA, head_dim=8, sliding_window=window or 4096, layer_types=MIXED)
    if arch == "opt":  # no intermediate_size (ffn_dim) and a projected 16-wide embedding
        return OPTConfig(**COMMON, ffn_dim=2 * HIDDEN, word_embed_proj_dim=16)
    raise ValueError(f"unknown tiny architecture {arch!r}")


def tiny_causal_lm(arch: str, window: int | None = None, seed: int = 0, attn: str | None = None,
                   dtype: torch.dtype = torch.float32, device: str = "cpu") -> Target:
    """A random ``arch`` target without tokenizer and without EOS (turns run to their budget). Gemma 2 runs
    ``eager`` (transformers refuses sdpa for it); the others ``sdpa`` unless ``attn`` says otherwise."""
    torch.manual_seed(seed)
    config = config_for(arch, window)
    attn = attn or ("eager" if arch == "gemma2" else "sdpa")
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=dtype).to(device).eval()
    model.requires_grad_(False)
    target = target_from_model(model, tokenizer=None, name=f"tiny-{arch}")
    target.eos_ids = frozenset()
    return target


def _random(module: torch.nn.Module, seed: int, std: float = 0.2) -> torch.nn.Module:
    torch.manual_seed(seed)
    for p in module.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=std)
    return module.eval().requires_grad_(False)


def tree_method(name: str, target: Target, seed: int = 1):
    """Method ``name`` on ``target`` with a random draft head and small trees (fast on a CPU)."""
    from methods.eagle.drafting import Eagle1, Eagle1Options, Eagle2, Eagle2Options
    from methods.eagle.head import EagleHead
    from methods.jakiro.dynamic import Jakiro, JakiroOptions
    from methods.jakiro.head import JakiroHead
    from methods.jakiro.star import JakiroStar, JakiroStarOptions
    from methods.medusa.drafting import Medusa, MedusaOptions
    from methods.medusa.heads import MedusaHeads
    from methods.pld import PromptLookup

    lm_head = target.model.get_output_embeddings().weight  # [V, H]
    V, H = lm_head.shape
    small = dict(total_tokens=16, depth=3, top_k=4)
    if name == "pld":
        return PromptLookup(target)
    if name == "eagle1":
        return Eagle1(target, Eagle1Options(), head=_random(EagleHead.for_target(target), seed))
    if name == "eagle2":
        return Eagle2(target, Eagle2Options(**small), head=_random(EagleHead.for_target(target), seed))
    if name == "medusa":
        heads = MedusaHeads(H, V, 4, 1, False).to(target.output_device, target.dtype)
        return Medusa(target, MedusaOptions(), heads=_random(heads, seed, std=0.3))
    if name == "jakiro":
        return Jakiro(target, JakiroOptions(**small), head=_random(JakiroHead.for_target(target), seed))
    if name == "jakiro_star":
        head = _random(JakiroHead.for_target(target, kind="jakiro_star"), seed)
        return JakiroStar(target, JakiroStarOptions(), head=head)
    if name == "eagle3":  # a random half of the vocabulary as the draft vocabulary
        from methods.eagle3.drafting import Eagle3

        return Eagle3.example(target, seed, **small)
    if name == "sps":  # a random one-layer draft of the same architecture (sliding layers included)
        from methods.sps import Sps

        return Sps.example(target, seed, k=4)
    raise ValueError(f"unknown tree method {name!r}")


TREE_METHODS = ("pld", "eagle1", "eagle2", "medusa", "jakiro", "jakiro_star", "eagle3", "sps")
