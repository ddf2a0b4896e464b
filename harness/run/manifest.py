"""The run directory's bookkeeping: a new run directory (created atomically, with a unique name), the manifest a run
writes into it (config, provenance, target, suites with their checksums, methods, runtimes), and what resuming a run
reads from it and checks (its manifest and config, the suites' checksums)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from harness.measure import env
from harness.measure.rundir import LOCK_FILE, MANIFEST_FILE, ManifestError, read_manifest
from harness.measure.trackers import model_devices
from harness.models import Target
from harness.run.config import ConfigError, RunConfig, config_from_dict
from harness.run.entries import Entry
from harness.run.suites import Suite


def new_run_dir(config: RunConfig) -> Path:
    """Create and return a new, empty run directory ``<output_dir>/<timestamp>-<digest>[-n]``.

    The directory is created with an exclusive ``mkdir``, so two runs started in the same second get different
    directories (the second one gets ``-2``) and never share or overwrite a run. An output directory that cannot hold
    run directories (a file, not writable) raises :class:`ConfigError` naming it.
    """
    base = Path(config.output_dir).expanduser()
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"output directory {base} (--output-dir): cannot create it: {e.strerror or e}") from None
    if not base.is_dir():
        raise ConfigError(f"output directory {base} (--output-dir): not a directory")
    stamp = env.now_iso().replace(":", "").replace("+0000", "Z").replace("-", "")
    name = f"{stamp}-{config.digest()}"
    for n in itertools.count(1):
        run_dir = base / (name if n == 1 else f"{name}-{n}")
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue  # never overwrite a run: another run took this name
        except OSError as e:
            raise ConfigError(f"output directory {base} (--output-dir): cannot create a run directory there: "
                              f"{e.strerror or e}") from None
        return run_dir
    raise AssertionError("unreachable")


def build_manifest(config: RunConfig, run_dir: Path, target: Target, suites: list, entries: dict[str, Entry]) -> dict:
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
                            "questions": len(s.questions),
                            # a context suite's recipe and what it built: bucket, exact tokens, documents, cut
                            **({"context": {"recipe": s.context.to_dict(),
                                            "prompts": {q.question_id: q.context for q in s.questions}}}
                               if s.context is not None else {})} for s in suites},
        # an entry a server ran shows what the server ran (harness.backends.contract.entry_options)
        "methods": {label: entry.describe() for label, entry in entries.items()},
        # how each runtime of the run calls the target (backend, cache, shapes, CUDA graphs, linear kernels)
        "runtimes": {entry.runtime: entry.runner.describe() for entry in entries.values()},
    }


def resume_manifest(run_dir: Path) -> dict:
    """The manifest of the run to resume; a missing one (not a run directory), an unreadable or invalid one, or one
    without a ``config`` object raises :class:`ConfigError` naming the file."""
    try:
        manifest = read_manifest(run_dir)
    except ManifestError as e:
        raise ConfigError(f"{e}; cannot resume") from None
    if manifest is None:
        if Path(run_dir).is_dir() and {p.name for p in Path(run_dir).iterdir()} <= {LOCK_FILE}:  # killed in load
            raise ConfigError(f"{run_dir} is empty: its run was stopped before it started (while the model loaded), "
                              "so there is nothing to resume; start the run again (and remove the empty folder)")
        raise ConfigError(f"{run_dir} is not a run directory (no {MANIFEST_FILE})")
    if not isinstance(manifest.get("config"), dict):
        raise ConfigError(f"{Path(run_dir) / MANIFEST_FILE}: corrupt manifest: expected a \"config\" object; "
                          "cannot resume")
    return manifest


def check_suites_unchanged(manifest: dict, suites: list[Suite], run_dir: Path) -> None:
    """Refuse to resume when a suite's questions file is not the one the run started with (sha256 in the manifest):
    new answers to changed prompts would be mixed with the old ones."""
    recorded = manifest.get("suites") if isinstance(manifest.get("suites"), dict) else {}
    for suite in suites:
        old = (recorded.get(suite.name) or {}).get("sha256") if isinstance(recorded.get(suite.name), dict) else None
        if old is None:
            raise ConfigError(f"--resume {run_dir}: the manifest records no checksum for suite {suite.name!r}; "
                              "cannot tell whether its questions changed, start a new run")
        if old != suite.sha256:
            raise ConfigError(f"--resume {run_dir}: suite {suite.name!r} changed since the run started: "
                              f"{suite.source} has sha256 {suite.sha256}, the manifest recorded {old}; resuming "
                              "would mix answers to different questions (restore the file or start a new run)")


def resumed_config(manifest: dict, run_dir: Path) -> RunConfig:
    try:
        return config_from_dict(dict(manifest["config"]))
    except ConfigError as e:
        raise ConfigError(f"{Path(run_dir) / MANIFEST_FILE}: {e}") from None
