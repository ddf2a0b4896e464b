"""Hydra with the shipped head against Hydra's own code (zankner/Hydra at 3f39fbd, ``hydra/model``; its
``pyproject.toml`` pins transformers 4.36.2): the same head, model, tree and prompts, greedy, 64 new tokens.

    python tests/support/reference_hydra.py harness MODEL WORK              # the harness's venv
    PYTHONPATH=HYDRA python tests/support/reference_hydra.py hydra WORK     # Hydra's venv (transformers 4.36.2)
    python tests/support/reference_hydra.py fixture WORK/hydra.json tests/data/hydra_reference.json

``harness MODEL WORK prefix-mlp`` (random heads, :func:`random_prefix_head`) and ``... prefix-mlp-shipped``
(:func:`shipped_prefix_head`, written to ``tests/data/hydra_prefix_reference.json``) compare Hydra++ heads instead of
the shipped one: the same steps, the head built by the harness side in ``WORK/hydra-own``.

The harness side builds the layout Hydra's loader reads (``HydraModel.from_pretrained``: a folder with a HydraConfig
``config.json`` naming the base model and ``hydra_lm_head.pt``) in ``WORK/hydra-head`` from the shipped head: its
``hydra_mlp.*`` weights unchanged, plus what its own format leaves out because the head shares the target's lm_head
(``hydra_share_lm_head``, draftbench's flag): ``hydra_lm_head.{i}.weight`` = the target's lm_head, ``.bias`` = 0, and
``input_embed_fn.weight`` = the target's input embedding (a key Hydra's trainer writes). It renders MT-bench's first
3 questions, both turns (turn 2's prompt holds vanilla's turn-1 answer), and writes to ``WORK/hydra.json`` the prompt
ids with the outputs and forwards of vanilla and ``hydra`` on :data:`TREE` (full vocabulary, and ``draft_vocab``
4096 as ``cpu_all_methods`` runs it), each prompt's first drafted tree, and the heads' top-5 tokens per head at
:data:`POSITIONS` of the first prompt (the target's feature there and the next tokens' embeddings, as Hydra's
``HydraMLP.forward`` feeds them in training). ``MODEL``: the default model's folder with ``rope_theta`` written at the
top of ``config.json`` (transformers 4.36 does not read ``rope_parameters`` and would run RoPE at 10,000), its
tokenizer readable by tokenizers 0.15.

The Hydra side loads that folder with ``HydraModel.from_pretrained``, checks the keys strictly, recomputes the head
outputs (from its own model's features and from the harness's), runs plain greedy (transformers 4.36's Llama) and
Hydra's generation loop (the loop of ``hydra_generate`` in ``hydra/model/hydra_model.py``, stopped as Spec-Bench's
``evaluation/inference_hydra.py`` stops it, at ``max_new_tokens``) on each prompt, and prints the comparison. Two
things in Hydra's Llama (written for Vicuna and Llama-2-7B) are adapted at run time, no file of Hydra's changed: RoPE
runs at the model's ``rope_theta`` (``HYDRA_ROPE_THETA=0``: at 10,000, as ``_init_rope`` builds it) and the KV cache
is sized by the key/value heads (``initialize_past_key_values`` sizes it by the query heads).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

# The 15-node tree that cpu_all_methods runs Hydra on (the first 15 paths of Medusa's mc_sim_7b_63).
TREE = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5], [0, 0, 1]]
POSITIONS = [4, 12, 20, 28]  # positions of the first prompt where the heads' outputs are compared
TOP = 5
MAX_NEW = 64
ROPE_THETA_PATCH = os.environ.get("HYDRA_ROPE_THETA", "1") == "1"  # 0: Hydra's Llama as published (RoPE at 10,000)
SHIPPED = Path(__file__).resolve().parents[2] / "methods" / "heads" / "smollm2-135m" / "hydra"  # read only


def build_layout(target, shipped: Path, model_path: str, out: Path) -> None:
    """Hydra's loader layout of the head in ``shipped`` (see the module docstring; its ``hydra_head_arch``'s key
    names); the ``shipped`` folder is only read."""
    from harness.engine.checkpoints import read_weights
    from methods.hydra.checkpoint import HYDRA_WEIGHT_FILES, published_key

    config = json.loads((shipped / "config.json").read_text())
    sd, _ = read_weights(shipped, HYDRA_WEIGHT_FILES, "Hydra heads")
    lm_head = target.model.get_output_embeddings().weight.detach().float()
    for i in range(config["hydra_num_heads"]):
        sd[published_key(f"hydra_lm_head.{i}.weight", config["hydra_head_arch"])] = lm_head.clone()
        sd[published_key(f"hydra_lm_head.{i}.bias", config["hydra_head_arch"])] = torch.zeros(lm_head.shape[0])
    sd["input_embed_fn.weight"] = target.model.get_input_embeddings().weight.detach().float().clone()
    if config["hydra_head_arch"] == "prefix-mlp":  # the keys the released prefix layer has and draftbench never uses
        from methods.eagle.head import rope_theta
        from methods.hydra.checkpoint import UNUSED_PREFIX_KEYS
        from methods.hydra.head import prefix_config

        embed_key, inv_freq_key = UNUSED_PREFIX_KEYS
        d = prefix_config(target).head_dim
        sd[embed_key] = sd["input_embed_fn.weight"].clone()
        sd[inv_freq_key] = 1.0 / rope_theta(target.config) ** (torch.arange(0, d, 2).float() / d)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**config, "base_model_name_or_path": model_path}, indent=2))
    torch.save({k: v.float().contiguous() for k, v in sd.items()}, out / "hydra_lm_head.pt")


def head_outputs(hydra, target, ids: torch.Tensor, positions: list[int]) -> list:
    """The harness's heads on prompt ``ids [1, T]``: per position p, per head i, the top-5 ids and logits on
    ``[h_p, E(x_{p+1}), ..., E(x_{p+i+1})]`` (the target's post-norm feature at p and the next i + 1 tokens'
    embeddings, the inputs Hydra's ``HydraMLP.forward`` gives head i at p; for prefix-mlp heads the prefix layer's
    output at p in place of h_p, as ``HydraPrefixMLP.forward`` gives it)."""
    feats = hydra.heads.context(target.model.model(ids).last_hidden_state)[0][0]  # [T, H]
    emb = hydra.embed(ids[0])  # [T, H]
    out = []
    for p in positions:
        per_head = []
        for i in range(hydra.heads.num_heads):
            x = torch.cat([feats[p], *emb[p + 1: p + i + 2]])  # [(i+2)H]
            top = torch.topk(hydra.heads(i, x, hydra.lm_head), TOP)
            per_head.append({"ids": top.indices.tolist(), "logits": top.values.tolist()})
        out.append(per_head)
    return out


def first_tree(hydra, target, ids: torch.Tensor) -> list[int]:
    """The first tree the harness's ``hydra`` drafts after prompt ``ids [1, T]``: the root (the target's greedy
    token) and the tree's tokens in Hydra's order (``sorted(choices, key=lambda x: (len(x), x))``)."""
    from harness.engine.sampling import SamplingParams

    feats = target.model.model(ids).last_hidden_state[0]  # [T, H] post-norm features
    root = int(target.model.lm_head(feats[-1]).argmax())
    hydra.begin(ids, feats)
    return [root] + hydra.propose(root, SamplingParams(), None).tokens.tolist()


def random_prefix_head(target, out: Path, seed: int = 0) -> Path:
    """Random Hydra++ heads for ``target`` in draftbench's format (4 heads x 4 layers, as the published Hydra++; the
    target's lm_head shared), seeded, with blocks 1..3 of each head equal: Hydra's ``HydraPrefixMLP`` repeats one
    ResBlock module there, so untied weights could not load into it. Norm weights are drawn around 1 so that a
    norm read from the wrong key would show."""
    from harness.engine.method import seeded
    from methods.hydra.checkpoint import save_hydra_heads
    from methods.hydra.head import HydraHeads, prefix_config

    V, H = target.model.get_output_embeddings().weight.shape
    with seeded(seed):
        heads = HydraHeads(H, V, num_heads=4, num_layers=4, share_lm_head=True, prefix=prefix_config(target))
        with torch.no_grad():
            for name, p in heads.prefix_embeding_layer.named_parameters():
                if "norm" in name:
                    p.uniform_(0.5, 1.5)
            for mlp in heads.hydra_mlp:
                for block in list(mlp)[2:]:
                    block.load_state_dict(mlp[1].state_dict())
    return save_hydra_heads(heads, out, base_model=target.name, dtype=torch.float32)


def shipped_prefix_head(target, out: Path, seed: int = 0) -> Path:
    """Hydra++ heads that draft well enough for tokens to be accepted: the shipped head's ``hydra_mlp`` weights
    behind a random prefix layer whose attention and MLP outputs are scaled by 0.05 and whose final norm's weight is
    the features' mean RMS (so its output stays near the target's feature, yet depends on the prefix KV)."""
    from harness.engine.method import seeded
    from methods.hydra.checkpoint import load_hydra_heads, save_hydra_heads
    from methods.hydra.head import HydraHeads, prefix_config

    shipped = load_hydra_heads(SHIPPED, target)
    V, H = target.model.get_output_embeddings().weight.shape
    with seeded(seed):
        heads = HydraHeads(H, V, shipped.num_heads, shipped.num_layers, share_lm_head=True,
                           prefix=prefix_config(target))
    heads.hydra_mlp.load_state_dict(shipped.hydra_mlp.state_dict())
    prefix = heads.prefix_embeding_layer
    with torch.no_grad():
        layer = prefix.layers[0]
        layer.self_attn.o_proj.weight.mul_(0.05)
        layer.mlp.down_proj.weight.mul_(0.05)
        ids = torch.arange(1000, 1064)[None]
        feats = target.model.model(ids).last_hidden_state[0]  # [64, H]
        prefix.norm.weight.fill_(float(feats.pow(2).mean(-1).sqrt().mean()))
    return save_hydra_heads(heads, out, base_model=target.name, dtype=torch.float32)


def harness_side(model_path: str, work: str, arch: str = "mlp") -> None:
    """``arch`` "prefix-mlp": a random Hydra++ head (:func:`random_prefix_head`) in place of the shipped one;
    "prefix-mlp-shipped": :func:`shipped_prefix_head`."""
    from harness.engine.sampling import SamplingParams
    from harness.models import load_target
    from harness.registry import get_method
    from tests.support.mt_bench_turns import vanilla_turns

    work_dir = Path(work)
    target = load_target("smollm2-135m", dtype="float32", device="cpu")
    own = {"mlp": lambda: SHIPPED, "prefix-mlp": lambda: random_prefix_head(target, work_dir / "hydra-own"),
           "prefix-mlp-shipped": lambda: shipped_prefix_head(target, work_dir / "hydra-own")}[arch]()
    build_layout(target, own, model_path, work_dir / "hydra-head")
    hydra = get_method("hydra").create(target, {"tree": TREE, "head": str(own)})
    # draft_vocab needs the shipped head's vocabulary file
    hydra_4096 = get_method("hydra").create(target, {"tree": TREE, "draft_vocab": 4096}) if arch == "mlp" else None
    rows = []
    with torch.inference_mode():
        for qid, turn, ids, answer in vanilla_turns(target, 3, MAX_NEW):
            h = hydra.generate(ids, MAX_NEW, SamplingParams())
            h4 = hydra_4096.generate(ids, MAX_NEW, SamplingParams()) if hydra_4096 else h
            rows.append({"qid": qid, "turn": turn, "prompt": ids[0].tolist(), "vanilla": answer,
                         "hydra": h.token_ids, "forwards": len(h.accept_lengths),
                         "accept_lengths": h.accept_lengths, "hydra_4096": h4.token_ids,
                         "forwards_4096": len(h4.accept_lengths), "first_tree": first_tree(hydra, target, ids)})
        ids = torch.tensor([rows[0]["prompt"]])
        heads = head_outputs(hydra, target, ids, POSITIONS)
        feats = target.model.model(ids).last_hidden_state[0]  # [T, H]
    out = {"tree": TREE, "positions": POSITIONS, "eos": sorted(target.eos_ids), "rows": rows,
           "harness_heads": heads, "harness_features": feats.tolist()}
    (work_dir / "hydra.json").write_text(json.dumps(out))


def head_tops(hydra_logits: torch.Tensor) -> list:
    """``hydra_logits [heads, 1, T, V]`` -> per position of :data:`POSITIONS`, per head, the top-5 ids and logits."""
    out = []
    for p in POSITIONS:
        tops = [torch.topk(hydra_logits[i, 0, p], TOP) for i in range(hydra_logits.shape[0])]
        out.append([{"ids": t.indices.tolist(), "logits": t.values.tolist()} for t in tops])
    return out


def hydra_turn(model, prompt: list[int], eos: set[int], buffers: dict) -> dict:
    """One turn of Hydra's greedy loop: ``hydra_generate``'s steps (``initialize_hydra``, ``proposal``,
    ``tree_decoding``, ``evaluate_posterior``, ``update_inference_inputs``), stopped once ``MAX_NEW`` tokens or an
    end-of-sequence token are out, the pending root (the last step's bonus token) counted as the harness counts it.
    Returns the tokens (cut at the budget and after the first EOS), forwards (prefill included), the first tree and
    the tokens each forward emits."""
    from hydra.model.utils import (
        evaluate_posterior,
        initialize_hydra,
        reset_hydra_mode,
        tree_decoding,
        update_inference_inputs,
    )

    input_ids = torch.tensor([prompt])
    if hasattr(model, "past_key_values"):
        past_key_values, data, length = model.past_key_values, model.past_key_values_data, model.current_length_data
        length.zero_()
    else:
        from hydra.model.kv_cache import initialize_past_key_values

        # initialize_past_key_values sizes the cache by num_attention_heads (Vicuna's and Llama-2-7B's attention has
        # as many key/value heads); the default model's has 3 key/value heads of 64 for 9 query heads
        c = model.base_model.config
        kv_config = SimpleNamespace(num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_key_value_heads,
                                    max_position_embeddings=c.max_position_embeddings,
                                    hidden_size=c.num_key_value_heads * (c.hidden_size // c.num_attention_heads))
        shape = SimpleNamespace(config=kv_config, device=model.base_model.device, dtype=model.base_model.dtype)
        past_key_values, data, length = initialize_past_key_values(shape, model.hydra_head_arch)
        model.past_key_values, model.past_key_values_data, model.current_length_data = past_key_values, data, length
    reset_hydra_mode(model)
    hidden, logits = initialize_hydra(input_ids, model, buffers["hydra_attn_mask"], past_key_values,
                                      buffers["proposal_cross_attn_masks"])
    forwards, new_token, first_tree, accepts = 1, 0, None, [1]
    while True:
        stream = input_ids[0, len(prompt):].tolist() + [int(logits[0, -1].argmax())]
        if len(stream) >= MAX_NEW or eos & set(stream):
            break
        candidates, tree_candidates = model.hydra_head.proposal(logits, hidden, buffers, past_key_values, None)
        if first_tree is None:
            first_tree = tree_candidates[0].tolist()
        hidden, logits = tree_decoding(model, tree_candidates, past_key_values, buffers["hydra_position_ids"],
                                       input_ids, buffers["retrieve_indices"])
        best, accept_length = evaluate_posterior(logits, candidates, 0.0, 0.09, 0.3, buffers["max_accepts"])
        input_ids, logits, hidden, new_token = update_inference_inputs(
            input_ids, candidates, best, accept_length, buffers["retrieve_indices"], logits, hidden, new_token,
            data, length, model.hydra_head_arch)
        forwards += 1
        accepts.append(int(accept_length) + 1)
    tokens = stream[:MAX_NEW]
    for i, t in enumerate(tokens):
        if t in eos:
            tokens = tokens[: i + 1]
            break
    kept, total = [], 0
    for a in accepts:  # tokens each forward emits, the last one cut at the budget as the harness cuts it
        kept.append(min(a, len(tokens) - total))
        total += kept[-1]
    return {"tokens": tokens, "forwards": forwards, "first_tree": first_tree, "accepts": kept}


def hydra_side(work: str) -> None:
    from hydra.model.hydra_model import HydraModel
    from hydra.model.utils import generate_hydra_buffers
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    work_dir = Path(work)
    res = json.loads((work_dir / "hydra.json").read_text())
    head_dir = work_dir / "hydra-head"
    theta = json.loads((Path(json.loads((head_dir / "config.json").read_text())["base_model_name_or_path"])
                        / "config.json").read_text())["rope_theta"]
    if ROPE_THETA_PATCH:
        import hydra.model.modeling_llama_kv as llama_kv

        # Hydra's Llama (from transformers 4.31) never reads rope_theta: every layer builds
        # LlamaRotaryEmbedding(head_dim, max_position_embeddings) at its default base 10,000 (_init_rope)
        llama_kv.LlamaRotaryEmbedding.__init__.__defaults__ = (2048, theta, None)
    model = HydraModel.from_pretrained(str(head_dir), torch_dtype=torch.float32).eval()
    built = model.hydra_head.load_state_dict(torch.load(head_dir / "hydra_lm_head.pt"), strict=True)
    own = work_dir / "hydra-own" if model.hydra_head_arch == "prefix-mlp" else SHIPPED
    shipped = (set(load_file(str(own / "hydra_lm_head.safetensors"))) if own == SHIPPED
               else set(torch.load(own / "hydra_lm_head.pt")))
    want = set(model.hydra_head.state_dict())
    print(f"built layout, strict load: missing {built.missing_keys}, unexpected {built.unexpected_keys}; the shipped "
          f"file alone: missing {sorted(want - shipped)}, unexpected {sorted(shipped - want)}")
    ids = torch.tensor([res["rows"][0]["prompt"]])
    with torch.inference_mode():
        own = model(ids, output_orig=True, run_hydra_head=True)
        from_harness = model(ids, output_orig=True, run_hydra_head=True,
                             base_hidden_states=torch.tensor([res["harness_features"]]))
    res["hydra_heads"], res["hydra_heads_on_harness_features"] = head_tops(own[0]), head_tops(from_harness[0])
    res["feature_max_abs_diff"] = float((own[4][0] - torch.tensor(res["harness_features"])).abs().max())
    for name in ("hydra_heads", "hydra_heads_on_harness_features"):
        same = sum(a["ids"] == b["ids"] for pa, pb in zip(res[name], res["harness_heads"]) for a, b in zip(pa, pb))
        diff = max(abs(x - y) for pa, pb in zip(res[name], res["harness_heads"]) for a, b in zip(pa, pb)
                   for x, y in zip(a["logits"], b["logits"]))
        pairs = len(POSITIONS) * len(res[name][0])
        print(f"{name}: top-{TOP} ids equal to the harness's at {same}/{pairs} (position, head) pairs, "
              f"largest logit difference {diff:.2e}")
    print(f"post-norm features, largest difference: {res['feature_max_abs_diff']:.2e}")
    plain = AutoModelForCausalLM.from_pretrained(str(model.base_model_name_or_path), torch_dtype=torch.float32).eval()
    buffers = generate_hydra_buffers(res["tree"], device="cpu")
    eos = set(res["eos"])
    for r in res["rows"]:
        ids = torch.tensor([r["prompt"]])
        with torch.inference_mode():
            seq = plain.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=sorted(eos),
                                 pad_token_id=sorted(eos)[0])
            turn = hydra_turn(model, r["prompt"], eos, buffers)
        r["plain_greedy"] = seq[0, ids.shape[1]:].tolist()
        r["ref"], r["ref_forwards"], r["ref_first_tree"], r["ref_accepts"] = (
            turn["tokens"], turn["forwards"], turn["first_tree"], turn["accepts"])
    (work_dir / "hydra.json").write_text(json.dumps(res))
    rows = res["rows"]

    def tau(tokens: str, forwards: str) -> str:
        return f"{sum(len(r[tokens]) for r in rows) / sum(r[forwards] for r in rows):.3f}"

    print(f"plain greedy (4.36) equal to the harness's vanilla: {sum(r['plain_greedy'] == r['vanilla'] for r in rows)}"
          f"/{len(rows)}; Hydra's loop: equal to vanilla {sum(r['ref'] == r['vanilla'] for r in rows)}/{len(rows)}, "
          f"forwards {sum(r['ref_forwards'] for r in rows)}, tau {tau('ref', 'ref_forwards')}; harness hydra: equal "
          f"to vanilla {sum(r['hydra'] == r['vanilla'] for r in rows)}/{len(rows)}, forwards "
          f"{sum(r['forwards'] for r in rows)}, tau {tau('hydra', 'forwards')}; harness hydra draft_vocab 4096: equal "
          f"to vanilla {sum(r['hydra_4096'] == r['vanilla'] for r in rows)}/{len(rows)}, forwards "
          f"{sum(r['forwards_4096'] for r in rows)}, tau {tau('hydra_4096', 'forwards_4096')}")
    print(f"forwards per turn (Hydra, harness): {[(r['ref_forwards'], r['forwards']) for r in rows]}; first trees "
          f"equal {sum(r['ref_first_tree'] == r['first_tree'] for r in rows)}/{len(rows)}; accepted lengths equal "
          f"step by step in {sum(r['ref_accepts'] == r['accept_lengths'] for r in rows)}/{len(rows)} turns")


def fixture(result: str, out: str) -> None:
    """The reference's recorded head outputs and first trees, for ``tests/test_hydra.py`` to replay."""
    res = json.loads(Path(result).read_text())
    rows = [{"qid": r["qid"], "turn": r["turn"], "prompt": r["prompt"], "first_tree": r["ref_first_tree"]}
            for r in res["rows"][:2]]
    heads = [[{"ids": h["ids"], "logits": [round(x, 4) for x in h["logits"]]} for h in pos]
             for pos in res["hydra_heads"]]
    Path(out).write_text(json.dumps({"source": "zankner/Hydra 3f39fbd, HydraModel.from_pretrained + its head "
                                               "(reference_hydra.py)", "tree": res["tree"],
                                     "positions": res["positions"], "heads": heads, "rows": rows}) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    side, args = sys.argv[1], sys.argv[2:]
    {"harness": harness_side, "hydra": hydra_side, "fixture": fixture}[side](*args)
