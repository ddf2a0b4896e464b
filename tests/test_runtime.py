"""The runtime option (``runtime: eager | compiled``, harness/engine/runtime.py): one seam for every target forward.

- configuration: bad runtime names fail with one line; entries expand per runtime with labelled copies; a default
  configuration's dict (and so its digest) does not change;
- the padding and bucket maths on literal examples, and that padding a verification forward changes neither the
  real slots' logits nor (after compaction) the cache;
- a transformers ``StaticCache`` compacted after a tree forward equals the cache of running the accepted tokens;
- the report compares a compiled label with the compiled baseline and never mixes runtimes in one table;
- the compile cache: its folder is keyed by torch, model, dtype, device and linear kernels, lives under
  $DRAFTBENCH_CACHE (else ~/.cache/draftbench), and ``draftbench cache clear`` removes it; the methods of one
  runtime share one runner;
- (slow: compilation takes seconds per graph) a second entry at the same shapes compiles nothing, the runner tells
  when a call starts and ends compiling, and its artefacts land in the keyed folder; every registered method's
  greedy output is the same compiled as eager,
  on a tiny target in both compiled flavours and on the default model, and a run with both runtimes keeps the
  compilation out of measured turns.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache, StaticCache

from harness.engine.compilecache import clear_compile_cache
from harness.engine.kv import attention_layout, compact_cache, static_cache_length, verification_masks
from harness.engine.runtime import (
    CompiledRunner,
    bucket_slots,
    cache_root,
    check_runtime,
    compile_cache_key,
    pad_mask_columns,
    pad_tree_slots,
    target_runner,
)
from harness.engine.tree import ancestor_matrix, slot_depths
from harness.measure.records import baseline_labels
from harness.report import markdown as MD
from harness.report import tables as T
from harness.report.ablation import ablation_table
from harness.run.config import ConfigError, MethodSpec, RunConfig, config_from_dict
from tests.support.helpers import (
    GREEDY,
    REAL_MODEL_SMALL,
    build_example,
    registered_methods,
    tiny_llama,
    tiny_target,
)

METHOD_NAMES = registered_methods()

# ------------------------------------------------------------------------------------------------ configuration


def test_unknown_runtime_fails_with_one_line():
    """A typo in a runtime name must stop the run before anything loads, in one line naming the choices; a
    multi-line traceback or a silent fall back to eager would be wrong."""
    with pytest.raises(ValueError, match=r"^unknown runtime 'fast'; use one of eager, compiled$"):
        check_runtime("fast")
    with pytest.raises(ConfigError, match=r"^run\.runtime\[1\]: unknown runtime 'fast'; use eager or compiled$"):
        RunConfig(runtime=["eager", "fast"])
    with pytest.raises(ConfigError, match=r"^run\.methods\[0\]\.runtime: unknown runtime 'jit'"):
        config_from_dict({"methods": [{"name": "vanilla", "runtime": "jit"}]})
    from harness.cli import build_parser
    from harness.cli.run import config_from_args

    with pytest.raises(ConfigError, match=r"^run\.runtime\[0\]: unknown runtime 'gpu'") as err:
        config_from_args(build_parser().parse_args(["run", "--runtime", "gpu"]))
    assert "\n" not in str(err.value)


def test_entries_run_every_method_once_per_runtime_with_labelled_copies():
    """Every entry without its own runtime runs once per run runtime, method by method, and a compiled entry's label
    ends in @compiled (a compiled number under an eager label would mix runtimes silently); an entry with its own
    runtime runs only under it; two entries that end up with one label are refused."""
    cfg = config_from_dict({"runtime": ["eager", "compiled"],
                            "methods": ["vanilla", {"name": "eagle2", "label": "e2", "options": {"top_k": 4}},
                                        {"name": "pld", "runtime": "compiled"}]})
    got = [(e.label, e.name, e.runtime, e.options) for e in cfg.entries()]
    assert got == [("vanilla", "vanilla", "eager", {}), ("vanilla@compiled", "vanilla", "compiled", {}),
                   ("e2", "eagle2", "eager", {"top_k": 4}), ("e2@compiled", "eagle2", "compiled", {"top_k": 4}),
                   ("pld@compiled", "pld", "compiled", {})]
    with pytest.raises(ConfigError, match=r"duplicate labels \['vanilla@compiled'\]"):
        config_from_dict({"runtime": ["eager", "compiled"],
                          "methods": ["vanilla", {"name": "vanilla", "label": "vanilla@compiled",
                                                  "runtime": "compiled"}]})


def test_default_configuration_dict_has_no_runtime_keys():
    """Runs made before runtimes existed have no runtime in their configuration: a default one must produce the
    same dict (so the same digest, and no spurious 'run configurations differ' warning in compare); a run that
    asks for the compiled runtime must record it, and the dict must round-trip."""
    d = RunConfig(methods=[MethodSpec("vanilla"), MethodSpec("pld", options={"n": 3})]).to_dict()
    assert "runtime" not in d and all("runtime" not in m for m in d["methods"])
    both = RunConfig(runtime=["eager", "compiled"], methods=[MethodSpec("pld", runtime="compiled")])
    assert both.to_dict()["runtime"] == ["eager", "compiled"] and both.to_dict()["methods"][0]["runtime"] == \
        "compiled"
    assert config_from_dict(both.to_dict()).digest() == both.digest() != RunConfig().digest()


# ------------------------------------------------------------------------------------------------ padding maths


def test_compile_weights_chooses_frozen_or_reusable_graphs():
    """compile_weights: a typo fails in one line; the default (frozen) stays out of the configuration's dict (so old
    digests hold); inputs reaches the compiled runner as freeze=False (graphs a next run loads), frozen as the
    runtime's default (frozen on CPU). A silent fall back to frozen would recompile every run unnoticed."""
    with pytest.raises(ConfigError, match=r"^run\.compile_weights: unknown choice 'packed'; use frozen or inputs$"):
        RunConfig(compile_weights="packed")
    assert "compile_weights" not in RunConfig().to_dict()
    assert RunConfig(compile_weights="inputs").to_dict()["compile_weights"] == "inputs"
    from harness.cli import build_parser
    from harness.cli.run import config_from_args

    cfg = config_from_args(build_parser().parse_args(["run", "--runtime", "compiled", "--compile-weights", "inputs"]))
    assert cfg.compile_weights == "inputs"
    target = tiny_target(eos=False)
    assert CompiledRunner(target).freezing and not CompiledRunner(target, freeze=False).freezing
    assert CompiledRunner(target, freeze=False).cache_dir != CompiledRunner(target).cache_dir
    # each flavour has its own folder: sharing one, a run of one flavour would remove the other's graphs (its
    # identity record names another flavour), so alternating flavours would never load anything
    folders = {CompiledRunner(target, static=s, freeze=f).cache_dir for s, f in ((True, None), (False, False),
                                                                                   (False, True))}
    assert len(folders) == 3, folders
    with pytest.raises(ValueError, match="freeze=True needs the dynamic flavour on CPU"):
        CompiledRunner(target, static=True, freeze=True)


def test_bucket_and_cache_length_examples():
    """Literal examples of the static flavour's shapes: a wrong bucket would compile a graph per tree size (or run
    a tree in too few slots), a wrong cache length a graph per turn."""
    assert [bucket_slots(n) for n in (1, 2, 3, 5, 8, 9, 26, 60, 64, 65, 200)] == \
        [1, 2, 4, 8, 8, 16, 32, 64, 64, 128, 256]
    assert bucket_slots(3, buckets=(2, 6)) == 6
    with pytest.raises(ValueError, match="at least one slot"):
        bucket_slots(0)
    assert [static_cache_length(n) for n in (1, 300, 1024, 1025, 5000)] == [1024, 1024, 1024, 2048, 8192]
    assert static_cache_length(100, minimum=64) == 128


def test_pad_tree_slots_example():
    """Root and one child padded to 4 slots: the pad slots sit at depth 0, hold token 0 and see only themselves
    inside the tree, and no real slot sees them (otherwise the real slots' logits would change)."""
    anc = ancestor_matrix(torch.tensor([-1]))  # [[1, 0], [1, 1]]
    ids, padded, depth = pad_tree_slots(torch.tensor([[7, 9]]), anc, slot_depths(anc), 4)
    assert ids.tolist() == [[7, 9, 0, 0]]
    assert padded.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert depth.tolist() == [0, 1, 0, 0]
    same = pad_tree_slots(torch.tensor([[7, 9]]), anc, slot_depths(anc), 2)
    assert same[0].tolist() == [[7, 9]] and same[1] is anc
    with pytest.raises(ValueError, match="cannot pad 2 slots to 1"):
        pad_tree_slots(torch.tensor([[7, 9]]), anc, slot_depths(anc), 1)


def test_pad_mask_columns_blocks_the_new_columns():
    """A static cache's stale positions must be blocked: the added key columns hold the dtype's minimum."""
    mask = torch.zeros(1, 1, 2, 3)
    out = pad_mask_columns(mask, 5)
    assert out.shape == (1, 1, 2, 5)
    assert (out[..., :3] == 0).all() and (out[..., 3:] == torch.finfo(torch.float32).min).all()
    assert pad_mask_columns(mask, 3) is mask
    with pytest.raises(ValueError, match="more than the cache's 2"):
        pad_mask_columns(mask, 2)


PREFIX = torch.tensor([[3, 14, 15, 9, 26]])  # committed prompt, P = 5
ROOT = 5
TOKENS = torch.tensor([35, 8, 9, 7, 29])  # root -> {35, 8}; 35 -> 9 -> 7; 35 -> 29
PARENTS = torch.tensor([-1, -1, 0, 2, 0])
KEEPS = [([0, 1, 3, 4], [35, 9, 7]), ([0, 2], [8]), ([0, 1], [35]), ([0], [])]


def _tree_inputs():
    ids = torch.cat([torch.tensor([ROOT]), TOKENS])[None]
    anc = ancestor_matrix(PARENTS)
    return ids, anc, slot_depths(anc)


def test_padded_verification_forward_changes_nothing_real():
    """The compiled runtime pads a tree with slots no real slot sees: the real slots' logits must equal those of
    the unpadded forward, and after compaction the cache must equal the unpadded one's (pad slots left behind, or
    seen by a real slot, would change the output)."""
    model = tiny_llama(vocab_size=64)
    P = PREFIX.shape[1]
    with torch.inference_mode():
        caches, logits = [], []
        for slots in (6, 8, 16):
            cache = DynamicCache(config=model.config)
            model(PREFIX, cache=cache, use_cache=True)
            ids, anc, depth = pad_tree_slots(*_tree_inputs(), slots)
            mask = verification_masks(attention_layout(cache), cache, anc, depth, P, torch.float32)
            out = model(ids, attention_mask=mask, position_ids=(depth + P)[None], cache=cache, use_cache=True)
            logits.append(out.logits[0, :6])
            compact_cache(cache, P, [0, 1, 3, 4])
            caches.append(cache)
    for got, cache in zip(logits[1:], caches[1:]):
        torch.testing.assert_close(got, logits[0], atol=1e-5, rtol=1e-5)
        assert cache.get_seq_length() == P + 4
        for a, b in zip(cache.layers, caches[0].layers):
            torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("first", ["inside", "outside"])
def test_static_cache_is_reused_across_turns_in_and_out_of_inference_mode(first):
    """The static flavour's one StaticCache serves turn after turn, whether a caller asks for it inside
    ``torch.inference_mode`` or not (a run, autotune and the tests do both). Its buffers are made in inference mode
    (on CUDA by transformers' lazy initialisation, whose ``cumulative_length.to(device)`` is a new tensor; here by
    a first call inside the mode), so a reset outside the mode raised "Inplace update to inference tensor outside
    InferenceMode" (the H200 run's `compiled-fp32` failure, every compiled turn after the first). Each turn must start
    empty and hold just its prompt after the (eager) prefill."""
    import contextlib

    runner = CompiledRunner(tiny_target(eos=False), static=True)
    prompt = torch.tensor([[5, 9, 13, 20]])
    modes = [True, False, True, False] if first == "inside" else [False, True, False, True]
    for inside in modes:
        with torch.inference_mode() if inside else contextlib.nullcontext():
            cache = runner.new_cache(16)
        assert cache.get_seq_length() == 0
        with torch.inference_mode() if inside else contextlib.nullcontext():
            runner.forward(prompt, cache, prefill=True, logits_to_keep=1)
        assert cache.get_seq_length() == 4
    assert runner._static_cache is cache  # one cache, reused (CUDA graphs read it by address)


@pytest.mark.parametrize("keep, accepted", KEEPS)
def test_static_cache_compaction_equals_running_the_accepted_tokens(keep, accepted):
    """A StaticCache (fixed buffers, the compiled runtime's static flavour) after a tree forward over its committed
    prefix and compaction must hold exactly the K/V of running prefix + root + accepted tokens, with its length
    (cumulative_length) at the committed length: a wrong move, offset or length would corrupt later steps."""
    model = tiny_llama(vocab_size=64)
    P = PREFIX.shape[1]
    with torch.inference_mode():
        cache = StaticCache(config=model.config, max_cache_len=32)
        model(PREFIX, cache=cache, use_cache=True)
        ids, anc, depth = pad_tree_slots(*_tree_inputs(), 8)  # bucket 8 for 6 slots
        mask = pad_mask_columns(verification_masks(attention_layout(cache), cache, anc, depth, P, torch.float32), 32)
        model(ids, attention_mask=mask, position_ids=(depth + P)[None], cache=cache, use_cache=True)
        compact_cache(cache, P, keep)
        direct = DynamicCache(config=model.config)
        model(torch.cat([PREFIX, torch.tensor([[ROOT] + accepted])], dim=1), cache=direct, use_cache=True)
    n = P + len(keep)
    assert int(cache.get_seq_length()) == n
    for got, want in zip(cache.layers, direct.layers):
        torch.testing.assert_close(got.keys[:, :, :n], want.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.values[:, :, :n], want.values, atol=1e-5, rtol=1e-5)


def test_eager_runner_is_the_model_itself():
    """runtime eager must call the model exactly as before runners existed: a DynamicCache, no padding, the tree's
    own position ids and masks (a changed eager path would change every published eager number)."""
    target = tiny_target(eos=False)
    runner = target_runner(target, "eager")
    assert runner is target_runner(target, "eager") and runner.runtime == "eager"
    cache = runner.new_cache(100)
    assert type(cache) is DynamicCache
    with torch.inference_mode():
        runner.forward(PREFIX, cache, prefill=True)
        ids, anc, depth = _tree_inputs()
        got_ids, pos, mask = runner.verify_inputs(ids, anc, depth, 5, attention_layout(cache), cache)
    assert got_ids is ids and pos.tolist() == [[5, 6, 6, 7, 8, 7]]
    assert mask.shape == (1, 1, 6, 11)
    assert runner.graphs == 0 and runner.describe() == {"runtime": "eager", "backend": "eager", "cache": "dynamic"}


# ------------------------------------------------------------------------------------------------ compile cache


def test_compile_cache_key_names_what_it_depends_on():
    """Another torch, model, model folder, dtype, device or linear-kernel choice must get its own folder (else a run
    could load artefacts compiled for something else); the same inputs must get the same folder (else nothing is
    ever reused)."""
    args = ("smollm2-135m", "/m/smollm2", torch.float32, "cpu", "onednn64")
    key = compile_cache_key(*args)
    assert key == compile_cache_key(*args)
    assert key.startswith(f"smollm2-135m-float32-cpu-torch{torch.__version__}-")
    assert len(key.rsplit("-", 1)[1]) == 12
    others = [("other", "/m/smollm2", torch.float32, "cpu", "onednn64"),
              ("smollm2-135m", "/m/elsewhere", torch.float32, "cpu", "onednn64"),
              ("smollm2-135m", "/m/smollm2", torch.bfloat16, "cpu", "onednn64"),
              ("smollm2-135m", "/m/smollm2", torch.float32, "cuda", "onednn64"),
              ("smollm2-135m", "/m/smollm2", torch.float32, "cpu", "default")]
    assert len({key, *(compile_cache_key(*o) for o in others)}) == 6
    assert "/" not in compile_cache_key("/abs/path model", "/abs/path model", torch.float32, "cpu", "default")


def test_cache_root_and_clear(tmp_path, monkeypatch, capsys):
    """The cache lives under $DRAFTBENCH_CACHE, else $XDG_CACHE_HOME/draftbench; a compiled runner's folder is
    <root>/compile/<key>; `draftbench cache clear` removes every target's folder and says how many (a cache that
    cannot be found or cleared would keep stale artefacts forever)."""
    from harness.cli import main

    monkeypatch.delenv("DRAFTBENCH_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "draftbench"
    monkeypatch.setenv("DRAFTBENCH_CACHE", str(tmp_path / "db"))
    assert cache_root() == tmp_path / "db"
    target = tiny_target(eos=False)
    runner = CompiledRunner(target)  # compiles nothing until its first call
    assert runner.cache_dir.parent == tmp_path / "db" / "compile"
    assert runner.cache_dir.name.startswith("tiny-llama-float32-cpu-")
    assert clear_compile_cache() == 0
    for name in ("a", "b"):
        (tmp_path / "db" / "compile" / name / "kernels").mkdir(parents=True)
        (tmp_path / "db" / "compile" / name / "kernels" / "k.so").write_bytes(b"x" * 10)
    assert main(["cache"]) == 0
    shown = capsys.readouterr().out
    assert str(tmp_path / "db" / "compile") in shown and "  a  0.0 MiB" in shown
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out.startswith("removed 2 compile cache folder(s)")
    assert not (tmp_path / "db" / "compile").exists()


def test_methods_of_one_runtime_share_one_runner():
    """vanilla and pld compiled on one target must call it through one runner (one set of graphs); a runner per
    method would compile the same forward once per entry."""
    target = tiny_target(eos=False)
    vanilla, pld = build_example("vanilla", target), build_example("pld", target)
    vanilla.runtime = pld.runtime = "compiled"
    assert vanilla.target_runner is pld.target_runner is target_runner(target, "compiled")
    assert target_runner(target, "eager") is not vanilla.target_runner


@pytest.mark.slow
def test_a_second_entry_at_the_same_shapes_compiles_nothing(tmp_path, monkeypatch):
    """vanilla then pld then vanilla again on one compiled target: the second vanilla must compile no graph (it
    reuses the first one's), pld only its verification graph (the prefill is vanilla's); every compiling call
    is told to on_compile as a start then an end carrying its seconds and the FX-graph cache outcome, and the
    artefacts are written under the runner's keyed folder."""
    monkeypatch.setenv("DRAFTBENCH_CACHE", str(tmp_path))
    target = tiny_target(eos=False)
    events, graphs = [], []
    for name in ("vanilla", "pld", "vanilla"):
        method = build_example(name, target)
        method.runtime = "compiled"
        runner = method.target_runner
        runner.on_compile = events.append
        before = runner.graphs
        assert method.generate(PROMPTS[1], BUDGET, GREEDY).token_ids == build_example(name, target).generate(
            PROMPTS[1], BUDGET, GREEDY).token_ids
        graphs.append(runner.graphs - before)
    assert graphs == [2, 1, 0]
    assert [(e.phase, e.graph) for e in events] == [("start", 0), ("end", 1), ("start", 1), ("end", 2),
                                                     ("start", 2), ("end", 3)]
    ends = [e for e in events if e.phase == "end"]
    assert all(e.seconds > 0 and e.cache in ("hit", "miss", "bypass") for e in ends)
    assert sum(e.seconds for e in ends) == pytest.approx(runner.compile_s)
    assert runner.cache_dir.parent == tmp_path / "compile" and any(runner.cache_dir.rglob("*.so"))


# ------------------------------------------------------------------------------------------------ report


def _rec(label, runtime, qid, tps, out, **extra):
    r = {"run_id": "r", "status": "ok", "error": None, "method": label.split("@")[0], "label": label,
         "lossless": True, "method_options": {}, "suite": "s", "suite_version": "1", "question_id": qid,
         "category": None, "turn": 0, "question_turns": 1, "target": "t", "dtype": "float32", "device": "cpu",
         "temperature": 0.0, "top_p": 1.0, "seed": 0, "repeat": 0, "prompt_tokens": 3, "new_tokens": 4,
         "steps": 4, "accept_lengths": [1, 1, 1, 1], "accepted_drafts": [], "draft_depths": [],
         "wall_time_s": 4 / tps, "prefill_time_s": 0.1, "stop_reason": "eos", "output_text": "x", "output_ids": out,
         "runtime": runtime, "compile_s": 0.0 if runtime == "eager" else 42.0, "turn_compile_s": 0.0}
    r.update(extra)
    return r


def test_report_compares_each_runtime_with_its_own_baseline(tmp_path):
    """vanilla 10 tok/s and pld 15 eager; vanilla@compiled 20 and pld@compiled 24 compiled (pld@compiled's second
    question differs from eager's output). pld@compiled's speed-up must be 24 / 20 = 1.2 (against the compiled
    baseline, not 2.4 against eager), its speed-up over eager 2.4, its eager match 0.5; the paper table must be
    split per runtime with the compile time reported beside, never inside, the speed."""
    records = []
    for qid in ("1", "2"):
        records += [_rec("vanilla", "eager", qid, 10.0, [1, 2]), _rec("pld", "eager", qid, 15.0, [1, 2]),
                    _rec("vanilla@compiled", "compiled", qid, 20.0, [1, 2]),
                    _rec("pld@compiled", "compiled", qid, 24.0, [1, 2] if qid == "1" else [1, 3])]
    turns = T.turns_table(records, {})
    assert baseline_labels(turns) == {"vanilla": "vanilla", "pld": "vanilla", "vanilla@compiled":
                                        "vanilla@compiled", "pld@compiled": "vanilla@compiled"}
    summary = T.summary_table(turns).set_index("label")
    assert summary.loc["pld", "speedup"] == pytest.approx(1.5)
    assert summary.loc["pld@compiled", "speedup"] == pytest.approx(1.2)
    assert summary.loc["pld@compiled", "speedup_vs_eager"] == pytest.approx(2.4)
    assert summary.loc["vanilla@compiled", "speedup_vs_eager"] == pytest.approx(2.0)
    assert summary.loc["pld@compiled", "lossless_share"] == 0.5  # vs vanilla@compiled
    assert summary.loc["pld@compiled", "eager_match_share"] == 0.5
    assert summary.loc["pld@compiled", "compile_s"] == 42.0 and summary.loc["pld", "compile_s"] == 0.0
    assert list(summary["runtime"]) == ["eager", "eager", "compiled", "compiled"]
    text = MD.paper_table(summary.reset_index())
    eager, compiled = text.split("**Temperature 0, runtime compiled**")
    assert "**Temperature 0, runtime eager**" in eager and "vanilla@compiled" not in eager
    assert "speed-up vs `vanilla@compiled`" in compiled and "| pld@compiled | 1.20× / 1.00 | 1.20× / 1.00 | 2.40× |" \
        in compiled
    assert "Compilation (warm-up, not in any turn's time): vanilla@compiled 42.0 s, pld@compiled 42.0 s." in compiled
    # the ablation table (its speed-up column) pairs each entry with its own runtime's baseline too: against eager
    # vanilla pld@compiled would read 2.4, and with no baseline of its label at all, n/a
    drafted = [dict(r, draft_depths=[1] * 4, accepted_drafts=[0] * 4) if r["method"] == "pld" else r for r in records]
    table = ablation_table(T.turns_table(drafted, {}), n_boot=50).set_index("label")
    assert table.loc["pld@compiled", "speedup"] == pytest.approx(1.2)
    assert table.loc["pld", "speedup"] == pytest.approx(1.5)
    # records of runs made before runtimes existed read as eager, and the table keeps its old heading
    old = T.turns_table([{k: v for k, v in r.items() if k not in ("runtime", "compile_s", "turn_compile_s")}
                         for r in records[:2]], {})
    assert "**Temperature 0** —" in MD.paper_table(T.summary_table(old))


# ------------------------------------------------------------------------------------------------ compiled (slow)

PROMPTS = [torch.tensor([[5, 9, 13, 20, 31, 7, 44]]), torch.tensor([[40, 41, 42, 43, 40, 41, 42, 43, 40, 41]])]
BUDGET = 24


@pytest.fixture(scope="module", params=["dynamic", "static"])
def tiny_compiled(request):
    """One tiny target per compiled flavour (its runner's graphs are shared by every method of the module) and the
    eager outputs of vanilla on it."""
    target = tiny_target(eos=False)
    target.runners["compiled"] = CompiledRunner(target, static=request.param == "static")
    return target


@pytest.mark.slow
@pytest.mark.parametrize("name", METHOD_NAMES)
def test_compiled_greedy_equals_eager_for_every_method_tiny(tiny_compiled, name):
    """Every registered method (built by Method.example) gives token for token the same greedy output compiled as
    eager, in both compiled flavours (dynamic shapes; static cache with tree buckets); a difference would mean the
    compiled seam pads, masks, compacts or reads logits wrongly (the tiny model has no near ties)."""
    eager = build_example(name, tiny_compiled)
    compiled = build_example(name, tiny_compiled)
    compiled.runtime = "compiled"
    for prompt in PROMPTS:
        assert compiled.generate(prompt, BUDGET, GREEDY).token_ids == eager.generate(prompt, BUDGET, GREEDY).token_ids
    runner = compiled.target_runner
    assert isinstance(runner, CompiledRunner) and runner.graphs >= 1 and runner.compile_s > 0


@pytest.mark.slow
def test_run_with_both_runtimes_keeps_compilation_out_of_measured_turns(tmp_path):
    """A run with runtime [eager, compiled] and no warm-up: the compiled labels' first questions compile, so they
    must be measured again (turn_compile_s 0), report the compilation separately (compile_s > 0), carry their
    runtime in every record and the manifest, produce the eager tokens, and be compared with vanilla@compiled."""
    from harness.run.runner import run

    suite = tmp_path / "q.jsonl"
    suite.write_text("\n".join(json.dumps({"question_id": str(i), "category": "c", "turns": [t]})
                               for i, t in enumerate(["hello there", "what is 2+2"])) + "\n")
    cfg = RunConfig(target="tiny-llama", methods=[MethodSpec("vanilla"), MethodSpec("pld")], suites=[str(suite)],
                    max_new_tokens=8, warmup=0, runtime=["eager", "compiled"], output_dir=str(tmp_path / "out"))
    run_dir = run(cfg, target=tiny_target(eos=False), progress=False)
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    by_label = {}
    for r in records:
        by_label.setdefault(r["label"], []).append(r)
    assert sorted(by_label) == ["pld", "pld@compiled", "vanilla", "vanilla@compiled"]
    for label, recs in by_label.items():
        compiled = label.endswith("@compiled")
        assert {r["runtime"] for r in recs} == {"compiled" if compiled else "eager"}
        assert all(r["turn_compile_s"] == 0 for r in recs)
        assert all((r["compile_s"] > 0) == compiled for r in recs)
        eager = sorted((r["question_id"], r["output_ids"]) for r in by_label[label.split("@")[0]])
        assert sorted((r["question_id"], r["output_ids"]) for r in recs) == eager
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["runtimes"]["compiled"]["backend"] == "inductor"
    assert manifest["methods"]["pld@compiled"]["runtime"] == "compiled"
    summary = T.summary_table(T.turns_table(records, manifest)).set_index("label")
    assert summary.loc["pld@compiled", "baseline"] == "vanilla@compiled"
    assert summary.loc["vanilla@compiled", "eager_match_share"] == 1.0


MOON = [{"role": "user", "content": "List three facts about the moon."}]


@pytest.fixture(scope="module")
def moon_eager(real_target, vanilla_reference):
    """The moon prompt on the default model and vanilla's eager greedy tokens for it (32)."""
    prompt = real_target.render_chat(MOON)
    return prompt, vanilla_reference(prompt, 32)


@pytest.mark.slow
@pytest.mark.parametrize("name", METHOD_NAMES)
def test_compiled_greedy_equals_eager_for_every_method_default_model(real_target, moon_eager, name):
    """On the default model (SmolLM2-135M, fp32, CPU: the dynamic flavour with oneDNN-packed linears, whose
    rounding differs from eager MKL's), every registered method gives the eager greedy tokens compiled: a
    difference would be a near tie flipped by the kernels or a seam bug, either of which the tables must not hide.
    The eager tokens are vanilla's, computed once: every method's eager output equals them (the losslessness that
    tests/test_default_model.py checks with these small trees on this prompt), so comparing with each method's own
    eager run would repeat that turn 15 times. All methods share one compiled runner (its graphs compile once:
    minutes on one CPU thread)."""
    prompt, eager = moon_eager
    compiled = build_example(name, real_target, **REAL_MODEL_SMALL.get(name, {}))
    compiled.runtime = "compiled"
    assert compiled.generate(prompt, 32, GREEDY).token_ids == eager
