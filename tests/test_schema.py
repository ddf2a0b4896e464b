"""The one validator of plain data (harness.schema): every annotation kind accepted and refused with its exact
message, the path of the bad element, unknown keys with their closest name, and the one error base the command line
catches. A failure here means an option, a configuration or a table would be accepted with the wrong type (and fail
later, far from the field) or refused with a message that no longer names the field."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

import pytest

from harness.engine.method import OptionsError, build_options
from harness.published.tables import TableError
from harness.run.config import ConfigError
from harness.run.suites import DataError
from harness.run.sweep import SweepError
from harness.schema import Bound, InputError, NonEmpty, check, expected, field_types, type_error, unknown_keys


@pytest.mark.parametrize("value, annotation", [
    (3, int), (2.5, float), (3, float), (True, bool), ("x", str), (None, type(None)), (None, Optional[int]),  # noqa: UP045
    (4, int | None), ("b", Literal["a", "b"]), ([1, 2], list[int]), ([], list[int]), ((1.0, 2), tuple[float, ...]),
    ({"a": 1}, dict[str, int]), ({"a": 1}, dict), ([1, "x"], list), (object(), Any), ("x", str | list),
    ([1], str | list), (math.inf, float),
])
def test_values_that_fit_their_annotation_pass(value, annotation):
    assert type_error(value, annotation) is None
    assert check(value, annotation, "f") is value


@pytest.mark.parametrize("value, annotation, message", [
    ("x", int, "eagle2.total_tokens: expected an integer, got 'x'"),
    (True, int, "eagle2.total_tokens: expected an integer, got True"),  # a YAML boolean is no count
    ("1.5", float, "eagle2.total_tokens: expected a number, got '1.5'"),
    (1, bool, "eagle2.total_tokens: expected true or false, got 1"),
    (7, str, "eagle2.total_tokens: expected a string, got 7"),
    (None, int, "eagle2.total_tokens: expected an integer, got None"),
    ("x", Optional[int], "eagle2.total_tokens: expected an integer or null, got 'x'"),  # noqa: UP045
    ("c", Literal["a", "b"], "eagle2.total_tokens: expected one of 'a', 'b', got 'c'"),
    (3, list[int], "eagle2.total_tokens: expected a list, got 3"),
    ([1, "a"], list[int], "eagle2.total_tokens[1]: expected an integer, got 'a'"),
    ([0, "x"], list[float] | None, "eagle2.total_tokens[1]: expected a number, got 'x'"),
    ({"a": "x"}, dict[str, int], "eagle2.total_tokens.a: expected an integer, got 'x'"),
    ([1], dict[str, int], "eagle2.total_tokens: expected a mapping, got [1]"),
    (5, str | list, "eagle2.total_tokens: expected a string or a list, got 5"),
])
def test_values_that_do_not_fit_are_refused_naming_the_field(value, annotation, message):
    with pytest.raises(InputError) as e:
        check(value, annotation, "eagle2.total_tokens")
    assert str(e.value) == message


def test_type_error_describes_containers_as_a_whole():
    assert type_error([1, "a"], list[int]) == "a list of integers"
    assert type_error({"a": "x"}, dict[str, int]) == "a mapping to integers"
    assert type_error({1: 2}, dict[str, int]) == "a mapping with strings as keys"


COUNT = Annotated[int, Bound(0)]
POSITIVE = Annotated[float, Bound(0, strict=True)]


@pytest.mark.parametrize("value, annotation, what", [
    (-1, COUNT, "an integer >= 0"), (True, COUNT, "an integer >= 0"), (0, POSITIVE, "a number > 0"),
    (math.nan, POSITIVE, "a number > 0"), ("1.5", POSITIVE, "a number > 0"),
    ("", Annotated[str, NonEmpty()], "a non-empty string"), (None, Annotated[str, NonEmpty()], "a non-empty string"),
    (None, list[COUNT], "a list"),
    ([1, -1], list[COUNT], "a list of integers >= 0"),
])
def test_rules_bound_a_number_and_refuse_an_empty_string(value, annotation, what):
    """Plain data without a dataclass (a run's records) states its ranges in the annotation: the value must fit the
    type and the rule, and the message says both. A rule ignored would let -1 tokens or a 0-second turn through."""
    assert type_error(value, annotation) == what


def test_rules_let_the_values_in_range_through_and_expected_says_it_all():
    assert type_error(0, COUNT) is None and type_error(0.5, POSITIVE) is None and type_error(2, POSITIVE) is None
    assert type_error("x", Annotated[str, NonEmpty()]) is None and type_error([0, 3], list[COUNT]) is None
    assert type_error(math.inf, POSITIVE) is None and type_error(math.inf, POSITIVE, finite=True) == "a number > 0"
    assert expected(list[COUNT]) == "a list of integers >= 0" and expected(str | int) == "a string or an integer"
    assert expected(Literal["ok", "error"]) == "one of 'ok', 'error'" and expected(float, plural=True) == "numbers"
    with pytest.raises(InputError, match=r"^run\.steps\[1\]: expected an integer >= 0, got -2$"):
        check([1, -2], list[COUNT], "run.steps")


def test_the_two_knobs_scalar_strings_and_finite_floats():
    """Options take any YAML scalar for a string (``contrastive: off`` arrives as False) and refuse NaN/inf."""
    assert type_error(False, str) == "a string" and type_error(False, str, scalar_str=True) is None
    assert type_error(math.nan, float) is None and type_error(math.nan, float, finite=True) == "a finite number"
    with pytest.raises(InputError, match=r"^x\[0\]: expected a finite number, got inf$"):
        check([math.inf], list[float], "x", finite=True)


def test_unknown_keys_name_the_closest_field_and_optionally_list_the_valid_ones():
    with pytest.raises(InputError) as e:
        unknown_keys(["tempratures", "zzz"], ["temperatures", "top_p"], "run")
    assert str(e.value) == "run: unknown field 'tempratures' (did you mean 'temperatures'?), 'zzz'"
    with pytest.raises(ConfigError) as e:
        unknown_keys(["dept"], ["depth", "top_k"], "method 'x'", "option", ConfigError, list_valid=True)
    assert str(e.value) == "method 'x': unknown option 'dept' (did you mean 'depth'?); valid: depth, top_k"
    unknown_keys(["depth"], ["depth"], "run")  # nothing unknown: no error


@dataclass
class _Options:
    total_tokens: int = 60
    mode: str = "hybrid"
    ratio: float = 0.5
    tree: str | list = "chain"


def test_build_options_checks_every_field_against_its_annotation():
    assert field_types(_Options) == {"total_tokens": int, "mode": str, "ratio": float, "tree": str | list}
    assert build_options(_Options, {"mode": False, "tree": [0]}, "method 'm'") == _Options(mode=False, tree=[0])
    for values, message in [
        ({"total_tokens": "x"}, "method 'm': option total_tokens: expected an integer, got 'x'"),
        ({"ratio": math.nan}, "method 'm': option ratio: expected a finite number, got nan"),
        ({"total_tokns": 3}, "method 'm': unknown option 'total_tokns' (did you mean 'total_tokens'?); valid: mode, "
                             "ratio, total_tokens, tree"),
    ]:
        with pytest.raises(OptionsError) as e:
            build_options(_Options, values, "method 'm'")
        assert str(e.value) == message


def test_every_input_error_has_the_one_base():
    """The command line prints any InputError as one line; an input error outside the family would not be named."""
    for cls in (OptionsError, ConfigError, TableError, DataError, SweepError):
        assert issubclass(cls, InputError) and issubclass(cls, ValueError)
