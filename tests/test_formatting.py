"""Every helper of harness.report.formatting on literal inputs with the exact text expected: the report's summary.md,
the ablation table, ``draftbench compare`` and the comparison with a published table all read through them, so a
change here changes every one of those files."""

import math

import numpy as np

from harness.report import formatting as F


def test_missing_is_none_and_nan_only():
    # NaN of either float type is "not measured"; 0, False and "" are measured values and must never read n/a
    assert F.missing(None) and F.missing(math.nan) and F.missing(np.float32("nan")) and F.missing(np.float64("nan"))
    assert not any(F.missing(v) for v in (0, 0.0, False, "", np.int64(0), [], "nan"))


def test_number_formats_or_says_na():
    assert F.number(2.4137) == "2.41"
    assert F.number(2.4137, ".3f") == "2.414"
    assert F.number(61.23, ".1f", " s") == "61.2 s"
    assert F.number(-1.123, "+.2f") == "-1.12" and F.number(1.123, "+.2f") == "+1.12"
    assert F.number(np.float64(0.5), ".3g") == "0.5"
    assert F.number(3) == "3.00"  # an int count reads like the floats beside it
    # a missing value has no unit: "n/a ×" would look like a measured ratio with a typo
    assert F.number(None, ".2f", "×") == "n/a"
    assert F.number(math.nan, ".1f", "%") == "n/a"


def test_ratio_and_speedup_tau_cell():
    assert F.ratio(2.4137) == "2.41×"
    assert F.ratio(math.nan) == "n/a"
    assert F.speedup_tau(2.413, 3.517) == "2.41× / 3.52"
    # no baseline: the speed-up is n/a but τ is still known
    assert F.speedup_tau(math.nan, 3.5) == "n/a / 3.50"
    assert F.speedup_tau(None, None) == "n/a / n/a"


def test_interval_reads_each_bound():
    assert F.interval(2.4137, 2.1, 2.75) == "2.41 [2.10, 2.75]"
    assert F.interval(1.0201, 0.98, 1.07, ".3f") == "1.020 [0.980, 1.070]"
    # the ablation table prints a missing estimate with its missing CI, keeping its columns' shape
    assert F.interval(math.nan, math.nan, math.nan) == "n/a [n/a, n/a]"


def test_size_in_mib_below_a_gib_and_gib_above():
    assert F.size(5 * 2**20) == "5 MiB"
    assert F.size(2**30 - 1) == "1024 MiB"
    assert F.size(2**30) == "1.00 GiB"
    assert F.size(3.5 * 2**30) == "3.50 GiB"
    assert F.size(None) == "n/a" and F.size(math.nan) == "n/a"


def test_html_number():
    # four significant digits below 10^4, whole numbers above (a tokens/s of 12345.6 must not read 1.235e+04)
    assert F.html_number(2.41367) == "2.414"
    assert F.html_number(1234.5) == "1234"  # .4g rounds half to even
    assert F.html_number(12345.6) == "12346"
    assert F.html_number(0.000123456) == "0.0001235"
    assert F.html_number(7) == "7" and F.html_number(np.int64(7)) == "7"
    # a bool is a flag, not the number 1
    assert F.html_number(True) == "true" and F.html_number(np.bool_(False)) == "false"
    # a missing value is an empty cell in HTML (n/a is for Markdown and terminal text)
    assert F.html_number(math.nan) == "" and F.html_number(None) == ""


def test_markdown_escape():
    # a "|" inside a cell would start a new column; a line break would end the row
    assert F.markdown_escape("a|b\nc") == "a\\|b c"
    assert F.markdown_escape(3) == "3"
    # escaping twice changes nothing (compare escapes its messages, and every row escapes its cells)
    assert F.markdown_escape(F.markdown_escape("a|b")) == "a\\|b"


def test_a_pipe_in_a_label_stays_in_its_cell():
    """A "|" in a label broke summary.md's, against_*.md's and compare's table rows (one column too many); the
    HTML report reads the cells back unescaped."""
    row = F.markdown_row(["eagle2|fast", "1.20×"])
    assert row == "| eagle2\\|fast | 1.20× |"
    assert F.markdown_cells(row) == ["eagle2|fast", "1.20×"]


def test_html_in_a_label_is_shown_as_text_in_markdown_and_read_back():
    """Markdown tables carried a label's raw HTML (``<img src=x onerror=alert(1)>``), which GitHub's step summary and
    other viewers render: it must be escaped (twice changes nothing), and the HTML report reads the label back."""
    label = "<img src=x onerror=alert(1)> & co"
    row = F.markdown_row([label, "1.20×"])
    assert row == "| &lt;img src=x onerror=alert(1)&gt; &amp; co | 1.20× |"
    assert F.markdown_escape(F.markdown_escape(label)) == F.markdown_escape(label)
    assert F.markdown_cells(row) == [label, "1.20×"]


def test_markdown_table_aligns_labels_left_and_numbers_right():
    assert F.markdown_table(["method", "mt", "mean"], [["pld", "2.41× / 3.52", ""], ["eagle2 †", "n/a / 1.00", "x"]]) \
        == ["| method | mt | mean |", "|---|---:|---:|", "| pld | 2.41× / 3.52 |  |", "| eagle2 † | n/a / 1.00 | x |"]
    # several label columns (the ablation's knobs), and all left (compare's table)
    assert F.markdown_table(["label", "mode", "τ"], [], left=2) == ["| label | mode | τ |", "|---|---|---:|"]
    assert F.markdown_table(["a", "b"], [["1", "2"]], left=2) == ["| a | b |", "|---|---|", "| 1 | 2 |"]
    assert F.markdown_row(["a", "", "b"]) == "| a |  | b |"
