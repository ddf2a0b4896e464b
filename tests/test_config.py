"""Run configuration: presets load, composition works, and every bad value names its field."""

import pytest

from harness.cli import build_parser
from harness.cli.run import config_from_args
from harness.run.config import (
    ConfigError,
    config_from_dict,
    load_preset_dict,
    preset_names,
)


def test_builtin_presets_validate():
    # a shipped preset that does not load would break `make demo`
    assert {"demo", "paper", "smoke"} <= set(preset_names())
    for name in preset_names():
        cfg = config_from_dict(load_preset_dict(name))
        assert cfg.methods and cfg.suites


def test_demo_preset_content():
    cfg = config_from_dict(load_preset_dict("demo"))
    assert cfg.target == "smollm2-135m"
    assert next(m.label for m in cfg.methods) == "vanilla"


def test_engines_vllm_preset_pairs_each_vllm_entry_with_its_harness_twin():
    # docs/results.md's harness-vs-vLLM table comes from this preset (docs/results.md); it validates without vLLM. A
    # referee key naming another entry would hold vLLM's ngram against the wrong draft (or against nothing), and a
    # harness eagle3 chain of other than 3 drafts (total_tokens counts the root) would not be vLLM's k = 3
    cfg = config_from_dict(load_preset_dict("engines_vllm"))
    by = {m.label: m for m in cfg.methods}
    assert [(m.label, m.referee) for m in cfg.methods if m.engine == "vllm"] == [
        ("vllm-vanilla", "vanilla"), ("vllm-ngram", "pld-k4"), ("vllm-eagle3", "eagle3-k3")]
    assert by["eagle3-k3"].options == {"total_tokens": 4, "depth": 3, "top_k": 1}
    ngram = {"num_draft_tokens": 4, "min_ngram": 2, "max_ngram": 3, "occurrence": "earliest"}
    assert by["vllm-ngram"].options == by["pld-k4"].options == ngram  # vLLM copies after the earliest match
    assert (cfg.limit, cfg.max_new_tokens, cfg.temperatures, cfg.interleave) == (3, 64, [0.0], True)


def test_engines_vllm_load_preset_sweeps_the_same_drafts_on_launched_servers():
    # docs/results.md's concurrency sweep comes from this preset: were an entry not on a launched vLLM server, its level
    # would measure the harness's loop (refused) or another server; were ngram's options not engines_vllm's, the
    # sweep's acceptance would not be the one-at-a-time table's; 16 distinct prompts x 3 levels fit MT-bench's 80
    cfg = config_from_dict(load_preset_dict("engines_vllm_load"))
    one_at_a_time = {m.label: m for m in config_from_dict(load_preset_dict("engines_vllm")).methods}
    assert cfg.engine == "openai" and [(m.label, m.engine or cfg.engine, m.engine_options) for m in cfg.methods] == [
        (label, "openai", {"launch": "vllm", "api": "completions"})
        for label in ("vllm-vanilla", "vllm-ngram", "vllm-eagle3")]
    by = {m.label: m for m in cfg.methods}
    assert by["vllm-ngram"].options == one_at_a_time["vllm-ngram"].options
    assert by["vllm-eagle3"].options == one_at_a_time["vllm-eagle3"].options == {"depth": 3}
    assert (cfg.load["concurrency"], cfg.load["num_prompts"], cfg.interleave) == ([1, 4, 16], 16, True)


@pytest.mark.parametrize("data, message", [
    ({"temperatures": [0, -1]}, r"run\.temperatures\[1\]: must be 0 \(greedy\) or a finite number >= 1e-05, got -1"),
    ({"limit": 0}, r"run\.limit: must be a positive integer"),
    # stratify without a limit would silently run every question of every task
    ({"stratify": True}, r"run\.stratify: counts `limit` per category; set a limit too"),
    ({"max_new_tokens": "many"}, r"run\.max_new_tokens: expected an integer"),
    ({"tempratures": [0]}, r"unknown field 'tempratures' \(did you mean 'temperatures'\?\)"),
    ({"methods": [{"name": "vanilla"}, "vanilla"]}, r"run\.methods: duplicate labels \['vanilla'\]"),
    ({"methods": [{"nme": "vanilla"}]}, r"run\.methods\[0\]: unknown key"),
    ({"score": "yes"}, r"run\.score: expected true or false"),
    # two suites of one name: the file's questions shared the built-in's keys and were skipped as done, and the
    # manifest kept one 'tiny' with the file's checksum, so every --resume refused ("suite 'tiny' changed")
    ({"suites": ["tiny", "other/tiny.jsonl"]},
     r"run\.suites: 'tiny' and 'other/tiny\.jsonl' are both suite 'tiny' \(a file is named after its stem\); "
     r"rename the file"),
])
def test_bad_values_name_the_field(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


def test_include_composes_and_later_keys_win(tmp_path):
    (tmp_path / "base.yaml").write_text("suites: [gsm8k]\nlimit: 5\nmax_new_tokens: 64\n")
    (tmp_path / "child.yaml").write_text("include: base.yaml\nlimit: 2\n")
    d = load_preset_dict(str(tmp_path / "child.yaml"))
    assert d == {"suites": ["gsm8k"], "limit": 2, "max_new_tokens": 64}


def test_cli_overrides_and_method_options():
    args = build_parser().parse_args(["run", "--preset", "demo", "--methods", "vanilla,pld", "--limit", "2",
                                      "--temperature", "0,0.7", "--opt", "pld.max_ngram=4", "--set", "repeats=2"])
    cfg = config_from_args(args)
    assert [m.label for m in cfg.methods] == ["vanilla", "pld"]
    assert cfg.methods[1].options == {"max_ngram": 4}
    assert cfg.limit == 2 and cfg.temperatures == [0.0, 0.7] and cfg.repeats == 2


def test_cli_option_for_unknown_label_fails():
    args = build_parser().parse_args(["run", "--methods", "vanilla", "--opt", "eagle2.depth=3"])
    with pytest.raises(ConfigError, match="LABEL one of \\['vanilla'\\]"):
        config_from_args(args)


def test_shipped_name_or_file_rule(tmp_path):
    """Presets, published tables and chat templates share one lookup: an existing file with the kind's suffix as it
    is, else a shipped name; a file with another suffix, or a missing one, is not taken for a shipped name."""
    from harness.run.shipped import find_shipped, shipped_names
    from harness.schema import did_you_mean

    folder = tmp_path / "shipped"
    folder.mkdir()
    (folder / "demo.yaml").write_text("a: 1\n")
    (folder / "paper.yaml").write_text("a: 2\n")
    mine = tmp_path / "mine.yml"
    mine.write_text("a: 3\n")
    (tmp_path / "notes.txt").write_text("x")
    assert shipped_names(folder, ".yaml") == ["demo", "paper"]
    assert find_shipped("demo", folder, (".yaml", ".yml")) == folder / "demo.yaml"
    assert find_shipped(str(mine), folder, (".yaml", ".yml")) == mine
    assert find_shipped(str(tmp_path / "notes.txt"), folder, (".yaml", ".yml")) is None
    assert find_shipped(str(tmp_path / "gone.yaml"), folder, (".yaml", ".yml")) is None
    assert find_shipped("dem", folder, (".yaml", ".yml")) is None
    assert did_you_mean("dem", ["demo", "paper"]) == " Did you mean 'demo'?"
    assert did_you_mean("zzz", ["demo", "paper"]) == ""


@pytest.mark.parametrize("data, message", [
    # every record an empty label writes is then rejected by the reader: the run measured nothing usable
    ({"methods": [{"name": "vanilla", "label": ""}]},
     "run.methods[0].label: must be a non-empty string (every record names its entry by it), got ''"),
    ({"methods": [{"name": "vanilla", "label": 7}]},
     "run.methods[0].label: must be a non-empty string (every record names its entry by it), got 7"),
    # a 100,000-character label stalled the plots' layout
    ({"methods": [{"name": "vanilla", "label": "x" * 100_000}]},
     "run.methods[0].label: at most 200 characters (it names table rows and plot bars), got 100,000"),
    ({"methods": [{"name": "vanilla", "label": "a\nb"}]},
     "run.methods[0].label: must not hold control characters (a table row holds one line), got 'a\\nb'"),
    # beyond int64: OverflowError writing the parquet tables, after the whole run
    ({"seeds": [0, 2**64]}, "run.seeds[1]: must fit a 64-bit integer (-9223372036854775808 .. 9223372036854775807), "
                            "got 18446744073709551616"),
    ({"max_new_tokens": 2**63}, "run.max_new_tokens: must fit a 64-bit integer (-9223372036854775808 .. "
                                "9223372036854775807), got 9223372036854775808"),
    # a method option goes into every record (method_options) and the tables' opt.* columns
    ({"methods": [{"name": "pld", "options": {"max_ngram": 2**70}}]},
     "run.methods[0].options.max_ngram: must fit a 64-bit integer, got 1180591620717411303424"),
])
def test_labels_and_integers_no_record_or_table_can_hold_are_refused(data, message):
    """Each was accepted and failed only later: an empty label's records were all rejected by the reader; a seed or
    count beyond 64 bits ended the run or the report in an OverflowError traceback."""
    with pytest.raises(ConfigError) as e:
        config_from_dict(data)
    assert str(e.value) == message


BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("text, problem", [
    ("methods: &m [vanilla, *m]\n", "an alias refers to a node that contains it (a self-reference)"),
    ("limit: " + "[" * 50_000 + "]" * 50_000 + "\n", "nested deeper than 100 levels"),
    (BILLION_LAUGHS, "more than 100,000 values once its aliases are expanded (an alias bomb?)"),
])
def test_a_hostile_preset_is_refused_in_one_line_before_anything_loads(tmp_path, text, problem):
    """A self-referencing preset and a 50,000-deep nested one ended in RecursionError tracebacks; a 1 KB preset of
    nested aliases (a "billion laughs") stands for 9^9 values and grew memory without end once copied. Each must be
    one ConfigError naming the file, raised while the YAML is read."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_preset_dict(str(path))
    assert str(e.value) == f"{path}: invalid YAML: {problem}"


def test_a_preset_that_is_a_fifo_or_folder_says_what_it_is(tmp_path):
    """A FIFO named as the preset blocked `draftbench run` for ever; a folder named x.yaml was "unknown preset (not a
    YAML file either)". Each must say what the path is."""
    import os

    os.mkfifo(tmp_path / "p.yaml")
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(ConfigError, match=r"preset '.*p\.yaml': a FIFO \(named pipe\), not a regular file"):
        load_preset_dict(str(tmp_path / "p.yaml"))
    with pytest.raises(ConfigError, match=r"preset '.*d\.yaml': a directory, not a regular file"):
        load_preset_dict(str(tmp_path / "d.yaml"))
