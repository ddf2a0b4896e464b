"""Planted faults for the drift sentinel (issue #49 item 2): does ``draftbench compare`` catch each one in one run?

Each fault is planted from outside the production code, for the length of one run, by a context manager that
patches one function the way a real bug would change it, and restores it after:

================= =================================================================================================
bonus-uncounted   the engine's counting forgets the bonus token: each verification step records its accepted
                  drafts as its accept length (``_TurnStats.step``), so τ = accepted + 1 loses its + 1
bonus-as-draft    the engine counts the bonus token as an accepted draft (``_TurnStats.step``: accepted drafts =
                  tokens emitted), so the draft acceptance rate and acc@i rise, τ and the outputs do not change
terminal-step     the loop ends one verification step early: the turn's last step (tokens, accept length, draft
                  counts) is dropped (:meth:`SpeculativeMethod.generate`)
over-accept       verification accepts one token too many: below the accepted path it also takes the first child
                  of the deepest accepted node, whatever the target says (``verify_greedy_on_device`` at T = 0,
                  :meth:`SpeculativeMethod.verify` at T > 0); losslessness is broken
head-int4         the EAGLE head's weights fake-quantized to int4 (round-to-nearest, symmetric, one scale per group
                  of :data:`INT4_GROUP` input weights) when it is loaded
head-perturbed    the EAGLE head's weights perturbed by Gaussian noise of :data:`PERTURB_SCALE` times each tensor's
                  standard deviation (seeded) when it is loaded: acceptance collapses
slow-verify       every speculative verification step (the target forward and the acceptance) made
                  :data:`SLOWDOWN` slower by sleeping that share of its own duration after it; vanilla unchanged
chat-template     the target's chat template changed: its default system prompt is replaced
                  (:data:`CHANGED_SYSTEM`), as when an upstream tokenizer update changes the template
================= =================================================================================================

The head faults leave the target's own tensors alone (a head that shares the target's embedding or lm_head keeps
it). :func:`run_with` runs a configuration in process (``harness.run.runner.run``) with a fault planted,
:func:`verdict` compares a run with a baseline (``compare``'s own :func:`harness.gate.compare.compare_sides`).
``python -m tests.support.faults`` (``.ci/faults``, docs/ci.md "Planted faults") plants each fault in one run of a
preset, adds clean reruns, and prints and writes caught / false-alarm counts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

import harness.engine.speculative as SPEC
import harness.run.runner as RUNNER
import methods.eagle.draft as EAGLE_DRAFT
from harness.gate.baseline import load_side
from harness.gate.compare import Thresholds, compare_sides
from harness.run.config import RunConfig, config_from_dict, load_preset_dict
from methods import SHIPPED_HEADS

INT4_GROUP = 32         # input weights per int4 scale
PERTURB_SCALE = 1.0     # noise standard deviation, in units of each weight tensor's own standard deviation
PERTURB_SEED = 0
SLOWDOWN = 0.15         # slow-verify: the share of a verification step's duration added to it
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CHANGED_SYSTEM = "You are a helpful assistant."


@contextlib.contextmanager
def patched(owner: object, name: str, make: Callable[[Callable], Callable]) -> Iterator[None]:
    """``owner.name`` replaced by ``make(original)`` inside the block, restored after (also on an error)."""
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def bonus_uncounted() -> contextlib.AbstractContextManager:
    def make(step):
        def wrong(self, tree_size, depth, accepted, emitted):
            return step(self, tree_size, depth, accepted, emitted - 1 if emitted > accepted else emitted)
        return wrong
    return patched(SPEC._TurnStats, "step", make)


def bonus_as_draft() -> contextlib.AbstractContextManager:
    def make(step):
        def wrong(self, tree_size, depth, accepted, emitted):
            return step(self, tree_size, depth, emitted, emitted)
        return wrong
    return patched(SPEC._TurnStats, "step", make)


def drop_terminal_step(gen):
    """``gen`` (a :class:`harness.engine.method.Generation`) without its last verification step: its tokens, its
    accept length, its draft counts and the logit trace of its tokens. A turn of the prefill alone is kept."""
    if len(gen.accept_lengths) < 2:
        return gen
    n = gen.accept_lengths[-1]
    keep = len(gen.token_ids) - n
    return dataclasses.replace(
        gen, token_ids=gen.token_ids[:keep], accept_lengths=gen.accept_lengths[:-1],
        accepted_drafts=gen.accepted_drafts[:-1], draft_depths=gen.draft_depths[:-1],
        logit_margins=gen.logit_margins[:keep], logit_tops=gen.logit_tops[:keep],
        logit_runner_ups=gen.logit_runner_ups[:keep])


def terminal_step() -> contextlib.AbstractContextManager:
    def make(generate):
        def wrong(self, *args, **kwargs):
            return drop_terminal_step(generate(self, *args, **kwargs))
        return wrong
    return patched(SPEC.SpeculativeMethod, "generate", make)


def extra_node(parents: list[int], path: list[int]) -> int | None:
    """The first child of the deepest node of ``path`` (of the root when the path is empty), None at a leaf.
    Example: parents [-1, -1, 1], path [1] -> 2; path [] -> 0; path [0] -> None."""
    last = path[-1] if path else -1
    return next((i for i, p in enumerate(parents) if p == last), None)


def over_accept() -> contextlib.ExitStack:
    def make_device(verify):
        def wrong(tree, logits, ancestors):
            on_path, bonus, best = verify(tree, logits, ancestors)  # [N] bool, [1], [N+1]
            path = torch.nonzero(on_path).flatten().tolist()
            extra = extra_node(tree.parents.tolist(), path)
            if extra is None:
                return on_path, bonus, best
            on_path = on_path.clone()
            on_path[extra] = True
            return on_path, best[extra + 1].view(1), best
        return wrong

    def make_host(verify):
        def wrong(self, tree, logits, sampling, generator=None):
            path, bonus = verify(self, tree, logits, sampling, generator)
            extra = extra_node(tree.parents.tolist(), path)
            if extra is None:
                return path, bonus
            return path + [extra], int(logits[extra + 1].argmax())
        return wrong

    stack = contextlib.ExitStack()
    stack.enter_context(patched(SPEC, "verify_greedy_on_device", make_device))
    stack.enter_context(patched(SPEC.SpeculativeMethod, "verify", make_host))
    return stack


def fake_int4(w: torch.Tensor, group: int = INT4_GROUP) -> torch.Tensor:
    """Symmetric int4 round-to-nearest per group of ``group`` consecutive input weights (the last dimension), back in
    ``w``'s dtype: scale = max |w| / 7 per group, q = clamp(round(w / scale), −8, 7), w' = q × scale.
    Example: one group [0.7, −0.35, 0.05, 0.0] -> scale 0.1 -> [0.7, −0.4, 0.0, 0.0] (−3.5 rounds to even −4)."""
    flat = w.reshape(-1, w.shape[-1]).float()  # [R, C]
    pad = (-flat.shape[1]) % group
    g = torch.nn.functional.pad(flat, (0, pad)).reshape(flat.shape[0], -1, group)  # [R, G, group]
    scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 7
    q = (g / scale).round().clamp(-8, 7) * scale
    return q.reshape(flat.shape[0], -1)[:, : flat.shape[1]].reshape(w.shape).to(w.dtype)


def perturbed(w: torch.Tensor, generator: torch.Generator, scale: float = PERTURB_SCALE) -> torch.Tensor:
    """``w`` plus Gaussian noise of standard deviation ``scale`` × ``w``'s own (seeded by ``generator``)."""
    noise = torch.randn(w.shape, generator=generator, dtype=torch.float32)
    return (w.float() + scale * w.float().std() * noise).to(w.dtype)


def head_tensors(head: torch.nn.Module, target) -> list[torch.nn.Parameter]:
    """The head's own weight matrices (2-D parameters), without those it shares with the target."""
    shared = {p.data_ptr() for p in target.model.parameters()}
    return [p for p in head.parameters() if p.dim() == 2 and p.data_ptr() not in shared]


def altered_head(change: Callable[[torch.Tensor, torch.Generator], torch.Tensor]) -> contextlib.AbstractContextManager:
    def make(load):
        def wrong(folder, target, *args, **kwargs):
            head = load(folder, target, *args, **kwargs)
            generator = torch.Generator().manual_seed(PERTURB_SEED)
            with torch.no_grad():
                for p in head_tensors(head, target):
                    p.copy_(change(p.data, generator))
            return head
        return wrong
    return patched(EAGLE_DRAFT, "load_eagle_head", make)


def slow_verify() -> contextlib.AbstractContextManager:
    def make(step):
        def slower(self, *args, **kwargs):
            t0 = time.perf_counter()
            out = step(self, *args, **kwargs)
            time.sleep(SLOWDOWN * (time.perf_counter() - t0))
            return out
        return slower
    return patched(SPEC.SpeculativeMethod, "_verify_step", make)


def changed_template(template: str) -> str:
    """The template with its default system prompt replaced; a ValueError when it has none to replace."""
    if DEFAULT_SYSTEM not in template:
        raise ValueError("chat-template fault: the target's template has no default system prompt to change")
    return template.replace(DEFAULT_SYSTEM, CHANGED_SYSTEM)


@contextlib.contextmanager
def chat_template() -> Iterator[None]:
    saved: list[tuple[object, str]] = []

    def make(apply):
        def wrong(target, name_or_path):
            apply(target, name_or_path)
            tok = target.tokenizer
            saved.append((tok, tok.chat_template))
            tok.chat_template = changed_template(tok.chat_template)
        return wrong

    try:
        with patched(RUNNER, "apply_chat_template", make):
            yield
    finally:
        for tok, template in saved:  # a target passed in (shared by several runs) gets its template back
            tok.chat_template = template


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    plant: Callable[[], contextlib.AbstractContextManager]


FAULTS = {f.name: f for f in (
    Fault("bonus-uncounted", "the engine's counting forgets the bonus token in each step's accept length",
          bonus_uncounted),
    Fault("bonus-as-draft", "the engine counts the bonus token as an accepted draft", bonus_as_draft),
    Fault("terminal-step", "the loop drops each turn's terminal verification step", terminal_step),
    Fault("over-accept", "verification accepts one token too many (lossless broken)", over_accept),
    Fault("head-int4", f"EAGLE head fake-quantized to int4 (RTN, groups of {INT4_GROUP})",
          lambda: altered_head(lambda w, g: fake_int4(w))),
    Fault("head-perturbed", f"EAGLE head weights + N(0, ({PERTURB_SCALE:g} std)^2)",
          lambda: altered_head(perturbed)),
    Fault("slow-verify", f"each speculative verification step {SLOWDOWN:.0%} slower", slow_verify),
    Fault("chat-template", "the chat template's default system prompt changed", chat_template),
)}


def perturbed_checkpoint(src: str | Path, dst: str | Path, perturb: bool) -> Path:
    """``dst``: a copy of the head folder ``src`` whose weight matrices (2-D float tensors of ``pytorch_model.bin`` or
    ``model.safetensors``) are :func:`perturbed` when ``perturb``, unchanged otherwise; how a head fault reaches an
    engine that loads the checkpoint itself (vLLM). The same path serves the clean and the faulty runs, so their
    configurations are the same."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    if perturb:
        generator = torch.Generator().manual_seed(PERTURB_SEED)
        for f in sorted(dst.iterdir()):
            if f.name.endswith(".safetensors"):
                state = load_file(f)
            elif f.name.endswith(".bin"):
                state = torch.load(f, map_location="cpu", weights_only=True)
            else:
                continue
            state = {k: perturbed(v, generator) if v.dim() == 2 and v.is_floating_point() else v
                     for k, v in state.items()}
            save_file(state, f) if f.name.endswith(".safetensors") else torch.save(state, f)
    return dst


def vllm_methods(head: str | Path) -> list[dict]:
    """The vLLM sentinel's entries: the harness's vanilla (the speed-up's and the outputs' reference) and vLLM's
    EAGLE-3 (a chain of 3) on the head folder ``head``."""
    return ["vanilla", {"name": "eagle3", "label": "vllm-eagle3", "engine": "vllm",
                        "options": {"depth": 3, "head": str(head)}}]


def preset_config(preset: str, output_dir: str | Path, **overrides) -> RunConfig:
    """The run configuration of ``preset`` (a name or YAML file) writing into ``output_dir``, fields overridden."""
    return config_from_dict({**load_preset_dict(preset), "output_dir": str(output_dir), **overrides})


def run_with(config: RunConfig, fault: str | None = None, target=None) -> Path:
    """Run ``config`` in process with ``fault`` (a :data:`FAULTS` name, None = clean) planted; the run directory."""
    plant = FAULTS[fault].plant() if fault else contextlib.nullcontext()
    with plant:
        return RUNNER.run(config, progress=False, target=target)


def verdict(baseline: str | Path, run_dir: str | Path, speed: bool = True, n_boot: int = 2000) -> dict:
    """``compare BASELINE RUN`` (with or without the speed gate): ``{"exit", "flagged", "failures": ["cell: rule:
    message", ...]}``. ``exit`` is what the ``compare`` command would exit with: 1 a rule failed, 2 it refused the
    run with an error (the one line its CLI prints, kept as the failure "error: ..."); both fail the sentinel."""
    th = Thresholds(gate_speed=speed, n_boot=n_boot)
    try:
        cmp = compare_sides(load_side(baseline, n_boot=n_boot), load_side(run_dir, n_boot=n_boot), th)
    except (KeyError, ValueError, OSError) as e:  # what the CLI turns into "draftbench: error: ..." and exit 2
        return {"exit": 2, "flagged": True, "failures": [f"run: error: {e}"]}
    return {"exit": cmp.exit_code, "flagged": cmp.exit_code == 1,
            "failures": [f"{f.cell}: {f.rule}: {f.message}" for f in cmp.failures]}


def measure(config: RunConfig, baseline: str | Path, plan: list[tuple[str, Callable | None]], speed: bool,
            results: Path, info: dict) -> list[dict]:
    """Run each (name, plant) of ``plan`` (plant None: a clean rerun) and compare it with ``baseline``; print a line
    per run and rewrite ``results`` (JSON: ``info`` and the rows) after each."""
    rows: list[dict] = []
    for name, plant in plan:
        t0 = time.perf_counter()
        with plant() if plant else contextlib.nullcontext():
            run_dir = RUNNER.run(config, progress=False)
        row = {"fault": name, "run": str(run_dir), **verdict(baseline, run_dir, speed),
               "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        rules = sorted({f.split(": ")[1] for f in row["failures"]})
        print(f"{name:<16} {'FLAGGED' if row['flagged'] else 'passed':<8} {', '.join(rules) or '-'}  "
              f"({row['seconds']} s, {run_dir})", flush=True)
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps({**info, "speed": speed, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return rows


@contextlib.contextmanager
def perturbed_copy(src: Path, dst: Path) -> Iterator[None]:
    """The head folder ``dst`` perturbed (from ``src``) inside the block, a clean copy of ``src`` again after."""
    perturbed_checkpoint(src, dst, True)
    try:
        yield
    finally:
        perturbed_checkpoint(src, dst, False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.support.faults", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="sentinel", help="default: %(default)s")
    p.add_argument("--baseline", default="results/baselines/cpu/sentinel",
                   help="default: %(default)s; with --vllm: saved from a clean run into OUTPUT_DIR/baseline")
    p.add_argument("--faults", help="comma-separated (default: all; with --vllm: head-perturbed,chat-template)")
    p.add_argument("--clean", type=int, default=10, help="same-commit reruns without a fault (default %(default)s)")
    p.add_argument("--output-dir", default="results/faults", help="runs and faults.json go here")
    p.add_argument("--no-speed", action="store_true", help="compare without the speed gate")
    p.add_argument("--vllm", action="store_true",
                   help="the preset's suite and tokens with vanilla and vLLM's EAGLE-3 at T = 0 (vLLM's CPU build); "
                        "the head fault goes to vLLM as a perturbed checkpoint copy")
    args = p.parse_args(argv)
    known = ("head-perturbed", "chat-template") if args.vllm else tuple(FAULTS)
    names = [n for n in (args.faults if args.faults is not None else ",".join(known)).split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        p.error(f"unknown fault(s) {unknown}; known{' with --vllm' if args.vllm else ''}: {', '.join(known)}")
    out = Path(args.output_dir)
    plan: list[tuple[str, Callable | None]] = [(n, FAULTS[n].plant) for n in names]
    baseline = Path(args.baseline)
    config = preset_config(args.preset, out / "runs")
    if args.vllm:
        shipped, head = SHIPPED_HEADS / config.target / "eagle3", out / "heads" / "eagle3"
        perturbed_checkpoint(shipped, head, False)
        config = preset_config(args.preset, out / "runs", methods=vllm_methods(head), temperatures=[0.0])
        plan = [(n, (lambda: perturbed_copy(shipped, head)) if n == "head-perturbed" else FAULTS[n].plant)
                for n in names]
        baseline = out / "baseline"
        if not (baseline / "baseline.json").exists():
            from harness.gate.baseline import save_baseline

            save_baseline(RUNNER.run(config, progress=False), out=baseline)
            print(f"baseline: {baseline} (one clean run)", flush=True)
    info = {"preset": args.preset, "baseline": str(baseline), "vllm": args.vllm}
    rows = measure(config, baseline, [*plan, *[("clean", None)] * args.clean], not args.no_speed,
                   out / "faults.json", info)
    planted = [r for r in rows if r["fault"] != "clean"]
    clean = [r for r in rows if r["fault"] == "clean"]
    print(f"caught {sum(r['flagged'] for r in planted)} of {len(planted)} planted faults; "
          f"false alarms {sum(r['flagged'] for r in clean)} of {len(clean)} clean reruns; {out / 'faults.json'}")
    return 1 if any(not r["flagged"] for r in planted) or any(r["flagged"] for r in clean) else 0


if __name__ == "__main__":
    sys.exit(main())
