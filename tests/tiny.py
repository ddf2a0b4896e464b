"""Tiny in-process models and tokenizers for fast tests (nothing is downloaded)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from harness.models import Target, target_from_model

SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (printable ASCII and newline) plus ChatML specials; ``<|im_end|>`` (id 4) is EOS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for c in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab[c] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="<|im_end|>",
                                  pad_token="</s>", additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_llama(vocab_size: int = 128, seed: int = 0, layers: int = 2, hidden: int = 32) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024, eos_token_id=4, bos_token_id=1, pad_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    model.requires_grad_(False)
    return model


def tiny_target(seed: int = 0, eos: bool = True) -> Target:
    """A random 2-layer Llama over the character tokenizer; ``eos=False`` removes EOS so turns run to the budget."""
    tgt = target_from_model(tiny_llama(seed=seed), char_tokenizer(), name="tiny-llama")
    if not eos:
        tgt.eos_ids = frozenset()
    return tgt
