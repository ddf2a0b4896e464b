"""`draftbench reproduce`: id mapping (--model-dir), planning runs from a table, the dry run, the CLI, and the
offline end-to-end reproduction of a stand-in table on the embedded default and its shipped heads."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import save_file

from harness.cli import main
from harness.published.dryrun import count_parameters, dry_run
from harness.published.reproduce import (
    ReproduceError,
    parse_model_dir,
    parse_server_urls,
    plan,
    resolve_head,
    run_config,
)
from harness.published.tables import load_table, table_from_dict
from tests.support.fake_openai_server import Fake, serve

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "data" / "standin_eagle2.yaml"
HEADS = REPO / "methods" / "heads" / "smollm2-135m"
STANDIN_MAP = ["lmsys/vicuna-7b-v1.3=smollm2-135m", f"yuhuili/EAGLE-Vicuna-7B-v1.3={HEADS / 'eagle'}",
               f"Jakiro-Vicuna-7B-v1.3={HEADS / 'jakiro'}"]


def test_model_dir_flags_and_mapping_file(tmp_path):
    """Repeated ID=FOLDER flags and a YAML file (folders relative to it) give one mapping; an embedded alias is a
    valid target; a missing folder or a malformed item is one clear error naming it."""
    (tmp_path / "heads" / "e").mkdir(parents=True)
    mapping = tmp_path / "models.yaml"
    mapping.write_text("yuhuili/EAGLE-Vicuna-7B-v1.3: heads/e\n")
    got = parse_model_dir(["lmsys/vicuna-7b-v1.3=smollm2-135m", str(mapping)])
    assert got == {"lmsys/vicuna-7b-v1.3": "smollm2-135m", "yuhuili/EAGLE-Vicuna-7B-v1.3": str(tmp_path / "heads/e")}
    with pytest.raises(ReproduceError, match=r"--model-dir: folder /nope for 'a/b' does not exist"):
        parse_model_dir(["a/b=/nope"])
    with pytest.raises(ReproduceError, match=r"--model-dir 'vicuna': expected ID=FOLDER or a \.yaml/\.json"):
        parse_model_dir(["vicuna"])


def test_plan_splits_rows_by_target_and_token_budget():
    """Rows of other targets or budgets cannot share a run: Jakiro's T=1 table puts the 512-token Jakiro row and
    the 1024-token EAGLE-1 row of Vicuna-7B in two parts, and a reported-only row cannot be asked for."""
    table = load_table("jakiro_a40_t1")
    parts = plan(table, ["vicuna_7b_jakiro", "vicuna_7b_eagle1", "vicuna_13b_jakiro"])
    assert [(p.target.key, p.max_new_tokens, [r.id for r in p.rows]) for p in parts] == [
        ("vicuna_7b", 512, ["vicuna_7b_jakiro"]), ("vicuna_7b", 1024, ["vicuna_7b_eagle1"]),
        ("vicuna_13b", 512, ["vicuna_13b_jakiro"])]
    with pytest.raises(ReproduceError, match="row 'vicuna_33b_jakiro' of 'jakiro_a40_t1' is reported only: no Jakiro"):
        plan(table, ["vicuna_33b_jakiro"])
    with pytest.raises(ReproduceError, match="has no row 'jakiro'; rows: vicuna_7b_eagle2"):
        plan(table, ["jakiro"])


def test_run_config_is_the_tables_protocol():
    """The run of a part is the table's protocol: suites, budget, temperature, warm-ups, repeats, template, the
    vanilla baseline first, each row as a label with its options and mapped head."""
    table = load_table("spec_bench_rtx3090")
    part = plan(table, ["eagle2", "pld"], {"yuhuili/EAGLE-Vicuna-7B-v1.3": "/local/eagle"})[0]
    cfg = run_config(table, part, limit=2)
    assert [(m.name, m.label) for m in cfg.methods] == [("vanilla", "vanilla"), ("eagle2", "eagle2"), ("pld", "pld")]
    assert cfg.methods[1].options == {"total_tokens": 60, "depth": 5, "top_k": 10, "head": "/local/eagle"}
    assert (cfg.suites, cfg.max_new_tokens, cfg.temperatures, cfg.warmup, cfg.repeats, cfg.limit) == (
        ["spec_bench"], 1024, [0.0], 3, 3, 2)
    assert (cfg.target, cfg.dtype, cfg.chat_template, cfg.baseline) == (
        "lmsys/vicuna-7b-v1.3", "float16", "vicuna_v1.1", "vanilla")
    eagle2 = load_table("eagle2_paper")
    llama = plan(eagle2, ["llama2_chat_7b_eagle2"])[0]
    assert run_config(eagle2, llama).system_prompt.startswith("You are a helpful, respectful and honest assistant.")


def test_heads_off_the_hub_need_a_mapping():
    """Jakiro heads are on Google Drive: without --model-dir the error must say where they are and what to pass."""
    table = load_table("jakiro_a40_t0")
    with pytest.raises(ReproduceError, match=r"head 'Jakiro-Vicuna-7B-v1.3' is published at https://drive\.google"
                                             r".*pass --model-dir Jakiro-Vicuna-7B-v1.3=FOLDER"):
        resolve_head(table.heads["Jakiro-Vicuna-7B-v1.3"], {})
    assert resolve_head(table.heads["Jakiro-Vicuna-7B-v1.3"], {"Jakiro-Vicuna-7B-v1.3": "/x"}) == "/x"


def test_count_parameters_from_safetensors_and_config(tmp_path):
    """Sizes come from the safetensors headers (exact, nothing loaded) or, without weights, from config.json's
    LLaMA shapes."""
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, str(tmp_path / "model.safetensors"))
    assert count_parameters(tmp_path) == 17
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps({"vocab_size": 100, "hidden_size": 8, "num_hidden_layers": 1,
                                                 "num_attention_heads": 2, "num_key_value_heads": 1,
                                                 "intermediate_size": 16}))
    # 2*100*8 embeddings + q,o 2*8*8 + k,v 2*8*4 + MLP 3*8*16 + 2 norms of 8 + final norm 8
    assert count_parameters(cfg) == 1600 + 128 + 64 + 384 + 16 + 8
    assert count_parameters(tmp_path / "cfg" / "missing") is None


def _tiny_table(tmp_path) -> tuple:
    """A table over the bundled tiny suite (4 questions, 5 turns) with a local 1-layer target and head."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "vocab_size": 100, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "intermediate_size": 16, "max_position_embeddings": 64}))
    head = tmp_path / "head"
    head.mkdir()
    save_file({"fc.weight": torch.zeros(8, 16)}, str(head / "model.safetensors"))
    data = yaml.safe_load(STANDIN.read_text())
    data["protocol"].update(suites=["tiny"], warmup=1, repeats=2,
                            columns={"tiny": {"label": "Tiny", "suite": "tiny"}})
    data["rows"] = [{"id": "e2", "target": "vicuna_7b", "method": "eagle2", "head": "yuhuili/EAGLE-Vicuna-7B-v1.3",
                     "options": {"total_tokens": 8}, "cells": {"tiny": {"speedup": 2.0}}}]
    table = table_from_dict(data, "tiny_table.yaml")
    return table, {"lmsys/vicuna-7b-v1.3": str(target), "yuhuili/EAGLE-Vicuna-7B-v1.3": str(head)}


def test_dry_run_lists_sizes_memory_and_generations(tmp_path):
    """The dry run must load nothing and still give: what is local, parameters, the KV-cache bytes, the memory
    estimate and generations = labels x turns x repeats + warm-up turns."""
    table, model_dir = _tiny_table(tmp_path)
    parts = plan(table, None, model_dir)
    text = dry_run(table, parts, lambda p: run_config(table, p, dtype="float32"), model_dir)
    assert f"target lmsys/vicuna-7b-v1.3 -> local {tmp_path / 'target'}" in text
    # from config.json: 2*100*8 embeddings + 2 layers x (q,o 128 + k,v 64 + MLP 384 + norms 16) + final norm 8
    assert "weights: 2,792 parameters (local copy), 0.00 GB in float32" in text
    assert f"head yuhuili/EAGLE-Vicuna-7B-v1.3 -> local {tmp_path / 'head'}, 128 parameters" in text
    # 2 (K and V) x 2 layers x 1 kv head x head_dim 4 x 64 positions x 4 bytes = 4096 B
    assert "KV cache at full context: 2 x 2 layers x 1 kv heads x 4 x 64 positions x 4 B = 0.00 GB" in text
    # labels vanilla + e2; tiny has 4 questions / 5 turns; 2 repeats -> 20; warm-up: 1 question (1 turn) per label
    assert "2 labels (vanilla, e2) x (tiny 4 q / 5 turns) x 2 repeat(s) = 20, + 2 warm-up turns" in text
    assert "total generations (all parts, warm-ups included): 22" in text


def test_cli_errors_are_one_line(capsys):
    """Bad table names and reported-only rows give `draftbench: error: ...` and exit code 2, not a traceback."""
    assert main(["reproduce", "eagle2_papr"]) == 2
    assert "unknown published table 'eagle2_papr'" in capsys.readouterr().err
    assert main(["reproduce", "medusa1", "--rows", "medusa1_paper_v15", "--dry-run"]) == 2
    assert "row 'medusa1_paper_v15' of 'medusa1' is reported only: " in capsys.readouterr().err


def test_cli_list_and_dry_run(capsys):
    """`reproduce --list` shows every shipped table with its rows; --dry-run on a shipped table needs no download."""
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    assert "jakiro_a40_t0" in out and "reported only: medusa1_paper_v15\n" in out
    assert main(["reproduce", "eagle2_paper", "--rows", "vicuna_7b_eagle2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "weights: 6.740 B parameters (table), 13.48 GB in float16" in out
    assert "KV cache at full context: 2 x 32 layers x 32 kv heads x 128 x 2048 positions x 2 B = 1.07 GB" in out


def test_cli_lists_the_new_tables_and_dry_runs_an_engine_table(capsys):
    """`reproduce --list` shows EAGLE-3's and Spec-Bench's 13B/33B tables and the engine tables with engine and
    batch sizes; an engine table's dry run names per row the engine, GPU, batch sizes and engine options, the entry a
    runnable row runs as and the reason of a reported-only one, and the load levels."""
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("eagle3_paper", "spec_bench_a100_vicuna13b", "spec_bench_a100_vicuna33b", "eagle3_sglang_h100"):
        assert f"\n{name} " in out
    assert "engine sglang v0.4.4, batch 2, 4, 8, 16, 24, 32, 48, 56, 64" in out
    # the EAGLE-3 row runs in a launched SGLang; the EAGLE row's head is not named by the paper
    assert "rows: sglang_eagle3_chain3; reported only: sglang_eagle_chain3" in out
    assert main(["reproduce", "eagle3_sglang_batch", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "engine: sglang v0.4.4, GPU: NVIDIA H100 (one GPU), batch size(s): 2, 4, 8, 16, 24, 32, 48, 56, 64" in out
    assert ("engine options: --speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 4") in out
    assert "a load sweep of that many concurrent requests through the served engine" in out
    assert "reproduce launches it (engine: openai, launch: sglang) with the same engine without speculation" in out
    assert "runs: entry sglang_eagle3_chain3, method eagle3, engine openai, launch sglang" in out
    assert "needs: the paper does not name the EAGLE head" in out
    assert "load levels: concurrency 2, 4, 8, 16, 24, 32, 48, 56, 64; " in out
    assert main(["reproduce", "eagle3_sglang_h100", "--rows", "sglang_eagle3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "row sglang_eagle3 " in out and "row sglang_vanilla" not in out and "load sweep" not in out


# A literal engine table: one suite (the bundled tiny one, 4 questions), two batch sizes, one EAGLE-3 row with its
# engine options. `engine` and the row's engine options are filled in per test.
def _engine_table(engine: str = "vllm", engine_options: dict | None = None, runnable: bool = True,
                  cells: dict | None = None):
    row = {"id": "e3", "label": "EAGLE-3", "target": "t", "method": "eagle3", "head": "org/head-eagle3", "options": {},
           "engine_options": engine_options or {}, "runnable": runnable, "reason": None if runnable else "not here",
           "cells": cells or {"bs1": {"throughput_ratio": 1.5}, "bs2": {"throughput_ratio": 1.25}}}
    return table_from_dict({
        "id": "tiny_engine", "title": "literal engine table", "hardware": "test GPU", "dtype": "float32",
        "source": {"kind": "paper", "citation": "test", "arxiv": "0000.00000"}, "framework": "test",
        "engine": {"name": engine, "version": "0.0"},
        "protocol": {"suites": ["tiny"], "max_new_tokens": 6, "temperature": 0.0, "warmup": 0, "repeats": 1,
                     "tau_convention": "eagle_script",
                     "columns": {"bs1": {"label": "bs 1", "suite": "tiny", "batch_size": 1},
                                 "bs2": {"label": "bs 2", "suite": "tiny", "batch_size": 2}}},
        "targets": {"t": {"id": "org/target"}},
        "heads": {"org/head-eagle3": {"kind": "eagle3"}},
        "rows": [row]}, "tiny_engine.yaml", stem="tiny_engine")


ENGINE_MAP = {"org/target": "smollm2-135m", "org/head-eagle3": "/local/eagle3"}
VLLM_SPEC = '{"method": "eagle3", "model": "org/head-eagle3", "num_speculative_tokens": 2}'


def test_an_engine_tables_run_is_its_rows_in_the_launched_engine_and_a_load_sweep():
    """vLLM: the row as an `engine: openai` entry launching vLLM with its speculative_config (parsed, the head id
    replaced by the mapped folder), the head as a method option, the same vLLM without speculation as the baseline
    (keeping the shared tensor_parallel_size), and load levels at the batch sizes, every question once a level. A
    wrong entry would measure another configuration than the table's; a wrong baseline, another ratio."""
    table = _engine_table("vllm", {"speculative_config": VLLM_SPEC, "tensor_parallel_size": 2})
    cfg = run_config(table, plan(table, None, ENGINE_MAP)[0])
    assert [(m.name, m.label, m.options, m.engine, m.engine_options) for m in cfg.methods] == [
        ("vanilla", "vanilla", {}, "openai", {"launch": "vllm", "tensor_parallel_size": 2}),
        ("eagle3", "e3", {"head": "/local/eagle3"}, "openai",
         {"launch": "vllm", "tensor_parallel_size": 2,
          "speculative_config": {"method": "eagle3", "model": "/local/eagle3", "num_speculative_tokens": 2}})]
    assert (cfg.engine, cfg.load, cfg.baseline, cfg.target, cfg.suites) == (
        "openai", {"concurrency": [1, 2], "num_prompts": 4}, "vanilla", "smollm2-135m", ["tiny"])
    assert (cfg.max_new_tokens, cfg.temperatures, cfg.repeats, cfg.warmup, cfg.dtype) == (6, [0.0], 1, 0, "float32")
    # SGLang: its flags as they are, the head as a method option (launch maps it to --speculative-draft-model-path);
    # the baseline drops every speculative_* flag (it would otherwise speculate) and keeps the others
    table = _engine_table("sglang", {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "tp_size": 2})
    cfg = run_config(table, plan(table, None, ENGINE_MAP)[0], engine_options={"mem_fraction_static": 0.4})
    assert [(m.label, m.options, m.engine_options) for m in cfg.methods] == [
        ("vanilla", {}, {"launch": "sglang", "tp_size": 2, "mem_fraction_static": 0.4}),
        ("e3", {"head": "/local/eagle3"}, {"launch": "sglang", "speculative_algorithm": "EAGLE3",
                                           "speculative_num_steps": 3, "tp_size": 2, "mem_fraction_static": 0.4})]
    # running servers: only their URLs (a server started elsewhere takes no options), one per label
    cfg = run_config(table, plan(table, None, ENGINE_MAP)[0], server_urls={"vanilla": "http://h:1", "e3": "http://h:2"})
    assert [(m.label, m.options, m.engine_options) for m in cfg.methods] == [
        ("vanilla", {}, {"server_url": "http://h:1"}), ("e3", {}, {"server_url": "http://h:2"})]
    with pytest.raises(ReproduceError, match=r"--server-url: give LABEL=URL for each of vanilla, e3 \(the baseline and "
                                             r"the rows\); missing vanilla"):
        run_config(table, plan(table, None, ENGINE_MAP)[0], server_urls={"e3": "http://h:2"})
    assert parse_server_urls(["vanilla=http://h:1", "e3=http://h:2"]) == {"vanilla": "http://h:1", "e3": "http://h:2"}
    with pytest.raises(ReproduceError, match=r"--server-url 'http://h:1': expected LABEL=URL"):
        parse_server_urls(["http://h:1"])
    # a level at batch size 2 cannot have 2 requests in flight with one prompt, and prompts are never repeated
    with pytest.raises(ReproduceError, match=r"batch size 2 needs 2 distinct prompts in flight and tiny has 1 "
                                             r"question\(s\) with --limit 1"):
        run_config(table, plan(table, None, ENGINE_MAP)[0], limit=1)


def test_an_engine_draftbench_cannot_launch_is_one_line_naming_those_it_can(capsys, tmp_path):
    """A table measured in an engine reproduce does not launch must say so and name vllm and sglang, not fail later
    in a launch or run in draftbench's own loop (which would compare batch 1 with the table's batch sizes)."""
    table = _engine_table("tgi", runnable=False)
    message = ("table 'tiny_engine' was measured in tgi 0.0 at batch size(s) 1, 2: draftbench launches vllm or sglang "
               "for an engine table, not tgi; `draftbench reproduce tiny_engine --dry-run` names the engine "
               "configuration each row needs")
    with pytest.raises(ReproduceError) as err:
        plan(table)
    assert str(err.value) == message
    path = tmp_path / "tiny_engine.yaml"
    path.write_text(yaml.safe_dump(table.raw))
    assert main(["reproduce", str(path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow  # loads the embedded default model
def test_an_engine_table_reproduced_against_running_servers(tmp_path, capsys):
    """End to end, no engine installed: the literal table's target mapped to the embedded default, its row and the
    baseline measured on two fake batching servers (--server-url), vanilla and one drafting 3 tokens a step with 1
    accepted (speed-up 1.75 at concurrency 1 by the fake's model, tests/support/fake_openai_server.py). The run must
    write one load row per request at each batch size, the manifest's reproduction, and the comparison with the
    throughput ratios of tables/load.csv; `report RUN --against` must find the same rows again."""
    from harness.report.load import read_load_rows

    made = [serve(Fake("step_ms=20,batch_cost=0.05")), serve(Fake("step_ms=20,batch_cost=0.05,spec=3,accept=1"))]
    try:
        path = tmp_path / "tiny_engine.yaml"
        path.write_text(yaml.safe_dump(_engine_table("vllm", {"speculative_config": VLLM_SPEC}).raw))
        assert main(["reproduce", str(path), "--model-dir", "org/target=smollm2-135m", "--server-url",
                     f"vanilla={made[0][1]}", "--server-url", f"e3={made[1][1]}", "--output-dir",
                     str(tmp_path / "results"), "--no-progress"]) == 0
    finally:
        for server, _ in made:
            server.shutdown()
    out = capsys.readouterr().out
    run_dir = next((tmp_path / "results").iterdir())
    rows = read_load_rows(run_dir)
    # 2 entries x 2 levels (batch sizes 1 and 2) x the tiny suite's 4 questions, 6 tokens each
    assert sorted({(r["label"], r["concurrency"]) for r in rows}) == [("e3", 1), ("e3", 2), ("vanilla", 1),
                                                                       ("vanilla", 2)]
    assert len(rows) == 16 and all(r["status"] == "ok" and r["new_tokens"] == 6 for r in rows)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["reproduce"]["rows"] == {"e3": "e3"} and manifest["reproduce"]["engine"] == "vllm"
    assert manifest["config"]["load"] == {"concurrency": [1, 2], "num_prompts": 4}
    against = pd.read_csv(run_dir / "tables" / "against_tiny_engine.csv")
    load = pd.read_csv(run_dir / "tables" / "load.csv").set_index(["label", "concurrency"])
    ratio = against[against["metric"] == "throughput_ratio"].set_index("column")
    assert ratio["reported"].tolist() == [1.5, 1.25]
    assert ratio.loc["bs1", "measured"] == pytest.approx(load.loc[("e3", 1), "throughput_ratio"])
    assert ratio.loc["bs2", "measured"] == pytest.approx(load.loc[("e3", 2), "throughput_ratio"])
    assert ratio.loc["bs1", "measured"] > 1.0  # 3 steps of 24 ms against 6 of 21 ms a request: speculation pays
    assert "against `tiny_engine`" in out and "| EAGLE-3 | " in out and " vs 1.50 (" in out
    assert main(["report", str(run_dir), "--against", str(path)]) == 0
    assert " vs 1.25 (" in capsys.readouterr().out


@pytest.mark.slow  # loads the embedded default model
def test_an_engine_table_reproduced_in_launched_servers(tmp_path, monkeypatch, capsys):
    """The launched path, vLLM's command replaced by the fake server as a process (as tests/test_served.py launches
    it): the row's server gets the table's speculative_config with the head id replaced by the mapped folder, the
    baseline's none, both the --engine-option. A head id left in, or a baseline that speculates, would measure
    another configuration than the table's."""
    from harness.backends import launch
    from harness.backends import vllm as V
    from harness.report.load import read_load_rows

    fake = str(REPO / "tests" / "support" / "fake_openai_server.py")
    seen = []

    def argv(python, target_path, served_name, dtype, port, speculative, options):
        seen.append((speculative, options))
        return [sys.executable, fake, str(port), "step_ms=5" + (",spec=3,accept=1" if speculative else "")]

    monkeypatch.setenv(V.PYTHON_ENV, sys.executable)
    monkeypatch.setattr(launch, "vllm_serve_argv", argv)
    path = tmp_path / "tiny_engine.yaml"
    path.write_text(yaml.safe_dump(_engine_table("vllm", {"speculative_config": VLLM_SPEC}).raw))
    assert main(["reproduce", str(path), "--model-dir", "org/target=smollm2-135m", "--model-dir",
                 f"org/head-eagle3={HEADS / 'eagle3'}", "--engine-option", "max_num_seqs=4", "--output-dir",
                 str(tmp_path / "results"), "--no-progress"]) == 0
    assert seen == [(None, {"max_num_seqs": 4}), ({"method": "eagle3", "model": str(HEADS / "eagle3"),
                                                   "num_speculative_tokens": 2}, {"max_num_seqs": 4})]
    rows = read_load_rows(next((tmp_path / "results").iterdir()))
    assert len(rows) == 16 and all(r["status"] == "ok" for r in rows)
    assert " vs 1.50 (" in capsys.readouterr().out


@pytest.mark.slow
def test_offline_reproduction_of_a_stand_in_table(tmp_path, data_dir, capsys):
    """End to end, offline: the stand-in table's ids mapped to the embedded default and its shipped EAGLE head, one
    question per suite, 32 tokens: the run happens, its manifest records the reproduction, the comparison table is
    printed and written, and `report RUN --against TABLE` finds the same rows again."""
    args = ["reproduce", str(STANDIN), "--rows", "vicuna_7b_eagle2", "--limit", "1", "--output-dir", str(tmp_path),
            "--data-dir", str(data_dir), "--no-progress", "--n-boot", "100"]
    for item in STANDIN_MAP:
        args += ["--model-dir", item]
    assert main(args) == 0
    out = capsys.readouterr().out
    print(out)
    assert "against `standin_eagle2`" in out and "| EAGLE-2 Vicuna-7B | " in out and " vs 3.62 (" in out
    assert "τ in the `eagle_script` convention" in out
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["reproduce"]["rows"] == {"vicuna_7b_eagle2": "vicuna_7b_eagle2"}
    assert manifest["config"]["chat_template"] == "vicuna_v1.1" and manifest["config"]["max_new_tokens"] == 32
    assert (run_dir / "tables" / "against_standin_eagle2.csv").exists()
    assert (run_dir / "plots" / "against_standin_eagle2.png").exists()
    assert "EAGLE-2 Vicuna-7B" in (run_dir / "against_standin_eagle2.html").read_text()  # the page of the comparison
    assert main(["report", str(run_dir), "--against", str(STANDIN)]) == 0
    assert " vs 3.63 (" in capsys.readouterr().out
