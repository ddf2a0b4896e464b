"""Training-data build: assistant loss mask, shards + manifest, resume, contamination, EAGLE shifting."""

import json

import pytest
import torch
from safetensors import safe_open

import harness.train.features as features_module
from harness.train.dataset import FeatureDataset, collate, eagle_noise, shift_for_eagle
from harness.train.distill import self_distilled
from harness.train.features import (
    batched_features,
    build_dataset,
    merge_datasets,
    render_with_mask,
    verify_shards,
)
from harness.train.sources import (
    ContaminationError,
    clean_turns,
    evaluation_questions,
    json_array_prefix,
    normalise,
)
from tests.support.helpers import tiny_target

CONVS = [  # ShareGPT format; c0 has two exchanges
    {"id": "c0", "conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"},
                                   {"from": "human", "value": "c"}, {"from": "gpt", "value": "d"}]},
    {"id": "c1", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
    {"id": "c2", "conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4"}]},
    {"id": "c3", "conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "q"},
                                   {"from": "gpt", "value": "r"}]},
]
NO_EVAL = {"an unrelated evaluation question": ["mt_bench/1"]}


@pytest.fixture
def convs_file(tmp_path):
    path = tmp_path / "convs.json"
    path.write_text(json.dumps(CONVS))
    return str(path)


def test_loss_mask_is_exactly_the_assistant_tokens():
    # "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n", one token per character/special:
    # y=21, o=22, <|im_end|>=23. A wrong span would include the template ("assistant\n") or the trailing "\n".
    tok = tiny_target().tokenizer
    ids, mask = render_with_mask(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], 100)
    assert len(ids) == 25
    assert [i for i, m in enumerate(mask) if m] == [21, 22, 23]


def test_loss_mask_two_turns_and_truncation():
    # two exchanges: b=20, <|im_end|>=21, d=43, <|im_end|>=44; the user turns "a"/"c" must stay 0.
    tok = tiny_target().tokenizer
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    ids, mask = render_with_mask(tok, msgs, 100)
    assert [i for i, m in enumerate(mask) if m] == [20, 21, 43, 44]
    ids, mask = render_with_mask(tok, msgs, 22)  # truncation keeps the first 22 tokens only
    assert len(ids) == 22 and [i for i, m in enumerate(mask) if m] == [20, 21]


def test_clean_turns_and_normalise():
    # a leading gpt turn and a trailing human turn are dropped; a non-alternating conversation is rejected
    raw = [{"from": "gpt", "value": "a"}, {"from": "human", "value": "b"}, {"from": "gpt", "value": "c"},
           {"from": "human", "value": "d"}]
    assert clean_turns(raw) == [{"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
    assert clean_turns([{"from": "human", "value": "b"}, {"from": "human", "value": "c"}]) is None
    assert normalise("  What is 2+2?\n") == "what is 2 2"
    assert json_array_prefix('[{"a": 1}, {"b": 2}, {"c": ') == ([{"a": 1}, {"b": 2}], True)


def test_build_writes_shards_manifest_and_post_norm_features(tmp_path, convs_file):
    target = tiny_target()
    m = build_dataset(target, [convs_file], tmp_path / "d", max_len=64, shard_size=3, eval_questions=NO_EVAL,
                         progress=False, command="test")
    assert m["complete"] and m["count"] == 4 and len(m["shards"]) == 2  # 3 + 1 conversations
    assert m["settings"]["max_len"] == 64 and m["settings"]["self_distill"] is False
    assert m["settings"]["chat_template_sha256"] and m["settings"]["target_config_sha256"]
    on_disk = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert on_disk["shards"] == m["shards"] and on_disk["command"] == "test"
    verify_shards(tmp_path / "d")  # every sha256 in the manifest matches its file
    with safe_open(str(tmp_path / "d" / m["shards"][0]["file"]), framework="pt") as f:
        ids, hidden, off = f.get_tensor("input_ids").long(), f.get_tensor("hidden"), f.get_tensor("offsets")
    assert hidden.dtype == torch.float16 and hidden.shape == (ids.shape[0], 32) and off[-1] == ids.shape[0]
    # the stored feature is the lm_head input: equal to output_hidden_states[-1], and lm_head of it = the logits
    first = ids[: off[1]][None]
    with torch.no_grad():
        out = target.model(first, output_hidden_states=True)
    torch.testing.assert_close(hidden[: off[1]].float(), out.hidden_states[-1][0], atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(target.model.lm_head(hidden[: off[1]].float()), out.logits[0], atol=2e-2, rtol=1e-2)


def test_build_with_layers_stores_the_requested_levels(tmp_path, convs_file):
    # `data build --layers low,mid,high` (what `train eagle3` reads): on a 4-layer target the levels are the inputs
    # of layers 2, 2, 1 -> clipped (2, 2, 2); use explicit indices to see distinct ones. The stored levels must be
    # those hidden states of the same forward, side by side, aligned with the tokens; the manifest records them,
    # a resume with other layers is refused and the training view hands them over with every item
    target = tiny_target(layers=4)
    m = build_dataset(target, [convs_file], tmp_path / "d", max_len=64, shard_size=3, eval_questions=NO_EVAL,
                      progress=False, layers="0,2,mid")
    assert m["hidden_layers"] == [0, 2, 2] and m["settings"]["layers"] == [0, 2, 2]
    with safe_open(str(tmp_path / "d" / m["shards"][0]["file"]), framework="pt") as f:
        ids, levels, off = f.get_tensor("input_ids").long(), f.get_tensor("levels"), f.get_tensor("offsets")
    assert levels.dtype == torch.float16 and levels.shape == (ids.shape[0], 3 * 32)
    with torch.no_grad():
        states = target.model(ids[: off[1]][None], output_hidden_states=True).hidden_states
    expected = torch.cat([states[0][0], states[2][0], states[2][0]], dim=-1)
    torch.testing.assert_close(levels[: off[1]].float(), expected, atol=2e-3, rtol=1e-3)
    item = FeatureDataset(tmp_path / "d", noise="none")[0]
    assert item["levels"].shape == (item["features"].shape[0], 96)
    with pytest.raises(ValueError, match=r"layers: \[0, 2, 2\] -> \[2, 2, 2\]"):
        build_dataset(target, [convs_file], tmp_path / "d", max_len=64, shard_size=3, eval_questions=NO_EVAL,
                      progress=False, layers="low,mid,high")
    plain = build_dataset(target, [convs_file], tmp_path / "p", max_len=64, shard_size=3, eval_questions=NO_EVAL,
                          progress=False)
    assert "hidden_layers" not in plain and "levels" not in FeatureDataset(tmp_path / "p", noise="none")[0]


def test_resume_after_kill_has_no_duplicates(tmp_path, convs_file, monkeypatch):
    target = tiny_target()
    calls = {"n": 0}
    real = batched_features

    def dies_on_second(*args):  # one call per shard
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("simulated kill")
        return real(*args)

    monkeypatch.setattr(features_module, "batched_features", dies_on_second)
    with pytest.raises(KeyboardInterrupt):  # shard 0 (conversations 0-1) is complete, shard 1 is not
        build_dataset(target, [convs_file], tmp_path / "d", max_len=64, shard_size=2, eval_questions=NO_EVAL,
                         progress=False)
    first = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert not first["complete"] and len(first["shards"]) == 1
    monkeypatch.setattr(features_module, "batched_features", real)
    m = build_dataset(target, [convs_file], tmp_path / "d", max_len=64, shard_size=2, eval_questions=NO_EVAL,
                         progress=False)
    assert m["complete"] and m["shards"][0] == first["shards"][0]  # shard 0 was not rebuilt
    ids = []
    for s in m["shards"]:
        with safe_open(str(tmp_path / "d" / s["file"]), framework="pt") as f:
            ids += json.loads(f.metadata()["ids"])
    assert sorted(ids) == ["sharegpt/c0", "sharegpt/c1", "sharegpt/c2", "sharegpt/c3"]  # each exactly once
    # resuming with other settings is refused rather than mixing two builds
    with pytest.raises(ValueError, match="max_len"):
        build_dataset(target, [convs_file], tmp_path / "d", max_len=32, shard_size=2, eval_questions=NO_EVAL,
                         progress=False)


def test_contamination_check_catches_a_planted_question(tmp_path, convs_file, monkeypatch):
    # c2's user turn "What is 2+2?" is planted (different case/spacing) as an MT-bench question
    data = tmp_path / "evaldata"
    (data / "eagle" / "mt_bench").mkdir(parents=True)
    (data / "eagle" / "mt_bench" / "question.jsonl").write_text(
        json.dumps({"question_id": 81, "category": "x", "turns": ["what is 2 + 2 ?", "and 3+3?"]}) + "\n")
    monkeypatch.setenv("DRAFTBENCH_DATA", str(data))
    assert evaluation_questions()["what is 2 + 2 ?"] == ["mt_bench/81"]
    with pytest.raises(ContaminationError, match=r"sharegpt/c2 = mt_bench/81"):
        build_dataset(tiny_target(), [convs_file], tmp_path / "d1", max_len=64, drop_contaminated=False,
                         progress=False)
    m = build_dataset(tiny_target(), [convs_file], tmp_path / "d2", max_len=64, progress=False)
    assert m["contaminated_dropped"] == 1 and m["contaminated_ids"] == {"sharegpt/c2": ["mt_bench/81"]}
    assert m["count"] == 3


def test_shift_for_eagle_literal():
    # position t reads (f_t, x_{t+1}) and regresses f_{t+1}; the last position has no target and no loss
    ids = torch.tensor([5, 6, 7])
    hidden = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    out = shift_for_eagle(ids, hidden, torch.tensor([0.0, 1.0, 1.0]))
    assert out["input_ids"].tolist() == [6, 7, 0]
    assert out["target"].tolist() == [[2.0, 2.0], [3.0, 3.0], [0.0, 0.0]]
    assert out["loss_mask"].tolist() == [0.0, 1.0, 0.0]
    assert out["token_mask"].tolist() == [0.0, 1.0, 1.0] and out["features"] is hidden


def test_noise_amplitude_follows_sequence_length():
    # published: U(-0.5,0.5) * 0.2 * 512 / S, so S=1024 stays within ±0.05 and S=64 reaches ±0.8; fixed scale ignores S
    g = torch.Generator().manual_seed(0)
    long_ = eagle_noise((4000,), 1024, generator=g)
    short = eagle_noise((4000,), 64, generator=g)
    fixed = eagle_noise((4000,), 64, scale=0.1, generator=g)
    assert long_.abs().max() <= 0.05 and long_.abs().max() > 0.045
    assert short.abs().max() <= 0.8 and short.abs().max() > 0.7
    assert fixed.abs().max() <= 0.05


def test_feature_dataset_split_and_collate(tmp_path, convs_file):
    build_dataset(tiny_target(), [convs_file], tmp_path / "d", max_len=64, eval_questions=NO_EVAL, progress=False)
    train, held = FeatureDataset(tmp_path / "d", "train", noise="none"), FeatureDataset(tmp_path / "d", "eval")
    assert (len(train), len(held)) == (3, 1)  # 5% of 4 rounds to 0, but at least one is held out
    a, b = train[0], train[1]
    batch = collate([a, b])
    S = max(a["input_ids"].shape[0], b["input_ids"].shape[0])
    assert batch["features"].shape == (2, S, 32) and batch["attention_mask"].sum().item() == (
        a["input_ids"].shape[0] + b["input_ids"].shape[0])
    short = 0 if a["input_ids"].shape[0] < b["input_ids"].shape[0] else 1
    n = batch["attention_mask"][short].sum()
    assert batch["loss_mask"][short, n:].sum() == 0  # padding never carries loss
    with pytest.raises(ValueError, match="noise"):
        FeatureDataset(tmp_path / "d", noise="gaussian")


def test_max_shards_trains_on_a_written_prefix_of_an_unfinished_build(tmp_path):
    """An incomplete build is refused, unless a prefix of written shards is asked for explicitly."""
    import json

    from harness.train.features import read_manifest

    (tmp_path / "manifest.json").write_text(json.dumps({"complete": False, "shards": [{"file": "a"}, {"file": "b"}]}))
    with pytest.raises(ValueError, match="incomplete.*--max-shards"):
        read_manifest(tmp_path)
    assert [s["file"] for s in read_manifest(tmp_path, max_shards=1)["shards"]] == ["a"]
    with pytest.raises(ValueError, match="2 shards are written, 3 requested"):
        read_manifest(tmp_path, max_shards=3)


def test_batched_self_distillation_equals_one_conversation_at_a_time():
    # Each assistant turn must be the target's greedy answer to the regenerated history (what vanilla decoding
    # gives for that prompt), whatever the batch: a padding or position bug in the left-padded batch would change
    # the answers of the shorter prompts; a turn-order bug would answer turn 2 without the new turn 1.
    from harness.engine.sampling import SamplingParams
    from methods.vanilla import Vanilla

    target = tiny_target(seed=3)
    convs = [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
              {"role": "user", "content": "cc"}, {"role": "assistant", "content": "d"}],
             [{"role": "user", "content": "a much longer question"}, {"role": "assistant", "content": "x"}],
             [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]]
    batched = self_distilled(target, convs, max_len=120, max_new_tokens=12, batch_size=3)
    vanilla = Vanilla(target)
    for conv, got in zip(convs, batched):
        assert [m["role"] for m in got] == [m["role"] for m in conv]
        history = []
        for m, g in zip(conv, got):
            if m["role"] == "assistant":
                gen = vanilla.generate(target.render_chat(history), 12, SamplingParams())
                ids = [t for t in gen.token_ids if t not in target.eos_ids]
                assert g["content"] == target.decode(ids)
            else:
                assert g == m
            history.append(g)
    # a prompt that already fills max_len drops its user turn and everything after it
    first_prompt = target.render_chat(convs[0][:1]).shape[1]
    assert self_distilled(target, convs[:1], max_len=first_prompt, max_new_tokens=12) == [[]]
    second_prompt = target.render_chat(batched[0][:3]).shape[1]
    short = self_distilled(target, convs[:1], max_len=second_prompt, max_new_tokens=12)
    assert short == [batched[0][:2]]


def test_self_distilled_build_skips_a_conversation_whose_first_prompt_fills_max_len(tmp_path):
    # c_long's first prompt alone exceeds max_len: self-distillation leaves it empty, and the build must skip it
    # (counted in skipped_no_assistant_tokens) instead of failing on an empty chat template
    convs = [{"id": "c_long", "conversations": [{"from": "human", "value": "x" * 80}, {"from": "gpt", "value": "y"}]},
             {"id": "c_ok", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]
    path = tmp_path / "convs.json"
    path.write_text(json.dumps(convs))
    m = build_dataset(tiny_target(), [str(path)], tmp_path / "d", max_len=40, self_distill=True, max_new_tokens=4,
                         eval_questions=NO_EVAL, progress=False, command="test")
    assert m["count"] == 1 and m["skipped_no_assistant_tokens"] == 1


def test_merge_links_the_shards_of_two_builds_and_refuses_another_target(tmp_path, convs_file):
    # the merged dataset must serve every conversation of both sources (in order), verify its sha256s, and refuse
    # features of a different target (mixing hidden spaces would train on garbage)
    a = build_dataset(tiny_target(), [convs_file], tmp_path / "a", max_len=64, shard_size=3, eval_questions=NO_EVAL,
                         progress=False, command="a")
    b = build_dataset(tiny_target(), [convs_file], tmp_path / "b", max_len=32, shard_size=2, eval_questions=NO_EVAL,
                         progress=False, command="b")
    m = merge_datasets([tmp_path / "a", tmp_path / "b"], tmp_path / "ab", command="merge")
    assert m["count"] == a["count"] + b["count"] and len(m["shards"]) == 4
    verify_shards(tmp_path / "ab")
    merged = FeatureDataset(tmp_path / "ab", noise="none")
    firsts = FeatureDataset(tmp_path / "a", noise="none")
    assert len(merged) == 8 and torch.equal(merged.raw(0)[0], firsts.raw(0)[0])
    assert torch.equal(merged.raw(7)[0], FeatureDataset(tmp_path / "b", noise="none").raw(3)[0])
    with pytest.raises(FileExistsError):
        merge_datasets([tmp_path / "a", tmp_path / "b"], tmp_path / "ab")
    build_dataset(tiny_target(seed=5), [convs_file], tmp_path / "c", max_len=64, eval_questions=NO_EVAL,
                     progress=False, command="c")
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    manifest["settings"]["target_config_sha256"] = "another"
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="target_config_sha256"):
        merge_datasets([tmp_path / "a", tmp_path / "c"], tmp_path / "ac")
