"""``draftbench train eval``: a saved head scored on the trainer's held-out split gives the trainer's own numbers;
heads that do not fit are refused in one line, with nothing written."""

import csv
import json

import pytest

from harness.cli import main
from harness.train.evaluate import eval_head, show
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
    an eagle3 run (draft vocabulary 40, 3 unrolled steps) and an eagle run (train_vocab 40) of 8 steps each."""
    root = tmp_path_factory.mktemp("traineval")
    (root / "convs.json").write_text(json.dumps(pattern_conversations(12)))
    target = tiny_target(eos=False, init=0.3)
    build_dataset(target, [str(root / "convs.json")], root / "data", max_len=96, shard_size=6,
                  eval_questions={"x": ["y/1"]}, progress=False, layers="low,mid,high")
    recipes = {
        "eagle3": train("eagle3", target, root / "data", root / "eagle3",
                        config(options={"draft_vocab": 40, "length": 3})),
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
        doc = eval_head(name, target, root / name / "checkpoints" / "step-0000008", root / "data", config())
        final = recipes[name]["final_eval"]
        assert (doc["acc"], doc["positions"], doc["loss"]) == (final["acc"], final["positions"], final["loss"]), name
        assert doc["positions"] == [97, 97, 97]


def test_the_published_head_gives_the_trainers_accuracy(runs, tmp_path):
    """The run's head/ (fp16 published weights, the draft vocabulary from its d2t/t2d or its token_counts.json)
    must count the same positions and hit the same tokens as the trainer's final eval on this data (the fp16
    rounding moves the loss in its 4th digit, no argmax here); and --out must write one tidy row per position and a
    manifest naming the weights' and the data's sha256, the split and the options read from the run's recipe."""
    target, root, recipes = runs
    out = tmp_path / "e.csv"
    doc = eval_head("eagle3", target, root / "eagle3" / "head", root / "data", config(), out=out)
    final = recipes["eagle3"]["final_eval"]
    assert (doc["acc"], doc["positions"]) == (final["acc"], final["positions"])
    assert doc["loss"] == pytest.approx(final["loss"], rel=1e-3)
    rows = list(csv.DictReader(out.open()))
    assert [(r["position"], r["acc"], r["positions"]) for r in rows] == \
        [(str(j + 1), str(a), "97") for j, a in enumerate(final["acc"])]
    manifest = json.loads(out.with_suffix(".json").read_text())
    assert manifest["head_weights_sha256"] == {
        "pytorch_model.bin": file_sha256(root / "eagle3" / "head" / "pytorch_model.bin")}
    assert manifest["data_manifest_sha256"] == recipes["eagle3"]["data_manifest_sha256"]
    assert manifest["split"]["eval_conversations"] == 3 and manifest["split"]["eval_fraction"] == 0.25
    assert manifest["options"] == {"draft_vocab": 40, "length": 3, "decay": 0.8}
    assert manifest["options_from"] == str(root / "eagle3" / "recipe.json") and "git_hash" in manifest
    assert show(doc).splitlines()[1:3] == ["position  top-1     positions",
                                           f"       1  {final['acc'][0]:>8.4f}         97"]
    eagle = eval_head("eagle", target, root / "eagle" / "head", root / "data", config())
    assert (eagle["acc"], eagle["positions"]) == (recipes["eagle"]["final_eval"]["acc"], [97, 97, 97])


def test_a_head_that_does_not_fit_is_refused_in_one_line(runs, tmp_path, capsys, monkeypatch):
    """Data made by another target, a head for another vocabulary, a head that fuses other layers than the data
    stores, an unknown objective or a missing head must stop with one line and write nothing: scoring them would
    report numbers of a mismatched pair (or crash inside the loss). The same command on the run's head prints the
    table and writes both files."""
    target, root, _ = runs
    other = tiny_target(eos=False, hidden=48)
    with pytest.raises(ValueError, match=r"features have hidden size 32, the target 'tiny-llama' has 48"):
        eval_head("eagle3", other, root / "eagle3" / "head", root / "data", config())
    moved = tmp_path / "moved"
    moved.mkdir()
    cfg = json.loads((root / "eagle3" / "head" / "config.json").read_text())
    (moved / "config.json").write_text(json.dumps({**cfg, "vocab_size": 64}))
    with pytest.raises(ValueError, match=r"vocab_size=64 do not match the target 'tiny-llama' \(hidden_size=32, "
                                         r"vocab_size=128\)"):
        eval_head("eagle3", target, moved, root / "data", config())
    (moved / "config.json").write_text(json.dumps({**cfg, "eagle_aux_hidden_state_layer_ids": [0, 1, 1]}))
    (moved / "pytorch_model.bin").write_bytes((root / "eagle3" / "head" / "pytorch_model.bin").read_bytes())
    monkeypatch.setattr("harness.cli.train.load_target", lambda *args, **kw: target)
    out = tmp_path / "r.csv"
    for objective, head, message in (
            ("eagle9", moved, "unknown objective 'eagle9'"),
            ("eagle3", tmp_path / "none", f"no head at {tmp_path / 'none'}"),
            ("eagle3", moved, "fuses target layers [0, 1, 1], the data stores levels [1, 1, 1]")):
        code = main(["train", "eval", objective, "--head", str(head), "--data", str(root / "data"),
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
        eval_head("eagle3", target, root / "eagle" / "checkpoints" / "step-0000008", root / "data", config())


@pytest.mark.parametrize("objective, options", [("jakiro", {"train_vocab": 40}), ("medusa", {"num_heads": 3}),
                                                ("hydra", {"num_heads": 2, "train_vocab": 40})])
def test_jakiro_medusa_and_hydra_heads_give_the_trainers_accuracy(runs, tmp_path, objective, options):
    """Each other objective's published head/ must be scored as the trainer scored it at its last step (same hits,
    same positions): its loader, its options (read from the run's recipe) and its draft vocabulary are the ones
    the trainer used; a head with fewer heads than draft positions counts nothing beyond them (hydra: 0 at 3)."""
    target, root, _ = runs
    recipe = train(objective, target, root / "data", tmp_path / objective, config(max_steps=4, options=options))
    doc = eval_head(objective, target, tmp_path / objective / "head", root / "data", config())
    final = recipe["final_eval"]
    assert (doc["acc"], doc["positions"]) == (final["acc"], final["positions"])
    assert {k: doc["options"][k] for k in options} == options
    if objective == "hydra":
        assert doc["positions"][2] == 0 and doc["acc"][2] is None
