"""The compile cache across runs (harness/engine/compilecache.py, the compiled runner's use of it, `draftbench cache`).

- a folder is used only when its identity record (torch build, CPU instruction set, model architecture, dtype,
  device, flavour) equals this process's: a foreign record (literal: another torch, another CPU), an unreadable one
  (literal garbage) or none at all removes the folder with one line saying why, and nothing crashes;
- the model digest names the architecture, not the weights (the graphs take the weights as inputs);
- a call's graphs count as loaded only when every one was an FX-graph cache hit (literal counter examples);
- `draftbench cache` says per entry how many graphs its last run loaded and compiled;
- (slow: fresh processes, each compiling a tiny target) a second process loads every graph the first compiled, with
  the same tokens; a corrupt artefact (every cached file overwritten with literal garbage) is compiled again, never
  a crash; a foreign identity record is replaced with one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from harness.engine.compilecache import (
    COMPILED,
    IDENTITY_FILE,
    LOADED,
    check_folder,
    identity,
    model_digest,
    outcome,
)
from harness.run.progress import read_compile_entries, write_compile_timing
from tests.support.compiled_run import run_in_process
from tests.support.helpers import tiny_llama

EXPECTED = {"torch": "2.13.0+cpu", "torch_git": "abc", "cpu": "AVX2", "model": "0123456789ab", "dtype": "float32",
            "device": "cpu", "flavour": "dynamic"}


def _folder_with(tmp_path, record: str | None):
    folder = tmp_path / "compile" / "tiny-llama-key"
    (folder / "fxgraph").mkdir(parents=True)
    (folder / "fxgraph" / "entry").write_bytes(b"compiled graph")
    if record is not None:
        (folder / IDENTITY_FILE).write_text(record)
    return folder


def test_a_folder_made_for_this_process_is_kept(tmp_path):
    """An identical record must keep the artefacts (else nothing is ever reused) and say nothing."""
    folder = _folder_with(tmp_path, json.dumps(EXPECTED))
    assert check_folder(folder, EXPECTED) is None
    assert (folder / "fxgraph" / "entry").read_bytes() == b"compiled graph"


def test_a_new_folder_gets_its_record_silently(tmp_path):
    """A folder that does not exist yet is no reason for a line; its record must be written so that the next run
    can check it."""
    folder = tmp_path / "compile" / "fresh"
    assert check_folder(folder, EXPECTED) is None
    assert json.loads((folder / IDENTITY_FILE).read_text()) == EXPECTED


@pytest.mark.parametrize("record, why", [
    (json.dumps(EXPECTED | {"torch": "2.12.0+cpu"}), "made for torch 2.12.0+cpu, this is 2.13.0+cpu"),
    (json.dumps(EXPECTED | {"cpu": "AVX512", "dtype": "bfloat16"}),
     "made for cpu AVX512, this is AVX2; dtype bfloat16, this is float32"),
    ('{"torch": "2.13', "has an unreadable identity record (JSONDecodeError)"),
    ("[1, 2]", "has an unreadable identity record (ValueError)"),
    (None, "has no identity record"),
])
def test_a_foreign_or_corrupt_folder_is_removed_with_one_line(tmp_path, record, why):
    """Artefacts made by another torch or for another CPU or dtype, or whose record is garbage or missing, must never
    be loaded: the folder is emptied, a fresh record written and one line says why (a crash, a silent load or a
    silent wipe would each be wrong)."""
    folder = _folder_with(tmp_path, record)
    line = check_folder(folder, EXPECTED)
    assert line == f"compile cache tiny-llama-key: {why}: removed, compiling again"
    assert "\n" not in line
    assert sorted(p.name for p in folder.iterdir()) == [IDENTITY_FILE]
    assert json.loads((folder / IDENTITY_FILE).read_text()) == EXPECTED
    assert check_folder(folder, EXPECTED) is None  # and the next run keeps it


def test_model_digest_names_the_architecture_not_the_weights():
    """Two tiny Llamas with one config and different random weights must share the digest (the graphs take weights
    as inputs, so the artefacts serve both); another width must not (its graphs have other shapes)."""
    a, b, wider = tiny_llama(seed=0), tiny_llama(seed=1), tiny_llama(seed=0, hidden=64)
    assert not torch.equal(a.lm_head.weight, b.lm_head.weight)
    assert model_digest(a) == model_digest(b)
    assert model_digest(a) != model_digest(wider)
    assert len(model_digest(a)) == 12
    ident = identity(a, torch.float32, "cpu", "dynamic")
    assert ident["torch"] == torch.__version__ and ident["cpu"] == torch.backends.cpu.get_cpu_capability()


def test_outcome_counts_a_call_loaded_only_when_every_graph_hit():
    """Two FX-cache hits and nothing else: loaded; a hit and a miss, or a bypass (frozen graphs), or no inductor at
    all: compiled (calling a lowered graph 'loaded' would hide compile time)."""
    zero = {f"{c}_{k}": 0 for c in ("fx", "aot") for k in ("hit", "miss", "bypass")}
    assert outcome(zero, zero | {"fx_hit": 2, "aot_hit": 2}) == (LOADED, "hit")
    assert outcome(zero, zero | {"fx_hit": 1, "fx_miss": 1}) == (COMPILED, "hit+miss")
    assert outcome(zero, zero | {"fx_bypass": 1, "aot_bypass": 1}) == (COMPILED, "bypass")
    assert outcome(zero, zero) == (COMPILED, "")


def test_cache_show_says_per_entry_what_was_loaded_and_compiled(tmp_path, monkeypatch, capsys):
    """`draftbench cache` lists each target folder with its flavour and CPU and, per entry, the graphs its last run
    loaded from the cache and compiled; an older timings file (bare seconds) still reads."""
    from harness.cli import main

    monkeypatch.setenv("DRAFTBENCH_CACHE", str(tmp_path))
    folder = _folder_with(tmp_path, json.dumps(EXPECTED))
    write_compile_timing(folder, "vanilla@compiled", 3.04, graphs=2, loaded=2)
    write_compile_timing(folder, "pld@compiled", 61.0, graphs=1, loaded=0)
    assert read_compile_entries(folder)["vanilla@compiled"] == {"seconds": 3.0, "graphs": 2.0, "loaded": 2.0}
    assert main(["cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  tiny-llama-key  0.0 MiB  (dynamic, cpu AVX2)")
    assert lines[2:] == ["    pld@compiled: last run 1 graph(s), 0 loaded from cache, 1 compiled, 61.0 s",
                         "    vanilla@compiled: last run 2 graph(s), 2 loaded from cache, 0 compiled, 3.0 s"]
    (folder / "timings.json").write_text(json.dumps({"entries": {"vanilla@compiled": 42.0}}))
    assert read_compile_entries(folder) == {"vanilla@compiled": {"seconds": 42.0}}


# ------------------------------------------------------------------------------------------------ across processes


@pytest.mark.slow
def test_a_second_process_loads_every_graph_and_survives_corrupt_and_foreign_artefacts(tmp_path):
    """Process 1 compiles vanilla's and pld's graphs on the tiny target (static flavour: no frozen weights); process
    2, same cache, must load every one of them ("end" events marked loaded, FX-cache hits) and give the same tokens;
    with every cached file then overwritten by literal garbage, process 3 must compile again and give the same tokens
    (a crash or a wrong token would be wrong); with a foreign identity record, process 4 must say so in one line and
    compile everything again."""
    first = run_in_process(tmp_path)
    assert first["graphs"] == 3 and first["loaded"] == 0 and first["note"] is None
    second = run_in_process(tmp_path)
    assert second["tokens"] == first["tokens"]
    assert second["graphs"] == second["loaded"] == 3, second["events"]
    assert [e[3] for e in second["events"] if e[0] == "end"] == [True, True, True]
    folder = first["folder"]
    for root, _dirs, files in os.walk(folder):
        for f in files:
            if f != IDENTITY_FILE:
                with open(os.path.join(root, f), "wb") as out:
                    out.write(b"\x00garbage\xff")
    third = run_in_process(tmp_path)
    assert third["tokens"] == first["tokens"]
    assert third["graphs"] == 3 and third["loaded"] == 0, third["events"]
    record = Path(folder) / IDENTITY_FILE
    found = json.loads(record.read_text())
    record.write_text(json.dumps(found | {"cpu": "SOME_OTHER_ISA"}))
    fourth = run_in_process(tmp_path)
    assert fourth["note"].endswith(f"made for cpu SOME_OTHER_ISA, this is {found['cpu']}: removed, compiling again")
    assert ["reset", 0, "", False, fourth["note"]] in fourth["events"]
    assert fourth["graphs"] == 3 and fourth["loaded"] == 0 and fourth["tokens"] == first["tokens"]
