"""Reading draft-head checkpoints: the weights file, ``config.json``, strict key checks and where a head lives.

Every draft method (EAGLE, Medusa, Jakiro, ...) loads its published format through these helpers, so every format
fails the same way: a :class:`CheckpointError` that names the file and every missing, unexpected or mis-shaped key
(the original EAGLE and Jakiro loaders use ``strict=False`` and silently keep random weights for a renamed key).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path

import torch

from harness.models import Target


class CheckpointError(ValueError):
    """A draft checkpoint that is missing, malformed or does not fit the target; the message names the file/key."""


def read_weights(folder: Path, names: tuple[str, ...], what: str) -> tuple[dict[str, torch.Tensor], Path]:
    """The state dict in the first of ``names`` that exists in ``folder`` (safetensors, or a torch pickle)."""
    for name in names:
        path = folder / name
        if path.is_file():
            try:
                if path.suffix == ".safetensors":
                    from safetensors.torch import load_file

                    return load_file(str(path)), path
                # weights_only: a pickle that would run code (or build anything but tensors) is refused, not run
                sd = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:  # safetensors' SafetensorError, pickle's UnpicklingError, a truncated zip, ...
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                kind = "safetensors" if path.suffix == ".safetensors" else "torch"
                raise CheckpointError(f"{path}: not a readable {kind} weights file ({type(e).__name__}: "
                                      f"{first[:200]})") from None
            if not isinstance(sd, Mapping):
                raise CheckpointError(f"{path}: expected a state dict (name -> tensor), got {type(sd).__name__}")
            return dict(sd), path
    raise CheckpointError(f"{what} folder {folder} has no weights file; expected one of: {', '.join(names)}")


def read_config(folder: Path, what: str) -> dict:
    """``folder/config.json`` as a dict, with errors that name the file."""
    path = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(f"{what} checkpoint folder {folder} does not exist")
    if not path.is_file():
        raise CheckpointError(f"{what} checkpoint folder {folder} has no config.json")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return raw


def check_state_dict(got: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]], where: str,
                     optional: frozenset[str] = frozenset()) -> None:
    """Raise :class:`CheckpointError` naming every missing, unexpected and mis-shaped key of ``got``.

    ``expected`` maps key -> shape; keys in ``optional`` may be absent. A missing key with a close unexpected key
    is reported as a probable rename, e.g. ``missing: fc.weight (found fc_weight: renamed?)``.
    """
    missing = sorted(k for k in expected if k not in got and k not in optional)
    unexpected = sorted(k for k in got if k not in expected)
    problems = []
    if missing:
        described = []
        for k in missing:
            close = difflib.get_close_matches(k, unexpected, n=1, cutoff=0.6)
            described.append(f"{k} (found {close[0]}: renamed?)" if close else k)
        problems.append("missing keys: " + ", ".join(described))
    if unexpected:
        problems.append("unexpected keys: " + ", ".join(unexpected))
    bad = [f"{k}: checkpoint {list(got[k].shape)} vs expected {list(shape)}"
           for k, shape in expected.items() if k in got and tuple(got[k].shape) != tuple(shape)]
    if bad:
        problems.append("shape mismatches: " + "; ".join(bad))
    if problems:
        raise CheckpointError(f"{where}: " + "; ".join(problems))


def target_vocab_hidden(target: Target) -> tuple[int, int]:
    """(V, H) of the target's lm_head, the space every draft head predicts in."""
    w = target.model.get_output_embeddings().weight
    return w.shape[0], w.shape[1]



def check_target_sizes(raw: dict, target: Target, where: str) -> tuple[int, int]:
    """(V, H) of ``target``; a config's ``hidden_size`` or ``vocab_size`` (when present) that differs is a
    :class:`CheckpointError` naming both, e.g. ``config.json: hidden_size=64 does not match the target 'x'
    (hidden_size=576)``."""
    V, H = target_vocab_hidden(target)
    for key, want in (("hidden_size", H), ("vocab_size", V)):
        if key in raw and raw[key] != want:
            raise CheckpointError(f"{where}: {key}={raw[key]} does not match the target {target.name!r} ({key}={want})")
    return V, H


def int_field(raw: dict, key: str, where: str, minimum: int) -> int:
    """Integer field ``key`` (>= ``minimum``) of a checkpoint config; missing or bad is a :class:`CheckpointError`."""
    if key not in raw:
        raise CheckpointError(f"{where}: missing field {key}")
    value = raw[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise CheckpointError(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def check_head_option(head) -> None:
    """Option ``head`` of a draft method: None (the shipped head) or a folder path."""
    if head is not None and not isinstance(head, str):
        raise ValueError(f"head must be a checkpoint folder path (string), got {type(head).__name__}")


def resolve_head_folder(option: str | None, target: Target, kind: str, shipped: Path) -> Path:
    """The checkpoint folder for option ``head`` (``kind`` = "eagle", "medusa", ...): the given path, or by default
    the head shipped for the target in ``shipped/<target>/<kind>``; the error says how to get one."""
    train = (f"train one with `draftbench train {kind}` (see `draftbench train --help`) and pass its folder as the "
             f"method option head=<folder>")
    if option is not None:
        folder = Path(option).expanduser()
        if not folder.is_dir():
            raise CheckpointError(f"option head: {kind} checkpoint folder {folder} does not exist; {train}")
        return folder
    folder = Path(shipped) / target.name / kind
    if not folder.is_dir():
        raise CheckpointError(f"no {kind} head is shipped for target {target.name!r} (looked in {folder}); {train}")
    return folder
