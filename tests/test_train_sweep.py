"""``draftbench train <objective> --sweep``: one head per value, equal budget, resumable, an index a run sweep reads."""

import json

import pytest

from harness.engine.method import OptionsError
from harness.run.config import ConfigError, config_from_dict
from harness.run.sweep import train_sweep_members
from harness.train.features import build_dataset
from harness.train.loop import TrainConfig
from harness.train.sweep import member_command, members, parse_grid, train_sweep
from tests.support.helpers import tiny_target


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweepdata")
    convs = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"say ab {i}"},
                                                {"from": "gpt", "value": "ab " * 5}]} for i in range(6)]
    (root / "convs.json").write_text(json.dumps(convs))
    target = tiny_target()
    build_dataset(target, [str(root / "convs.json")], root / "data", max_len=64, shard_size=8,
                  eval_questions={"unrelated": ["x/1"]}, progress=False)
    return target, root / "data"


def test_grid_and_member_options_default_k_to_min_2_n():
    """Without experts_per_tok the sweep must give K = min(2, N); if N = 1 got K = 2 the objective would reject it,
    and if N = 4 got K = 1 the ablation would not match the paper's K = 2."""
    grid = parse_grid(["num_experts=1,2,4"])
    assert grid == {"num_experts": [1, 2, 4]}
    rows = members("jakiro", {"train_vocab": 64}, grid)
    assert [r["name"] for r in rows] == ["num_experts=1", "num_experts=2", "num_experts=4"]
    assert [r["options"]["experts_per_tok"] for r in rows] == [1, 2, 2]
    assert all(r["options"]["train_vocab"] == 64 for r in rows)
    assert members("jakiro", {"experts_per_tok": 1}, {"num_experts": [2, 3]})[1]["options"]["experts_per_tok"] == 1


def test_bad_sweep_value_names_the_option():
    """A typo in a swept value must fail before any training, naming option and value (not an hour later)."""
    with pytest.raises(OptionsError, match=r"train --sweep num_experts=0: .*num_experts"):
        members("jakiro", {}, parse_grid(["num_experts=2,0"]))
    with pytest.raises(ValueError, match="swept twice"):
        parse_grid(["num_experts=1", "num_experts=2"])


def test_member_command_is_the_single_training_command():
    """A member's recipe must hold a command that retrains exactly that head (no --sweep, its own --out)."""
    argv = ["jakiro", "--data", "feats", "--sweep", "num_experts=1,2", "--max-steps", "5", "--out", "runs/x",
            "--option", "train_vocab=64"]
    assert member_command(argv, "runs/x/num_experts=2", {"num_experts": 2}) == (
        "draftbench train jakiro --data feats --max-steps 5 --option train_vocab=64 --option num_experts=2 "
        "--out runs/x/num_experts=2")


def test_sweep_trains_each_value_resumes_and_feeds_a_run_sweep(data, tmp_path, monkeypatch):
    """Every member must be trained with the same budget into its own folder with a recipe; a second call must skip
    finished members (not retrain them); and a run's head sweep over the folder must yield one entry per head."""
    target, feats = data
    cfg = TrainConfig(lr=3e-3, warmup_steps=1, max_steps=2, batch_size=2, eval_fraction=0.2, eval_every=100,
                      save_every=1, log_every=1, eval_positions=2, cpu=True, progress=False,
                      options={"train_vocab": 32})
    out = tmp_path / "experts"
    rows = train_sweep("jakiro", target, feats, out, cfg, {"num_experts": [1, 3]}, ["jakiro", "--sweep", "x"])
    assert [r["status"] for r in rows] == ["done", "done"]
    for n, k in ((1, 1), (3, 2)):
        recipe = json.loads((out / f"num_experts={n}" / "recipe.json").read_text())
        assert (recipe["options"]["num_experts"], recipe["options"]["experts_per_tok"]) == (n, k)
        assert recipe["steps"] == 2 and recipe["config"]["batch_size"] == 2 and recipe["config"]["lr"] == 3e-3
        assert recipe["command"].endswith(f"--option num_experts={n} --out {out / f'num_experts={n}'}")
        head_cfg = json.loads((out / f"num_experts={n}" / "head" / "config.json").read_text())
        assert head_cfg["num_local_experts"] == n and head_cfg["num_experts_per_tok"] == k

    import harness.train.sweep as S

    def no_training(*a, **k):
        raise AssertionError("a finished member was trained again")

    monkeypatch.setattr(S, "train", no_training)
    again = train_sweep("jakiro", target, feats, out, cfg, {"num_experts": [1, 3]}, [])
    assert [r["steps"] for r in again] == [2, 2]

    assert [m["name"] for m in train_sweep_members(out)] == ["num_experts=1", "num_experts=3"]
    run = config_from_dict({"methods": ["vanilla", "jakiro"], "sweep": {"jakiro": {"head": [str(out)]}}})
    assert [m.label for m in run.methods] == ["vanilla", "jakiro[num_experts=1]", "jakiro[num_experts=3]"]
    assert [m.options.get("head") for m in run.methods] == [
        None, str(out / "num_experts=1" / "head"), str(out / "num_experts=3" / "head")]
    with pytest.raises(ConfigError, match=r"run\.sweep\.jakiro\.mode=hybird"):
        config_from_dict({"methods": ["jakiro"], "sweep": {"jakiro": {"head": [str(out)], "mode": ["hybird"]}}})
