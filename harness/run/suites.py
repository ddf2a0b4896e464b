"""Benchmark suites as data: one YAML definition per suite in a registered folder (the built-in ones in ``suites/``,
:func:`harness.registry.register_suite_dir`), questions in JSON lines, and the quality scorers they name.

A suite YAML has these fields (``SUITE_FIELDS``): ``name`` (= the file stem), ``version`` (a string; bump it on
any change that makes old results incomparable), ``description``, ``file`` (relative to ``$DRAFTBENCH_DATA``, or
to the definition's folder when ``bundled: true``), ``sha256``, ``records`` (expected count), ``source_url`` (raw
download URL), ``licence``, ``scorer`` (null or a registered scorer, :data:`harness.registry.SCORERS`), and optional
``system_prompt`` (null: the chat template's default), ``max_new_tokens`` (null: the run's default), ``bundled``,
``category_groups`` (group name ->
the file's categories recorded under that name, e.g. Spec-Bench's eight MT-bench categories as ``mt_bench``) and
``context`` (a recipe that builds the suite's prompts at input lengths from the file's documents, with the target's
tokenizer: :mod:`harness.run.context`; its questions are ``<bucket>-<j>`` and get their text from
:func:`build_context_suite` once the target is loaded).

``sha256: null`` says the upstream file has no published checksum yet: the first ``fetch_suite`` records the digest
of what it downloaded in ``<file>.sha256`` beside it, and every later load checks the file against that pin (a file
without a pin loads, and the run's manifest records its digest).

A questions file has one JSON object per line: ``{"question_id", "category", "turns": [...], "reference"?: ...}``;
``reference`` is a list (of strings, or of other JSON values such as Spec-Bench's RAG rows), a string or an object.

    suite = load_suite("mt_bench")                 # needs $DRAFTBENCH_DATA
    suite = load_suite("my_prompts.jsonl")         # a user file in the same format
    suite.select(limit=5).questions
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.measure.rundir import file_kind
from harness.registry import SCORERS, UnknownNameError, suite_dirs
from harness.run.context import (
    ContextError,
    Recipe,
    build_prompt,
    first_document,
    parse_recipe,
    question_id,
    recipe_digest,
    with_buckets,
)
from harness.schema import InputError, did_you_mean, json_lines, type_error, unknown_keys
from harness.yamlsafe import safe_load

DATA_ENV = "DRAFTBENCH_DATA"

REQUIRED_FIELDS = ("name", "version", "description", "file", "sha256", "records", "source_url", "licence", "scorer")
OPTIONAL_FIELDS = {"system_prompt": None, "max_new_tokens": None, "bundled": False, "category_groups": None,
                   "context": None}
PIN_SUFFIX = ".sha256"  # beside a data file whose definition has sha256: null (pinned on first fetch)
SUITE_FIELDS = REQUIRED_FIELDS + tuple(OPTIONAL_FIELDS)


class DataError(InputError):
    """A suite or data file problem: unknown suite, missing/corrupt/malformed file. The message is one clear line."""


@dataclass
class Question:
    """One prompt of a suite; ``turns`` are the user messages in order (MT-bench has two)."""

    question_id: str
    category: str | None
    turns: list[str]
    reference: list[Any] | None = None  # strings for the scored suites; other JSON values are kept as they are
    context: dict[str, Any] | None = None  # a context suite's prompt: bucket, documents, cut_tokens (run.context)


@dataclass
class Suite:
    """A loaded suite: its questions in file order plus how to run and score them."""

    name: str
    version: str
    questions: list[Question]
    scorer: str | None = None
    system_prompt: str | None = None
    max_new_tokens: int | None = None
    source: str = ""
    sha256: str | None = None
    context: Recipe | None = None  # a context suite's recipe (harness.run.context); its documents follow
    documents: list[tuple[str, str]] | None = None  # (source question_id, text) of a context suite's documents

    def select(self, limit: int | None = None, question_ids: list[str] | None = None,
               per_category: bool = False) -> Suite:
        """A copy with only ``question_ids`` (kept in file order), then only the first ``limit`` of those; in a
        context suite, the first ``limit`` of every bucket; with ``per_category``, the first ``limit`` of every
        category (after the suite's ``category_groups``: Spec-Bench's six tasks), so a short run covers each task.

        Example: questions q1, q2, q3; select(question_ids=["q3", "q1"]) -> [q1, q3]; select(limit=2) -> [q1, q2].
        Context suite with buckets 512, 1024 and prompts 512-0, 512-1, 1024-0, 1024-1: select(limit=1) -> 512-0,
        1024-0. Categories a, a, b, b, a (q1..q5): select(limit=1, per_category=True) -> [q1, q3].
        """
        questions = self.questions
        if question_ids is not None:
            wanted = [str(q) for q in question_ids]
            known = {q.question_id for q in questions}
            unknown = [q for q in wanted if q not in known]
            if unknown:
                examples = ", ".join(q.question_id for q in questions[:5])
                raise DataError(f"suite {self.name!r} has no question_id {', '.join(map(repr, unknown))}; "
                                f"valid ids look like: {examples} ({len(questions)} in all)")
            keep = set(wanted)
            questions = [q for q in questions if q.question_id in keep]
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise DataError(f"limit must be a positive integer or None, got {limit!r}")
            if self.context is not None:
                questions = [q for q in questions if q.context["prompt"] < limit]
            elif per_category:
                taken: dict[str | None, int] = {}
                kept = []
                for q in questions:
                    taken[q.category] = taken.get(q.category, 0) + 1
                    if taken[q.category] <= limit:
                        kept.append(q)
                questions = kept
            else:
                questions = questions[:limit]
        return dataclasses.replace(self, questions=list(questions))

    def __len__(self) -> int:
        return len(self.questions)


def suite_definitions() -> dict[str, Path]:
    """Suite name -> its YAML definition, over every registered folder (the first folder naming a suite wins)."""
    found: dict[str, Path] = {}
    for folder in suite_dirs():
        for path in sorted(folder.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def suite_names() -> list[str]:
    """The names of the registered suites, sorted."""
    return sorted(suite_definitions())


def suite_info(name: str) -> dict[str, Any]:
    """The validated fields of suite ``name`` (optional ones filled with their defaults) plus ``config_path``."""
    definitions = suite_definitions()
    names = sorted(definitions)
    if name not in names:
        raise DataError(f"unknown suite {name!r}.{did_you_mean(name, names, cutoff=0.5)} Known: {', '.join(names)} "
                        "(or pass a path to a .jsonl file)")
    path = definitions[name]
    with open(path, encoding="utf-8") as f:
        info = safe_load(f.read())
    return _validate_info(info, path)


def _validate_info(info: Any, path: Path) -> dict[str, Any]:
    if not isinstance(info, dict):
        raise DataError(f"{path}: expected a mapping of suite fields, got {type(info).__name__}")
    missing = [k for k in REQUIRED_FIELDS if k not in info]
    if missing:
        raise DataError(f"{path}: missing field(s) {', '.join(missing)}")
    unknown_keys(info, SUITE_FIELDS, str(path), "field", DataError, list_valid=True)
    info = {**OPTIONAL_FIELDS, **info, "config_path": str(path)}
    if info["name"] != path.stem:
        raise DataError(f"{path}: name {info['name']!r} must equal the file name {path.stem!r}")
    if not isinstance(info["version"], str):
        raise DataError(f"{path}: version must be a string (quote it: version: \"{info['version']}\")")
    if not isinstance(info["records"], int) or info["records"] < 1:
        raise DataError(f"{path}: records must be a positive integer, got {info['records']!r}")
    if info["max_new_tokens"] is not None and (not isinstance(info["max_new_tokens"], int)
                                               or info["max_new_tokens"] < 1):
        raise DataError(f"{path}: max_new_tokens must be null or a positive integer, got {info['max_new_tokens']!r}")
    sha = info["sha256"]
    if sha is not None and (not isinstance(sha, str) or len(sha) != 64
                            or any(c not in "0123456789abcdef" for c in sha)):
        raise DataError(f"{path}: sha256 must be 64 lowercase hex digits or null (pinned on first fetch), got {sha!r}")
    if info["context"] is not None:
        try:
            info["context"] = parse_recipe(info["context"], str(path))
        except ContextError as e:
            raise DataError(str(e)) from None
    groups = info["category_groups"]
    if type_error(groups, dict[str, list[str]] | None):
        raise DataError(f"{path}: category_groups must map a group name to a list of category names, "
                        f"got {groups!r:.80}")
    if info["scorer"] is not None and info["scorer"] not in SCORERS:
        raise DataError(f"{path}: scorer {info['scorer']!r} is not one of {', '.join(SCORERS.names())} (or null)")
    return info


def data_dir_from_env(data_dir: str | Path | None = None) -> Path:
    """``data_dir`` if given, else ``$DRAFTBENCH_DATA``; a clear error if neither is set."""
    if data_dir is None:
        value = os.environ.get(DATA_ENV)
        if not value:
            raise DataError(f"{DATA_ENV} is not set: point it at the folder holding the suite data "
                            f"(e.g. export {DATA_ENV}=/path/to/data), or pass data_dir")
        data_dir = value
    return Path(data_dir).expanduser()


def suite_path(info: dict[str, Any], data_dir: str | Path | None = None) -> Path:
    """Where the questions file of a suite lives (inside the package for bundled suites)."""
    if info["bundled"]:
        return Path(info["config_path"]).parent / info["file"]
    return data_dir_from_env(data_dir) / info["file"]


def is_suite_file(name_or_path: str | Path) -> bool:
    """Whether a ``suites`` entry names a user file (a path, or a name ending in ``.jsonl``) rather than a built-in
    suite."""
    text = str(name_or_path)
    return text.endswith(".jsonl") or os.sep in text or "/" in text


def suite_name_of(name_or_path: str | Path) -> str:
    """The name a ``suites`` entry's suite gets in records and tables: a built-in suite's own name, a user file's
    stem. Examples: "mt_bench" -> "mt_bench"; "prompts/tiny.jsonl" -> "tiny"."""
    return Path(str(name_or_path)).stem if is_suite_file(name_or_path) else str(name_or_path)


def duplicate_suite_names(entries: list[str]) -> str | None:
    """Why two ``suites`` entries cannot run together (records key questions by suite name, so the second suite's
    questions would be taken as done and skipped), or None. Example: ["tiny", "x/tiny.jsonl"] -> "'tiny' and
    'x/tiny.jsonl' are both suite 'tiny' (a file is named after its stem); rename the file"."""
    seen: dict[str, str] = {}
    for entry in entries:
        name = suite_name_of(entry)
        if name in seen:
            return (f"{seen[name]!r} and {entry!r} are both suite {name!r} (a file is named after its stem); "
                    "rename the file")
        seen[name] = str(entry)
    return None


def load_suite(name_or_path: str | Path, data_dir: str | Path | None = None,
               buckets: list[int] | None = None) -> Suite:
    """Load a built-in suite by name (checksum and record count verified) or a user ``.jsonl`` file by path.

    A user file becomes a suite named after its stem (:func:`suite_name_of`), version "user", no scorer, with its
    sha256 computed. A context suite (a ``context`` recipe) loads its documents and one question per bucket and
    prompt, without text until :func:`build_context_suite`; ``buckets`` (a run's ``context_buckets``) replaces the
    recipe's buckets, and its sha256 is :func:`harness.run.context.recipe_digest` of its file and recipe.
    """
    text = str(name_or_path)
    if is_suite_file(text):
        path = Path(text).expanduser()
        if not path.is_file():
            raise DataError(f"questions file {path} {not_a_file(path)}")
        digest = sha256_file(path)
        return Suite(name=suite_name_of(text), version="user", questions=read_questions(path),
                     source=str(path.resolve()),
                     sha256=digest)
    info = suite_info(text)
    path = suite_path(info, data_dir)
    if path.exists() and not path.is_file():
        raise DataError(f"suite {info['name']!r}: {path} {not_a_file(path)}")
    if not path.is_file():
        fetch = "" if info["bundled"] else f"; when online, `draftbench data fetch {info['name']}` downloads it"
        what = "document source" if info["context"] else "data file"
        raise DataError(f"suite {info['name']!r}: {what} {path} is missing; it comes from {info['source_url']}"
                        f"{fetch}")
    digest = sha256_file(path)
    expected, where = info["sha256"], "expected sha256"
    if expected is None:
        expected = pinned_sha256(path)
        where = f"pinned in {path.name}{PIN_SUFFIX} at its first fetch"
    if expected is not None and digest != expected:
        raise DataError(f"suite {info['name']!r}: checksum mismatch for {path}: {where} {expected}, "
                        f"got {digest} (corrupt or a different version; re-download from {info['source_url']})")
    questions = read_questions(path)
    if info["category_groups"]:
        group_of = {c: g for g, cats in info["category_groups"].items() for c in cats}
        questions = [dataclasses.replace(q, category=group_of.get(q.category, q.category)) for q in questions]
    if len(questions) != info["records"]:
        raise DataError(f"suite {info['name']!r}: {path} has {len(questions)} records, expected {info['records']}")
    if info["context"] is not None:
        return _context_suite(info, questions, str(path), digest, buckets)
    return Suite(name=info["name"], version=info["version"], questions=questions, scorer=info["scorer"],
                 system_prompt=info["system_prompt"], max_new_tokens=info["max_new_tokens"], source=str(path),
                 sha256=digest)


def _context_suite(info: dict[str, Any], sources: list[Question], path: str, digest: str,
                   buckets: list[int] | None) -> Suite:
    """A context suite's documents and its questions (``<bucket>-<j>``, no text yet) from its source records."""
    try:
        recipe = with_buckets(info["context"], buckets)
    except ContextError as e:
        raise DataError(str(e)) from None
    documents = [(q.question_id, q.turns[0].removeprefix(recipe.strip_prefix)) for q in sources]
    questions = [Question(question_id=question_id(b, j), category=None, turns=[],
                          context={"bucket": b, "prompt": j}) for b in recipe.buckets for j in range(recipe.prompts)]
    return Suite(name=info["name"], version=info["version"], questions=questions, scorer=info["scorer"],
                 system_prompt=info["system_prompt"], max_new_tokens=info["max_new_tokens"], source=path,
                 sha256=recipe_digest(digest, recipe), context=recipe, documents=documents)


def build_context_suite(suite: Suite, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                        measure: Callable[[str], int]) -> Suite:
    """A context suite with the text of its (selected) questions built by the target's tokenizer
    (:func:`harness.run.context.build_prompt`: ``encode``/``decode`` without special tokens, ``measure`` the rendered
    prompt's length); any other suite unchanged. A bucket that cannot be built raises :class:`DataError`."""
    if suite.context is None:
        return suite
    recipe, texts = suite.context, [text for _, text in suite.documents]
    questions = []
    for q in suite.questions:
        bucket, j = q.context["bucket"], q.context["prompt"]
        try:
            built = build_prompt(texts, first_document(j, recipe.prompts, len(texts)), bucket, recipe, encode, decode,
                                 measure)
        except ContextError as e:
            raise DataError(f"suite {suite.name!r}: {e}") from None
        context = {**q.context, "documents": [suite.documents[i][0] for i in built["documents"]],
                   "cut_tokens": built["cut_tokens"], "prompt_tokens": built["prompt_tokens"]}
        questions.append(dataclasses.replace(q, turns=[built["text"]], context=context))
    return dataclasses.replace(suite, questions=questions)


def not_a_file(path: Path) -> str:
    """Why ``path`` is no file to read, in words: "does not exist", or what it is instead ("is a FIFO (named pipe),
    not a regular file"; a FIFO would block the read, a directory fail it)."""
    if not path.exists():
        return "does not exist"
    return f"is {file_kind(path.stat().st_mode)}, not a regular file"


def pinned_sha256(path: str | Path) -> str | None:
    """The digest pinned beside ``path`` (``<file>.sha256``, written by the first fetch), or None."""
    pin = Path(str(path) + PIN_SUFFIX)
    if not pin.is_file():
        return None
    text = pin.read_text(encoding="utf-8").split()
    return text[0] if text else None


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_questions(path: str | Path) -> list[Question]:
    """Parse a questions file: JSON lines, or a Parquet table with the same columns (SPEED-Bench's format,
    :func:`parquet_records`). Blank lines (and a missing final newline) are fine, anything else malformed is not."""
    if Path(path).suffix == ".parquet":
        return _unique([(f"{path}:row {i}", parse_record(r, f"{path}:row {i}"))
                        for i, r in enumerate(parquet_records(path), start=1)], path)
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 ({e})") from e
    return _unique([(where, parse_record(record, where)) for where, record in json_lines(text, path, DataError)], path)


def _unique(parsed: list[tuple[str, Question]], path: str | Path) -> list[Question]:
    """The questions of ``parsed`` ((where, question) in file order); a repeated question_id or none at all fails."""
    seen: set[str] = set()
    for where, question in parsed:
        if question.question_id in seen:
            raise DataError(f"{where}: duplicate question_id {question.question_id!r}")
        seen.add(question.question_id)
    if not parsed:
        raise DataError(f"{path}: no records")
    return [q for _, q in parsed]


def parquet_records(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a Parquet questions table as records, e.g. SPEED-Bench's (arXiv:2604.09557; the
    ``nvidia/SPEED-Bench`` dataset: ``question_id``, ``category``, ``sub_category``, ``turns``, ``source``,
    ``src_id``, ``difficulty``, ``multiturn``); the columns besides ``question_id``, ``category`` and ``turns`` are
    not needed. A row whose turns are empty is a placeholder that SPEED-Bench's own preparation script fills from its
    sources (its throughput splits ship so): refused, naming it."""
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow's errors for a file that is not Parquet
        raise DataError(f"{path}: not a readable Parquet table ({type(e).__name__}: {e})") from e
    for i, row in enumerate(rows, start=1):
        turns = row.get("turns")
        if isinstance(turns, list) and (not turns or not all(isinstance(t, str) and t for t in turns)):
            raise DataError(f"{path}:row {i}: question {row.get('question_id')!r} has empty turns, a placeholder "
                            "left for SPEED-Bench's data preparation script to fill from its sources; run it first")
    return rows


def parse_record(record: Any, where: str) -> Question:
    """One JSON record -> :class:`Question`; ``where`` ("file:line") prefixes every error.

    Example: {"question_id": 81, "category": "writing", "turns": ["Hi"]} -> Question("81", "writing", ["Hi"], None).
    An empty category ("") becomes None. ``reference`` is kept as a list: a list as it is (Spec-Bench's RAG rows
    hold lists of answers), a string or an object as a one-element list.
    """
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "question_id" not in record:
        raise DataError(f"{where}: record has no 'question_id'")
    if "turns" not in record:
        raise DataError(f"{where}: record {record['question_id']!r} has no 'turns' (a list of user messages)")
    turns = record["turns"]
    if type_error(turns, list[str]) or not turns:
        raise DataError(f"{where}: 'turns' must be a non-empty list of strings, got {turns!r:.80}")
    reference = record.get("reference")
    if isinstance(reference, (str, dict)):
        reference = [reference]
    if reference is not None and not isinstance(reference, list):
        raise DataError(f"{where}: 'reference' must be a list, a string, an object or absent, got {reference!r:.80}")
    category = record.get("category")
    if category is not None and not isinstance(category, str):
        raise DataError(f"{where}: 'category' must be a string, got {category!r}")
    return Question(question_id=str(record["question_id"]), category=category or None, turns=list(turns),
                    reference=list(reference) if reference is not None else None)


def fetch_suite(name: str, data_dir: str | Path | None = None, url: str | None = None,
                timeout_s: float = 60) -> Path:
    """Download suite ``name`` from its ``source_url`` (or ``url``) into the data dir, verify it, return the path.

    A file already present with the right checksum is kept; a download with the wrong checksum is discarded and
    raises :class:`DataError`, leaving any existing file untouched. Bundled suites need no download. A definition
    with ``sha256: null`` accepts the first download and pins its digest in ``<file>.sha256``; later fetches must
    match that pin.
    """
    info = suite_info(name)
    if info["bundled"]:
        return suite_path(info)
    dest = suite_path(info, data_dir)
    expected = info["sha256"] or pinned_sha256(dest)
    if dest.is_file() and expected is not None and sha256_file(dest) == expected:
        return dest
    source = url or info["source_url"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(source, timeout=timeout_s) as response, open(part, "wb") as out:
            for block in iter(lambda: response.read(1 << 20), b""):
                h.update(block)
                out.write(block)
    except (urllib.error.URLError, OSError) as e:
        part.unlink(missing_ok=True)
        raise DataError(f"suite {name!r}: download from {source} failed: {e}") from e
    if expected is not None and h.hexdigest() != expected:
        part.unlink(missing_ok=True)
        raise DataError(f"suite {name!r}: download from {source} has sha256 {h.hexdigest()}, expected "
                        f"{expected}; not saved")
    os.replace(part, dest)
    if info["sha256"] is None:
        Path(str(dest) + PIN_SUFFIX).write_text(f"{h.hexdigest()}  {dest.name}\n", encoding="utf-8")
    return dest


def score(scorer_name: str | None, question: Question, answer_text: str) -> float | None:
    """Score ``answer_text`` (the model's final turn) for ``question`` with a registered scorer; None when the suite
    has no scorer.

    Example: score("gsm8k_exact_match", question, "... so she has 18 apples. #### 18") -> 1.0 (reference 18).
    """
    if scorer_name is None:
        return None
    try:
        scorer = SCORERS.get(scorer_name)
    except UnknownNameError as e:
        raise DataError(str(e)) from e
    return scorer(question, answer_text)
