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
