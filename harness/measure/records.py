"""Per-turn records, appended durably to ``records.jsonl`` in a run directory, and resumed without duplicates.

One JSON object per line, one line per (method label, suite, question, turn, temperature, seed, repeat).
All turns of one question are written in a single ``write`` + ``fsync``, so a killed run leaves either every
turn of a question or none of them (a torn last line is ignored and overwritten on resume). In a data-parallel run
(``accelerate launch``) process ``r`` of ``w`` writes ``records.rank<r>.jsonl``; readers take every
``records*.jsonl`` of the run directory.

Fields (``None`` where not applicable or not measurable on this device):

=========================== ==================================================================================
run_id, status, error       run identity; ``"ok"`` or ``"error"`` (then ``error`` holds type and message)
method, label, lossless     registered method name, the run's label for it (unique per run), lossless flag
method_options              dict of the method's options (ablation knobs)
suite, suite_version        suite name and its version
question_id, category, turn question identity (``question_id`` as a string), 0-based turn index
target, dtype, device       the target model alias/id, torch dtype, device string
temperature, top_p, seed    sampling settings; ``repeat`` counts repeated measurements
prompt_tokens, new_tokens   tokens in the rendered prompt; tokens generated (``len(output_ids)``)
steps                       target forward passes (prefill included) = ``len(accept_lengths)``
accept_lengths              tokens appended per target forward (see ``harness.engine.method.Generation``)
accepted_drafts             draft tokens accepted per verification step (uncut)
draft_depths                depth of the draft tree per verification step
wall_time_s, prefill_time_s synchronised wall time of the turn (prefill included); time to the first token
stop_reason                 "eos" or "max_new_tokens"
output_text, output_ids     the generated text and token ids
rss_bytes, peak_rss_bytes   process RSS after the turn; lifetime peak RSS
cuda_peak_allocated_bytes, cuda_peak_reserved_bytes, nvml_used_bytes   GPU memory, summed over a device map's
                            GPUs (None on CPU)
energy_j, mean_power_w      NVML energy over the turn and energy / wall time (None without a GPU)
nvml_devices                PCI bus ids of the NVML boards read (None without NVML)
timings, counters           method-specific breakdown (e.g. draft_s, verify_s; draft_forwards)
timings_synchronised        whether the timings split was measured with a device sync at each mark (None: no split)
logit_margins, logit_tops,  greedy only (else None): per emitted token, the target's top-1 minus top-2 logit, the
logit_runner_ups            top-1 logit and the top-2 token (``harness.measure.metrics.divergence``)
score, score_name           quality of the answer where the suite has a scorer (on the last turn)
timestamp                   ISO time the turn finished
=========================== ==================================================================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RECORDS_FILE = "records.jsonl"
RECORDS_GLOB = "records*.jsonl"

# fields that identify one observation; a resumed run skips questions whose key is complete
KEY_FIELDS = ("label", "suite", "question_id", "temperature", "seed", "repeat")


def question_key(rec: dict[str, Any]) -> tuple:
    return tuple(str(rec[f]) if f == "question_id" else rec[f] for f in KEY_FIELDS)


class RecordStore:
    """Append-only JSONL store of turn records in ``run_dir``."""

    def __init__(self, run_dir: str | Path, rank: int | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / (RECORDS_FILE if rank is None else f"records.rank{rank}.jsonl")
        self._repair_tail()

    def _repair_tail(self) -> None:
        """Drop a torn last line left by a kill in the middle of a write."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        with open(self.path, "r+b") as f:
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Append records (one question's turns) atomically enough: one write, flushed and fsynced."""
        lines = "".join(json.dumps(r, ensure_ascii=False, default=_jsonable) + "\n" for r in records)
        if not lines:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        """Records of the whole run (every process's file)."""
        return read_records(self.run_dir)

    def done_keys(self) -> set[tuple]:
        return {question_key(r) for r in self.read()}


def record_files(run_dir: str | Path) -> list[Path]:
    return sorted(Path(run_dir).glob(RECORDS_GLOB))


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a run directory (every ``records*.jsonl``) or of one records file."""
    path = Path(path)
    files = record_files(path) if path.is_dir() else [path]
    out: list[dict[str, Any]] = []
    for file in files:
        out.extend(_read_file(file))
    return out


def _read_file(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # torn tail from a killed writer; everything before it is intact
    return out


def _jsonable(obj: Any):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")
