"""The method registry: names resolve, typos get suggestions, duplicates and non-methods are refused."""

import pytest

from harness.engine.method import Method, OptionsError
from harness.registry import (
    METHODS,
    Registry,
    UnknownNameError,
    get_method,
    method_names,
    register_method,
)


def test_builtin_methods_register_themselves():
    # if vanilla is missing, methods/ modules are not imported by load_builtin_methods
    assert "vanilla" in method_names()
    assert get_method("vanilla").name == "vanilla"


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


def test_method_base_generate_is_abstract():
    with pytest.raises(NotImplementedError):
        Method(target=None).generate(None, 1, None)


def test_entry_point_plugins_are_loaded(monkeypatch):
    # a package that declares `[project.entry-points."draftbench.methods"] x = "pkg.module"` must be found
    from importlib import metadata

    import harness.registry as registry

    ep = metadata.EntryPoint(name="plugin_test", value="tests.plugin_method", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry.metadata, "entry_points",
                        lambda group: [ep] if group == registry.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(registry, "_loaded", False)
    assert "plugin_test" in registry.method_names()
    assert registry.get_method("plugin_test").__name__ == "PluginMethod"
