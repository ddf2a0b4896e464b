"""Tiny random causal LMs of several architectures, and every registered tree method on them with random draft heads
(``Method.example``).

Used by the sliding-window / any-architecture tests, the divergence and GPU tests. Nothing is downloaded:
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

from harness.engine.speculative import SpeculativeMethod
from harness.models import SDPA_GQA, Target, register_attention, target_from_model
from harness.registry import get_method
from tests.support.helpers import build_example, registered_methods

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
    ``eager`` (transformers refuses sdpa for it); the others ``sdpa_gqa`` (what ``load_target`` loads for
    ``auto``) unless ``attn`` says otherwise."""
    register_attention()
    torch.manual_seed(seed)
    config = config_for(arch, window)
    attn = attn or ("eager" if arch == "gemma2" else SDPA_GQA)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=dtype).to(device).eval()
    model.requires_grad_(False)
    target = target_from_model(model, tokenizer=None, name=f"tiny-{arch}")
    target.eos_ids = frozenset()
    return target


# options that keep the trees small on a CPU; every other method runs with its defaults
SMALL_TREES = {name: dict(total_tokens=16, depth=3, top_k=4) for name in ("eagle2", "eagle3", "jakiro")}
SMALL_TREES["sps"] = dict(k=4)


def tree_method(name: str, target: Target, seed: int = 1):
    """Registered method ``name`` on ``target``, built by ``Method.example`` (random draft parts, small trees)."""
    return build_example(name, target, seed, **SMALL_TREES.get(name, {}))


# every registered tree-drafting method, read at collection time: a new one is covered by construction
TREE_METHODS = tuple(name for name in registered_methods() if issubclass(get_method(name), SpeculativeMethod))
