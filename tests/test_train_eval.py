"""``draftbench train eval``: a saved head scored on the trainer's held-out split gives the trainer's own numbers;
heads that do not fit are refused in one line, with nothing written."""

import csv
import json

import pytest

from harness.cli import main
from harness.measure.noise import paired_rate_difference_ci
from harness.train.evaluate import eval_heads, show
from harness.train.features import build_dataset, file_sha256
from harness.train.loop import TrainConfig, train
from tests.support.helpers import tiny_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pattern_conversations(n: int) -> list[dict]:
    """Answers that repeat a short motif: something a head learns in a few steps."""
    motifs = ["ab ", "xyz ", "hello ", "12 "]
    return [{"id": f"p{i}", "conversations": [
        {"from": "human", "value": f"repeat {motifs[i % 4].strip()} please {i}"},
        {"from": "gpt", "value": motifs[i % 4] * (6 + i % 3)}]} for i in range(n)]


def config(**kw) -> TrainConfig:
    base = dict(lr=3e-3, warmup_steps=2, max_steps=8, batch_size=4, eval_fraction=0.25, eval_every=1000,
                log_every=1, save_every=1000, eval_positions=3, cpu=True, progress=False)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny target, 12 conversations with EAGLE-3's three levels (the last 3 held out at eval_fraction 0.25),
    an eagle3 run (draft vocabulary 40, 3 unrolled steps; checkpoints at steps 4 and 8) and an eagle run
    (train_vocab 40) of 8 steps each."""
    root = tmp_path_factory.mktemp("traineval")
    (root / "convs.json").write_text(json.dumps(pattern_conversations(12)))
    target = tiny_target(eos=False, init=0.3)
    build_dataset(target, [str(root / "convs.json")], root / "data", max_len=96, shard_size=6,
                  eval_questions={"x": ["y/1"]}, progress=False, layers="low,mid,high")
    recipes = {
        "eagle3": train("eagle3", target, root / "data", root / "eagle3",
                        config(options={"draft_vocab": 40, "length": 3}, save_every=4)),
        "eagle": train("eagle", target, root / "data", root / "eagle", config(options={"train_vocab": 40})),
    }
    return target, root, recipes


def test_the_last_checkpoint_gives_the_trainers_final_eval_exactly(runs):
    """The run's last checkpoint (fp32 weights), scored on the same data with the run's split settings, must give
    the accuracy per position, the positions counted and the loss the trainer printed at its end, to the last
    digit; any difference means eval scores another split, another draft vocabulary or another loss than the
    trainer's. The 3 held-out conversations hold 97 scored positions at every draft position here."""
    target, root, recipes = runs
    for name in ("eagle3", "eagle"):
        doc = eval_heads(name, target, [root / name / "checkpoints" / "step-0000008"], root / "data", config())
        (head,), final = doc["heads"], recipes[name]["final_eval"]
        assert (head["acc"], head["positions"], head["loss"]) == (final["acc"], final["positions"], final["loss"]), name
        assert head["positions"] == [97, 97, 97]


def test_the_published_head_gives_the_trainers_accuracy(runs, tmp_path):
    """The run's head/ (fp16 published weights, the draft vocabulary from its d2t/t2d or its token_counts.json)
    must count the same positions and hit the same tokens as the trainer's final eval on this data (the fp16
    rounding moves the loss in its 4th digit, no argmax here); and --out must write one tidy row per position and a
    manifest naming the weights' and the data's sha256, the split and the options read from the run's recipe."""
    target, root, recipes = runs
    out = tmp_path / "e.csv"
    doc = eval_heads("eagle3", target, [root / "eagle3" / "head"], root / "data", config(), out=out)
    (head,), final = doc["heads"], recipes["eagle3"]["final_eval"]
    assert (head["acc"], head["positions"]) == (final["acc"], final["positions"])
    assert head["loss"] == pytest.approx(final["loss"], rel=1e-3)
    rows = list(csv.DictReader(out.open()))
    assert [(r["position"], r["acc"], r["positions"], r["diff"]) for r in rows] == \
        [(str(j + 1), str(a), "97", "") for j, a in enumerate(final["acc"])]
    manifest = json.loads(out.with_suffix(".json").read_text())
    (entry,) = manifest["heads"]
    assert entry["head_weights_sha256"] == {
        "pytorch_model.bin": file_sha256(root / "eagle3" / "head" / "pytorch_model.bin")}
    assert manifest["data_manifest_sha256"] == recipes["eagle3"]["data_manifest_sha256"]
    assert manifest["split"]["eval_conversations"] == 3 and manifest["split"]["eval_fraction"] == 0.25
    assert entry["options"] == {"draft_vocab": 40, "length": 3, "decay": 0.8}
    assert entry["options_from"] == str(root / "eagle3" / "recipe.json") and "git_hash" in manifest
    assert "bootstrap" not in manifest
    assert show(doc).splitlines()[1:3] == ["position  top-1     positions",
                                           f"       1  {final['acc'][0]:>8.4f}         97"]
    (eagle,) = eval_heads("eagle", target, [root / "eagle" / "head"], root / "data", config())["heads"]
    assert (eagle["acc"], eagle["positions"]) == (recipes["eagle"]["final_eval"]["acc"], [97, 97, 97])


def test_two_heads_give_their_difference_with_a_paired_ci(runs, tmp_path):
    """The run's last checkpoint (A) against its step-4 checkpoint (B) and against itself (C), counted one
    conversation at a time: each head's accuracy must still be the batched one (A: the trainer's final eval to the
    last digit, else the per-conversation counts score other positions), B-A must be acc_B - acc_A from the same
    counts and lie inside its CI, and A against itself must give 0 with CI [0, 0] (a non-zero one would mean the two
    sides are not paired conversation by conversation). The CSV gets diff/ci_low/ci_high on B's and C's rows and
    the manifest lists every head, its per-conversation counts, the resample count and the seed."""
    target, root, recipes = runs
    last, early = (root / "eagle3" / "checkpoints" / f"step-000000{n}" for n in (8, 4))
    out = tmp_path / "cmp.csv"
    doc = eval_heads("eagle3", target, [last, early, last], root / "data", config(), out=out, n_boot=500)
    a, b, c = doc["heads"]
    final = recipes["eagle3"]["final_eval"]
    assert (a["acc"], a["positions"], a["loss"]) == (final["acc"], final["positions"], final["loss"])
    assert a["positions"] == b["positions"] == [97, 97, 97]
    assert len(a["conversation_hits"]) == 3 and [sum(col) for col in zip(*a["conversation_positions"])] == [97] * 3
    assert [sum(col) for col in zip(*b["conversation_hits"])] == [round(x * 97) for x in b["acc"]]
    for j in range(3):
        diff, low, high = b["diff"][j]
        assert diff == pytest.approx(b["acc"][j] - a["acc"][j], abs=2e-6) and low <= diff <= high
        assert c["diff"][j] == [0.0, 0.0, 0.0]
    assert a["acc"] != b["acc"]  # the two checkpoints differ: the comparison is not vacuous
    rows = list(csv.DictReader(out.open()))
    assert [r["diff"] != "" for r in rows] == [False] * 3 + [True] * 6
    assert float(rows[3]["diff"]) == b["diff"][0][0] and float(rows[3]["ci_low"]) == b["diff"][0][1]
    manifest = json.loads(out.with_suffix(".json").read_text())
    assert [h["head"] for h in manifest["heads"]] == [str(last), str(early), str(last)]
    assert manifest["bootstrap"]["resamples"] == 500 and manifest["bootstrap"]["seed"] == 0
    assert manifest["heads"][1]["conversation_hits"] == b["conversation_hits"]
    printed = show(doc).splitlines()
    assert printed[1].split() == ["position", "top-1", "A", "top-1", "B", "top-1", "C", "B-A", "[95%", "CI]",
                                  "C-A", "[95%", "CI]", "positions"]
    assert printed[2].endswith("+0.0000 [+0.0000, +0.0000]         97"), printed[2]


def test_the_conversation_bootstrap_on_a_hand_checkable_example():
    """Three conversations, one draft position. A hits 1 of 2, 0 of 2, 2 of 4 (3/8); B hits 2 of 2, 0 of 2, 2 of 4
    (4/8): B-A = 1/8. Resampling conversations (not positions), a resample's difference is the number of
    draws of conversation 1 over the resample's positions (only conversation 1 differs, by one hit); its extremes
    are 0 (conversation 1 never drawn) and 3/6 (drawn three times). A resampler that drew positions would
    not keep each conversation's hits together, and one that drew A's and B's conversations apart would not give 0
    for identical heads."""
    a_hits, b_hits, totals = [[1], [0], [2]], [[2], [0], [2]], [[2], [2], [4]]
    ((diff, low, high),) = paired_rate_difference_ci(a_hits, totals, b_hits, totals, n_boot=2000, seed=0)
    assert diff == 0.125
    assert 0.0 <= low < diff < high <= 0.5
    assert paired_rate_difference_ci(a_hits, totals, a_hits, totals, n_boot=50) == [(0.0, 0.0, 0.0)]
    # a single conversation: every resample is that conversation, so the CI is the point
    assert paired_rate_difference_ci([[1]], [[2]], [[2]], [[2]], n_boot=10) == [(0.5, 0.5, 0.5)]
    # a position where A counts nothing has no difference
    ((d, lo, hi),) = paired_rate_difference_ci([[0]], [[0]], [[1]], [[2]], n_boot=10)
    assert d != d and lo != lo and hi != hi


def test_a_head_that_does_not_fit_is_refused_in_one_line(runs, tmp_path, capsys, monkeypatch):
    """Data made by another target, a head for another vocabulary, a head that fuses other layers than the data
    stores, an unknown objective, a missing head (first or second of a comparison) or no bootstrap resamples must
    stop with one line and write nothing: scoring them would
    report numbers of a mismatched pair (or crash inside the loss). The same command on the run's head prints the
    table and writes both files."""
    target, root, _ = runs
    other = tiny_target(eos=False, hidden=48)
    with pytest.raises(ValueError, match=r"features have hidden size 32, the target 'tiny-llama' has 48"):
        eval_heads("eagle3", other, [root / "eagle3" / "head"], root / "data", config())
    moved = tmp_path / "moved"
    moved.mkdir()
    cfg = json.loads((root / "eagle3" / "head" / "config.json").read_text())
    (moved / "config.json").write_text(json.dumps({**cfg, "vocab_size": 64}))
    with pytest.raises(ValueError, match=r"vocab_size=64 do not match the target 'tiny-llama' \(hidden_size=32, "
                                         r"vocab_size=128\)"):
        eval_heads("eagle3", target, [moved], root / "data", config())
    (moved / "config.json").write_text(json.dumps({**cfg, "eagle_aux_hidden_state_layer_ids": [0, 1, 1]}))
    (moved / "pytorch_model.bin").write_bytes((root / "eagle3" / "head" / "pytorch_model.bin").read_bytes())
    monkeypatch.setattr("harness.cli.train.load_target", lambda *args, **kw: target)
    out = tmp_path / "r.csv"
    shipped, none = ["--head", str(root / "eagle3" / "head")], tmp_path / "none"
    for objective, args, message in (
            ("eagle9", ["--head", str(moved)], "unknown objective 'eagle9'"),
            ("eagle3", ["--head", str(none)], f"no head at {none}"),
            ("eagle3", ["--head", str(moved)], "fuses target layers [0, 1, 1], the data stores levels [1, 1, 1]"),
            ("eagle3", [*shipped, "--head", str(none)], f"no head at {none}"),
            ("eagle3", [*shipped, "--head", str(moved)], "fuses target layers [0, 1, 1]"),
            ("eagle3", [*shipped, *shipped, "--bootstrap", "0"], "--bootstrap 0: give a number of resamples")):
        code = main(["train", "eval", objective, *args, "--data", str(root / "data"),
                     "--out", str(out), "--eval-fraction", "0.25", "--cpu"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith("draftbench: error: "), err
        assert message in err, err
    assert not out.exists() and not out.with_suffix(".json").exists()
    assert main(["train", "eval", "eagle3", "--head", str(root / "eagle3" / "head"), "--data", str(root / "data"),
                 "--out", str(out), "--eval-fraction", "0.25", "--eval-positions", "3", "--cpu"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1] == "position  top-1     positions" and len(printed) == 7, printed
    assert out.exists() and out.with_suffix(".json").exists()


def test_a_checkpoint_of_another_objective_is_refused(runs):
    """Scoring the eagle run's checkpoint as eagle3 must fail in one line naming the checkpoint, not load half of
    it (its keys are EAGLE-1's and it has no draft vocabulary maps)."""
    target, root, _ = runs
    with pytest.raises(ValueError, match="checkpoint does not fit objective 'eagle3'"):
        eval_heads("eagle3", target, [root / "eagle" / "checkpoints" / "step-0000008"], root / "data", config())


@pytest.mark.parametrize("objective, options", [("jakiro", {"train_vocab": 40}), ("medusa", {"num_heads": 3}),
                                                ("hydra", {"num_heads": 2, "train_vocab": 40})])
def test_jakiro_medusa_and_hydra_heads_give_the_trainers_accuracy(runs, tmp_path, objective, options):
    """Each other objective's published head/ must be scored as the trainer scored it at its last step (same hits,
    same positions): its loader, its options (read from the run's recipe) and its draft vocabulary are the ones
    the trainer used; a head with fewer heads than draft positions counts nothing beyond them (hydra: 0 at 3)."""
    target, root, _ = runs
    recipe = train(objective, target, root / "data", tmp_path / objective, config(max_steps=4, options=options))
    (doc,) = eval_heads(objective, target, [tmp_path / objective / "head"], root / "data", config())["heads"]
    final = recipe["final_eval"]
    assert (doc["acc"], doc["positions"]) == (final["acc"], final["positions"])
    assert {k: doc["options"][k] for k in options} == options
    if objective == "hydra":
        assert doc["positions"][2] == 0 and doc["acc"][2] is None
