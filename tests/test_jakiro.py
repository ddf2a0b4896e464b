"""Jakiro / Jakiro*: MoE maths on literal tensors, published checkpoint format, every decoding mode lossless (greedy
equals vanilla; chi-square at T > 0), draft-forward counts, the published Jakiro* bug caught by the audit, the
training objective and the ablation preset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness.engine.checkpoints import CheckpointError
from harness.engine.method import OptionsError
from harness.engine.sampling import SamplingParams
from harness.registry import get_method
from harness.run.config import config_from_dict, load_preset_dict
from harness.train.objectives import get_objective
from methods.eagle.objective import eagle_losses
from methods.jakiro.checkpoint import load_jakiro_head, save_jakiro_head
from methods.jakiro.jakiro import (
    Jakiro,
    JakiroOptions,
    round_robin_children,
    second_rows,
)
from methods.jakiro.jakiro_star import (
    JakiroStar,
    JakiroStarOptions,
    fold_joint,
    joint_topk_distinct,
    published_star_bookkeeping,
)
from methods.jakiro.moe import (
    contrast_coefficients,
    contrast_pair,
    gather_experts,
    select_experts,
)
from methods.vanilla import Vanilla
from tests.support.helpers import GREEDY, assert_refused, sampled_pvalue, sampling_target, tiny_target
from tests.support.helpers import random_jakiro_head as random_head

H, V = 32, 128  # tiny target (tests/support/helpers.py)
PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matmuls on a busy 2-core machine are ~1000x slower with 2 intra-op threads (spinning) than with 1."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------------ MoE maths


@pytest.mark.parametrize("logits,n,k,ids,weights", [
    ([1.0, 0.0, 9.0, 9.0], 2, 2, [0, 1], [0.7311, 0.2689]),          # N=2: trailing contrast logits ignored
    ([0.0, 2.0, 1.0], 3, 2, [1, 2], [0.7311, 0.2689]),               # N=3, K=2: softmax over the SELECTED logits
    ([0.0, 2.0, 1.0, 3.0], 4, 1, [3], [1.0]),                        # N=4, K=1: one expert, weight 1
    ([0.5, 0.5, 0.0, 2.0, 7.0, 7.0], 4, 3, [3, 0, 1], [0.6915, 0.1543, 0.1543]),  # N=4 (+2), K=3
])
def test_select_experts(logits, n, k, ids, weights):
    # the released N>2 code weights by softmax(r[:2]) whatever was selected: [0, 2, 1], K=2 would give weights of
    # experts 0 and 1 (.119, .881) to experts 1 and 2; top-K on the contrast logits would pick 4/5 above
    got_ids, got_w = select_experts(torch.tensor(logits), n, k)
    assert got_ids.tolist()[:1] == ids[:1] and sorted(got_ids.tolist()) == sorted(ids)
    torch.testing.assert_close(got_w, torch.tensor(weights), atol=1e-4, rtol=0)


def test_contrast_coefficients_sign_and_weights():
    # C - h = v_hi e_hi - v_lo e_lo: swapping the contrast logits must swap the sign, the magnitudes are softmax
    r = torch.tensor([[5.0, -5.0, 1.0, 0.0], [5.0, -5.0, 0.0, 1.0]])
    torch.testing.assert_close(contrast_coefficients(r, 2), torch.tensor([[0.7311, -0.2689], [-0.2689, 0.7311]]),
                               atol=1e-4, rtol=0)
    # N = 3: the pair is the two best mixture experts in index order; N = 2 always (0, 1); N = 1 (0, 0)
    assert contrast_pair(torch.tensor([0.5, -1.0, 2.0, 0.0, 0.0]), 3).tolist() == [0, 2]
    assert contrast_pair(torch.tensor([-3.0, 3.0, 0.0, 0.0]), 2).tolist() == [0, 1]
    assert contrast_pair(torch.tensor([1.0, 0.0, 0.0]), 1).tolist() == [0, 0]


def test_gather_experts_literal():
    # expert-major outputs [N=3, S=2, H=1] gathered per position: position 0 takes experts (2, 0), position 1 (1, 1)
    all_out = torch.tensor([[[0.0], [1.0]], [[10.0], [11.0]], [[20.0], [21.0]]])
    got = gather_experts(all_out, torch.tensor([[2, 0], [1, 1]]))
    assert got.squeeze(-1).tolist() == [[20.0, 0.0], [11.0, 11.0]]


def test_head_outputs_match_the_published_formulas():
    """M = h + softmax(r0, r1) . (e0, e1) and C = h + sign(r2 - r3) (v0 e0 - v1 e1), written out for N = K = 2 with
    the residual h added to BOTH (released ``cnets.py`` ``mlp_moe``). A wrong sign, a missing residual, weights from the
    contrast pair or a contrast with the wrong expert would differ."""
    target = tiny_target()
    head = random_head(target)
    h = torch.randn(5, H, generator=torch.Generator().manual_seed(1))
    out = head.moe_outputs(h, contrast=True, experts=True)
    layer = head.layers[0]
    u = layer.post_attention_layernorm(h)
    r = layer.mlp_moe.gate(u)  # [5, 4]
    e0, e1 = layer.mlp_moe.experts[0](u), layer.mlp_moe.experts[1](u)
    w = torch.softmax(r[:, :2], -1)
    v = torch.softmax(r[:, 2:], -1)
    sign = torch.sign(r[:, 2] - r[:, 3])[:, None]
    torch.testing.assert_close(out.mixture, h + w[:, :1] * e0 + w[:, 1:] * e1)
    torch.testing.assert_close(out.contrast, h + sign * (v[:, :1] * e0 - v[:, 1:] * e1))
    best = r[:, 0] >= r[:, 1]
    torch.testing.assert_close(out.experts[:, 0], h + torch.where(best[:, None], e0, e1))


@pytest.mark.parametrize("n,k", [(3, 2), (4, 1), (4, 3)])
def test_head_top_k_mixture_for_more_experts(n, k):
    """For N in {3, 4}: M - h is the softmax-over-selected weighted sum of exactly the top-K experts."""
    target = tiny_target()
    head = random_head(target, num_experts=n, experts_per_tok=k)
    h = torch.randn(4, H, generator=torch.Generator().manual_seed(2))
    out = head.moe_outputs(h)
    moe = head.layers[0].mlp_moe
    u = head.layers[0].post_attention_layernorm(h)
    r = moe.gate(u)
    assert r.shape == (4, n + 2)
    for s in range(4):
        top = torch.topk(r[s, :n], k)
        w = torch.softmax(top.values, -1)
        expected = h[s] + sum(w[j] * moe.experts[int(i)](u[s]) for j, i in enumerate(top.indices))
        torch.testing.assert_close(out.mixture[s], expected)


# ------------------------------------------------------------------------------------------------ candidates


def test_round_robin_children_literal():
    # docstring example: rep 0 ranks [5, 7, 2], rep 1 ranks [7, 9, 5]; decoupled siblings come from both experts
    lp = torch.full((1, 2, 12), -20.0)
    lp[0, 0, [5, 7, 2]] = torch.tensor([-1.0, -2.0, -3.0])
    lp[0, 1, [7, 9, 5]] = torch.tensor([-0.5, -1.5, -2.5])
    tok, score, src = round_robin_children(lp, 3)
    assert tok.tolist() == [[5, 7, 9]] and src.tolist() == [[0, 1, 1]]
    assert score.tolist() == [[-1.0, -0.5, -1.5]]
    # one representation (mixed candidates) is plain top-k
    tok1, _, src1 = round_robin_children(lp[:, :1], 3)
    assert tok1.tolist() == [[5, 7, 2]] and src1.tolist() == [[0, 0, 0]]


def test_second_rows_alignments():
    # selected level-5 nodes j with parents [2, 0, 2]: fixed -> their own parent's C row; released -> row j
    parent_row = torch.tensor([2, 0, 2])
    assert second_rows(3, parent_row, 3, "fixed").tolist() == [2, 0, 2]
    assert second_rows(3, parent_row, 3, "released").tolist() == [0, 1, 2]
    assert second_rows(3, torch.zeros(3, dtype=torch.long), 1, "released").tolist() == [0, 0, 0]  # the root: one row


@pytest.mark.parametrize("alignment", ["released", "fixed"])
def test_hybrid_last_level_is_attached_by_alignment(alignment):
    """depth 2, top_k 3: level 3 comes from C of the penultimate forward (over the level-1 frontier). Under the j-th
    selected level-2 node the children are topk(lm_head(C[row])) with row = j (released) or the row of j's own parent
    (fixed). Attaching the wrong row, or taking level 3 from M, fails."""
    target = tiny_target()
    method = Jakiro(target, JakiroOptions(depth=2, top_k=3, total_tokens=20, alignment=alignment),
                    head=random_head(target, seed=3, std=0.3))
    captured = []
    real = method.tree_outputs

    def spy(*args, **kwargs):
        out, kv = real(*args, **kwargs)
        captured.append((kwargs, out))
        return out, kv

    method.tree_outputs = spy
    method.begin(PROMPT, target.model(PROMPT, output_hidden_states=True).hidden_states[-1][0])
    c = method.expand(3)
    assert len(captured) == 1 and captured[0][0]["contrast"]  # one tree forward, and it computed C
    out = captured[0][1]
    level1 = c.scores[:3]
    frontier = torch.argsort(level1, descending=True, stable=True).tolist()  # level-1 frontier order = row order
    level3_parents = c.parents[12:].view(3, 3)[:, 0].tolist()  # selected level-2 nodes j = 0, 1, 2
    parent_rows = [frontier.index(int(c.parents[p])) for p in level3_parents]
    assert parent_rows != [0, 1, 2]  # precondition: the two alignments differ for this seed
    for j in range(3):
        row = j if alignment == "released" else parent_rows[j]
        expected = torch.topk(method.log_probs(out.contrast[row]), 3).indices
        assert c.tokens[12 + 3 * j: 15 + 3 * j].tolist() == expected.tolist()


# ------------------------------------------------------------------------------------------------ checkpoints


def published_jakiro_folder(folder: Path, bias: bool = True, n_experts: int = 2, seed: int = 1,
                            kind: str = "jakiro") -> dict[str, torch.Tensor]:
    """A Jakiro checkpoint as the Jakiro repository ships one (``jakiro/model/ea_model.py``): no embedding, gate [N+2,
    H], experts H x H SwiGLU; Jakiro* (kind jakiro_star): gate [N, H], GeLU experts fc/proj of intermediate_size."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.2

    sd = {
        "fc.weight": w(H, 2 * H),
        "layers.0.self_attn.q_proj.weight": w(H, H),
        "layers.0.self_attn.k_proj.weight": w(16, H),
        "layers.0.self_attn.v_proj.weight": w(16, H),
        "layers.0.self_attn.o_proj.weight": w(H, H),
        "layers.0.post_attention_layernorm.weight": 1 + w(H),
    }
    if bias:
        sd["fc.bias"] = w(H)
    if kind == "jakiro":
        sd["layers.0.mlp_moe.gate.weight"] = w(n_experts + 2, H)
        for i in range(n_experts):
            for name, shape in (("gate_proj", (H, H)), ("up_proj", (H, H)), ("down_proj", (H, H))):
                sd[f"layers.0.mlp_moe.experts.{i}.{name}.weight"] = w(*shape)
    else:
        sd["layers.0.mlp_moe.gate.weight"] = w(n_experts, H)
        for i in range(n_experts):
            sd[f"layers.0.mlp_moe.experts.{i}.fc.weight"] = w(64, H)
            sd[f"layers.0.mlp_moe.experts.{i}.proj.weight"] = w(H, 64)
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": V,
              "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "hidden_act": "silu",
              "num_local_experts": n_experts, "num_experts_per_tok": 2}
    if not bias:
        config["bias"] = False
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    torch.save(sd, folder / "pytorch_model.bin")
    return sd


def hand_written_single_position(sd, emb, feature):
    """The published Jakiro head on ONE position (attention sees only itself): x = fc(cat(emb, f)); h = x + o(v(x))
    (GQA: 2 KV heads repeated for 4 query heads); u = RMSNorm(h); r = gate(u); e_i = down(silu(gate_i u) * up_i u);
    returns (M, C) = (h + softmax(r0, r1).e, h + sign(r2 - r3)(v0 e0 - v1 e1))."""
    x = F.linear(torch.cat([emb, feature]), sd["fc.weight"], sd.get("fc.bias"))
    v = F.linear(x, sd["layers.0.self_attn.v_proj.weight"]).view(2, 8).repeat_interleave(2, dim=0).reshape(-1)
    h = x + F.linear(v, sd["layers.0.self_attn.o_proj.weight"])
    u = h * torch.rsqrt(h.pow(2).mean() + 1e-6) * sd["layers.0.post_attention_layernorm.weight"]
    r = F.linear(u, sd["layers.0.mlp_moe.gate.weight"])
    e = [F.linear(F.silu(F.linear(u, sd[f"layers.0.mlp_moe.experts.{i}.gate_proj.weight"]))
                  * F.linear(u, sd[f"layers.0.mlp_moe.experts.{i}.up_proj.weight"]),
                  sd[f"layers.0.mlp_moe.experts.{i}.down_proj.weight"]) for i in range(2)]
    w, vv = torch.softmax(r[:2], 0), torch.softmax(r[2:], 0)
    return h + w[0] * e[0] + w[1] * e[1], h + torch.sign(r[2] - r[3]) * (vv[0] * e[0] - vv[1] * e[1])


@pytest.mark.parametrize("bias", [True, False])
def test_published_checkpoint_loads_and_matches_hand_written_head(tmp_path, bias):
    """The published format loads with only the embedding missing (it then shares the target's) and computes the
    architecture of the released ``cnets.py`` (embedding first in fc, no input norm, MoE after post-attention norm)."""
    target = tiny_target()
    sd = published_jakiro_folder(tmp_path, bias=bias)
    head = load_jakiro_head(tmp_path, target)
    assert head.shares_target_embedding and head.embed_tokens is target.model.get_input_embeddings()
    assert (head.fc.bias is not None) == bias
    feature = torch.randn(H, generator=torch.Generator().manual_seed(5))
    out, _ = head.forward_outputs(feature.view(1, 1, H), torch.tensor([[7]]), torch.tensor([[3]]), contrast=True)
    m, c = hand_written_single_position(sd, target.model.get_input_embeddings().weight[7], feature)
    torch.testing.assert_close(out.mixture.view(H), m, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.contrast.view(H), c, rtol=1e-5, atol=1e-5)


def test_renamed_key_fails_naming_it(tmp_path):
    """strict=False in the original keeps random weights for a renamed key; here the error names both names."""
    target = tiny_target()
    sd = published_jakiro_folder(tmp_path)
    sd["layers.0.mlp_moe.router.weight"] = sd.pop("layers.0.mlp_moe.gate.weight")
    assert_refused(tmp_path, "pytorch_model.bin", sd, load_jakiro_head, target,
                   r"missing keys: layers\.0\.mlp_moe\.gate\.weight \(found "
                   r"layers\.0\.mlp_moe\.router\.weight: renamed\?\)")


def test_only_the_embedding_may_be_missing(tmp_path):
    """Dropping an expert weight fails naming it; a checkpoint for a 4-expert router does not fit N = 2."""
    target = tiny_target()
    sd = published_jakiro_folder(tmp_path)
    del sd["layers.0.mlp_moe.experts.1.up_proj.weight"]
    assert_refused(tmp_path, "pytorch_model.bin", sd, load_jakiro_head, target,
                   r"missing keys: layers\.0\.mlp_moe\.experts\.1\.up_proj\.weight")
    sd = published_jakiro_folder(tmp_path)
    sd["layers.0.mlp_moe.gate.weight"] = torch.zeros(6, H)
    assert_refused(tmp_path, "pytorch_model.bin", sd, load_jakiro_head, target,
                   r"gate\.weight: checkpoint \[6, 32\] vs expected \[4, 32\]")


def test_module_prefix_and_missing_expert_config(tmp_path):
    """accelerate's `module.` prefix is stripped; a config.json without num_local_experts is refused by name."""
    target = tiny_target()
    sd = published_jakiro_folder(tmp_path)
    torch.save({f"module.{k}": v for k, v in sd.items()}, tmp_path / "pytorch_model.bin")
    load_jakiro_head(tmp_path, target)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["num_local_experts"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json: missing field num_local_experts"):
        load_jakiro_head(tmp_path, target)


def test_jakiro_star_checkpoint_loads(tmp_path):
    """Jakiro*: GeLU experts proj(gelu(fc(u))) of intermediate_size and an N-output router."""
    target = tiny_target()
    sd = published_jakiro_folder(tmp_path, kind="jakiro_star")
    head = load_jakiro_head(tmp_path, target, kind="jakiro_star")
    u = torch.randn(H)
    expert = head.layers[0].mlp_moe.experts[1]
    expected = F.linear(F.gelu(F.linear(u, sd["layers.0.mlp_moe.experts.1.fc.weight"])),
                        sd["layers.0.mlp_moe.experts.1.proj.weight"])
    torch.testing.assert_close(expert(u), expected)
    assert head.layers[0].mlp_moe.gate.weight.shape == (2, H)


def test_save_round_trip(tmp_path):
    """The saver writes exactly the published key set in fp16 without the embedding, and it loads back."""
    target = tiny_target()
    head = random_head(target, num_experts=3, experts_per_tok=2, expert_intermediate_size=48)
    save_jakiro_head(head, tmp_path / "h")
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert "embed_tokens.weight" not in saved and all(t.dtype == torch.float16 for t in saved.values())
    assert saved["layers.0.mlp_moe.gate.weight"].shape == (5, H)
    assert saved["layers.0.mlp_moe.experts.2.down_proj.weight"].shape == (H, 48)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert (cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["expert_intermediate_size"]) == (3, 2, 48)
    loaded = load_jakiro_head(tmp_path / "h", target)
    f, ids, pos = torch.randn(1, 4, H), torch.tensor([[5, 6, 7, 8]]), torch.arange(4).view(1, 4)
    torch.testing.assert_close(loaded(f, ids, pos)[0], head(f, ids, pos)[0], rtol=0, atol=2e-2)


# ------------------------------------------------------------------------------------------------ losslessness

COMBOS = [(mode, contrastive, alignment, candidates)
          for mode in ("hybrid", "ar", "parallel") for contrastive in ("on", "off")
          for alignment in ("released", "fixed") for candidates in ("mixed", "decoupled")]


@pytest.fixture(scope="module")
def greedy_setup():
    target = tiny_target(eos=False)
    return target, random_head(target, seed=4), Vanilla(target).generate(PROMPT, 12, GREEDY).token_ids


@pytest.mark.parametrize("mode,contrastive,alignment,candidates", COMBOS)
def test_greedy_equals_vanilla(greedy_setup, mode, contrastive, alignment, candidates):
    # any mode/option only changes the tree; a wrong position, mask or KV column would change the output
    target, head, expected = greedy_setup
    opts = JakiroOptions(mode=mode, contrastive=contrastive, alignment=alignment, candidates=candidates, depth=3,
                         top_k=3, total_tokens=12)
    assert Jakiro(target, opts, head=head).generate(PROMPT, 12, GREEDY).token_ids == expected


@pytest.mark.parametrize("n,k,mode", [(3, 2, "hybrid"), (4, 1, "parallel"), (1, 1, "hybrid")])
def test_greedy_equals_vanilla_other_expert_counts(greedy_setup, n, k, mode):
    target, _, expected = greedy_setup
    head = random_head(target, seed=5, num_experts=n, experts_per_tok=k)
    opts = JakiroOptions(mode=mode, candidates="decoupled", depth=3, top_k=3, total_tokens=12)
    assert Jakiro(target, opts, head=head).generate(PROMPT, 12, GREEDY).token_ids == expected


def oracle_setup():
    """A target that always says token 0 (final norm weight 0: all logits 0, argmax 0) and a head whose every output
    (M, C, experts) is the constant f* = 1000 lm_head[0], whose argmax is 0: every level must be accepted."""
    target = tiny_target(eos=False)
    model = target.model
    model.model.norm.weight.data.zero_()
    model.lm_head.weight.data[0] *= 3
    head = random_head(target, seed=6)
    f_star = 1000 * model.lm_head.weight[0]
    assert int(model.lm_head(f_star).argmax()) == 0
    head.fc.weight.data.zero_()
    head.fc.bias.data.copy_(f_star)
    head.layers[0].self_attn.o_proj.weight.data.zero_()
    for expert in head.layers[0].mlp_moe.experts:
        expert.down_proj.weight.data.zero_()
    return target, head


@pytest.mark.parametrize("mode,candidates", [("hybrid", "mixed"), ("ar", "decoupled"), ("parallel", "mixed")])
def test_a_perfect_head_is_accepted_to_full_depth(mode, candidates):
    """With a head that always agrees with the target, every step accepts depth + 1 drafts: levels from C (hybrid,
    parallel) sit at the right depth and are kept by the re-ranking."""
    target, head = oracle_setup()
    method = Jakiro(target, JakiroOptions(mode=mode, candidates=candidates, depth=3, top_k=3, total_tokens=16),
                    head=head)
    gen = method.generate(PROMPT, 21, GREEDY)
    assert gen.token_ids == [0] * 21
    assert gen.accepted_drafts[:4] == [4, 4, 4, 4]


@pytest.mark.parametrize("mode,per_cycle", [("hybrid", 4), ("ar", 5), ("parallel", 3)])
def test_draft_forwards_per_cycle(greedy_setup, mode, per_cycle):
    # depth d = 4: hybrid saves one forward (d), ar is EAGLE-2's d + 1, parallel ceil((d+1)/2)
    target, head, _ = greedy_setup
    gen = Jakiro(target, JakiroOptions(mode=mode, depth=4, top_k=3, total_tokens=12), head=head).generate(
        PROMPT, 8, GREEDY)
    cycles = len(gen.accepted_drafts)
    assert cycles > 0 and gen.counters["draft_forwards"] == per_cycle * cycles


STAR_TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


@pytest.mark.parametrize("variant", ["corrected", "as_published"])
def test_jakiro_star_greedy_equals_vanilla(greedy_setup, variant):
    """At T=0 both variants work (the released code crashes there) and are exact; default tree: 26 nodes."""
    target, _, expected = greedy_setup
    head = random_head(target, seed=7, kind="jakiro_star")
    method = JakiroStar(target, JakiroStarOptions(variant=variant), head=head)
    assert len(method.node_depths) == 26 and max(method.node_depths) == 6
    assert method.generate(PROMPT, 12, GREEDY).token_ids == expected


def test_jakiro_star_candidate_helpers_literal():
    # joint (expert, token) logits, V = 3: distinct tokens by joint value; the marginal over experts
    assert joint_topk_distinct(torch.tensor([5.0, 1.0, 0.0, 4.0, 6.0, 0.0]), 3, 3).tolist() == [1, 0, 2]
    torch.testing.assert_close(fold_joint(torch.tensor([0.1, 0.2, 0.3, 0.4]), 2), torch.tensor([0.4, 0.6]))
    # the released bookkeeping: draws (expert 0, token 1) and (expert 1, token 1) -> both "probabilities" are
    # expert 1's share of token 1 (0.3), the second made conditional: 0.3 / (1 - 0.3)
    joint = torch.tensor([0.1, 0.2, 0.4, 0.3])
    tokens, q_tilde, residual = published_star_bookkeeping(joint, torch.tensor([1, 3]), torch.zeros(2, 2), 2)
    assert tokens.tolist() == [1, 1]
    torch.testing.assert_close(q_tilde, torch.tensor([0.3, 0.3 / 0.7]))
    torch.testing.assert_close(residual, torch.tensor([0.5, 0.5]))


N_SAMPLES = 800


@pytest.fixture(scope="module")
def sampling_setup():
    target = sampling_target()
    # the Jakiro* head is peaked (std 1): its draft differs clearly from the target, as a real draft's tail does
    return target, random_head(target, seed=0, std=0.3), random_head(target, seed=0, std=1.0, kind="jakiro_star")


@pytest.mark.slow
@pytest.mark.parametrize("opts", [
    dict(mode="hybrid"), dict(mode="ar", contrastive="off"),
    dict(mode="parallel", alignment="fixed", candidates="decoupled"),
], ids=["hybrid", "ar-no-contrast", "parallel-fixed-decoupled"])
def test_jakiro_sampling_is_lossless(sampling_setup, opts):
    # the first three tokens' joint distribution must be the target's; a biased acceptance shows up here
    target, head, _ = sampling_setup
    method = Jakiro(target, JakiroOptions(depth=2, top_k=3, total_tokens=8, **opts), head=head)
    assert sampled_pvalue(method, SamplingParams(temperature=1.0), 400) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)],
                         ids=["T1", "T0.7-top_p0.9"])
def test_jakiro_star_corrected_is_lossless(sampling_setup, sampling):
    """The corrected Jakiro* draws without replacement from the joint softmax's token marginal and hands that q to
    the sampled-proposal verification: exact."""
    target, _, head = sampling_setup
    method = JakiroStar(target, JakiroStarOptions(variant="corrected", tree=STAR_TREE), head=head)
    assert method.lossless
    assert sampled_pvalue(method, sampling, N_SAMPLES) > 1e-3


@pytest.mark.slow
def test_jakiro_star_as_published_fails_the_audit(sampling_setup):
    """The released bookkeeping (expert 1's share as the proposal probability, a softmax of probabilities as the
    residual, duplicates) over-accepts drafted tokens: the same chi-square test must reject it, and the method
    must say it is not lossless."""
    target, _, head = sampling_setup
    method = JakiroStar(target, JakiroStarOptions(variant="as_published", tree=STAR_TREE), head=head)
    assert not method.lossless and method.describe()["lossless"] is False
    assert sampled_pvalue(method, SamplingParams(temperature=1.0), 400) < 1e-6


# ------------------------------------------------------------------------------------------------ options, registry


def test_registered_with_validated_options(greedy_setup):
    target, head, _ = greedy_setup
    assert get_method("jakiro") is Jakiro and get_method("jakiro_star") is JakiroStar
    assert JakiroOptions(contrastive=False).contrastive == "off"  # YAML reads a bare `off` as false
    with pytest.raises(OptionsError, match="mode must be one of hybrid, ar, parallel"):
        Jakiro.create(target, {"mode": "tree"})
    with pytest.raises(OptionsError, match="alignment must be 'released' or 'fixed'"):
        Jakiro.create(target, {"alignment": "misaligned"})
    with pytest.raises(OptionsError, match="variant must be 'corrected' or 'as_published'"):
        JakiroStar.create(target, {"variant": "fixed"})
    with pytest.raises(CheckpointError, match="num_experts=3 but the checkpoint has num_local_experts=2"):
        Jakiro(target, JakiroOptions(num_experts=3), head=head)
    with pytest.raises(ValueError, match=r"experts_per_tok must be in \[1, 2\]"):
        Jakiro(target, JakiroOptions(experts_per_tok=3), head=random_head(target))
    described = Jakiro(target, JakiroOptions(mode="ar"), head=random_head(target)).describe()
    assert described["options"]["mode"] == "ar" and described["lossless"] is True


def test_describe_records_the_checkpoint_expert_counts():
    """With num_experts / experts_per_tok left null the records must carry the checkpoint's N and K: an expert-count
    ablation's table column comes from here; null there would leave the N axis empty."""
    target = tiny_target()
    described = Jakiro(target, JakiroOptions(), head=random_head(target, num_experts=3, experts_per_tok=2)).describe()
    assert (described["options"]["num_experts"], described["options"]["experts_per_tok"]) == (3, 2)
    described = Jakiro(target, JakiroOptions(experts_per_tok=1), head=random_head(target, num_experts=3)).describe()
    assert (described["options"]["num_experts"], described["options"]["experts_per_tok"]) == (3, 1)


def test_experts_per_tok_option_changes_k():
    target = tiny_target()
    head = random_head(target, num_experts=3, experts_per_tok=2)
    Jakiro(target, JakiroOptions(experts_per_tok=1), head=head)
    assert head.layers[0].mlp_moe.experts_per_tok == 1


def test_ablation_preset():
    """The mode ablation is a grid over the same head: hybrid, ar, parallel and hybrid without contrast."""
    cfg = config_from_dict(load_preset_dict("jakiro_ablation"))
    assert [m.label for m in cfg.methods] == ["vanilla", "eagle2", "jakiro[mode=hybrid]", "jakiro[mode=ar]",
                                              "jakiro[mode=parallel]", "jakiro[contrastive=off]"]
    assert cfg.suites == ["mt_bench"]
    assert cfg.methods[5].options == {"mode": "hybrid", "contrastive": "off"}


# ------------------------------------------------------------------------------------------------ objective


def test_objective_loss_weights_and_two_step_target():
    """L = 1.0 (vloss1 + 0.5 vloss2) + 0.1 (ploss1 + 0.5 ploss2), C compared with target[t + 1] (f_{t+2}) under
    mask[t + 1]. Comparing C with f_{t+1}, or other weights, gives another number."""
    target = tiny_target()
    objective = get_objective("jakiro").create(target, {})
    head = objective.build_head()
    g = torch.Generator().manual_seed(0)
    B, S = 2, 6
    batch = {"features": torch.randn(B, S, H, generator=g), "input_ids": torch.randint(0, V, (B, S), generator=g),
             "target": torch.randn(B, S, H, generator=g), "loss_mask": torch.tensor([[1.0] * 5 + [0.0]] * 2)}
    loss, parts = objective.loss(head, batch)
    out, _ = head.forward_outputs(batch["features"], batch["input_ids"], torch.arange(S).expand(B, S), contrast=True)
    lm = target.model.lm_head
    v1, p1, _ = eagle_losses(out.mixture, batch["target"], batch["loss_mask"], lm)
    v2, p2, _ = eagle_losses(out.contrast[:, :-1], batch["target"][:, 1:], batch["loss_mask"][:, 1:], lm)
    assert loss.item() == pytest.approx((v1 + 0.5 * v2 + 0.1 * (p1 + 0.5 * p2)).item(), rel=1e-5)
    assert set(parts) == {"vloss1", "ploss1", "vloss2", "ploss2"}
    loss.backward()
    assert head.layers[0].mlp_moe.gate.weight.grad.abs().sum() > 0  # the router is trained through M and C
    assert objective.defaults["lr"] == 9e-5 and objective.defaults["weight_decay"] == 1e-3


def test_objective_options_and_save(tmp_path):
    target = tiny_target()
    objective = get_objective("jakiro").create(target, {"num_experts": 4, "experts_per_tok": 2,
                                                        "expert_intermediate_size": 16})
    head = objective.build_head()
    assert len(head.layers[0].mlp_moe.experts) == 4
    objective.save(head, tmp_path / "out")
    assert load_jakiro_head(tmp_path / "out", target).layers[0].mlp_moe.experts[0].up_proj.weight.shape == (16, H)
    with pytest.raises(OptionsError, match="experts_per_tok"):
        get_objective("jakiro").create(target, {"num_experts": 2, "experts_per_tok": 3})


def tiny_objective_batch():
    """A jakiro objective (defaults) on the tiny target, a head drawn with seed 0 and a 2 x 6 random batch whose last
    position is masked out: the set-up the default loss below was pinned on."""
    target = tiny_target()
    objective = get_objective("jakiro").create(target, {})
    torch.manual_seed(0)
    head = objective.build_head()
    g = torch.Generator().manual_seed(0)
    B, S = 2, 6
    batch = {"features": torch.randn(B, S, H, generator=g), "input_ids": torch.randint(0, V, (B, S), generator=g),
             "target": torch.randn(B, S, H, generator=g), "loss_mask": torch.tensor([[1.0] * 5 + [0.0]] * 2)}
    return target, head, batch


def test_objective_default_loss_is_the_published_value():
    """The values main's objective (before the multi-step options existed) gave on this head and batch, bit for
    bit: the default and an explicit unroll=1 / hass_steps=1 are the published single-step loss. A different sum
    order, an extra term or C trained at another step would change the last bits or more."""
    target, head, batch = tiny_objective_batch()
    for options in ({}, {"unroll": 1, "hass_steps": 1}):
        loss, parts = get_objective("jakiro").create(target, options).loss(head, batch)
        assert loss.item() == 1.4602837562561035
        assert parts == {"vloss1": 0.4962204098701477, "ploss1": 4.853604316711426,
                         "vloss2": 0.4721178412437439, "ploss2": 4.852878093719482}
    head.zero_grad()
    loss.backward()
    assert head.fc.weight.grad.double().sum().item() == pytest.approx(0.09023349611857157, rel=1e-6)


def test_objective_multistep_trains_later_steps_on_m_alone():
    """Steps 2..n add M's EAGLE losses only (C keeps its step-1 loss): hass_steps weights each 1 and detaches the
    fed-back M, unroll weights step j by 0.8^(j-1) and lets gradients through it. Step 1's parts are the default
    run's; the total is the default loss plus the later steps' weighted terms. Training C again at later steps, or
    a wrong weight, breaks the sum; no detach would give the training-time test's gradient."""
    target, head, batch = tiny_objective_batch()
    plain, plain_parts = get_objective("jakiro").create(target, {}).loss(head, batch)
    hass, hp = get_objective("jakiro").create(target, {"hass_steps": 3}).loss(head, batch)
    ttt, tp = get_objective("jakiro").create(target, {"unroll": 3}).loss(head, batch)
    assert set(hp) == set(tp) == set(plain_parts) | {"vloss_step2", "ploss_step2", "vloss_step3", "ploss_step3"}
    for parts in (hp, tp):
        assert {k: parts[k] for k in plain_parts} == plain_parts
        assert parts["vloss_step2"] == pytest.approx(tp["vloss_step2"], rel=1e-6)  # same forward, both forms
    later = [hp[f"vloss_step{j}"] + 0.1 * hp[f"ploss_step{j}"] for j in (2, 3)]
    assert hass.item() == pytest.approx(plain.item() + later[0] + later[1], rel=1e-5)
    assert ttt.item() == pytest.approx(plain.item() + 0.8 * later[0] + 0.64 * later[1], rel=1e-5)
    grads = []
    for options in ({"hass_steps": 2}, {"unroll": 2, "unroll_decay": 1.0}):
        head.zero_grad()
        get_objective("jakiro").create(target, options).loss(head, batch)[0].backward()
        grads.append(head.layers[0].mlp_moe.experts[0].down_proj.weight.grad.clone())
    assert not torch.allclose(grads[0], grads[1])


def test_objective_multistep_feeds_back_the_mixture():
    """A head that generated its own features (f_{t+1} = M(f_<=t, x_<=t+1)[t]) is a perfect draft: fed its own M
    at steps 2 and 3 it reads the true features again, so M's feature loss is 0 at every step. Feeding back C, or
    the feature at the wrong position, would leave an error."""
    from tests.test_train_objectives import perfect_batch

    target = tiny_target()
    head = random_head(target)
    objective = get_objective("jakiro").create(target, {"hass_steps": 3})
    _, parts = objective.loss(head, perfect_batch(objective, head, [10, 20, 30, 40, 50, 60, 70, 80]))
    assert max(parts["vloss1"], parts["vloss_step2"], parts["vloss_step3"]) < 1e-9
    assert parts["vloss2"] > 1e-3  # C is a different output: the check above is not vacuous


@pytest.mark.parametrize("options", [{"hass_steps": 3}, {"unroll": 3}, {"hass_steps": 3, "griffin_topk": 3}])
def test_objective_multistep_trains_and_saves_the_published_format(tmp_path, options):
    """30 Adam steps on one toy batch lower the multi-step loss; the head saves in the published Jakiro format
    (the same files and config.json as a default-trained head's) and loads back with its weights (fp16 on disk)."""
    target, _, batch = tiny_objective_batch()
    objective = get_objective("jakiro").create(target, options)
    torch.manual_seed(0)
    head = objective.build_head()
    optimizer = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(30):
        loss, _ = objective.loss(head, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    objective.save(head, tmp_path / "multi")
    plain = get_objective("jakiro").create(target, {})
    plain.save(plain.build_head(), tmp_path / "plain")
    assert sorted(p.name for p in (tmp_path / "multi").iterdir()) == ["config.json", "model.safetensors"]
    assert (tmp_path / "multi" / "config.json").read_text() == (tmp_path / "plain" / "config.json").read_text()
    loaded = dict(load_jakiro_head(tmp_path / "multi", target).named_parameters())
    for name, value in head.named_parameters():
        if value.requires_grad:  # the trained weights; the embedding is the target's
            torch.testing.assert_close(loaded[name], value.detach().half().to(loaded[name].dtype), msg=name)
