"""``draftbench train scale``: nested prefixes, one held-out set for every point, the points it says, resume."""

import csv
import json

import pytest

from harness.cli import main
from harness.train.dataset import FeatureDataset
from harness.train.features import build_dataset
from harness.train.loop import TrainConfig
from harness.train.objectives import objective_names
from harness.train.scaling import TauSpec, data_split, parse_tokens, prefix_lengths, show_tokens, train_scale
from methods.eagle.objective import EagleObjective
from tests.support.helpers import die_at_loss_call, tiny_target


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A tiny target and 20 conversations of growing length (the last 4 held out at eval_fraction 0.2)."""
    root = tmp_path_factory.mktemp("scaledata")
    convs = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"say ab {i}"},
                                                {"from": "gpt", "value": "ab " * (3 + i % 5)}]} for i in range(20)]
    (root / "convs.json").write_text(json.dumps(convs))
    target = tiny_target()
    build_dataset(target, [str(root / "convs.json")], root / "data", max_len=64, shard_size=8,
                  eval_questions={"unrelated": ["x/1"]}, progress=False)
    return target, root / "data"


def config(**kw) -> TrainConfig:
    base = dict(lr=3e-3, warmup_steps=1, max_steps=3, batch_size=2, eval_fraction=0.2, eval_every=100,
                save_every=1, log_every=1, eval_positions=2, cpu=True, progress=False)
    return TrainConfig(**{**base, **kw})


def test_parse_and_show_token_sizes():
    """Sizes must parse with k/M suffixes into sorted integers and name their folders back the same way; a typo or
    a repeated size must fail rather than train a wrong or duplicate point."""
    assert parse_tokens("1M,30k,100K") == [30_000, 100_000, 1_000_000]
    assert parse_tokens("1.5k,300") == [300, 1500]
    assert [show_tokens(n) for n in (999, 1500, 30_000, 1_000_000, 3_000_000)] == ["999", "1.5k", "30k", "1M", "3M"]
    with pytest.raises(ValueError, match="'30x' is not a token count"):
        parse_tokens("30x")
    with pytest.raises(ValueError, match="given twice"):
        parse_tokens("30k,30000")


def test_prefix_lengths_are_the_shortest_prefix_reaching_each_size():
    """Each size takes the fewest leading conversations whose tokens reach it; a size beyond the pool, or two sizes
    with the same prefix, must be refused (the first would silently train on less, the second train one head
    twice)."""
    assert prefix_lengths([100, 200, 300], [100, 250, 600]) == [1, 2, 3]
    assert prefix_lengths([100, 200, 300], [1, 101]) == [1, 2]
    with pytest.raises(ValueError, match="holds only 600 tokens"):
        prefix_lengths([100, 200, 300], [601])
    with pytest.raises(ValueError, match="same prefix"):
        prefix_lengths([100, 200, 300], [120, 150])


def test_scale_writes_its_points_nested_on_one_held_out_set_and_resumes(data, tmp_path, monkeypatch):
    """Three sizes must give exactly three trained points (folders, recipes, one table row per point and position)
    whose training prefixes are nested and whose held-out set is the same; a run killed in its second point must,
    when re-run, skip the finished point, resume the second and end with the same table as an uninterrupted run."""
    target, feats = data
    split = data_split(feats, config())
    cum = [sum(split["tokens"][:k]) for k in (2, 5, 12)]
    sizes = [cum[0], cum[1], cum[2]]
    argv = ["scale", "eagle", "--data", str(feats), "--tokens", ",".join(map(str, sizes)), "--out", "X"]
    straight = train_scale("eagle", target, feats, tmp_path / "straight", config(), sizes, argv)
    assert sorted(p.name for p in (tmp_path / "straight" / "eagle").iterdir()) == sorted(map(show_tokens, sizes))
    assert [(r["point"], r["position"], r["train_conversations"]) for r in straight] == [
        (show_tokens(sizes[0]), 1, 2), (show_tokens(sizes[0]), 2, 2), (show_tokens(sizes[1]), 1, 5),
        (show_tokens(sizes[1]), 2, 5), (show_tokens(sizes[2]), 1, 12), (show_tokens(sizes[2]), 2, 12)]
    with open(tmp_path / "straight" / "scaling.csv") as f:
        assert len(list(csv.DictReader(f))) == 6
    assert (tmp_path / "straight" / "scaling.png").is_file()
    index = json.loads((tmp_path / "straight" / "scaling.json").read_text())["objectives"]["eagle"]
    assert index["eval_set"]["conversations"] == 4 and index["budget"] == "max_steps=3 per point"
    recipes = [json.loads((tmp_path / "straight" / "eagle" / show_tokens(n) / "recipe.json").read_text())
               for n in sizes]
    assert [r["train_conversations"] for r in recipes] == [2, 5, 12]
    assert {r["eval_conversations"] for r in recipes} == {4} and all(r["steps"] == 3 for r in recipes)
    assert recipes[1]["command"] == (f"draftbench train eagle --data {feats} --train-conversations 5 "
                                     f"--out {tmp_path / 'straight' / 'eagle' / show_tokens(sizes[1])}")
    prefixes = [FeatureDataset(feats, "train", 0.2, "none", 2048, None, k).index for k in (2, 5, 12)]
    assert prefixes[0] == prefixes[1][:2] and prefixes[1] == prefixes[2][:5]
    held_out = FeatureDataset(feats, "eval", 0.2, "none", 2048).index
    assert not set(held_out) & set(prefixes[2])

    # killed in the second point (3 steps + 1 evaluation per point: the 6th loss call is the second point's 2nd step)
    die_at_loss_call(monkeypatch, EagleObjective, 6)
    with pytest.raises(KeyboardInterrupt):
        train_scale("eagle", target, feats, tmp_path / "resumed", config(), sizes, argv)
    monkeypatch.undo()
    import harness.train.scaling as S

    trained = []
    real = S.train
    monkeypatch.setattr(S, "train", lambda obj, tgt, d, folder, *a, **k: trained.append(folder.name)
                        or real(obj, tgt, d, folder, *a, **k))
    resumed = train_scale("eagle", target, feats, tmp_path / "resumed", config(), sizes, argv)
    assert trained == [show_tokens(sizes[1]), show_tokens(sizes[2])]  # the first point is not trained again
    log = (tmp_path / "resumed" / "eagle" / show_tokens(sizes[1]) / "train_log.jsonl").read_text().splitlines()
    assert [r["step"] for r in map(json.loads, log) if r["kind"] == "train"] == [1, 2, 3]
    keep = ("point", "position", "train_tokens", "steps", "acc", "eval_loss")
    assert [{k: r[k] for k in keep} for r in resumed] == [{k: r[k] for k in keep} for r in straight]
    with pytest.raises(ValueError, match="another held-out set"):  # a larger held-out set in the same folder
        train_scale("eagle", target, feats, tmp_path / "resumed", config(eval_fraction=0.3), sizes[:1], argv)


def test_tau_per_point_through_the_runner(data, tmp_path):
    """With a τ spec each point's head must be run by its method on the suite's questions, τ >= 1 recorded in the
    point's tau.json and in the table; an objective that is no method's name must ask for --tau-method before
    training anything."""
    target, feats = data
    with pytest.raises(ValueError, match="no method 'eagle' runs the head; name one with --tau-method"):
        train_scale("eagle", target, feats, tmp_path / "s", config(), [10], [], TauSpec())
    suite = tmp_path / "q.jsonl"
    suite.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["say ab 3"]}) + "\n")
    size = data_split(feats, config())["tokens"][0]
    rows = train_scale("eagle", target, feats, tmp_path / "s", config(), [size], [],
                       TauSpec(questions=1, max_new_tokens=8, suite=str(suite), method="eagle2"))
    tau = json.loads((tmp_path / "s" / "eagle" / show_tokens(size) / "tau.json").read_text())
    assert tau["tau"] >= 1.0 and tau["questions"] == 1 and tau["method"] == "eagle2"
    assert [r["tau"] for r in rows] == [tau["tau"]] * 2


def test_bad_input_is_one_line(data, tmp_path, capsys):
    """A size larger than the data, or an unknown objective, must stop before any training with one error line."""
    _, feats = data
    code = main(["train", "scale", "eagle", "--data", str(feats), "--tokens", "10M", "--out", str(tmp_path / "o"),
                 "--cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--tokens 10M: the training pool holds only" in err[0], err
    code = main(["train", "scale", "eagel", "--data", str(feats), "--tokens", "1k", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"draftbench: error: train scale: unknown objective 'eagel'; known: "
                                 f"{', '.join(objective_names())}"]
    assert not (tmp_path / "o" / "eagle").exists()


def test_tau_data_is_checked_before_training(data, tmp_path, monkeypatch, capsys):
    """--tau on a suite whose data cannot be read (no DRAFTBENCH_DATA) must fail in one line before the first
    training step: found only after training, it cost a finished hour-long run its τ."""
    _, feats = data
    monkeypatch.delenv("DRAFTBENCH_DATA", raising=False)
    code = main(["train", "scale", "eagle", "--data", str(feats), "--tokens", "100", "--out", str(tmp_path / "o"),
                 "--cpu", "--tau", "--tau-method", "eagle2", "--max-steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "DRAFTBENCH_DATA is not set" in err[0], err
    assert not (tmp_path / "o" / "eagle").exists()
