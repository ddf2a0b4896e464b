"""Self-distillation in two stages (``data build --self-distill``): the token store of generated ids (stage a) is
resumable and reused, the features (stage b) come from batched forwards equal to one forward per conversation."""

import json
import os

import pytest
import torch
from safetensors import safe_open

import harness.train.features as features_module
from harness.train.distill import HFGenerator, make_generator, self_distilled, until_eos
from harness.train.features import (
    batched_features,
    build_dataset,
    read_token_records,
    record_mask,
    render_with_mask,
    token_record,
)
from tests.support.helpers import tiny_target

CONVS = [  # ShareGPT format; c0 has two exchanges, c4's prompt is too long for max_len 40 (nothing to learn)
    {"id": "c0", "conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"},
                                   {"from": "human", "value": "c"}, {"from": "gpt", "value": "d"}]},
    {"id": "c1", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
    {"id": "c2", "conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4"}]},
    {"id": "c3", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "r"}]},
    {"id": "c4", "conversations": [{"from": "human", "value": "x" * 80}, {"from": "gpt", "value": "y"}]},
]
NO_EVAL = {"an unrelated evaluation question": ["mt_bench/1"]}
BUILD = dict(max_len=40, self_distill=True, max_new_tokens=6, shard_size=3, part_size=2, eval_questions=NO_EVAL,
             progress=False, command="test")


@pytest.fixture
def convs_file(tmp_path):
    path = tmp_path / "convs.json"
    path.write_text(json.dumps(CONVS))
    return str(path)


def _shard_tensors(folder, manifest):
    out = []
    for s in manifest["shards"]:
        with safe_open(str(folder / s["file"]), framework="pt") as f:
            out.append(({k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["ids"])))  # noqa: SIM118
    return out


def test_token_store_resumes_to_the_files_of_an_uninterrupted_run(tmp_path, convs_file, monkeypatch):
    # stage (a) killed while generating its second part (items 2-3) must restart at that part: the same
    # part files as a run that was never interrupted, each conversation exactly once, the first part not redone
    whole = build_dataset(tiny_target(), [convs_file], tmp_path / "whole", **BUILD)
    real, calls = features_module.self_distilled, {"n": 0}

    def dies_on_second_part(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("simulated kill")
        return real(*args, **kwargs)

    monkeypatch.setattr(features_module, "self_distilled", dies_on_second_part)
    with pytest.raises(KeyboardInterrupt):
        build_dataset(tiny_target(), [convs_file], tmp_path / "cut", **BUILD)
    store = tmp_path / "cut" / "distilled"
    first = json.loads((store / "manifest.json").read_text())
    assert [p["file"] for p in first["parts"]] == ["part-00000.jsonl"] and not first["complete"]
    assert not (tmp_path / "cut" / "shard-00000.safetensors").exists()  # shard 0 (items 0-2) needs parts 0, 1
    monkeypatch.setattr(features_module, "self_distilled", real)
    resumed = build_dataset(tiny_target(), [convs_file], tmp_path / "cut", **BUILD)
    assert json.loads((store / "manifest.json").read_text())["parts"][0] == first["parts"][0]  # not redone
    names = sorted(os.listdir(tmp_path / "whole" / "distilled"))
    assert names == sorted(os.listdir(store)) == ["manifest.json", "part-00000.jsonl", "part-00001.jsonl",
                                                  "part-00002.jsonl"]
    for name in names[1:]:
        assert (store / name).read_bytes() == (tmp_path / "whole" / "distilled" / name).read_bytes()
    ids = [json.loads(line)["id"] for name in names[1:] for line in (store / name).read_text().splitlines()]
    assert sorted(ids) == [f"sharegpt/c{i}" for i in range(5)]  # each exactly once
    assert resumed["count"] == whole["count"] == 4 and resumed["skipped_no_assistant_tokens"] == 1
    for (a, ia), (b, ib) in zip(_shard_tensors(tmp_path / "cut", resumed), _shard_tensors(tmp_path / "whole", whole),
                                strict=True):
        assert ia == ib and a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
    gen = resumed["stages"]["generate"]
    assert gen["tokens"] > 0 and gen["tokens_per_s"] > 0 and gen["generators"][0]["generator"] == "hf"
    assert resumed["stages"]["features"]["tokens"] == resumed["tokens"]


def test_stored_ids_are_the_rendering_of_the_distilled_conversations(tmp_path, convs_file):
    # the token store must hold exactly what the one-stage build rendered: the chat rendering of the regenerated
    # conversation and its assistant mask (a mask-run bug would shift the loss onto prompt tokens)
    target = tiny_target()
    build_dataset(target, [convs_file], tmp_path / "d", **BUILD)
    records = read_token_records(tmp_path / "d" / "distilled", 0, 5)
    by_id = {f"sharegpt/{c['id']}": [{"role": "user" if t["from"] == "human" else "assistant",
                                      "content": t["value"]} for t in c["conversations"]] for c in CONVS}
    # part 0 (the first two conversations of the selection) was generated as one batch, like this call
    distilled = self_distilled(target, [by_id[r["id"]] for r in records[:2]], max_len=40, max_new_tokens=6,
                               batch_size=2)
    assert sum(bool(m) for m in distilled) >= 1
    for record, messages in zip(records[:2], distilled, strict=True):
        ids, mask = render_with_mask(target.tokenizer, messages, 40) if messages else ([], [])
        assert record["input_ids"] == ids
        assert record_mask(record) == mask
    assert {"id": "sharegpt/c4", "input_ids": [], "assistant": []} in records
    assert read_token_records(tmp_path / "d" / "distilled", 1, 4) == records[1:4]  # across a part boundary


def test_token_record_stores_the_mask_as_runs():
    # the mask's runs of ones as [start, end): a run bug would move the loss onto prompt tokens
    record = token_record("c", [1, 2, 3, 4, 5], [0, 1, 1, 0, 1])
    assert record == {"id": "c", "input_ids": [1, 2, 3, 4, 5], "assistant": [[1, 3], [4, 5]]}
    assert record_mask(record) == [0, 1, 1, 0, 1]
    assert record_mask(token_record("e", [7, 8], [0, 0])) == [0, 0]


def test_a_build_with_other_layers_reuses_the_token_store(tmp_path, convs_file, monkeypatch):
    # stage (b) alone: another feature setting over the same tokens must generate nothing (generation is patched
    # to fail) and store the same ids and mask, the same post-norm features and the requested levels
    target = tiny_target(layers=4)
    first = build_dataset(target, [convs_file], tmp_path / "a", **BUILD)

    def no_generation(*args, **kwargs):
        raise AssertionError("stage (a) ran again")

    monkeypatch.setattr(features_module, "self_distilled", no_generation)
    monkeypatch.setattr(features_module, "make_generator", no_generation)
    second = build_dataset(target, [convs_file], tmp_path / "b", **BUILD, layers="0,2",
                           tokens_dir=tmp_path / "a" / "distilled")
    assert second["stages"]["generate"] == first["stages"]["generate"] and second["hidden_layers"] == [0, 2]
    assert not (tmp_path / "b" / "distilled").exists()
    for (a, _), (b, _) in zip(_shard_tensors(tmp_path / "a", first), _shard_tensors(tmp_path / "b", second),
                              strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        torch.testing.assert_close(a["hidden"], b["hidden"], atol=2e-3, rtol=1e-3)
        assert b["levels"].shape == (b["input_ids"].shape[0], 2 * 32)
    # the store belongs to its settings: a build that would need other answers is refused, not mixed in
    with pytest.raises(ValueError, match="max_new_tokens: 6 -> 7"):
        build_dataset(target, [convs_file], tmp_path / "c", **{**BUILD, "max_new_tokens": 7},
                      tokens_dir=tmp_path / "a" / "distilled")


def test_batched_features_equal_one_forward_per_conversation():
    # right padding without a mask is exact in exact arithmetic (causal attention: a real token never sees a pad;
    # positions 0..S-1 are its own); fp32 GEMMs of another batch shape round differently, and the result is stored
    # as fp16, so the tolerance is fp16's (about 1e-3 relative). A position or padding bug would differ by O(1).
    target = tiny_target(layers=4, seed=2)
    seqs = [[5, 9, 30, 41, 7, 8, 60], [12], [70, 71, 72], list(range(10, 40))]
    one_by_one = batched_features(target, seqs, (0, 3), batch_tokens=0)
    batched = batched_features(target, seqs, (0, 3), batch_tokens=10_000)
    for s, one, many in zip(seqs, one_by_one, batched, strict=True):
        with torch.no_grad():
            ref = target.model(torch.tensor([s]), output_hidden_states=True).hidden_states
        assert one[0].shape == many[0].shape == (len(s), 32) and many[1].shape == (len(s), 64)
        torch.testing.assert_close(many[0].float(), ref[-1][0], atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(many[1].float(), torch.cat([ref[0][0], ref[3][0]], -1), atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(many[0], one[0], atol=2e-3, rtol=1e-3)
    assert batched_features(target, seqs, None, 64)[3][0].shape == (30, 32)  # 30 tokens alone, the rest grouped


def test_generators_and_bad_input():
    # until_eos cuts at the first EOS; HFGenerator counts what it generated; unknown generator, a bad batch and
    # vLLM without its venv are each one clear line
    assert until_eos([5, 7, 2, 9], {2}) == [5, 7] and until_eos([5], {2}) == [5]
    target = tiny_target(eos=False)
    gen = HFGenerator(target, batch=2)
    answers = gen([[3, 40, 41], [3, 50, 51, 52], [3, 60]], [4, 2, 3])
    assert [len(a) for a in answers] == [4, 2, 3] and gen.tokens == 9 and gen.seconds > 0
    with pytest.raises(ValueError, match="unknown generator 'sglang'; choose one of hf, vllm"):
        make_generator("sglang", target, 16, 64)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        make_generator("hf", target, 0, 64)
    with pytest.raises(ValueError, match="must be a Hugging Face folder"):
        make_generator("vllm", target, 16, 64)


def test_vllm_generator_refused_in_one_line_without_its_venv(tmp_path, convs_file, monkeypatch):
    target = tiny_target()
    target.model.save_pretrained(tmp_path / "model")
    target.path = str(tmp_path / "model")
    monkeypatch.setenv("DRAFTBENCH_VLLM_PYTHON", str(tmp_path / "no-venv" / "python"))
    with pytest.raises(ValueError, match=r"engine vllm: no python at .*no-venv/python; create vLLM's venv"):
        build_dataset(target, [convs_file], tmp_path / "d", **BUILD, generator="vllm")
    with pytest.raises(ValueError, match="part_size >= 1"):
        build_dataset(target, [convs_file], tmp_path / "e", **{**BUILD, "part_size": 0})
    with pytest.raises(ValueError, match=r"token store \(--tokens\) .* needs --self-distill"):
        build_dataset(target, [convs_file], tmp_path / "f", **{**BUILD, "self_distill": False}, tokens_dir=tmp_path)


@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_vllm_generator_answers_like_hf(tmp_path):
    # vLLM's engine (its own venv) must give the target's greedy answers: the same tokens as model.generate on a
    # tiny Llama whose logits are not near-tied (initializer 0.3), each cut at its room and at EOS
    from harness.backends import vllm

    if not os.path.isfile(vllm.python()):
        pytest.skip(f"no vLLM venv at {vllm.python()} (set {vllm.PYTHON_ENV})")
    target = tiny_target(hidden=256, init=0.3, seed=4)
    target.model.save_pretrained(tmp_path / "model")
    target.tokenizer.save_pretrained(tmp_path / "model")
    target.path = str(tmp_path / "model")
    prompts, rooms = [[3, 40, 41], [3, 50, 51, 52, 53, 54], [3, 60]], [8, 5, 12]
    gen = make_generator("vllm", target, 4, 64)
    try:
        got = gen(prompts, rooms)
    finally:
        gen.close()
    assert got == HFGenerator(target, 3)(prompts, rooms)
    assert gen.tokens == sum(map(len, got)) and gen.describe()["engine"] == "vllm"


def test_cli_build_reports_each_stage(tmp_path, convs_file, monkeypatch, capsys):
    # `draftbench data build --self-distill` prints tokens and tokens/s of generation and of the features; a second
    # build with --tokens of the first reports the same generation stage (reused, nothing generated)
    import harness.cli.data as cli_data
    from harness.cli import main

    monkeypatch.setattr(cli_data, "load_target", lambda *a, **k: tiny_target())
    monkeypatch.setattr(features_module, "evaluation_questions", lambda data_dir: NO_EVAL)
    args = ["data", "build", "--source", convs_file, "--self-distill", "--max-len", "40", "--max-new-tokens", "4",
            "--distill-part", "2", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    first = capsys.readouterr().out.splitlines()
    assert first[1].startswith("generate: ") and first[1].endswith(f"tokens/s ({tmp_path / 'a' / 'distilled'})")
    assert first[2].startswith("features: ") and first[2].endswith(" tokens/s")
    assert main([*args, "--out", str(tmp_path / "b"), "--tokens", str(tmp_path / "a" / "distilled")]) == 0
    assert capsys.readouterr().out.splitlines()[1] == first[1]


def test_a_build_resumed_without_its_store_generates_only_the_missing_shards(tmp_path, convs_file, monkeypatch):
    # a self-distilled build whose first shard was written before the token store existed (or whose store was
    # removed) must generate the parts of the missing shards only, not regenerate the finished shard's answers
    build = {**BUILD, "shard_size": 2}
    real, calls = features_module.batched_features, {"n": 0}

    def dies_on_second_shard(*args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("simulated kill")
        return real(*args)

    monkeypatch.setattr(features_module, "batched_features", dies_on_second_shard)
    with pytest.raises(KeyboardInterrupt):
        build_dataset(tiny_target(), [convs_file], tmp_path / "d", **build)
    monkeypatch.setattr(features_module, "batched_features", real)
    for f in (tmp_path / "d" / "distilled").iterdir():
        f.unlink()
    m = build_dataset(tiny_target(), [convs_file], tmp_path / "d", **build)
    store = json.loads((tmp_path / "d" / "distilled" / "manifest.json").read_text())
    assert [p["file"] for p in store["parts"]] == ["part-00001.jsonl", "part-00002.jsonl"]  # not part 0
    assert not store["complete"] and m["complete"] and len(m["shards"]) == 3
