"""Context-length buckets (issue #23, item 1): prompts built at exact input lengths from real documents, the recipe
parsed and hashed, buckets refused past the target's window, and the records that say what was built."""

import json
from types import SimpleNamespace

import pytest
import torch

from harness import registry
from harness.backends.contract import Backend, EnginePlan, EngineTurn
from harness.measure.records import read_records
from harness.run import entries as entries_module
from harness.run.config import ConfigError, MethodSpec, RunConfig
from harness.run.context import (
    ContextError,
    Recipe,
    build_prompt,
    check_buckets,
    parse_recipe,
    recipe_digest,
)
from harness.run.entries import engine_positions, token_budget
from harness.run.runner import run
from harness.run.suites import DataError, build_context_suite, load_suite
from methods.eagle.checkpoint import save_eagle_head
from methods.eagle.head import EagleHead
from tests.support.helpers import tiny_target

DOCS = ["Alpha one.", "Bravo two.", "Charlie three."]
RECIPE = Recipe(buckets=(40,), prompts=1, question="\nQ?", preamble="Docs:\n", separator=" | ")
TEMPLATE = 19  # tokens the character tokenizer's ChatML template adds around one user message (see tiny_target)


def encode(text):
    return [ord(c) for c in text]


def decode(ids):
    return "".join(chr(i) for i in ids)


def measure(text):
    return TEMPLATE + len(text)


def test_prompt_is_cut_to_exactly_the_bucket():
    """28 tokens are fixed (template 19 + preamble and question 9), so 12 document tokens fit; two documents are read
    (23 tokens) and 11 are cut. A prompt off by one token would put it in the wrong bucket."""
    built = build_prompt(DOCS, 0, 40, RECIPE, encode, decode, measure)
    assert built == {"text": "Docs:\nAlpha one. |\nQ?", "prompt_tokens": 40, "documents": [0, 1], "cut_tokens": 11}


def test_prompt_starts_at_its_document_and_wraps_around():
    """Prompt j reads from its own first document on, wrapping to the first; otherwise two prompts would be one."""
    built = build_prompt(DOCS, 2, 50, RECIPE, encode, decode, measure)
    assert built["text"] == "Docs:\nCharlie three. | Alpha\nQ?" and built["documents"] == [2, 0]


def test_retokenisation_is_corrected_to_the_exact_length():
    """A tokenizer whose decoded cut re-tokenises longer (here "." counts twice when measured) must still land on the
    bucket: n is corrected by the difference (12 document tokens measure 41, 11 measure 40)."""
    def measure_dot_twice(text):
        return TEMPLATE + len(text) + text.count(".")
    built = build_prompt(DOCS, 0, 40, RECIPE, encode, decode, measure_dot_twice)
    assert built["prompt_tokens"] == 40 and built["text"] == "Docs:\nAlpha one. \nQ?"


def test_a_bucket_no_cut_can_hit_keeps_the_longest_below_it():
    """When 12 document tokens measure 41 and 11 measure 39 ("|" counts twice), the prompt is 39 tokens and says
    so, rather than 41 (past the bucket) or a failure."""
    def measure_pipe_twice(text):
        return TEMPLATE + len(text) + text.count("|")
    built = build_prompt(DOCS, 0, 40, RECIPE, encode, decode, measure_pipe_twice)
    assert (built["prompt_tokens"], built["text"], built["cut_tokens"]) == (39, "Docs:\nAlpha one. \nQ?", 12)


def test_too_little_text_is_refused():
    """A bucket the documents cannot fill must fail, not give a shorter prompt labelled with the bucket."""
    with pytest.raises(ContextError, match="bucket 200: the 3 documents give a prompt of 68 tokens"):
        build_prompt(DOCS, 0, 200, RECIPE, encode, decode, measure)
    with pytest.raises(ContextError, match="alone take 28 tokens"):
        build_prompt(DOCS, 0, 28, RECIPE, encode, decode, measure)


def test_bucket_past_the_window_is_refused_naming_the_limit():
    """The issue's bad input: a 9000-token bucket on an 8192-position model fails before anything runs."""
    with pytest.raises(ContextError, match="9000 do not fit target 'm''s 8192-position window"):
        check_buckets((512, 9000), 8192, "m")
    check_buckets((512, 8191), 8192, "m")  # the longest that leaves one position for the answer


def test_recipe_fields_are_checked():
    """Misspelt or unsorted recipe fields would build another suite than the one named."""
    assert parse_recipe({"buckets": [512, 1024], "prompts": 2, "question": "Q?"}, "x.yaml") == \
        Recipe((512, 1024), 2, "Q?")
    with pytest.raises(ContextError, match="x.yaml: unknown context field"):
        parse_recipe({"buckets": [512], "prompts": 1, "question": "Q", "bukets": 1}, "x.yaml")
    with pytest.raises(ContextError, match="distinct and increasing"):
        parse_recipe({"buckets": [1024, 512], "prompts": 1, "question": "Q"}, "x.yaml")
    with pytest.raises(ContextError, match="context.question is required"):
        parse_recipe({"buckets": [512], "prompts": 1}, "x.yaml")


def test_digest_covers_source_and_recipe():
    """Changing the source file or any recipe field must change the suite's sha256 (a resumed run checks it)."""
    a = recipe_digest("0" * 64, RECIPE)
    assert a != recipe_digest("1" * 64, RECIPE)
    assert a != recipe_digest("0" * 64, Recipe((41,), 1, "\nQ?", "Docs:\n", " | "))
    assert a == recipe_digest("0" * 64, Recipe((40,), 1, "\nQ?", "Docs:\n", " | "))


@pytest.fixture()
def context_suite(tmp_path, monkeypatch):
    """A suite ``ctx`` in a registered folder: six documents of 200 characters, buckets 64 and 128, two prompts."""
    folder = tmp_path / "defs"
    folder.mkdir()
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"question_id": 100 + i, "category": "news",
                                        "turns": [f"Summarize: {chr(65 + i) * 199}."]}) + "\n" for i in range(6)))
    from harness.run.suites import sha256_file

    (folder / "ctx.yaml").write_text(f"""name: ctx
version: "1"
description: test
file: {docs}
sha256: {sha256_file(docs)}
records: 6
source_url: null
licence: test
scorer: null
context:
  buckets: [64, 128]
  prompts: 2
  strip_prefix: "Summarize: "
  question: "\\nWhich letters?"
""")
    monkeypatch.setattr(registry, "_SUITE_DIRS", [*registry.suite_dirs(), folder])
    monkeypatch.setenv("DRAFTBENCH_DATA", str(tmp_path))
    return docs


def test_context_suite_selects_per_bucket(context_suite):
    """limit applies per bucket: limit=1 keeps the first prompt of each length, not the 64-token bucket only."""
    suite = load_suite("ctx")
    assert [q.question_id for q in suite.questions] == ["64-0", "64-1", "128-0", "128-1"]
    assert [q.question_id for q in suite.select(1).questions] == ["64-0", "128-0"]
    assert [q.question_id for q in load_suite("ctx", buckets=[128]).questions] == ["128-0", "128-1"]
    assert load_suite("ctx").sha256 != load_suite("ctx", buckets=[128]).sha256


def test_context_suite_built_with_the_targets_tokenizer(context_suite):
    """Every prompt is exactly its bucket long once rendered, and says which documents it read and what was cut."""
    target = tiny_target()
    tok = target.tokenizer
    suite = build_context_suite(load_suite("ctx"), lambda t: tok(t, add_special_tokens=False)["input_ids"],
                                tok.decode,
                                lambda t: target.render_chat([{"role": "user", "content": t}]).shape[1])
    q = suite.questions[1]  # 64-1: starts at document 6 * 1 // 2 = 3 ("D..."), 64 - 19 - 15 = 30 characters of it
    assert q.turns == ["D" * 30 + "\nWhich letters?"]
    assert q.context == {"bucket": 64, "prompt": 1, "documents": ["103"], "cut_tokens": 170, "prompt_tokens": 64}
    assert [x.context["prompt_tokens"] for x in suite.questions] == [64, 64, 128, 128]


def test_run_records_buckets_and_refuses_a_bucket_past_the_window(context_suite, tmp_path):
    """The records carry the bucket, the exact prompt length, the documents, the cut and the KV cache sizes (the
    target's, the draft head's within its window); a bucket past the tiny model's 1024 positions fails as a
    configuration error, before any run directory is made."""
    target = tiny_target(eos=False)
    save_eagle_head(EagleHead.for_target(target), tmp_path / "eagle", dtype=torch.float32)
    eagle = MethodSpec("eagle1", options={"head": str(tmp_path / "eagle"), "tree": [[0], [0, 0]], "draft_window": 100})
    cfg = RunConfig(target="tiny-llama", device="cpu", suites=["ctx"], max_new_tokens=3, warmup=0,
                    methods=[MethodSpec("vanilla"), eagle], output_dir=str(tmp_path / "out"))
    run_dir = run(cfg, target=target, progress=False)
    recs = [r for r in read_records(run_dir) if r["label"] == "vanilla"]
    assert [(r["context_bucket"], r["prompt_tokens"], r["context_documents"]) for r in recs] == \
        [(64, 64, ["100"]), (64, 64, ["103"]), (128, 128, ["100"]), (128, 128, ["103"])]
    # 2 (K, V) x 2 layers x 2 kv heads x head_dim 8 x (64 + 3 positions) x 4 bytes
    assert recs[0]["kv_cache_bytes"] == 2 * 2 * 2 * 8 * 67 * 4
    # the draft head's own: 2 x its 1 layer x 2 kv heads x 8 x positions x 4, within its 100-position window; vanilla
    # keeps none
    heads = [r for r in read_records(run_dir) if r["label"] == "eagle1"]
    assert [r["draft_kv_bytes"] for r in heads] == [2 * 1 * 2 * 8 * 67 * 4] * 2 + [2 * 1 * 2 * 8 * 100 * 4] * 2
    assert [r["kv_cache_bytes"] for r in heads] == [2 * 2 * 2 * 8 * 67 * 4] * 2 + [2 * 2 * 2 * 8 * 131 * 4] * 2
    assert all(r["draft_kv_bytes"] is None for r in recs)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["suites"]["ctx"]["context"]["prompts"]["128-1"]["documents"] == ["103"]
    with pytest.raises(ConfigError, match="2048 do not fit target 'tiny-llama''s 1024-position window"):
        run(RunConfig(target="tiny-llama", device="cpu", suites=["ctx"], context_buckets=[64, 2048],
                      output_dir=str(tmp_path / "out2")), target=target, progress=False)
    assert not (tmp_path / "out2").exists() or not any((tmp_path / "out2").iterdir())


def test_an_answer_cut_by_the_window_says_so(context_suite, tmp_path):
    """A 1000-token prompt leaves 24 of the tiny model's 1024 positions: the 30-token budget is cut to 24 and the
    record says so (nothing is cut silently). The prompt reads five documents (966 characters of 200 + separators)."""
    cfg = RunConfig(target="tiny-llama", device="cpu", suites=["ctx"], context_buckets=[1000], limit=1,
                    max_new_tokens=30, warmup=0, output_dir=str(tmp_path / "out"))
    (rec,) = read_records(run(cfg, target=tiny_target(eos=False), progress=False))
    assert (rec["prompt_tokens"], rec["new_tokens"], rec["max_new_tokens_cut_to"]) == (1000, 24, 24)
    assert rec["context_documents"] == ["100", "101", "102", "103", "104"] and rec["context_cut_tokens"] == 42


def test_one_function_owns_a_turns_budget_and_its_cut_to_the_window():
    """token_budget is the one rule for every door (measured turns, the warm-up, load levels, an engine's reserved
    context): the suite's own budget over the run's, the warm-up's 64 at most, cut so that prompt + answer fit the
    window, and no room at all is an error, never a budget of 0 or less."""
    assert token_budget(512, None) == 512 and token_budget(512, 128) == 128  # the suite's own wins
    assert token_budget(512, None, warm_up=True) == 64 and token_budget(512, 32, warm_up=True) == 32
    assert token_budget(512, None, 1800, 2048) == 248  # cut to the window
    assert token_budget(512, None, 1800, None) == 512  # no known window: nothing to cut to
    assert token_budget(30, None, 1000, 1024, warm_up=True) == 24  # the warm-up is cut as well
    with pytest.raises(ValueError, match="prompt of 2048 tokens leaves no room in the model's 2048-token context"):
        token_budget(512, None, 2048, 2048)


def test_missing_document_source_is_one_line(context_suite):
    """A missing source file is one line naming it, not a traceback from the tokenizer."""
    context_suite.unlink()
    with pytest.raises(DataError) as e:
        load_suite("ctx")
    assert "document source" in str(e.value) and "\n" not in str(e.value)


def test_run_config_refuses_bad_buckets():
    """context_buckets is checked with the config, and left out of its digest when unset (old digests hold)."""
    with pytest.raises(ConfigError, match="distinct and increasing"):
        RunConfig(context_buckets=[2048, 512])
    assert "context_buckets" not in RunConfig().to_dict()


def test_an_engine_gets_the_runs_context_and_its_caches_are_na(context_suite, tmp_path, monkeypatch):
    """An entry on another engine: the engine is started with room for the longest bucket and the answer (vLLM's
    worker defaults to 2048 positions and would refuse a 2048-token bucket's prompt and answer), and its records
    carry the bucket with ``kv_cache_bytes`` and ``draft_kv_bytes`` null (n/a: the engine's caches are its own), not
    the harness's figures and never 0; ``prefill_time_s`` is the engine's time to the first token."""
    def suite(buckets, own=None):
        return SimpleNamespace(context=None if buckets is None else Recipe(tuple(buckets), 1, "Q?"),
                               max_new_tokens=own)

    assert engine_positions([suite([512, 2048])], 64, 8192) == 2112
    assert engine_positions([suite([7168])], 2048, 8192) == 8192  # the runner cuts the answer to the window anyway
    assert engine_positions([suite([64, 128])], 3, None) == 131
    assert engine_positions([suite([128]), suite([64], own=80)], 3, None) == 144  # a suite's own budget counts
    assert engine_positions([suite(None)], 3, 8192) is None  # no context suite: the engine's own default
    started = []

    class Fixed(Backend):
        name = "vllm"

        def generate(self, request):
            return EngineTurn(token_ids=[5, 6, 7], wall_time_s=0.5, ttft_s=0.25, stop_reason="length")

        def describe(self):
            return {"engine": "vllm", "version": "0-fixed"}

        def close(self):
            pass

    def create(plan, path, dtype, positions, window, vocab):
        started.append((plan.engine, positions, window))
        return Fixed()

    def plan(engine, method, options, given, target, engine_options):  # no vLLM needed to plan this test's entry
        return EnginePlan(engine, method, options, frozenset(given), target, dict(engine_options or {}))

    monkeypatch.setattr(entries_module, "check_engine", plan)
    monkeypatch.setattr(entries_module, "create_backend", create)
    cfg = RunConfig(target="tiny-llama", device="cpu", suites=["ctx"], max_new_tokens=3, warmup=0,
                    methods=[MethodSpec("vanilla"), MethodSpec("vanilla", label="engine", engine="vllm")],
                    output_dir=str(tmp_path / "out"))
    recs = [r for r in read_records(run(cfg, target=tiny_target(eos=False), progress=False)) if r["label"] == "engine"]
    # the longest bucket 128 + 3, and the target's 1024-position window (vLLM's drafter room is capped by it)
    assert started == [("vllm", 131, 1024)]  # only the entry another engine runs starts one
    assert [(r["context_bucket"], r["prompt_tokens"], r["prefill_time_s"]) for r in recs] == \
        [(64, 64, 0.25), (64, 64, 0.25), (128, 128, 0.25), (128, 128, 0.25)]
    assert all(r["kv_cache_bytes"] is None and r["draft_kv_bytes"] is None for r in recs)
    assert all("kv_cache_bytes" in r and "draft_kv_bytes" in r for r in recs)
