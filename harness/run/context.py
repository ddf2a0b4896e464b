"""Context-length buckets: a suite built at target input lengths from real documents (issue #23, item 1).

A suite definition with a ``context:`` block (:data:`RECIPE_FIELDS`) names no questions of its own: its ``file``
holds the *documents* (e.g. CNN/DailyMail articles, ``suites/long_context.yaml``), and every prompt is built from
them at one input length, its *bucket*. Prompt ``j`` of bucket ``B`` is, in order::

    preamble + document[s_j] + separator + document[s_j + 1] + ... (cut) + question

with ``s_j = j * D // prompts`` (``D`` documents, taken in file order and wrapped around), so the prompts of one
bucket start at different documents and a longer bucket extends the same text. The documents are cut at the
tokenizer's boundary so that the prompt the target sees (its chat template applied, the run's system prompt
included) is ``B`` tokens long: the document ids are cut to ``n``, decoded, and ``n`` is corrected by the
difference until the rendered prompt measures ``B`` (a decoded cut can re-tokenise a token longer or shorter; when
no cut measures exactly ``B``, the longest below it is kept and its records give its exact length).
Nothing is random: the same source file, recipe and tokenizer give the same prompts, and the suite's sha256
(:func:`recipe_digest`) covers the source file's digest and the recipe, as a questions file's covers its bytes.

Every prompt carries its recipe in its records (:func:`context_fields`): ``context_bucket``, the exact
``prompt_tokens`` the runner records anyway, the ``context_documents`` used, and ``context_cut_tokens``, how
many tokens of the last document were cut away to fit the bucket (a prompt cut to fit says so).

A bucket longer than the target's window is refused before the target is loaded (:func:`check_buckets`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.schema import InputError, type_error

# recipe field -> (type, default; None = required)
RECIPE_FIELDS: dict[str, tuple[Any, Any]] = {
    "buckets": (list[int], None),        # target input lengths in tokens, e.g. [512, 1024, 2048, 4096, 7168]
    "prompts": (int, None),              # prompts per bucket
    "question": (str, None),             # appended after the documents
    "preamble": (str, ""),               # before the documents
    "separator": (str, "\n\n"),          # between two documents
    "strip_prefix": (str, ""),           # removed from the start of each source turn (e.g. "Summarize: ")
}
CORRECTION_ROUNDS = 8  # re-measurements of the rendered prompt before a bucket that cannot be hit exactly fails


class ContextError(InputError):
    """A context recipe or bucket that cannot be built; the message names the field or the limit."""


@dataclass(frozen=True)
class Recipe:
    """How a context suite's prompts are built (the ``context:`` block of its YAML; fields in the module docstring)."""

    buckets: tuple[int, ...]
    prompts: int
    question: str
    preamble: str = ""
    separator: str = "\n\n"
    strip_prefix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "buckets": list(self.buckets)}


def parse_recipe(raw: Any, where: str) -> Recipe:
    """A ``context:`` mapping -> :class:`Recipe`, every field checked; ``where`` prefixes errors.

    Example: {"buckets": [512, 1024], "prompts": 2, "question": "Q?"} -> Recipe((512, 1024), 2, "Q?").
    """
    if not isinstance(raw, dict):
        raise ContextError(f"{where}: context must be a mapping of {', '.join(RECIPE_FIELDS)}, got {raw!r:.80}")
    unknown = sorted(set(raw) - set(RECIPE_FIELDS))
    if unknown:
        raise ContextError(f"{where}: unknown context field(s) {', '.join(unknown)}; valid: {', '.join(RECIPE_FIELDS)}")
    values = {}
    for name, (kind, default) in RECIPE_FIELDS.items():
        if name not in raw:
            if default is None:
                raise ContextError(f"{where}: context.{name} is required")
            values[name] = default
            continue
        if type_error(raw[name], kind):
            raise ContextError(f"{where}: context.{name} must be {getattr(kind, '__name__', kind)}, "
                               f"got {raw[name]!r:.80}")
        values[name] = raw[name]
    values["buckets"] = check_bucket_list(values["buckets"], f"{where}: context.buckets")
    if values["prompts"] < 1:
        raise ContextError(f"{where}: context.prompts must be >= 1, got {values['prompts']}")
    return Recipe(**values)


def check_bucket_list(buckets: Sequence[int], where: str) -> tuple[int, ...]:
    """Buckets as a tuple: positive, distinct, increasing. Example: [512, 2048] -> (512, 2048); [2048, 512] raises."""
    if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets):
        raise ContextError(f"{where}: expected a non-empty list of positive token counts, got {list(buckets)}")
    if list(buckets) != sorted(set(buckets)):
        raise ContextError(f"{where}: buckets must be distinct and increasing, got {list(buckets)}")
    return tuple(buckets)


def check_buckets(buckets: Sequence[int], window: int | None, target: str) -> None:
    """Refuse a bucket longer than the target's window (its ``max_position_embeddings``), naming the limit; a
    bucket equal to the window leaves no room for an answer and is refused too. ``window`` None: not known, no check.
    Example: buckets (512, 9000), window 8192 -> ContextError "... 9000 ... 8192-position window ...".
    """
    if window is None:
        return
    over = [b for b in buckets if b >= window]
    if over:
        raise ContextError(f"context bucket(s) {', '.join(map(str, over))} do not fit target {target!r}'s "
                           f"{window}-position window (a bucket must be shorter, to leave room for the answer); "
                           f"use buckets below {window}")


def recipe_digest(source_sha256: str, recipe: Recipe) -> str:
    """The sha256 a context suite is known by: over its source file's digest and its recipe (canonical JSON)."""
    text = json.dumps({"source_sha256": source_sha256, "recipe": recipe.to_dict()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def with_buckets(recipe: Recipe, buckets: Sequence[int] | None) -> Recipe:
    """The recipe at ``buckets`` (a run's ``context_buckets``) instead of its own; unchanged for None."""
    if buckets is None:
        return recipe
    return dataclasses.replace(recipe, buckets=check_bucket_list(buckets, "run.context_buckets"))


def question_id(bucket: int, j: int) -> str:
    """The id of prompt ``j`` of ``bucket``. Example: (2048, 1) -> "2048-1"."""
    return f"{bucket}-{j}"


def first_document(j: int, prompts: int, documents: int) -> int:
    """Index of the first document of prompt ``j``: ``j * documents // prompts``. Example: (1, 4, 80) -> 20."""
    return j * documents // prompts


def build_prompt(documents: Sequence[str], start: int, bucket: int, recipe: Recipe,
                 encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                 measure: Callable[[str], int]) -> dict[str, Any]:
    """One prompt of ``bucket`` tokens as the target sees it: exactly, unless no cut of the documents re-tokenises
    to that length (a decoded cut that merges with its neighbour); then the longest one below it, whose exact length
    ``prompt_tokens`` says.

    ``encode``/``decode``: the tokenizer without special tokens; ``measure(text)``: the length of the rendered chat
    prompt whose user message is ``text``. Returns ``{"text", "prompt_tokens", "documents" (indices of the
    documents the prompt reads from), "cut_tokens" (tokens of the last of them the cut left out)}``. Raises
    :class:`ContextError` when the documents are too short for the bucket or the bucket is below the template and
    question's own length.
    """
    fixed = measure(recipe.preamble + recipe.question)
    if fixed >= bucket:
        raise ContextError(f"context bucket {bucket}: the chat template, preamble and question alone take {fixed} "
                           "tokens; use a longer bucket")
    # enough documents for the bucket (documents never shrink when tokenised, so their ids bound the length)
    used: list[int] = []
    ids: list[int] = []
    for k in range(len(documents)):
        used.append((start + k) % len(documents))
        ids = encode(recipe.separator.join(documents[i] for i in used))
        if len(ids) >= bucket - fixed + CORRECTION_ROUNDS:
            break
    n = min(bucket - fixed, len(ids))
    best: tuple[int, str, int] | None = None  # (tokens, text, document tokens) of the longest prompt <= bucket
    tried: set[int] = set()
    while n not in tried and len(tried) < CORRECTION_ROUNDS:
        tried.add(n)
        text = recipe.preamble + decode(ids[:n]) + recipe.question
        got = measure(text)
        if got <= bucket and (best is None or got > best[0]):
            best = (got, text, n)
        if got == bucket:
            break
        n = max(0, min(len(ids), n + bucket - got))
    if best is None:
        raise ContextError(f"context bucket {bucket}: no cut of the documents renders to {bucket} tokens or fewer")
    if best[0] < bucket and best[2] == len(ids):
        raise ContextError(f"context bucket {bucket}: the {len(documents)} documents give a prompt of {best[0]} "
                           f"tokens, not {bucket} (too little text in the source for this bucket)")
    kept = best[2]
    for m in range(1, len(used) + 1):  # the documents the cut reaches into, and what it left of the last one
        covered = len(encode(recipe.separator.join(documents[i] for i in used[:m])))
        if covered >= kept:
            return {"text": best[1], "prompt_tokens": best[0], "documents": used[:m], "cut_tokens": covered - kept}
    return {"text": best[1], "prompt_tokens": best[0], "documents": used, "cut_tokens": 0}


def context_fields(context: dict[str, Any] | None) -> dict[str, Any]:
    """The record fields of a context prompt (none for an ordinary question). Example: {"bucket": 512, "documents":
    ["241"], "cut_tokens": 300, ...} -> {"context_bucket": 512, "context_documents": ["241"],
    "context_cut_tokens": 300}."""
    if not context:
        return {}
    return {"context_bucket": context["bucket"], "context_documents": context["documents"],
            "context_cut_tokens": context["cut_tokens"]}
