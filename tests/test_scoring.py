"""suites.scoring: GSM8K answer extraction and HumanEval pass@1 through the sandbox."""

import os
from decimal import Decimal
from pathlib import Path

import pytest

from harness.run.suites import DataError, Question, load_suite, score
from suites.scoring import (
    build_humaneval_program,
    extract_code,
    extract_gsm8k_answer,
    find_humaneval_problem,
    gsm8k_reference,
    humaneval_problems,
    parse_number,
)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DRAFTBENCH_DATA") or REPO.parent / "shared" / "data")
needs_data = pytest.mark.skipif(not (SHARED_DATA / "eagle").is_dir(),
                                reason=f"shared evaluation data not found at {SHARED_DATA} (set DRAFTBENCH_DATA)")

GSM = Question("g1", "math", ["How many?"], ["5 + 13 = <<5+13=18>>18 apples\n#### 18"])


@pytest.mark.parametrize("text, expected", [
    ("She has 5 + 13 = 18 apples.\n#### 18", "18"),                    # GSM8K's own marker
    ("#### $1,080.", "1080"),                                           # dollars, thousands separator, final dot
    ("Step 1: 4 * 3 = 12\n#### 12\nThat took 3 steps.", "12"),         # marker wins over a later number
    ("So the answer is $18.00.", "18"),                                 # "answer is", decimals equal to integer
    ("The final answer is: -7", "-7"),                                  # negative
    ("Answer: **42**", "42"),                                           # markdown around the number
    ("Therefore \\boxed{25} is the total; checked 3 times.", "25"),     # boxed beats the later "3"
    ("\\boxed{\\$1,234}", "1234"),
    ("First 3 + 4 = 7, then 7 * 2 = 14 dollars.", "14"),               # fallback: last number
    ("It ran from 2019-2020", "2020"),                                  # a range is not a negative number
    ("The temperature fell to −3 degrees", "-3"),                       # Unicode minus sign
    ("I cannot tell.", None),
])
def test_extract_gsm8k_answer(text, expected):
    """Each format models actually produce must yield the intended number (or None when there is none)."""
    found = extract_gsm8k_answer(text)
    assert found == (Decimal(expected) if expected is not None else None)


@pytest.mark.parametrize("text, expected", [("1,080", "1080"), ("$18.00", "18"), ("-5.", "-5"), ("x", None)])
def test_parse_number(text, expected):
    """Separators, currency and a trailing full stop must not change the value."""
    assert parse_number(text) == (Decimal(expected) if expected else None)


def test_gsm8k_exact_match_scores():
    """18.00 equals 18; 17 does not; a missing number scores 0, never an exception."""
    assert score("gsm8k_exact_match", GSM, "... which makes 18.00 apples.") == 1.0
    assert score("gsm8k_exact_match", GSM, "The answer is 17.") == 0.0
    assert score("gsm8k_exact_match", GSM, "No idea.") == 0.0


def test_gsm8k_reference_needs_marker():
    """A GSM8K question without '#### N' cannot be scored; the error must name the question."""
    assert gsm8k_reference(GSM) == 18
    with pytest.raises(DataError, match="'bad'"):
        gsm8k_reference(Question("bad", "math", ["q"], ["no marker here"]))


def test_score_without_scorer_and_unknown_scorer():
    """Suites without a scorer give None; a misspelt scorer must not silently score nothing."""
    assert score(None, GSM, "18") is None
    with pytest.raises(DataError, match="Did you mean 'gsm8k_exact_match'"):
        score("gsm8k_exact", GSM, "18")


@pytest.mark.parametrize("answer, expected", [
    ("Here you go:\n```python\ndef f(x):\n    return x\n```\nHope it helps.", "def f(x):\n    return x\n"),
    ("```\nprint(1)\n```", "print(1)\n"),                                          # fence without language
    ("```text\nusage\n```\n```python\ndef f(): pass\n```", "def f(): pass\n"),     # prefer the python block
    ("```python\nimport os\n```\n```python\ndef f(x): return 2\n```", "def f(x): return 2\n"),  # defines entry
    ("```python\ndef f(x):\n    return x", "def f(x):\n    return x"),            # cut by the token budget
    ("    return x\n", "    return x\n"),                                         # raw body, no fence
])
def test_extract_code(answer, expected):
    """The code to test must be exactly the block the model meant, or correct answers score 0."""
    assert extract_code(answer, entry_point="f") == expected


def test_build_program_body_vs_full_definition():
    """A body completion is appended to the prompt; a full definition follows the prompt and replaces its stub."""
    problem = {"prompt": "import math\n\ndef f(x):\n    \"\"\"doc\"\"\"\n", "entry_point": "f",
               "test": "def check(c):\n    assert c(4) == 2.0\n"}
    body = build_humaneval_program(problem, "    return math.sqrt(x)\n")
    assert body.startswith(problem["prompt"] + "    return math.sqrt(x)\n") and body.endswith("check(f)\n")
    full = build_humaneval_program(problem, "def f(x):\n    return math.sqrt(x)\n")
    assert full.count("def f(x):") == 2 and full.index("return math.sqrt") > full.index('"""doc"""')


def test_humaneval_index_is_cached():
    """The 164-problem index is built once per process, not once per question."""
    assert len(humaneval_problems()) == 164 and humaneval_problems() is humaneval_problems()


@needs_data
def test_prompt_match_finds_all_80_humaneval_questions():
    """Every question must map to a distinct HumanEval problem despite the varying whitespace after the
    instruction (blank line, newline, or none at all)."""
    suite = load_suite("humaneval", data_dir=SHARED_DATA)
    task_ids = [find_humaneval_problem(q)["task_id"] for q in suite.questions]
    assert len(set(task_ids)) == 80 and all(t.startswith("HumanEval/") for t in task_ids)
    assert all(find_humaneval_problem(q)["canonical_solution"] == q.reference[0] for q in suite.questions)


@needs_data
def test_canonical_solutions_pass_and_wrong_completion_fails():
    """The reference solutions must score 1 (else the scorer is broken) and a wrong body must score 0."""
    suite = load_suite("humaneval", data_dir=SHARED_DATA).select(limit=3)
    for q in suite.questions:
        assert score("humaneval_pass_at_1", q, q.reference[0]) == 1.0, q.question_id
    first = suite.questions[0]  # below_threshold(l, t)
    assert score("humaneval_pass_at_1", first, "    return False\n") == 0.0


@needs_data
def test_fenced_full_function_answer_passes():
    """Chat models answer with the whole function in a ```python block; that must count as a pass."""
    q = load_suite("humaneval", data_dir=SHARED_DATA).questions[0]
    answer = ("Sure! Here is the completed function:\n\n```python\ndef below_threshold(l: list, t: int):\n"
              "    return all(x < t for x in l)\n```\n\nThis checks every element.")
    assert score("humaneval_pass_at_1", q, answer) == 1.0


def test_humaneval_unknown_prompt_is_a_clear_error():
    """A question that is not from HumanEval cannot be scored; say which one."""
    with pytest.raises(DataError, match="humaneval question 'x'.*matches no problem"):
        find_humaneval_problem(Question("x", "code", ["Complete the code I provided.\ndef nope():\n    pass\n"]))
