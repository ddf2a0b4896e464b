"""The one run loop: method x temperature x seed x repeat x suite x question, one record per turn.

Every turn goes through its entry's one door (:mod:`harness.run.entries`: the entries are planned and checked once,
before the target loads, and asked for a turn the same way whatever engine runs them), so ``run_question`` does not
branch on the engine. Warm-up goes through exactly the same ``run_question`` path, untimed and unrecorded. Every
method entry runs under its runtime (``RunConfig.entries``: eager, or the target's compiled forward,
:mod:`harness.engine.runtime`); a compiled runtime builds its graphs at their first call, which is warm-up too: a
question during which a graph still compiled is measured again, and the records report compilation separately
(``compile_s``, ``turn_compile_s``).
Every timed turn is bracketed by device synchronisation (:class:`harness.measure.trackers.Tracker`). A failing turn
(exception or out-of-memory) becomes an error record and the run goes on; a failing scorer becomes the record's
``score_error``. Records of a question are appended together, so a killed or interrupted run can be resumed
(``draftbench run --resume RUN_DIR``) with no lost and no duplicated records: the resumed run re-runs every question
that is not complete, after checking that the suites' files still have the checksums the manifest recorded.

A run with ``precisions`` loads the target in float32 and measures each entry on a copy of it in the entry's
precision (:func:`harness.models.with_precision`); every record of such a run names its ``precision``.

A run with a ``load:`` block measures load levels instead (:mod:`harness.run.load`: many requests in flight on a
served engine, one level per concurrency), after the same checks, loading and warm-up.

The run directory is created (atomically, with a unique name) before the target is loaded, so a bad output directory
fails at once; it is removed again, if still empty, when the run fails before its manifest is written.

Data parallel: under ``accelerate launch --num_processes W draftbench run ...`` every process loads the target on
its own device, takes every W-th pending question and writes its own records file; rank 0 writes the manifest.
accelerate does the process management (no scheduler of our own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import math
import os
import shlex
import sys
import traceback
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.backends.contract import BackendError
from harness.engine.runtime import CompiledRunner
from harness.engine.sampling import SamplingParams
from harness.measure import env
from harness.measure.records import RecordStore, question_key
from harness.measure.rundir import (
    LOCK_FILE,
    RunInUseError,
    RunLock,
    write_manifest,
)
from harness.measure.trackers import Tracker, model_devices, release_cached_memory
from harness.models import (
    EMBEDDED_TARGETS,
    Target,
    embedded_converted,
    load_target,
    materialize_embedded,
    target_window,
    with_precision,
)
from harness.run.chat import apply_chat_template
from harness.run.config import ConfigError, RunConfig
from harness.run.context import ContextError, check_buckets, context_fields
from harness.run.entries import Entry, Turn, engine_positions, open_entries, plan_entries, token_budget
from harness.run.load import level_questions, run_load
from harness.run.manifest import build_manifest, check_suites_unchanged, new_run_dir, resume_manifest, resumed_config
from harness.run.progress import Progress, QuestionLines
from harness.run.suites import Suite, build_context_suite, load_suite
from harness.run.suites import score as score_answer


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run. ``run_dir``: the run to resume (its records so far are stored), or None when the run was
    interrupted before its manifest was written (nothing to resume; the empty run directory is removed)."""

    def __init__(self, run_dir: Path | None):
        super().__init__(str(run_dir) if run_dir else "interrupted before the run started")
        self.run_dir = run_dir


class RunStopped(OSError):
    """A started run that could not go on (the disk full, a records file that cannot be written): the message is
    the cause, naming the file, then where the records so far are kept and the command that resumes the run."""

    def __init__(self, run_dir: Path, cause: BaseException):
        super().__init__(f"{cause}; the records so far are kept in {run_dir}; resume with: draftbench run --resume "
                         f"{shlex.quote(str(run_dir))}")
        self.run_dir = run_dir


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


def _tokenizable(text: str) -> str:
    """``text`` with each lone surrogate (which no tokenizer takes: the next turn's prompt failed on it) as U+FFFD,
    the replacement character; the record keeps the text as generated (:func:`harness.measure.rundir.dumps_json`)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _error_text(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" at {Path(last[0].filename).name}:{last[0].lineno}" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


def run_question(entry: Entry, target: Target, ctx: TurnContext, question, sampling: SamplingParams,
                 max_new_tokens: int, score: bool, warm_up: bool = False) -> list[dict[str, Any]]:
    """Generate every turn of ``question`` through ``entry``'s one door (:meth:`harness.run.entries.Entry.turn`,
    whatever engine runs it; later turns see the model's own earlier answers); one record per turn.
    ``max_new_tokens``: the run's; each turn's budget is :func:`harness.run.entries.token_budget`'s (the suite's
    own, the warm-up's cap, cut to the target's window)."""
    seed = question_seed(ctx.seed, question.question_id)
    generator = torch.Generator(device=target.device).manual_seed(seed)
    suite = ctx.suite
    window = getattr(target.config, "max_position_embeddings", None)
    uncut = token_budget(max_new_tokens, suite.max_new_tokens, warm_up=warm_up)
    system = [{"role": "system", "content": suite.system_prompt}] if suite.system_prompt else []
    messages: list[dict] = []
    records = []
    failed: str | None = None
    attempt = uuid.uuid4().hex[:16]  # shared by this attempt's records (see harness.measure.records)
    for turn, text in enumerate(question.turns):
        rec = {
            "run_id": ctx.run_id, "status": "ok", "error": None, "attempt": attempt, "method": entry.name,
            "label": ctx.label, "lossless": entry.lossless, "method_options": entry.method_options,
            "suite": suite.name, "suite_version": suite.version, "question_id": str(question.question_id),
            "category": question.category, "turn": turn, "question_turns": len(question.turns), "target": target.name,
            "dtype": str(target.dtype).replace("torch.", ""), "device": str(target.device),
            "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": ctx.seed, "repeat": ctx.repeat,
            "runtime": entry.runtime, **context_fields(question.context),
            **({} if target.precision is None else {"precision": target.precision}),
            **({} if entry.deployable else {"deployable": False}),
        }
        if failed:
            rec.update(status="error", error=f"skipped: an earlier turn failed ({failed})")
            records.append(rec)
            continue
        messages.append({"role": "user", "content": text})
        try:
            prompt_ids = target.render_chat(messages, suite.system_prompt)
            budget = token_budget(max_new_tokens, suite.max_new_tokens, int(prompt_ids.shape[1]), window, warm_up)
            if budget < uncut and question.context:  # a context prompt says that its answer was cut to fit the window
                rec["max_new_tokens_cut_to"] = budget
            rec["prompt_tokens"] = int(prompt_ids.shape[1])
            rec.update(entry.turn(Turn(system + messages, prompt_ids, budget, sampling, seed, generator,
                                       bool(question.context))))
            messages.append({"role": "assistant", "content": _tokenizable(rec["output_text"])})
        except Exception as exc:
            failed = _error_text(exc)
            rec.update(status="error", error=failed)
            if isinstance(exc, BackendError):  # the engine failed, not the method: resume runs the question again
                rec["retry"] = True
            if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
                _free_memory(target.device)
        rec["score"], rec["score_name"], rec["score_error"] = None, None, None
        if score and suite.scorer and turn == len(question.turns) - 1 and rec["status"] == "ok":
            rec["score_name"] = suite.scorer
            try:
                rec["score"] = _checked_score(score_answer(suite.scorer, question, rec["output_text"]))
            except Exception as exc:
                rec["score_error"] = _error_text(exc)
        rec["timestamp"] = env.now_iso()
        records.append(rec)
    return records


def check_context_windows(suites: list[Suite], target_name: str, target: Target | None) -> None:
    """Refuse, before the target's weights load, a context suite's bucket longer than the target's window."""
    context = [s for s in suites if s.context is not None]
    if not context:
        return
    window = (getattr(target.config, "max_position_embeddings", None) if target is not None
              else target_window(target_name))
    try:
        for s in context:
            check_buckets(s.context.buckets, window, target_name)
    except ContextError as e:
        raise ConfigError(f"suite {s.name!r}: {e}") from None


def built_suites(suites: list[Suite], target: Target) -> list[Suite]:
    """The suites with every context suite's prompts built by the target's tokenizer and chat template (each
    suite's own system prompt included), so that every prompt is exactly its bucket's length."""
    tok = target.tokenizer

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    def measure(suite: Suite) -> Callable[[str], int]:
        return lambda text: int(target.render_chat([{"role": "user", "content": text}], suite.system_prompt).shape[1])

    return [build_context_suite(s, encode, tok.decode, measure(s)) for s in suites]


def _checked_score(value: Any) -> float:
    """A scorer's result as a float; anything but a finite number is a scoring failure."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"the scorer returned {value!r}, not a finite number")
    return float(value)


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


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
        progress: bool = True, target: Target | None = None, on_question: Callable | None = None,
        manifest_extra: Mapping[str, Any] | None = None) -> Path:
    """Run ``config`` into a new run directory, or continue the run in ``resume``; return the run directory.

    ``manifest_extra``: more top-level manifest keys (``draftbench reproduce`` stores its ``reproduce`` block),
    written with the manifest, once, before the first question (a resumed run keeps its manifest as it is).
    ``target`` may be passed in (tests use tiny in-process models); ``on_question`` is called after every stored
    question (tests use it to simulate a kill). Bad input (configuration, suites, method options, output directory)
    fails before the target is loaded. Ctrl-C raises :class:`RunInterrupted` naming the run to resume; a file that
    cannot be written once the run started (disk full) raises :class:`RunStopped`, naming it and the resume command.
    """
    dist = Distributed.detect()
    manifest = None
    if resume is not None:
        run_dir = Path(resume)
        manifest = resume_manifest(run_dir)
        stored = resumed_config(manifest, run_dir)
        if config is not None and config.digest() != stored.digest():
            raise ConfigError(f"--resume {run_dir}: the given configuration differs from the run's "
                              f"(digest {config.digest()} != {stored.digest()}); resume without changing it")
        config = stored
    elif config is None:
        raise ConfigError("run: a configuration or --resume RUN_DIR is required")
    if config.threads:
        torch.set_num_threads(config.threads)
    say = Progress(enabled=progress and dist.rank == 0)

    data_dir = config.data_dir or os.environ.get("DRAFTBENCH_DATA")
    suites = [load_suite(s, data_dir, config.context_buckets).select(config.limit, config.questions, config.stratify)
              for s in config.suites]
    if manifest is not None:
        check_suites_unchanged(manifest, suites, run_dir)
    if config.load is not None and dist.world > 1:
        raise ConfigError("run.load: load levels are measured by one process (the server batches the requests); "
                          "start the run without accelerate launch")
    if config.load is not None:  # a level that needs more distinct prompts than the suites have fails here
        level_questions(config.load_spec(), [q for s in suites for q in s.questions])
    plans = plan_entries(config, dist.world)  # unknown methods, bad options or engines fail here, before loading
    check_context_windows(suites, config.target, target)
    if resume is None:
        run_dir = _shared_run_dir(config, dist)
    lock = _shared_lock(run_dir, dist)  # one writer per run directory (rank 0 holds it for a data-parallel run)
    started = manifest is not None  # the run has a manifest: it can be resumed
    entries: dict[str, Entry] = {}
    precisions = list(dict.fromkeys(plan.spec.precision for plan in plans if plan.spec.precision))
    try:
        if target is None:
            device = process_device(dist.state.device) if dist.world > 1 and config.device == "auto" else config.device
            max_memory = None
            if config.device_map and dist.world > 1:  # each process spreads its target over its own GPUs only
                gpus = process_gpus(dist.rank, dist.world, torch.cuda.device_count())
                max_memory = {i: torch.cuda.mem_get_info(i)[0] for i in gpus}
                device = f"cuda:{gpus[0]}"
            if config.target in EMBEDDED_TARGETS and not embedded_converted(config.target):
                with say.phase(f"converting the embedded GGUF of {config.target} to safetensors (first run only)"):
                    materialize_embedded(config.target)
            with say.phase(f"loading the target {config.target}"):
                target = load_target(config.target, "float32" if precisions else config.dtype, device,
                                     config.device_map, config.attn_implementation, max_memory)
        apply_chat_template(target, config.chat_template)
        if config.system_prompt is not None:
            suites = [dataclasses.replace(s, system_prompt=config.system_prompt) for s in suites]
        suites = built_suites(suites, target)
        positions = engine_positions(suites, config.max_new_tokens, getattr(target.config, "max_position_embeddings",
                                                                            None))
        tracker = Tracker(target.device, model_devices(target.model, target.device))
        if any(plan.spec.runtime == "compiled" for plan in plans) and "compiled" not in target.runners:
            # compile_weights inputs: graphs a next run loads whole (frozen: the runtime's default, see runtime.py)
            target.runners["compiled"] = CompiledRunner(
                target, freeze=False if config.compile_weights == "inputs" else None)
        copies = {p: with_precision(target, p) for p in precisions}  # the target in each precision of the run
        entries = open_entries(plans, target, config.profile, positions, tracker, say.on_compile, copies)
        if manifest is None and dist.rank == 0:
            engines = {label: e.backend.describe() for label, e in entries.items() if e.backend is not None}
            manifest = {**build_manifest(config, run_dir, target, suites, entries), "processes": dist.world,
                        # which engine ran which entry (absent when the harness ran them all)
                        **({"engines": engines} if engines else {}), **(manifest_extra or {})}
            write_manifest(run_dir, manifest)
        dist.barrier()
        started = True
        if config.load is not None:  # load levels instead of one question at a time (harness.run.load)
            run_load(config, run_dir, target, suites, entries, say, lambda e: _warm_up(e, target, config, suites),
                     lambda qid: question_seed(config.seeds[0], qid))
        else:
            _run_all(config, run_dir, dist, target, suites, entries, say, on_question)
    except KeyboardInterrupt:
        raise RunInterrupted(run_dir if started else None) from None
    except (OSError, UnicodeError) as e:  # a full disk, a file that cannot be written: the records so far are kept
        if not started:
            raise
        raise RunStopped(run_dir, e) from None
    finally:
        for entry in entries.values():
            entry.close()
        if lock is not None:
            lock.release()
        if not started and resume is None and dist.rank == 0:
            _remove_if_empty(run_dir)
    dist.barrier()
    return run_dir


def _shared_lock(run_dir: Path, dist: Distributed) -> RunLock | None:
    """Rank 0 takes the run directory's lock (:class:`harness.measure.rundir.RunLock`) and every process gets its
    outcome: the lock on rank 0, None elsewhere, or :class:`RunInUseError` everywhere."""
    lock, error = None, None
    if dist.rank == 0:
        try:
            lock = RunLock(run_dir).acquire()
        except RunInUseError as e:
            error = str(e)
    error = dist.share(error)
    if error is not None:
        raise RunInUseError(error)
    return lock


def _shared_run_dir(config: RunConfig, dist: Distributed) -> Path:
    """Rank 0 creates the run directory and every process gets its name (or rank 0's error)."""
    made: tuple[str, str] | None = None
    if dist.rank == 0:
        try:
            made = ("dir", str(new_run_dir(config)))
        except ConfigError as e:
            made = ("error", str(e))
    kind, value = dist.share(made)
    if kind == "error":
        raise ConfigError(value)
    return Path(value)


def _remove_if_empty(run_dir: Path) -> None:
    """Remove a run directory that holds nothing but its lock file (a run stopped before it started)."""
    if {p.name for p in run_dir.iterdir()} <= {LOCK_FILE}:
        with contextlib.suppress(OSError):
            (run_dir / LOCK_FILE).unlink()
            run_dir.rmdir()


def _run_all(config: RunConfig, run_dir: Path, dist: Distributed, target: Target, suites: list[Suite],
             entries: dict[str, Entry], say: Progress, on_question: Callable | None) -> None:
    """Every pending question of the run: those without a complete attempt in the run's records."""
    store = RecordStore(run_dir, rank=dist.rank if dist.world > 1 else None)  # repairs this process's torn tail
    dist.barrier()
    done = store.done_keys({(s.name, q.question_id): len(q.turns) for s in suites for q in s.questions})
    dist.barrier()  # every process has read the same records before any appends: they split the same pending list
    devices = model_devices(target.model, target.device)

    def measure(spec, compiling, ctx, q, sampling, bar) -> None:
        say.entry = spec.label  # a question that still compiles a graph says whose
        recs = compiling.measure(functools.partial(
            run_question, entries[spec.label], entries[spec.label].target, ctx, q, sampling, config.max_new_tokens,
            config.score))
        store.append(recs)
        done.add(_key(ctx, q))
        _show_speed(bar, recs)
        if on_question is not None:
            on_question(recs)

    specs = config.entries()

    def warmed_up(spec) -> _Compiling:
        release_cached_memory(devices)  # a method's peak memory must not include the cache earlier ones left
        runner = entries[spec.label].runner
        compiling = _Compiling(runner)
        place = f"{specs.index(spec) + 1}/{len(specs)}"
        with compiling.warm_up(), say.warm_up(spec.label, place, runner):
            _warm_up(entries[spec.label], entries[spec.label].target, config, suites)
        return compiling

    def cells():  # (temperature, sampling, seed, repeat, suite) in the run's order
        for temperature in config.temperatures:
            sampling = SamplingParams(temperature, config.top_p, config.top_k)
            for seed in config.seeds:
                for repeat in range(config.repeats):
                    for suite in suites:
                        yield temperature, sampling, seed, repeat, suite

    if config.interleave:  # question-major: every entry answers a question before the next question starts
        compilings = {spec.label: warmed_up(spec) for spec in specs}
        for temperature, sampling, seed, repeat, suite in cells():
            ctxs = {spec.label: TurnContext(run_dir.name, spec.label, suite, temperature, seed, repeat)
                    for spec in specs}
            todo = [q for q in suite.questions
                    if any(_key(c, q) not in done for c in ctxs.values())][dist.rank::dist.world]
            bar = _progress(todo, f"interleaved {suite.name} T={temperature}", say)
            for q in bar:
                for spec in specs:
                    if _key(ctxs[spec.label], q) not in done:
                        release_cached_memory(devices)
                        measure(spec, compilings[spec.label], ctxs[spec.label], q, sampling, bar)
        return
    for spec in specs:  # entry-major: each entry answers every question before the next entry starts
        compiling = warmed_up(spec)
        for temperature, sampling, seed, repeat, suite in cells():
            ctx = TurnContext(run_dir.name, spec.label, suite, temperature, seed, repeat)
            todo = [q for q in suite.questions if _key(ctx, q) not in done][dist.rank::dist.world]
            bar = _progress(todo, f"{spec.label} {suite.name} T={temperature}", say)
            for q in bar:
                measure(spec, compiling, ctx, q, sampling, bar)


COMPILE_RETRIES = 2  # a question that compiled a new graph is measured again, at most this many times


class _Compiling:
    """Keeps compilation out of measured turns: the time a label's runtime spends compiling (a compiled runtime's
    graphs are built at their first call) is warm-up, reported in every record as ``compile_s``, never part of
    ``wall_time_s``. A question during which a new graph compiled (a shape the warm-up did not meet) is run again,
    up to :data:`COMPILE_RETRIES` times, and the last attempt is recorded; its records say how much compilation is
    still inside their wall time (``turn_compile_s``, 0 normally)."""

    def __init__(self, runner):
        self.runner = runner
        self.compile_s = 0.0  # this label's compile time so far (warm-up and discarded attempts)

    @contextlib.contextmanager
    def warm_up(self):
        before = self.runner.compile_s
        try:
            yield
        finally:
            self.compile_s += self.runner.compile_s - before

    def measure(self, run_once: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        for attempt in range(COMPILE_RETRIES + 1):
            before = self.runner.compile_s
            recs = run_once()
            spent = self.runner.compile_s - before
            if spent == 0.0 or attempt == COMPILE_RETRIES:
                break
            self.compile_s += spent
        for rec in recs:
            rec["compile_s"] = round(self.compile_s, 3)
            rec["turn_compile_s"] = round(spent, 3)
        return recs


def process_device(device: torch.device | str) -> str:
    """The device name (:data:`harness.models.DEVICE_FORMS`) of the device accelerate gives a data-parallel process
    whose run says ``device: auto``. accelerate names a CPU process's device ``cpu:0``, which is no device name
    draftbench takes; a GPU keeps its index. Examples: "cpu:0" -> "cpu"; "cuda:3" -> "cuda:3"; "mps" -> "mps"."""
    device = torch.device(device)
    return str(device) if device.type == "cuda" else device.type


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


def _warm_up(entry: Entry, target: Target, config: RunConfig, suites: list) -> None:
    """Untimed questions through the same path as measured ones (fills caches, autotuning, allocator pools)."""
    if not config.warmup:
        return
    suite = suites[0]
    ctx = TurnContext("warmup", "warmup", suite, config.temperatures[0], config.seeds[0], 0)
    sampling = SamplingParams(config.temperatures[0], config.top_p, config.top_k)
    for q in suite.questions[: config.warmup]:
        run_question(entry, target, ctx, q, sampling, config.max_new_tokens, score=False, warm_up=True)
    entry.forget()  # the measured questions must not find the warm-up's answers in a stateful method's memory


def _progress(items: list, desc: str, say: Progress):
    """The questions of one cell, shown as tqdm's bar on a terminal, as plain lines otherwise (a log file)."""
    if not say.enabled or not items:
        return items
    stream = say.stream or sys.stderr
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return QuestionLines(items, desc, say)
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="q", leave=True, dynamic_ncols=True)


def _show_speed(bar, recs: list[dict]) -> None:
    if not hasattr(bar, "set_postfix"):
        return
    ok = [r for r in recs if r["status"] == "ok"]
    if ok:
        from harness.measure.acceptance import tau
        from harness.measure.metrics import tokens_per_second

        tps = tokens_per_second(sum(r["new_tokens"] for r in ok), sum(r["wall_time_s"] for r in ok))
        bar.set_postfix(tok_s=f"{tps:.1f}", tau=f"{tau([r['accept_lengths'] for r in ok]):.2f}")
    else:
        bar.set_postfix(error=recs[0]["error"][:40] if recs else "")
