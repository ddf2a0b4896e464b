"""Draft-head training: schedule, unroll mask, EAGLE learning, resume, Medusa loss, a 2-process accelerate run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness.train.dataset import FeatureDataset, collate
from harness.train.features import build_dataset, dataset_token_counts
from harness.train.loop import (
    LOG_FILE,
    TrainConfig,
    evaluate,
    latest_checkpoint,
    lr_factor,
    train,
)
from harness.train.objectives import (
    get_objective,
    masked_mean,
    objective_names,
    register_objective,
)
from methods.eagle.objective import EagleObjective, eagle_losses, unroll_mask
from methods.medusa.objective import medusa_targets
from tests.support.helpers import die_at_loss_call, tiny_target

REPO = Path(__file__).resolve().parent.parent


def pattern_conversations(n: int) -> list[dict]:
    """Conversations whose answers repeat a short motif: learnable from the features in a few hundred steps."""
    motifs = ["ab ", "xyz ", "hello ", "12 "]
    return [{"id": f"p{i}", "conversations": [
        {"from": "human", "value": f"repeat {motifs[i % 4].strip()} please {i}"},
        {"from": "gpt", "value": motifs[i % 4] * (6 + i % 3)}]} for i in range(n)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A tiny target and a 16-conversation feature dataset built with it (the last 3 held out at eval_fraction 0.2)."""
    root = tmp_path_factory.mktemp("train")
    src = root / "convs.json"
    src.write_text(json.dumps(pattern_conversations(16)))
    target = tiny_target()
    build_dataset(target, [str(src)], root / "data", max_len=96, shard_size=8,
                     eval_questions={"unrelated": ["x/1"]}, progress=False)
    return target, root


def small_config(**kw) -> TrainConfig:
    base = dict(lr=3e-3, warmup_steps=5, batch_size=4, eval_fraction=0.2, eval_every=1000, log_every=1,
                save_every=1000, eval_positions=3, cpu=True, progress=False)
    return TrainConfig(**{**base, **kw})


def test_lr_factor_warmup_then_cosine():
    # warm-up reaches 1.0 at its last step, cosine halves at the midpoint of the rest and ends at 0
    assert lr_factor(0, 10, 110) == pytest.approx(0.1)
    assert lr_factor(9, 10, 110) == pytest.approx(1.0)
    assert lr_factor(60, 10, 110) == pytest.approx(0.5)
    assert lr_factor(110, 10, 110) == pytest.approx(0.0)
    assert lr_factor(110, 10, 110, min_ratio=0.1) == pytest.approx(0.1)


def test_unroll_mask_literal():
    # step 1 is plain causal; at step 2 query p sees true keys <= p-1 and only its own step-2 key
    assert unroll_mask(3, 1).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert unroll_mask(3, 2).int().tolist() == [[0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 1, 0], [1, 1, 0, 0, 0, 1]]


def test_unrolled_step1_equals_plain_forward(built):
    # with k=1 the unrolled accuracy must be the plain causal forward's top-1 agreement (same mask, same inputs)
    target, root = built
    obj = get_objective("eagle").create(target)
    torch.manual_seed(0)
    head = obj.build_head()
    batch = collate([FeatureDataset(root / "data", noise="none")[i] for i in range(2)])
    correct, total = obj.accuracy(head, batch, 1)
    B, S = batch["input_ids"].shape
    with torch.no_grad():
        pred = head(batch["features"], batch["input_ids"], torch.arange(S).expand(B, S))[0]  # plain causal forward
    want = target.model.lm_head(batch["target"]).argmax(-1)
    hits = ((target.model.lm_head(pred).argmax(-1) == want) & (batch["loss_mask"] > 0)).sum()
    assert total[0] == (batch["loss_mask"] > 0).sum() and correct[0] == hits


def eval_acc(target, root, head_folder=None) -> list[float]:
    """Held-out top-1 accuracy per draft position of a saved head (or of a fresh random head)."""
    from accelerate import Accelerator

    from methods.eagle.checkpoint import load_eagle_head

    obj = get_objective("eagle").create(target)
    torch.manual_seed(1)
    head = obj.build_head() if head_folder is None else load_eagle_head(head_folder, target).float()
    held = FeatureDataset(root / "data", "eval", eval_fraction=0.2, noise="none")
    return evaluate(obj, head, held, small_config(), Accelerator(cpu=True))["acc"]


@pytest.mark.slow
def test_eagle_training_beats_a_random_head(built, tmp_path):
    # 200 steps on pattern data: the held-out draft top-1 accuracy at positions 1..3 must rise far above a random
    # head's (which agrees with the target's greedy token only by chance)
    target, root = built
    recipe = train("eagle", target, root / "data", tmp_path / "run", small_config(max_steps=200, eval_every=100))
    trained, random_ = eval_acc(target, root, tmp_path / "run" / "head"), eval_acc(target, root)
    assert recipe["steps"] == 200 and recipe["final_eval"]["acc"][0] == pytest.approx(trained[0], abs=0.02)
    assert trained[0] > 0.6 and trained[0] > random_[0] + 0.3, (trained, random_)
    assert trained[2] > random_[2] + 0.2, (trained, random_)
    for name in ("recipe.json", "loss.png", "train_log.jsonl", "head/config.json", "head/model.safetensors"):
        assert (tmp_path / "run" / name).exists(), name
    assert recipe["data_manifest_sha256"] and recipe["wall_time_s"] > 0 and recipe["command"]


def test_resume_continues_step_count_and_schedule(built, tmp_path, monkeypatch):
    # a run killed after its step-4 checkpoint resumes at step 5 and ends with the same head as an uninterrupted
    # run: the step counter, schedule, optimizer, data order and RNG all come back
    target, root = built
    cfg = small_config(max_steps=6, save_every=2)
    train("eagle", target, root / "data", tmp_path / "straight", cfg)

    die_at_loss_call(monkeypatch, EagleObjective, 5)
    with pytest.raises(KeyboardInterrupt):
        train("eagle", target, root / "data", tmp_path / "resumed", cfg)
    assert latest_checkpoint(tmp_path / "resumed").name == "step-0000004"
    monkeypatch.undo()
    recipe = train("eagle", target, root / "data", tmp_path / "resumed", cfg)
    assert recipe["steps"] == 6
    steps = [r["step"] for r in map(json.loads, (tmp_path / "resumed" / LOG_FILE).read_text().splitlines())
             if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]  # no step repeated or skipped
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "straight" / "head" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "head" / "model.safetensors"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], msg=key)
    with pytest.raises(ValueError, match="total_steps"):  # the same folder with another schedule is refused
        train("eagle", target, root / "data", tmp_path / "resumed", small_config(max_steps=9))
    # a resume unpickles nothing that could run code: the counters and schedule are JSON, accelerate's own files are
    # read with weights_only=True; a checkpoint that keeps its counters in a pickle is refused, not loaded
    ckpt = latest_checkpoint(tmp_path / "resumed")
    assert (ckpt / "train_state.json").is_file() and not list(ckpt.glob("custom_checkpoint_*"))
    (ckpt / "train_state.json").unlink()
    with pytest.raises(ValueError, match="train_state.json; this checkpoint keeps its counters in a pickle"):
        train("eagle", target, root / "data", tmp_path / "resumed", cfg)


def test_medusa_loss_weights_and_learning(built, tmp_path):
    # paper weighting is 0.8**i; a few steps must lower the weighted loss; the published-format heads are saved
    target, root = built
    obj = get_objective("medusa").create(target, {"num_heads": 2})
    batch = collate([FeatureDataset(root / "data", noise="none")[i] for i in range(2)])
    torch.manual_seed(0)
    head = obj.build_head()
    loss, parts = obj.loss(head, batch)
    assert loss.item() == pytest.approx(parts["ce0"] + 0.8 * parts["ce1"], rel=1e-5)
    uniform = get_objective("medusa").create(target, {"num_heads": 2, "weighting": "uniform"})
    assert uniform.loss(head, batch)[0].item() == pytest.approx(parts["ce0"] + parts["ce1"], rel=1e-5)
    recipe = train("medusa", target, root / "data", tmp_path / "m",
                      small_config(max_steps=30, lr=1e-2, options={"num_heads": 2}))
    log = [json.loads(x) for x in (tmp_path / "m" / LOG_FILE).read_text().splitlines()]
    losses = [r["loss"] for r in log if r["kind"] == "train"]
    assert min(losses[-5:]) < losses[0] - 0.2, losses
    cfg = json.loads((tmp_path / "m" / "head" / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 2 and cfg["medusa_share_lm_head"] is True  # small target: shared lm_head
    assert recipe["config"]["lr"] == 1e-2 and recipe["config"]["noise"] == "none"


def test_objective_registry_rejects_non_objectives_and_names_close_matches():
    with pytest.raises(TypeError, match="must subclass"):
        register_objective("bogus")(object)
    with pytest.raises(KeyError, match="eagle"):
        get_objective("eagel")
    assert {"eagle", "medusa"} <= set(objective_names())


@pytest.mark.slow
def test_two_process_accelerate_launch(built, tmp_path):
    # the distributed (DDP over gloo) path: 2 CPU processes train 3 steps from the CLI entry point. accelerate's
    # `--cpu` launcher starts a single process unless mpirun is set up, so the processes come from its torchrun
    # launcher (`--multi_gpu`) and the trainer's own `--cpu` keeps each on the CPU.
    target, root = built
    model_dir = tmp_path / "tiny-target"
    target.model.save_pretrained(model_dir)
    target.tokenizer.save_pretrained(model_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "harness.train",
           "eagle", "--target", str(model_dir), "--data", str(root / "data"), "--out", str(tmp_path / "ddp"),
           "--max-steps", "3", "--batch-size", "2", "--warmup-steps", "1", "--cpu", "--no-progress",
           # two head forwards per step (unroll) under DDP, and the reduced-vocabulary loss
           "--option", "unroll=2", "--option", "train_vocab=16"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recipe = json.loads((tmp_path / "ddp" / "recipe.json").read_text())
    assert recipe["num_processes"] == 2 and recipe["steps"] == 3 and "MULTI_CPU" in recipe["distributed_type"]
    assert recipe["options"]["unroll"] == 2 and recipe["options"]["train_vocab"] == 16
    assert (tmp_path / "ddp" / "head" / "model.safetensors").exists()


def test_losses_on_masked_positions_equal_the_all_position_formulas(built):
    # The objectives run the V-wide lm_head only where the loss mask is on. The value must equal the published
    # all-position formulas (EAGLE: masked mean of the soft CE; Medusa: masked mean CE per head, weighted 0.8**i);
    # a gather/label misalignment would change it.
    target, root = built
    lm_head = target.model.lm_head
    torch.manual_seed(0)
    pred, feat = torch.randn(2, 6, 32), torch.randn(2, 6, 32)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 1, 0, 0, 0, 1]], dtype=torch.float)
    vloss, ploss, _ = eagle_losses(pred, feat, mask, lm_head)
    ref = -(torch.softmax(lm_head(feat), -1) * torch.log_softmax(lm_head(pred), -1)).sum(-1)  # [B, S]
    assert ploss.item() == pytest.approx(((ref * mask).sum() / (mask.sum() + 1e-5)).item(), rel=1e-5)
    assert vloss.item() == pytest.approx(masked_mean(F.smooth_l1_loss(pred, feat, reduction="none").mean(-1),
                                                        mask).item(), rel=1e-5)
    obj = get_objective("medusa").create(target, {"num_heads": 2})
    batch = collate([FeatureDataset(root / "data", noise="none")[i] for i in range(2)])
    head = obj.build_head()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(std=0.1)
    _loss, parts = obj.loss(head, batch)
    logits = head(batch["features"], lm_head)  # [2, B, S, V], all positions
    token_mask = batch["token_mask"] * batch["attention_mask"]
    for i in range(2):
        labels, m = medusa_targets(batch["token_ids"], token_mask, i)
        ce = F.cross_entropy(logits[i, :, : labels.shape[1]].transpose(1, 2), labels, reduction="none")
        assert parts[f"ce{i}"] == pytest.approx(masked_mean(ce, m).item(), rel=1e-4)


def test_reduced_training_vocabulary_renormalises_the_target_over_the_kept_tokens(built, tmp_path):
    # train_vocab=N: the soft CE compares the draft's and the target's distributions renormalised over the N most
    # frequent tokens (EAGLE-3's reduced vocabulary); the accuracy counts a hit only if the draft's pick among them
    # is the target's full-vocabulary greedy token; Medusa's CE drops labels outside the kept tokens.
    target, root = built
    counts = dataset_token_counts(root / "data", 128)
    obj = get_objective("eagle").create(target, {"train_vocab": 8})
    obj.set_token_counts(counts)
    kept = obj.draft_lm_head.token_ids
    assert kept.tolist() == sorted(torch.topk(counts, 8).indices.tolist()) and counts[kept].min() > 0
    torch.manual_seed(0)
    pred, feat = torch.randn(1, 4, 32), torch.randn(1, 4, 32)
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    _, ploss, _ = eagle_losses(pred, feat, mask, obj.draft_lm_head.compact)
    lm = target.model.lm_head
    p = torch.softmax(lm(feat)[..., kept], -1)
    q = torch.log_softmax(lm(pred)[..., kept], -1)
    assert ploss.item() == pytest.approx((((-(p * q).sum(-1)) * mask).sum() / (mask.sum() + 1e-5)).item(), rel=1e-5)
    assert obj.draft_lm_head.argmax(pred).tolist() == kept[lm(pred)[..., kept].argmax(-1)].tolist()
    # training end to end with a reduced vocabulary writes the counts the method's draft_vocab option reads
    recipe = train("eagle", target, root / "data", tmp_path / "v",
                   small_config(max_steps=3, warmup_steps=1, options={"train_vocab": 8}))
    assert recipe["options"]["train_vocab"] == 8
    assert (tmp_path / "v" / "head" / "token_counts.json").exists()
    med = get_objective("medusa").create(target, {"num_heads": 2, "train_vocab": 8})
    med.set_token_counts(counts)
    batch = collate([FeatureDataset(root / "data", noise="none")[i] for i in range(2)])
    loss, parts = med.loss(med.build_head(), batch)
    assert torch.isfinite(loss) and set(parts) == {"ce0", "ce1"}
    with pytest.raises(ValueError, match="train_vocab must be 0"):
        get_objective("eagle").create(target, {"train_vocab": -1})


def test_unrolled_loss_adds_the_second_draft_step(built):
    # unroll=2 must be the published step-1 loss plus 0.8 x the loss of a second step that reads the head's own
    # step-1 output (moved one position on) with the true token, under unroll_mask(S, 2); anything else (no shift,
    # true features at step 2, a causal mask that lets the chain see later true positions) changes the value
    target, root = built
    batch = collate([FeatureDataset(root / "data", noise="none")[i] for i in range(2)])
    one = get_objective("eagle").create(target)
    two = get_objective("eagle").create(target, {"unroll": 2})
    torch.manual_seed(3)
    head = one.build_head()
    l1, _ = one.loss(head, batch)
    l2, parts = two.loss(head, batch)
    B, S = batch["input_ids"].shape
    pos = torch.arange(S).expand(B, S)
    pred1, kv = head(batch["features"], batch["input_ids"], pos)
    x = torch.cat([torch.zeros_like(pred1[:, :1]), pred1[:, :-1]], dim=1)
    pred2, _ = head(x, batch["input_ids"], pos, kv=kv, attn_mask=unroll_mask(S, 2))
    valid = batch["loss_mask"] * (pos >= 1)
    v2, p2, _ = eagle_losses(pred2, batch["target"], valid, target.model.lm_head)
    assert l2.item() == pytest.approx(l1.item() + 0.8 * (v2 + 0.1 * p2).item(), rel=1e-5)
    assert set(parts) == {"vloss1", "ploss1", "vloss2", "ploss2"}
