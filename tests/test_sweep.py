"""Grid expansion of run configurations: ``sweep:`` in presets and ``--sweep LABEL.OPTION=v1,v2``."""

import pytest

from harness.cli import build_parser
from harness.cli.run import config_from_args
from harness.run.config import ConfigError, config_from_dict, load_preset_dict
from harness.run.sweep import parse_values, show_value

BASE = {"methods": ["vanilla", {"name": "jakiro", "options": {"total_tokens": 16, "depth": 3}}]}


def labels(cfg):
    return [m.label for m in cfg.methods]


def test_grid_expands_in_place_in_product_order_with_readable_labels():
    """Cartesian product, options in written order, values as listed, replacing the entry in place; the other
    options of the entry are kept. Another order would shuffle tables between runs."""
    cfg = config_from_dict({**BASE, "methods": [*BASE["methods"], "pld"],
                            "sweep": {"jakiro": {"mode": ["hybrid", "ar"], "top_k": [4, 8]}}})
    assert labels(cfg) == ["vanilla", "jakiro[mode=hybrid,top_k=4]", "jakiro[mode=hybrid,top_k=8]",
                           "jakiro[mode=ar,top_k=4]", "jakiro[mode=ar,top_k=8]", "pld"]
    assert cfg.methods[3].options == {"total_tokens": 16, "depth": 3, "mode": "ar", "top_k": 4}
    assert cfg.sweep_spec == [{"jakiro": {"mode": ["hybrid", "ar"], "top_k": [4, 8]}}]


def test_list_of_grids_is_a_union_without_repeats():
    """The paper's ablation is not a product: grids of one entry concatenate, a repeated combination once."""
    cfg = config_from_dict({**BASE, "sweep": [{"jakiro": {"mode": ["hybrid", "ar"]}},
                                              {"jakiro": {"mode": ["hybrid"], "contrastive": ["off"]}},
                                              {"jakiro": {"mode": ["ar"]}}]})
    assert labels(cfg) == ["vanilla", "jakiro[mode=hybrid]", "jakiro[mode=ar]", "jakiro[mode=hybrid,contrastive=off]"]


def test_labels_show_validated_values():
    """YAML reads `off` as false; the label must say what the method does (off), and a head path its folder."""
    cfg = config_from_dict({**BASE, "sweep": {"jakiro": {"contrastive": [False, "on"]}}})
    assert labels(cfg)[1:] == ["jakiro[contrastive=off]", "jakiro[contrastive=on]"]
    assert show_value("work/experts/num_experts=2/head") == "num_experts=2"
    assert show_value(0.5) == "0.5" and show_value([[0], [0, 1]]) == "[[0],[0,1]]"
    assert parse_values("hybrid, ar") == ["hybrid", "ar"] and parse_values("8,16") == [8, 16]
    assert parse_values("off") == ["off"] and parse_values("[0.5, 0]") == [0.5, 0]


@pytest.mark.parametrize("sweep, message", [
    ({"jakiro": {"mode": ["hybrid", "hybird"]}}, r"run\.sweep\.jakiro\.mode=hybird: mode must be one of hybrid"),
    ({"jakiro": {"top_kk": [4]}}, r"run\.sweep\.jakiro\.top_kk=4: unknown option 'top_kk' \(did you mean 'top_k'\?\)"),
    ({"jakiro": {"depth": [0]}}, r"run\.sweep\.jakiro\.depth=0: depth must be >= 1"),
    ({"nosuch": {"x": [1]}}, r"run\.sweep\.nosuch: no method entry is labelled 'nosuch'"),
    ({"jakiro": {"mode": []}}, r"run\.sweep\.jakiro\.mode: no values"),
    ({"jakiro": ["mode"]}, r"run\.sweep\.jakiro: expected a mapping option"),
    ([{"jakiro": {"mode": ["ar"]}}, {"jakiro": {"depth": [-1]}}], r"run\.sweep\[1\]\.jakiro\.depth=-1"),
])
def test_bad_sweep_fails_naming_the_option(sweep, message):
    """A bad value must fail at configuration time with one line naming the sweep field, not mid-run."""
    with pytest.raises(ConfigError, match=message):
        config_from_dict({**BASE, "sweep": sweep})


def test_command_line_sweep_and_merge_with_a_preset():
    """--sweep flags of one label form one grid; a method named but not listed is added; a flag replaces the
    preset's values of that option."""
    args = build_parser().parse_args(["run", "--methods", "vanilla", "--sweep", "jakiro.mode=hybrid,ar,parallel",
                                      "--sweep", "jakiro.total_tokens=8,16"])
    cfg = config_from_args(args)
    assert len(cfg.methods) == 7 and labels(cfg)[1] == "jakiro[mode=hybrid,total_tokens=8]"
    assert labels(cfg)[-1] == "jakiro[mode=parallel,total_tokens=16]"
    args = build_parser().parse_args(["run", "--preset", "jakiro_ablation", "--sweep", "jakiro.mode=ar"])
    preset = config_from_args(args)
    assert "jakiro[mode=ar]" in labels(preset) and "jakiro[mode=hybrid]" not in labels(preset)
    with pytest.raises(ValueError, match=r"--sweep .jakiro\.mode.: expected LABEL\.OPTION=V1,V2"):
        config_from_args(build_parser().parse_args(["run", "--sweep", "jakiro.mode"]))


def test_expanded_config_round_trips_through_the_manifest():
    """Resume rebuilds the config from manifest.json; it must not expand the sweep a second time (duplicate
    labels) and must keep the digest (else --resume would refuse the run)."""
    cfg = config_from_dict({**BASE, "sweep": {"jakiro": {"mode": ["hybrid", "ar"]}}})
    again = config_from_dict(cfg.to_dict())
    assert labels(again) == labels(cfg) and again.digest() == cfg.digest()


def test_shipped_ablation_presets():
    """jakiro_ablation keeps working by name; the paper layout has Table 4's rows (N = 2..5 with K = 2, without
    parallel decoding, without contrast, without both)."""
    cfg = config_from_dict(load_preset_dict("jakiro_ablation"))
    assert labels(cfg)[0] == "vanilla" and "jakiro[mode=ar]" in labels(cfg)
    paper = config_from_dict(load_preset_dict("jakiro_paper_ablation"))
    assert labels(paper) == ["vanilla", "jakiro[num_experts=2]", "jakiro[num_experts=3]", "jakiro[num_experts=4]",
                             "jakiro[num_experts=5]", "jakiro[mode=ar]", "jakiro[contrastive=off]",
                             "jakiro[contrast_weight=0,mode=ar]"]
    opts = {m.label: m.options for m in paper.methods}
    assert opts["jakiro[mode=ar]"]["head"].endswith("num_experts=2/head")
    assert opts["jakiro[contrastive=off]"]["mode"] == "hybrid"


def test_sweep_keeps_the_entrys_engine_and_sweeps_engine_options():
    """An expanded entry runs where its entry ran (engine, runtime, engine options); before, a sweep dropped them and
    `vllm-eagle3[depth=2]` silently ran on the harness. `engine_options.<path>` sweeps a key of what the entry passes
    to its engine (vLLM's num_speculative_tokens for eagle1 and medusa, which have no method option for it)."""
    eagle3 = {"name": "eagle3", "label": "v-eagle3", "engine": "vllm", "engine_options": {"max_model_len": 1024}}
    cfg = config_from_dict({"methods": ["vanilla", eagle3], "sweep": {"v-eagle3": {"depth": [2, 3]}}})
    assert [(m.label, m.engine, m.engine_options, m.options) for m in cfg.methods[1:]] == [
        ("v-eagle3[depth=2]", "vllm", {"max_model_len": 1024}, {"depth": 2}),
        ("v-eagle3[depth=3]", "vllm", {"max_model_len": 1024}, {"depth": 3})]
    medusa = {"name": "medusa", "label": "v-medusa", "engine": "vllm"}
    cfg = config_from_dict({"methods": [medusa], "engine_options": {"speculative_config": {"method": "medusa"}},
                            "sweep": {"v-medusa": {"engine_options": {"speculative_config": {
                                "num_speculative_tokens": [1, 2]}}}}})
    assert [(m.label, m.options, m.engine_options) for m in cfg.methods] == [
        ("v-medusa[num_speculative_tokens=1]", {}, {"speculative_config": {"method": "medusa",
                                                                            "num_speculative_tokens": 1}}),
        ("v-medusa[num_speculative_tokens=2]", {}, {"speculative_config": {"method": "medusa",
                                                                            "num_speculative_tokens": 2}})]
    assert cfg.sweep_spec == [{"v-medusa": {"engine_options.speculative_config.num_speculative_tokens": [1, 2]}}]
    assert cfg.engine_options == {"speculative_config": {"method": "medusa"}}  # the run's own is not changed
    args = build_parser().parse_args(["run", "--methods", "vanilla", "--engine", "vllm", "--sweep",
                                      "vanilla.engine_options.speculative_config.num_speculative_tokens=3,4"])
    assert [(m.label, m.engine_options) for m in config_from_args(args).methods] == [
        ("vanilla[num_speculative_tokens=3]", {"speculative_config": {"num_speculative_tokens": 3}}),
        ("vanilla[num_speculative_tokens=4]", {"speculative_config": {"num_speculative_tokens": 4}})]
    with pytest.raises(ConfigError, match=r"run\.sweep\.pld: sweeps engine_options, but entry 'pld' runs on the "
                                          r"harness engine"):
        config_from_dict({"methods": ["pld"], "sweep": {"pld": {"engine_options.x": [1]}}})
    with pytest.raises(ConfigError, match=r"run\.sweep\.v-medusa\.engine_options\.speculative_config\.k: "
                                          r"speculative_config is 'medusa', not a mapping"):
        config_from_dict({"methods": [{**medusa, "engine_options": {"speculative_config": "medusa"}}],
                          "sweep": {"v-medusa": {"engine_options.speculative_config.k": [1]}}})
