"""The method registry: names resolve, typos get suggestions, duplicates and non-methods are refused."""

import sys

import pytest
import torch

from harness.engine.method import Method, OptionsError
from harness.engine.sampling import SamplingParams
from harness.registry import (
    METHODS,
    Registry,
    UnknownNameError,
    get_method,
    method_names,
    register_method,
)
from tests.support.helpers import tiny_target


def test_builtin_methods_register_themselves():
    # if vanilla is missing, methods/ modules are not imported by load_builtin_methods
    assert "vanilla" in method_names()
    assert get_method("vanilla").name == "vanilla"


# the methods this project ships (test modules register scripted methods of their own while pytest collects them)
SHIPPED = [n for n in method_names() if get_method(n).__module__.startswith("methods.")]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_method_has_a_one_line_summary(name):
    """``draftbench list`` prints the first line of a method's docstring: a summary wrapped over two lines (as a
    line-length rewrap once did to eagle2 and jakiro_star) would print cut mid-sentence."""
    cls = get_method(name)
    doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip()
    assert doc, f"{name} has no docstring to summarise it"
    first = doc.splitlines()[0]
    assert first.endswith((".", ")")), f"{name}: summary line is not a whole sentence: {first!r}"


def test_unknown_name_suggests_close_match():
    # a typo must produce a "did you mean" with the right name, not a bare KeyError
    with pytest.raises(UnknownNameError, match=r"unknown method 'vanila'\. Did you mean 'vanilla'"):
        get_method("vanila")


def test_unknown_name_lists_known_names():
    with pytest.raises(UnknownNameError, match="Known: .*vanilla"):
        get_method("zzzz")


def test_duplicate_name_is_refused():
    # two classes under one name would make results ambiguous
    reg = Registry("thing")

    @reg.register("a")
    class A: ...

    with pytest.raises(ValueError, match="'a' is already registered"):
        @reg.register("a")
        class B: ...


def test_register_method_requires_method_subclass():
    with pytest.raises(TypeError, match="must subclass harness.engine.method.Method"):
        register_method("not_a_method")(object)
    assert "not_a_method" not in METHODS


def test_bad_method_option_names_the_field():
    # vanilla has no options: an option given to it must fail and say which one
    with pytest.raises(OptionsError, match="method 'vanilla': unknown option 'depth'"):
        get_method("vanilla").create(target=None, options={"depth": 3})


def test_a_method_without_generate_says_what_to_implement():
    # the base class only states the contract: a subclass that implements nothing must fail naming the method and
    # what to implement, not return nothing or fail somewhere deeper
    class Bare(Method):
        name = "bare"

    with pytest.raises(NotImplementedError, match=r"method 'bare' \(.*Bare\) does not implement generate\(\); "
                                                  r"implement it, or subclass .*SpeculativeMethod"):
        Bare(target=None).generate(torch.tensor([[1]]), 1, SamplingParams())


def test_example_defaults_to_create_with_validated_options():
    # Method.example builds a method without files; for a method without learned parts it is create(): options
    # are validated by name and unset ones keep their defaults
    pld = get_method("pld").example(None, num_draft_tokens=4)
    assert (pld.options.num_draft_tokens, pld.options.max_ngram) == (4, 3)
    with pytest.raises(OptionsError, match="method 'vanilla': unknown option 'depth'"):
        get_method("vanilla").example(None, depth=3)


@pytest.mark.parametrize("name", ["eagle2", "eagle3", "jakiro", "jakiro_star", "medusa", "hydra", "sps"])
def test_example_draft_parts_are_seeded_and_leave_the_global_rng_alone(name):
    # the same seed gives the same random head, another seed another one, and the caller's random stream is
    # neither consumed nor reseeded (a test drawing random numbers after building a method is unaffected)
    target = tiny_target()

    shared = target.model.get_input_embeddings().weight

    def weights(method):
        module = getattr(method, "head", None) or getattr(method, "heads", None) or method.draft.model
        return torch.cat([p.flatten() for p in module.parameters() if p is not shared])

    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    a = get_method(name).example(target, seed=3)
    assert torch.equal(torch.rand(3), expected_draw)
    b, c = get_method(name).example(target, seed=3), get_method(name).example(target, seed=4)
    assert torch.equal(weights(a), weights(b)) and not torch.equal(weights(a), weights(c))


def test_entry_point_plugins_are_loaded(monkeypatch):
    # a package that declares `[project.entry-points."draftbench.methods"] x = "pkg.module"` must be found
    from importlib import metadata

    import harness.registry as registry

    ep = metadata.EntryPoint(name="plugin_test", value="tests.support.plugin_method", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry.metadata, "entry_points",
                        lambda group: [ep] if group == registry.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(registry, "_loaded", False)
    assert "plugin_test" in registry.method_names()
    assert registry.get_method("plugin_test").__name__ == "PluginMethod"
