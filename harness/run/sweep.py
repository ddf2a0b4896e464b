"""Grids of method options (ablations): a ``sweep:`` in a preset or ``--sweep LABEL.OPTION=v1,v2`` on the command
line expands one method entry into one labelled entry per combination of values.

In a preset::

    methods:
      - vanilla
      - {name: jakiro, options: {total_tokens: 16, depth: 3, top_k: 4}}
    sweep:
      jakiro: {mode: [hybrid, ar, parallel], total_tokens: [8, 16, 32]}   # label -> option -> values

``sweep`` is a mapping (method label -> option -> values) or a list of such grids. Each grid is a cartesian
product over its options, in the order written, values in the order listed; it replaces its entry in place by
``jakiro[mode=hybrid,total_tokens=8]``, ``jakiro[mode=hybrid,total_tokens=16]``, ... (readable, unique, stable).
Several grids of the same entry (a list) are concatenated, a repeated combination kept once: the Jakiro paper's
ablation is ``[{jakiro: {head: [...]}}, {jakiro: {mode: [ar]}}, {jakiro: {contrastive: ["off"]}}]``, not a
product. A label that names no entry but is a method name adds that method with its default options.

Every combination is validated by building the method's options (:func:`harness.engine.method.build_options`), so
``--sweep jakiro.mode=hybird`` fails at configuration time naming the option and the value. The label shows the
validated value (``contrastive: off`` and ``contrastive: false`` both show ``off``); a path shows its last folder
name other than ``head`` (``work/experts/num_experts=2/head`` -> ``num_experts=2``, which names itself).

An option ``engine_options.<key>[.<key>...]`` sweeps what the entry passes to its engine instead of a method option
(an entry run by vLLM, :mod:`harness.backends.vllm`): ``{vllm-eagle3: {engine_options.speculative_config.
num_speculative_tokens: [1, 2, 3]}}`` (or nested, ``{engine_options: {speculative_config: {num_speculative_tokens:
[1, 2, 3]}}}``) gives ``vllm-eagle3[num_speculative_tokens=1]`` ... with the entry's own engine options (else the
run's) changed at that key; these values go to the engine unchecked.

A value of option ``head`` that is a folder written by ``draftbench train <objective> --sweep`` (it holds
:data:`TRAIN_SWEEP_FILE`) stands for all of that sweep's heads, each labelled by its own value
(``jakiro[num_experts=2]``). The labels are for reading only: tables take every knob from the records' method
options (``opt.<name>`` columns), never from a label.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from harness.schema import InputError
from harness.yamlsafe import safe_load

TRAIN_SWEEP_FILE = "sweep.json"  # written by harness.train.sweep into the sweep's output folder

Grid = dict[str, dict[str, list[Any]]]  # label -> option -> values
ENGINE_OPTIONS = "engine_options."  # an option named so sweeps a key of the entry's engine_options


class SweepError(InputError):
    """A sweep that is malformed or has a bad value; the message names the sweep field (``run.sweep.LABEL.OPTION``)."""


def yaml_value(raw: str, where: str) -> Any:
    """``raw`` (a flag's value: ``--set``, ``--opt``, ``--sweep``) parsed as one YAML value (safe_load: no tags,
    nothing runs), or a one-line :class:`~harness.schema.InputError` that quotes ``where``. Example: ("[1",
    "limit=[1") -> "limit=[1: not valid YAML (expected ',' or ']', but got '<stream end>')"; a tag such as
    "!!python/name:os.system" is refused the same way."""
    try:
        return safe_load(raw)
    except yaml.YAMLError as e:
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise InputError(f"{where}: not valid YAML ({problem})") from None


def parse_values(text: str) -> list[Any]:
    """Values of one ``OPTION=...`` assignment: a YAML list (``[8, 16]``) or comma-separated YAML scalars.

    Example: "hybrid,ar" -> ["hybrid", "ar"]; "8, 16" -> [8, 16]; "[0.5, 0]" -> [0.5, 0]; "off" -> ["off"] (kept
    as text, not YAML's false, so ``contrastive=off`` means what it says).
    """
    text = text.strip()
    if text.startswith("["):
        values = yaml_value(text, text)
        return values if isinstance(values, list) else [values]
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        value = yaml_value(part, text)
        out.append(part if isinstance(value, bool) and part.lower() not in ("true", "false") else value)
    return out


def parse_assignment(text: str, with_label: bool, where: str) -> tuple[str | None, str, list[Any]]:
    """``LABEL.OPTION=v1,v2`` (``with_label``) or ``OPTION=v1,v2`` -> (label or None, option, values)."""
    form = "LABEL.OPTION=V1,V2" if with_label else "OPTION=V1,V2"
    key, eq, raw = text.partition("=")
    label, option = (key.rpartition(".")[0], key.rpartition(".")[2]) if with_label else (None, key)
    if with_label and "." + ENGINE_OPTIONS in key:  # LABEL.engine_options.a.b=...: the dotted path is the option
        label, _, path = key.partition("." + ENGINE_OPTIONS)
        option = ENGINE_OPTIONS + path
    if not eq or not option.strip() or (with_label and not label):
        raise SweepError(f"{where} {text!r}: expected {form}")
    values = parse_values(raw)
    if not values:
        raise SweepError(f"{where} {text!r}: no values after '='")
    return (label.strip() if label else None), option.strip(), values


def normalize(raw: Any, where: str = "run.sweep") -> list[Grid]:
    """A ``sweep:`` value as a list of grids ``{label: {option: [values]}}``; a scalar value becomes a one-value
    list. Raises :class:`SweepError` naming the field for anything else."""
    grids = raw if isinstance(raw, list) else [raw]
    out: list[Grid] = []
    for i, grid in enumerate(grids):
        at = f"{where}[{i}]" if isinstance(raw, list) else where
        if not isinstance(grid, Mapping) or not grid:
            raise SweepError(f"{at}: expected a mapping label -> {{option: [values]}}, got {grid!r}")
        norm: Grid = {}
        for label, options in grid.items():
            if not isinstance(options, Mapping) or not options:
                raise SweepError(f"{at}.{label}: expected a mapping option -> [values], got {options!r}")
            norm[str(label)] = {}
            for option, values in _flat_engine_options(options).items():
                values = list(values) if isinstance(values, (list, tuple)) else [values]
                if not values:
                    raise SweepError(f"{at}.{label}.{option}: no values")
                norm[str(label)][str(option)] = values
        out.append(norm)
    return out


def _flat_engine_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A grid's options with a nested ``engine_options`` mapping written as dotted options down to its value lists.
    Example: {"depth": [2], "engine_options": {"speculative_config": {"num_speculative_tokens": [1, 2]}}} ->
    {"depth": [2], "engine_options.speculative_config.num_speculative_tokens": [1, 2]}."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        else:
            out[prefix] = value

    for option, values in options.items():
        if str(option) == ENGINE_OPTIONS.rstrip(".") and isinstance(values, Mapping):
            walk(str(option), values)
        else:
            out[str(option)] = values
    return out


def add_cli_sweeps(data: dict[str, Any], items: Sequence[str]) -> dict[str, Any]:
    """Merge ``--sweep LABEL.OPTION=v1,v2`` flags into a preset mapping's ``sweep``: the options of one label form one
    grid; it is merged into every preset grid of that label (a flag's option replaces the preset's) or, when no
    grid has the label, added as a new grid. Returns ``data`` (changed in place)."""
    if not items:
        return data
    flags: Grid = {}
    for item in items:
        label, option, values = parse_assignment(item, True, "--sweep")
        flags.setdefault(label, {})[option] = values
    grids = normalize(data["sweep"]) if data.get("sweep") is not None else []
    for label, options in flags.items():
        hits = [g for g in grids if label in g]
        for g in hits:
            g[label] = {**g[label], **options}
        if not hits:
            grids.append({label: dict(options)})
    data["sweep"] = grids
    return data


def show_value(value: Any) -> str:
    """How a value reads in a label. Example: 16 -> "16"; 0.5 -> "0.5"; [[0], [0, 1]] -> "[[0],[0,1]]";
    "work/experts/num_experts=2/head" -> "num_experts=2"; None -> "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return format(value, "g")
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    text = str(value)
    if "/" in text:
        parts = [p for p in Path(text).parts if p not in ("head", "/")]
        return parts[-1] if parts else text
    return text


def _fragment(option: str, value: Any, shown: str | None = None) -> str:
    shown = show_value(value) if shown is None else shown
    # a head folder named by its own knob (``num_experts=2``) reads best without the ``head=`` prefix
    return shown if option == "head" and "=" in shown else f"{option}={shown}"


def train_sweep_members(folder: str | Path) -> list[dict[str, Any]] | None:
    """The heads of a training sweep folder, ``[{"name": "num_experts=2", "head": "<folder>/num_experts=2/head"},
    ...]`` in the sweep's order, or None when ``folder`` holds no :data:`TRAIN_SWEEP_FILE`."""
    path = Path(str(folder)) / TRAIN_SWEEP_FILE
    if not path.is_file():
        return None
    try:
        members = json.loads(path.read_text())["members"]
        return [{"name": m["name"], "head": str(Path(str(folder)) / m["head"])} for m in members]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise SweepError(f"{path}: not a draftbench training sweep file ({e})") from e


def _choices(option: str, values: list[Any]) -> list[tuple[Any, str | None]]:
    """(value, label text or None) per value; a ``head`` value naming a training sweep becomes its heads."""
    out: list[tuple[Any, str | None]] = []
    for v in values:
        members = train_sweep_members(v) if option == "head" and isinstance(v, str) else None
        if members is None:
            out.append((v, None))
        else:
            out.extend((m["head"], m["name"]) for m in members)
    return out


def expand_entry(name: str, label: str, options: Mapping[str, Any], grid: Mapping[str, list[Any]],
                 check: Callable[[dict[str, Any], str], Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    """One entry x one grid -> ``[(label, options)]`` in product order. ``check(options, where)`` builds the method's
    options dataclass (raising on a bad value); every single value is checked on its own first, so the error names
    the option that is wrong, then every combination."""
    axes = []
    for option, values in grid.items():
        choices = [(v, None) for v in values] if option.startswith(ENGINE_OPTIONS) else _choices(option, values)
        for value, _ in choices:
            if not option.startswith(ENGINE_OPTIONS):
                _checked(check, {**options, option: value}, f"{where}.{option}={show_value(value)}")
        axes.append([(option, v, shown) for v, shown in choices])
    out = []
    for combo in itertools.product(*axes):
        opts = {**options, **{o: v for o, v, _ in combo}}
        method_opts = {o: v for o, v in opts.items() if not o.startswith(ENGINE_OPTIONS)}
        built = _checked(check, method_opts,
                         f"{where} combination {', '.join(f'{o}={show_value(v)}' for o, v, _ in combo)}")
        norm = dataclasses.asdict(built) if dataclasses.is_dataclass(built) else {}
        fragments = [_fragment(o.rpartition(".")[2] if o.startswith(ENGINE_OPTIONS) else o, v,
                               shown if shown is not None else show_value(norm.get(o, v))) for o, v, shown in combo]
        out.append((f"{label}[{','.join(fragments)}]", opts))
    return out


def _checked(check: Callable[[dict[str, Any], str], Any], options: dict[str, Any], where: str) -> Any:
    try:
        return check(options, where)
    except SweepError:
        raise
    except (ValueError, TypeError) as e:
        message = str(e)
        raise SweepError(message if message.startswith(where) else f"{where}: {message}") from e


def expand(entries: list[tuple[str, str, dict[str, Any]]], grids: list[Grid], options_class: Callable[[str], type],
           where: str = "run.sweep") -> list[tuple[str, str, dict[str, Any], str]]:
    """Expand ``entries`` ``[(name, label, options)]`` by ``grids``; returns the new entry list
    ``[(name, label, options, base)]``, ``base`` the label of the entry it came from (its engine, runtime and engine
    options are the new entry's; ``options`` may hold ``engine_options.<path>`` keys, see the module docstring).

    ``options_class(name)`` is the method's Options dataclass (it raises for an unknown method). A grid label that
    names no entry but is a method name appends that method (default options) first.
    """
    from harness.engine.method import build_options

    entries = [(n, lab, dict(o)) for n, lab, o in entries]
    expanded: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for i, grid in enumerate(grids):
        for label, options in grid.items():
            at = f"{where}[{i}].{label}" if len(grids) > 1 else f"{where}.{label}"
            base = [e for e in entries if e[1] == label]
            if not base:
                try:
                    options_class(label)
                except (KeyError, ValueError) as e:
                    raise SweepError(f"{at}: no method entry is labelled {label!r} (labels: "
                                     f"{[e[1] for e in entries]}) and it is not a method name") from e
                entries.append((label, label, {}))
                base = [entries[-1]]
            name, _, opts = base[0]
            cls = options_class(name)
            check = lambda o, w, cls=cls: build_options(cls, o, w)  # noqa: E731
            got = expanded.setdefault(label, [])
            for new_label, new_opts in expand_entry(name, label, opts, options, check, at):
                if all(new_opts != o for _, o in got):
                    got.append((new_label, new_opts))
    out = []
    for name, label, opts in entries:
        if label in expanded:
            out.extend((name, new_label, new_opts, label) for new_label, new_opts in expanded[label])
        else:
            out.append((name, label, opts, label))
    labels = [lab for _, lab, _, _ in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise SweepError(f"{where}: the expansion gives duplicate labels {dup}; make the swept values distinct")
    return out
