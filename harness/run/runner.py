"""The one run loop: method x temperature x seed x repeat x suite x question, one record per turn.

Warm-up goes through exactly the same ``run_question`` path, untimed and unrecorded. Every timed turn is bracketed
by device synchronisation (:class:`harness.measure.trackers.Tracker`). A failing turn (exception or out-of-memory) becomes
an error record and the run goes on. Records of a question are appended together, so a killed run can be resumed
(``draftbench run --resume RUN_DIR``) with no lost and no duplicated records.

Data parallel: under ``accelerate launch --num_processes W draftbench run ...`` every process loads the target on
its own device, takes every W-th pending question and writes its own records file; rank 0 writes the manifest.
accelerate does the process management (no scheduler of our own).
"""

from __future__ import annotations

import gc
import json
import os
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.engine.method import Method
from harness.engine.sampling import SamplingParams
from harness.measure import env
from harness.measure.records import RecordStore, question_key
from harness.measure.trackers import Tracker, model_devices, release_cached_memory
from harness.models import Target, load_target
from harness.registry import get_method
from harness.run.config import ConfigError, RunConfig, config_from_dict
from harness.run.suites import Suite, load_suite
from harness.run.suites import score as score_answer

MANIFEST_FILE = "manifest.json"


@dataclass
class TurnContext:
    """What identifies a measured question: copied into each of its records."""

    run_id: str
    label: str
    suite: Suite
    temperature: float
    seed: int
    repeat: int


def question_seed(seed: int, question_id: str) -> int:
    """Per-question RNG seed, independent of run order (so a resumed run samples what an uninterrupted one would)."""
    return (seed * 1_000_003 + zlib.crc32(str(question_id).encode())) % (2**63)


def new_run_dir(config: RunConfig) -> Path:
    base = Path(config.output_dir)
    stamp = env.now_iso().replace(":", "").replace("+0000", "Z").replace("-", "")
    run_dir = base / f"{stamp}-{config.digest()}"
    n = 1
    while run_dir.exists():  # never overwrite a run
        n += 1
        run_dir = base / f"{stamp}-{config.digest()}-{n}"
    return run_dir


def build_manifest(config: RunConfig, run_dir: Path, target: Target, suites: list, methods: dict[str, Method]) -> dict:
    source = Path(target.path) / "draftbench_source.json"
    return {
        "run_id": run_dir.name,
        "created": env.now_iso(),
        "command": env.command_line(),
        **env.git_info(),
        "versions": env.versions(),
        "device": env.device_info(target.device),
        "config": config.to_dict(),
        "config_digest": config.digest(),
        "target": {"name": target.name, "path": target.path, "dtype": str(target.dtype).replace("torch.", ""),
                   "model_type": getattr(target.config, "model_type", None),
                   "attn_implementation": getattr(target.config, "_attn_implementation", None),
                   "devices": [str(d) for d in model_devices(target.model, target.device)],
                   "num_parameters": sum(p.numel() for p in target.model.parameters()),
                   "source": json.loads(source.read_text()) if source.exists() else None},
        "suites": {s.name: {"version": s.version, "source": str(s.source), "sha256": s.sha256,
                            "questions": len(s.questions)} for s in suites},
        "methods": {label: m.describe() for label, m in methods.items()},
    }


def _error_text(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" at {Path(last[0].filename).name}:{last[0].lineno}" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


def run_question(method: Method, target: Target, ctx: TurnContext, question, sampling: SamplingParams,
                 max_new_tokens: int, tracker: Tracker, score: bool) -> list[dict[str, Any]]:
    """Generate every turn of ``question`` (later turns see the model's own earlier answers); one record per turn."""
    generator = torch.Generator(device=target.device).manual_seed(question_seed(ctx.seed, question.question_id))
    suite = ctx.suite
    messages: list[dict] = []
    records = []
    failed: str | None = None
    for turn, text in enumerate(question.turns):
        rec = {
            "run_id": ctx.run_id, "status": "ok", "error": None, "method": method.name, "label": ctx.label,
            "lossless": method.lossless, "method_options": method.describe()["options"],
            "suite": suite.name, "suite_version": suite.version, "question_id": str(question.question_id),
            "category": question.category, "turn": turn, "target": target.name,
            "dtype": str(target.dtype).replace("torch.", ""), "device": str(target.device),
            "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": ctx.seed, "repeat": ctx.repeat,
        }
        if failed:
            rec.update(status="error", error=f"skipped: an earlier turn failed ({failed})")
            records.append(rec)
            continue
        messages.append({"role": "user", "content": text})
        try:
            prompt_ids = target.render_chat(messages, suite.system_prompt)
            budget = max_new_tokens
            limit = getattr(target.config, "max_position_embeddings", None)
            if limit and prompt_ids.shape[1] + budget > limit:
                budget = limit - prompt_ids.shape[1]
                if budget <= 0:
                    raise ValueError(f"prompt of {prompt_ids.shape[1]} tokens leaves no room in the model's "
                                     f"{limit}-token context")
            with tracker.track() as m:
                gen = method.generate(prompt_ids, budget, sampling, generator)
            answer = target.decode(gen.token_ids)
            rec.update(
                prompt_tokens=int(prompt_ids.shape[1]), new_tokens=len(gen.token_ids), steps=gen.steps,
                accept_lengths=gen.accept_lengths, accepted_drafts=gen.accepted_drafts,
                draft_depths=gen.draft_depths, wall_time_s=m.wall_time_s, prefill_time_s=gen.prefill_time_s,
                stop_reason=gen.stop_reason, output_text=answer, output_ids=gen.token_ids,
                rss_bytes=m.rss_bytes, peak_rss_bytes=m.peak_rss_bytes,
                cuda_peak_allocated_bytes=m.cuda_peak_allocated_bytes,
                cuda_peak_reserved_bytes=m.cuda_peak_reserved_bytes, nvml_used_bytes=m.nvml_used_bytes,
                energy_j=m.energy_j, mean_power_w=m.mean_power_w, timings=gen.timings, counters=gen.counters,
                timings_synchronised=gen.timings_synchronised, nvml_devices=m.nvml_devices,
                logit_margins=gen.logit_margins or None, logit_tops=gen.logit_tops or None,
                logit_runner_ups=gen.logit_runner_ups or None,
            )
            messages.append({"role": "assistant", "content": answer})
        except Exception as exc:
            failed = _error_text(exc)
            rec.update(status="error", error=failed)
            if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
                _free_memory(target.device)
        rec["score"], rec["score_name"] = None, None
        if score and suite.scorer and turn == len(question.turns) - 1 and rec["status"] == "ok":
            try:
                rec["score"], rec["score_name"] = score_answer(suite.scorer, question, rec["output_text"]), suite.scorer
            except Exception as exc:
                rec["score_name"], rec["error"] = suite.scorer, f"scoring failed: {_error_text(exc)}"
        rec["timestamp"] = env.now_iso()
        records.append(rec)
    return records


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def load_manifest(run_dir: Path) -> dict:
    path = Path(run_dir) / MANIFEST_FILE
    if not path.exists():
        raise ConfigError(f"{run_dir} is not a run directory (no {MANIFEST_FILE})")
    return json.loads(path.read_text())


@dataclass
class Distributed:
    """This process's place in a data-parallel run (rank 0 of 1 when not launched by accelerate)."""

    rank: int = 0
    world: int = 1
    state: Any = None

    @classmethod
    def detect(cls) -> Distributed:
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return cls()
        from accelerate import PartialState

        state = PartialState(cpu=not torch.cuda.is_available())
        return cls(state.process_index, state.num_processes, state)

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every process."""
        if self.world == 1:
            return value
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([value], from_process=0)[0]

    def barrier(self) -> None:
        if self.world > 1:
            self.state.wait_for_everyone()


def run(config: RunConfig | None = None, resume: str | Path | None = None,
        progress: bool = True, target: Target | None = None, on_question: Callable | None = None) -> Path:
    """Run ``config`` into a new run directory, or continue the run in ``resume``; return the run directory.

    ``target`` may be passed in (tests use tiny in-process models); ``on_question`` is called after every stored
    question (tests use it to simulate a kill).
    """
    dist = Distributed.detect()
    if resume is not None:
        run_dir = Path(resume)
        manifest = load_manifest(run_dir)
        stored = config_from_dict({k: v for k, v in manifest["config"].items()})
        if config is not None and config.digest() != stored.digest():
            raise ConfigError(f"--resume {run_dir}: the given configuration differs from the run's "
                              f"(digest {config.digest()} != {stored.digest()}); resume without changing it")
        config = stored
    else:
        if config is None:
            raise ConfigError("run: a configuration or --resume RUN_DIR is required")
        run_dir = Path(dist.share(str(new_run_dir(config)) if dist.rank == 0 else None))
        manifest = None
    if config.threads:
        torch.set_num_threads(config.threads)

    data_dir = config.data_dir or os.environ.get("DRAFTBENCH_DATA")
    suites = [load_suite(s, data_dir).select(config.limit, config.questions) for s in config.suites]
    # build every method before loading anything heavy fails late: unknown names and bad options fail here
    classes = {spec.label: get_method(spec.name) for spec in config.methods}
    if target is None:
        device = str(dist.state.device) if dist.world > 1 and config.device == "auto" else config.device
        max_memory = None
        if config.device_map and dist.world > 1:  # each process spreads its target over its own GPUs only
            gpus = process_gpus(dist.rank, dist.world, torch.cuda.device_count())
            max_memory = {i: torch.cuda.mem_get_info(i)[0] for i in gpus}
            device = f"cuda:{gpus[0]}"
        target = load_target(config.target, config.dtype, device, config.device_map, config.attn_implementation,
                             max_memory)
    methods = {spec.label: classes[spec.label].create(target, spec.options) for spec in config.methods}
    for method in methods.values():
        method.profile = PROFILE[config.profile]

    run_dir.mkdir(parents=True, exist_ok=True)
    if manifest is None and dist.rank == 0:
        manifest = build_manifest(config, run_dir, target, suites, methods)
        manifest["processes"] = dist.world
        (run_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, default=str))
    dist.barrier()
    store = RecordStore(run_dir, rank=dist.rank if dist.world > 1 else None)
    done = store.done_keys()
    devices = model_devices(target.model, target.device)
    tracker = Tracker(target.device, devices)

    for spec in config.methods:
        method = methods[spec.label]
        release_cached_memory(devices)  # a method's peak memory must not include the cache earlier ones left
        _warm_up(method, target, config, suites, tracker)
        for temperature in config.temperatures:
            sampling = SamplingParams(temperature, config.top_p, config.top_k)
            for seed in config.seeds:
                for repeat in range(config.repeats):
                    for suite in suites:
                        ctx = TurnContext(run_dir.name, spec.label, suite, temperature, seed, repeat)
                        todo = [q for q in suite.questions if _key(ctx, q) not in done][dist.rank::dist.world]
                        bar = _progress(todo, f"{spec.label} {suite.name} T={temperature}", progress)
                        for q in bar:
                            recs = run_question(method, target, ctx, q, sampling,
                                                suite.max_new_tokens or config.max_new_tokens, tracker, config.score)
                            store.append(recs)
                            done.add(_key(ctx, q))
                            _show_speed(bar, recs)
                            if on_question is not None:
                                on_question(recs)
    dist.barrier()
    return run_dir


PROFILE = {"auto": None, "on": True, "off": False}  # RunConfig.profile -> SpeculativeMethod.profile


def process_gpus(rank: int, world: int, count: int) -> list[int]:
    """The GPUs process ``rank`` of ``world`` may spread a device-mapped target over: a contiguous, disjoint share
    of the ``count`` visible GPUs (the first ``count % world`` processes get one more).
    Example: 8 GPUs, 3 processes -> [0, 1, 2], [3, 4, 5], [6, 7]."""
    if count < world:
        raise ConfigError(f"run.device_map: {world} data-parallel processes need at least {world} GPUs (one each), "
                          f"found {count}")
    base, extra = divmod(count, world)
    start = rank * base + min(rank, extra)
    return list(range(start, start + base + (rank < extra)))


def _key(ctx: TurnContext, q) -> tuple:
    return question_key({"label": ctx.label, "suite": ctx.suite.name, "question_id": q.question_id,
                         "temperature": ctx.temperature, "seed": ctx.seed, "repeat": ctx.repeat})


def _warm_up(method: Method, target: Target, config: RunConfig, suites: list, tracker: Tracker) -> None:
    """Untimed questions through the same path as measured ones (fills caches, autotuning, allocator pools)."""
    if not config.warmup:
        return
    suite = suites[0]
    ctx = TurnContext("warmup", "warmup", suite, config.temperatures[0], config.seeds[0], 0)
    sampling = SamplingParams(config.temperatures[0], config.top_p, config.top_k)
    for q in suite.questions[: config.warmup]:
        run_question(method, target, ctx, q, sampling, min(64, suite.max_new_tokens or config.max_new_tokens),
                     tracker, score=False)


def _progress(items: list, desc: str, enabled: bool):
    if not enabled or not items:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="q", leave=True, dynamic_ncols=True)


def _show_speed(bar, recs: list[dict]) -> None:
    if not hasattr(bar, "set_postfix"):
        return
    ok = [r for r in recs if r["status"] == "ok"]
    if ok:
        from harness.measure.metrics import tau, tokens_per_second

        tps = tokens_per_second(sum(r["new_tokens"] for r in ok), sum(r["wall_time_s"] for r in ok))
        bar.set_postfix(tok_s=f"{tps:.1f}", tau=f"{tau([r['accept_lengths'] for r in ok]):.2f}")
    else:
        bar.set_postfix(error=recs[0]["error"][:40] if recs else "")
