"""The one set of test helpers (test modules import from here, never from each other).

- tiny in-process targets (nothing is downloaded): :func:`tiny_target` (a random Llama, with the character tokenizer
  or bare token ids), :func:`sampling_target` (vocabulary 8, for exact distributions), :func:`bigram_target` (an
  oracle-friendly target whose next token is a fixed function of the current one);
- randomly initialised draft heads for the tiny targets;
- the invariants every :class:`harness.engine.method.Generation` must satisfy (:func:`check_generation`);
- exact joint distributions of the first tokens and the chi-square test against them, for any method instance
  (:func:`sampled_pvalue`) or any registered method with any options (:func:`method_pvalue`);
- the registered methods, built without files (:func:`registered_methods`, :func:`build_example`), and the oracle
  wrapper that makes any speculative method's tree acceptable to full depth (:func:`install_oracle`), and the small
  trees the real-model tests build them with (:data:`REAL_MODEL_SMALL`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import weakref
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from harness.engine.method import Generation, Method, build_options
from harness.engine.sampling import SamplingParams, logits_to_probs
from harness.engine.speculative import SpeculativeMethod
from harness.engine.tree import DraftTree, children_lists, depths
from harness.models import SDPA_GQA, Target, register_attention, target_from_model
from harness.registry import get_method, method_names
from methods.rest.datastore import Datastore

GREEDY = SamplingParams()
SAMPLINGS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)]
SAMPLING_IDS = ["T1", "T0.7-top_p0.9"]

# ------------------------------------------------------------------------------------------------ tiny targets

SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAR_VOCAB = len(SPECIALS) + 96  # printable ASCII and newline


def jsonl_file(path: Path, rows: list[dict]) -> Path:
    """Write ``rows`` to ``path`` as JSON Lines (one object a line, a suite's questions file) and return the path."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


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


def tiny_llama(vocab_size: int = 128, seed: int = 0, layers: int = 2, hidden: int = 32, init: float = 0.02,
               special_ids: bool = True) -> LlamaForCausalLM:
    """A random Llama (4 query heads over 2 KV heads, fp32, frozen, draftbench's ``sdpa_gqa`` attention).
    ``init``: the initializer range (0.3 gives peaked next-token distributions). ``special_ids``: the character
    tokenizer's EOS 4, BOS 1 and PAD 2 in the config (PAD's embedding row is then zero); False leaves transformers'
    defaults (no PAD)."""
    torch.manual_seed(seed)
    ids = dict(eos_token_id=4, bos_token_id=1, pad_token_id=2, max_position_embeddings=1024) if special_ids else \
        dict(max_position_embeddings=256)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      initializer_range=init, **ids)
    model = LlamaForCausalLM(cfg).eval()
    register_attention()
    model.set_attn_implementation(SDPA_GQA)  # what load_target loads for ``auto``
    model.requires_grad_(False)
    return model


def tiny_target(seed: int = 0, eos: bool = True, *, vocab: int = 128, hidden: int = 32, layers: int = 2,
                init: float = 0.02, tokenizer: bool = True) -> Target:
    """A random tiny Llama as a :class:`Target` named ``tiny-llama``.

    ``tokenizer=True`` (default): vocabulary 128 over the character tokenizer (chat template, EOS id 4);
    ``eos=False`` removes EOS so turns run to the budget. ``tokenizer=False``: bare token ids over ``vocab``
    tokens, no tokenizer and no EOS (the engine tests' targets)."""
    if tokenizer and vocab < CHAR_VOCAB:
        raise ValueError(f"the character tokenizer needs vocab >= {CHAR_VOCAB}, got {vocab}")
    model = tiny_llama(vocab_size=vocab, seed=seed, layers=layers, hidden=hidden, init=init, special_ids=tokenizer)
    tgt = target_from_model(model, char_tokenizer() if tokenizer else None, name="tiny-llama")
    if not eos or not tokenizer:
        tgt.eos_ids = frozenset()
    return tgt


def sampling_target() -> Target:
    """Vocabulary 8, hidden 16, one layer, peaked and non-trivial distributions (initializer range 0.3): small
    enough to enumerate every continuation of a few tokens exactly (:func:`exact_joint`)."""
    return tiny_target(vocab=8, hidden=16, layers=1, init=0.3, seed=0, tokenizer=False)


def bigram_target(step: int = 5, shift: int = 3):
    """An "oracle-friendly" target over V = H = 32: the next token is g(x) = (step*x + shift) mod 32 of the current
    token only. Attention and MLP outputs are zeroed (o_proj = down_proj = 0), the embedding E is orthogonal and
    lm_head = M_g E with M_g[y, x] = 1 iff g(x) = y, so the post-norm feature is f_t = sqrt(32) E[x_t] and the
    logits are sqrt(32) * onehot(g(x_t)). Returns (target, E, g)."""
    model = tiny_llama(vocab_size=32, hidden=32, seed=11)
    E = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(12)))[0]  # orthogonal
    g = [(step * x + shift) % 32 for x in range(32)]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(E)
        model.lm_head.weight.copy_(E[torch.tensor([g.index(y) for y in range(32)])])  # row y = E[g^-1(y)]
    target = target_from_model(model, None, name="bigram")
    target.eos_ids = frozenset()
    return target, E, g


# ------------------------------------------------------------------------------------------------ random draft heads


def random_eagle_head(target: Target, seed: int = 1):
    """An EAGLE head for ``target`` with PyTorch's default initialisation from ``seed`` (the same head as
    ``Eagle1.example(target, seed)``)."""
    from methods.eagle.head import EagleHead

    torch.manual_seed(seed)
    return EagleHead.for_target(target).eval().requires_grad_(False)


def random_jakiro_head(target: Target, seed: int = 0, std: float = 0.2, **kw):
    """A Jakiro (or, ``kind="jakiro_star"``, Jakiro*) head with every trainable weight drawn from N(0, std^2):
    larger ``std`` gives a more peaked draft that differs clearly from the target."""
    from methods.jakiro.head import JakiroHead

    torch.manual_seed(seed)
    head = JakiroHead.for_target(target, **kw)
    for p in head.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=std)
    return head.eval().requires_grad_(False)


def random_medusa_heads(hidden: int, vocab: int, num_heads: int = 4, shared: bool = False, seed: int = 1):
    """Medusa heads (one ResBlock each) with every weight drawn from N(0, 0.3^2); ``shared``: no own lm_heads."""
    from methods.medusa.head import MedusaHeads

    torch.manual_seed(seed)
    heads = MedusaHeads(hidden, vocab, num_heads, 1, shared)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return heads.eval().requires_grad_(False)


# ------------------------------------------------------------------------------------------------ invariants


def die_at_loss_call(monkeypatch, objective_cls: type, n: int) -> None:
    """Make ``objective_cls.loss`` raise ``KeyboardInterrupt`` on its n-th call: a training run killed mid-way
    (``monkeypatch.undo()`` restores it)."""
    real = objective_cls.loss
    calls = {"n": 0}

    def dies(self, head, batch):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt("simulated kill")
        return real(self, head, batch)

    monkeypatch.setattr(objective_cls, "loss", dies)


def check_generation(gen: Generation, method: Method, prompt_len: int, budget: int) -> None:
    """What every Generation must satisfy, whatever was accepted (see :class:`harness.engine.method.Generation`):
    the accept lengths add up to the tokens, the budget and EOS are respected and named as the stop reason; for a
    speculative method also one accept length per target forward, one accepted/depth pair per verification step
    (never more accepted than proposed), and a cache of prompt + everything emitted except the pending token."""
    eos = method.target.eos_ids
    assert sum(gen.accept_lengths) == len(gen.token_ids) <= budget, (gen.accept_lengths, len(gen.token_ids))
    assert all(a >= 1 for a in gen.accept_lengths)
    assert not any(t in eos for t in gen.token_ids[:-1]), "a token after EOS was emitted"
    if gen.stop_reason == "eos":
        assert gen.token_ids[-1] in eos
    else:
        assert gen.stop_reason == "max_new_tokens" and len(gen.token_ids) == budget, gen.stop_reason
    if isinstance(method, SpeculativeMethod) and budget > 0:
        assert len(gen.accept_lengths) == gen.counters["target_forwards"]
        assert len(gen.accepted_drafts) == len(gen.draft_depths) == len(gen.accept_lengths) - 1
        assert all(0 <= a <= d for a, d in zip(gen.accepted_drafts, gen.draft_depths))
        assert gen.counters["draft_forwards"] >= 0 and gen.counters["tree_tokens"] >= sum(gen.draft_depths)
        assert method.last_cache_length == prompt_len + len(gen.token_ids) - 1
        assert set(gen.timings) == {"draft_s", "verify_s", "overhead_s"}


# ------------------------------------------------------------------------------------------------ exact distributions

SAMPLE_PROMPT = torch.tensor([[1, 2, 3]])


def exact_joint(target: Target, sampling: SamplingParams, prompt: torch.Tensor = SAMPLE_PROMPT,
                tokens: int = 3) -> dict[tuple[int, ...], float]:
    """P(x0, ..., x_{tokens-1}) of plain sampling from ``target`` after ``prompt [1, P]``, by running the model over
    every continuation (1 + V + ... + V^(tokens-1) contexts; V = 8 and 3 tokens: 73)."""
    v = target.config.vocab_size
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    with torch.inference_mode():
        for length in range(tokens):
            prefixes = list(joint)
            tail = torch.tensor(prefixes, dtype=torch.long).reshape(len(prefixes), length)  # [n, length]
            ctx = torch.cat([prompt.expand(len(prefixes), -1), tail], dim=1)  # [n, P + length]
            probs = logits_to_probs(target.model(ctx).logits[:, -1], sampling).tolist()  # [n, V]
            joint = {p + (x,): joint[p] * probs[i][x] for i, p in enumerate(prefixes) for x in range(v)}
    return joint


def chi_square_pvalue(counts: Counter, expected_probs: dict, min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value of observing ``counts`` (outcome -> count) if outcomes follow ``expected_probs``
    (outcome -> prob); no scipy needed.

    Outcomes whose expected count is below ``min_expected`` are pooled into one bin (so the chi-square
    approximation holds); an observed outcome with expected probability 0 gives p = 0.
    """
    n = sum(counts.values())
    if any(expected_probs.get(k, 0.0) <= 0 for k in counts):
        return 0.0
    stat, bins, pooled_obs, pooled_exp = 0.0, 0, 0.0, 0.0
    for k, prob in expected_probs.items():
        exp = n * prob
        obs = counts.get(k, 0)
        if exp < min_expected:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
            continue
        stat += (obs - exp) ** 2 / exp
        bins += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        bins += 1
    dof = max(bins - 1, 1)
    # survival function of chi2(dof) = regularised upper incomplete gamma Q(dof/2, stat/2)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def sampled_counts(method: Method, sampling: SamplingParams, n: int, prompt: torch.Tensor = SAMPLE_PROMPT,
                   tokens: int = 3, seed: int = 2024) -> Counter:
    """How often each sequence of the first ``tokens`` tokens came out of ``n`` seeded generations."""
    g = torch.Generator().manual_seed(seed)
    return Counter(tuple(method.generate(prompt, tokens, sampling, g).token_ids) for _ in range(n))


def sampled_pvalue(method: Method, sampling: SamplingParams, n: int = 1500, prompt: torch.Tensor = SAMPLE_PROMPT,
                   tokens: int = 3) -> float:
    """Chi-square p-value of ``method``'s first ``tokens`` tokens (``n`` samples) against the exact joint of its
    target: a lossless method gives a p-value that is not small; a biased one, p near 0."""
    counts = sampled_counts(method, sampling, n, prompt, tokens)
    return chi_square_pvalue(counts, exact_joint(method.target, sampling, prompt, tokens))


def method_pvalue(name: str, sampling: SamplingParams, n: int = 1500, seed: int = 0, **options) -> float:
    """:func:`sampled_pvalue` of the registered method ``name`` built by :func:`build_example` with ``options`` on
    :func:`sampling_target`."""
    return sampled_pvalue(build_example(name, sampling_target(), seed, **options), sampling, n)


# ------------------------------------------------------------------------------------------------ the registry


def registered_methods() -> list[str]:
    """Every method the plugins register (the built-in ``methods`` package and the ``draftbench.methods`` entry
    points), sorted: the parameter list of the losslessness tests, read at collection time, so a method is covered
    as soon as its module registers it. Test doubles that test modules register (defined under ``tests.``) are
    left out: they are not methods to benchmark and some are lossy on purpose."""
    return [name for name in method_names() if not get_method(name).__module__.startswith("tests.")]


# REST's example datastore (methods/rest/rest.py, Rest.example): the target's greedy continuations of 4 random prompts,
# ~200 full-context forwards (seconds on the real model, where three test files build it). Kept per (target, seed),
# as long as that target lives, and shared by the REST examples built on it: the store is read-only, and each method
# still gets its own options and context.
_REST_STORES: dict[tuple[int, int], Datastore] = {}


def build_example(name: str, target: Target, seed: int = 0, **options) -> Method:
    """``get_method(name).example(target, seed, **options)``; a method that cannot be built that way fails the
    test with a message that says what to do (not a skip). REST's example reuses the datastore its first example
    on the same target and seed built."""
    cls = get_method(name)
    try:
        if name == "rest" and target is not None:
            key = (id(target), seed)
            if key in _REST_STORES:
                return cls(target, build_options(cls.Options, options, f"method {cls.name!r}"),
                           store=_REST_STORES[key])
            method = cls.example(target, seed=seed, **options)
            _REST_STORES[key] = method.store
            weakref.finalize(target, _REST_STORES.pop, key, None)  # before its id can name another target
            return method
        return cls.example(target, seed=seed, **options)
    except Exception as e:
        raise AssertionError(
            f"method {name!r} ({cls.__module__}.{cls.__qualname__}) cannot be built without files: "
            f"{cls.__qualname__}.example(target, seed={seed}, **{options!r}) raised {type(e).__name__}: {e}. A method "
            "that loads a checkpoint must override Method.example to build its draft parts randomly "
            "(harness/engine/method.py); every registered method is tested that way.") from e


# Small trees for the real default model (tests/test_default_model.py, tests/test_runtime.py): on CPU every step costs
# a target forward over the whole tree (the 49152-wide lm_head runs on every node: 60 nodes cost ~4x a 1-token
# forward) plus, for the head methods, one draft forward per level (each with a 49152-wide lm_head), and random draft
# parts accept almost nothing, so a turn is ~40 such steps. Three levels, 6-16 nodes, keep every code path (siblings,
# re-ranking, Jakiro's two-step level, SAM's EAGLE-2 fallback, REST's trie, Token Recycling's static tree, Lookahead's
# window beside its n-gram guesses) at a fraction of the published trees' cost.
SMALL_STATIC_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 6 nodes, depth 3
SMALL_RANK_TREE = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0]]  # Medusa/Hydra: 7 nodes, ranks 0-2
REAL_MODEL_SMALL = {
    "eagle1": {"tree": SMALL_STATIC_TREE},
    "eagle2": {"total_tokens": 8, "depth": 2, "top_k": 3},
    "eagle3": {"total_tokens": 8, "depth": 2, "top_k": 3},
    "jakiro": {"total_tokens": 8, "depth": 2, "top_k": 3},
    "jakiro_star": {"tree": SMALL_STATIC_TREE},
    "medusa": {"tree": SMALL_RANK_TREE},
    "hydra": {"tree": SMALL_RANK_TREE},
    "sam": {"total_tokens": 8, "depth": 2, "top_k": 3},  # its EAGLE-2 fallback's tree (60 nodes by default)
    "rest": {"num_draft": 8},  # trie nodes (64 by default)
    "token_recycling": {"tree": SMALL_STATIC_TREE},  # 80 nodes by default
    "lookahead": {"window": 4, "ngram": 3, "guess": 4},  # 16 slots a forward (W=15, N=5, G=15: 115 by default)
}


def oracle_tree(tree: DraftTree, future: list[int], vocab: int) -> tuple[DraftTree, list[int]]:
    """``tree`` with the tokens on the path from the root to its first deepest node replaced by ``future`` (the
    target's greedy continuation after the root), so that greedy verification accepts that whole path. A sibling
    ranked before a path node with the same token would be taken instead, so its token is moved to the next id.
    Returns (new tree, the path's node indices)."""
    if len(tree) == 0:
        return tree, []
    parents = tree.parents.tolist()
    level = depths(tree.parents.cpu()).tolist()
    node, path = level.index(max(level)), []
    while node >= 0:
        path.insert(0, node)
        node = parents[node]
    tokens = tree.tokens.clone()
    kids = children_lists(parents)
    for depth, node in enumerate(path[: len(future)]):
        want = future[depth]
        tokens[node] = want
        for sibling in kids[parents[node] + 1]:
            if sibling == node:
                break
            if int(tokens[sibling]) == want:
                tokens[sibling] = (want + 1) % vocab
    return DraftTree(tokens, tree.parents, tree.draft_probs), path


def install_oracle(method: SpeculativeMethod, continuation: list[int]) -> list[int]:
    """Make ``method`` (an instance) propose its own trees, run its own ``begin``/``accept`` bookkeeping, and have
    every proposed tree rewritten by :func:`oracle_tree` with ``continuation`` (vanilla's greedy tokens for the
    prompt, longer than the budget): every verification step then accepts the tree's full depth. Returns the list
    that receives each step's path length."""
    vocab = method.target.config.vocab_size
    begin, propose, accept = method.begin, method.propose, method.accept
    where = {"root": 0}
    path_lengths: list[int] = []

    def oracle_begin(prompt_ids, hidden):
        where["root"] = 0
        begin(prompt_ids, hidden)

    def oracle_propose(root, sampling, generator):
        i = where["root"]
        assert root == continuation[i], f"root {root} is not vanilla's token {i} ({continuation[i]})"
        tree, path = oracle_tree(propose(root, sampling, generator), continuation[i + 1:], vocab)
        path_lengths.append(len(path))
        return tree

    def oracle_accept(tokens, hidden, next_root):
        accept(tokens, hidden, next_root)
        where["root"] += len(tokens)

    method.begin, method.propose, method.accept = oracle_begin, oracle_propose, oracle_accept
    return path_lengths


def dev_tool(name: str) -> str:
    """The path of a command-line tool from the dev extras (``actionlint``, ``ruff``): beside this Python (the venv's)
    or on PATH. Missing: the calling test skips, except under CI (CI=true), where a missing tool fails the test
    rather than silently skipping a check."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        message = f"{name} is not installed (pip install -e '.[dev]')"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def assert_refused(folder, weights: str, sd: dict, load, target, match: str) -> None:
    """Save the state dict ``sd`` as ``folder/weights`` (a checkpoint folder a published-format builder made) and
    assert that ``load(folder, target)`` refuses it with a :class:`~harness.engine.checkpoints.CheckpointError`
    matching ``match``: the strict-key checks of every head format (a loader that keeps random weights for a key it
    does not find, as ``strict=False`` does, would load instead)."""
    from harness.engine.checkpoints import CheckpointError

    torch.save(sd, folder / weights)
    with pytest.raises(CheckpointError, match=match):
        load(folder, target)
