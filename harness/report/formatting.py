"""How numbers read in every text draftbench writes: one rule for a missing value ("n/a"), numbers, ratios, 95%
confidence intervals, byte sizes, and Markdown tables.

Used wherever a table becomes text: the report's ``summary.md`` (:mod:`harness.report.markdown`), the ablation
table (:mod:`harness.report.ablation`), ``draftbench compare`` (:mod:`harness.gate.compare`), the comparison
with a published table and the HTML pages (:mod:`harness.report.html`).

A missing value is None or NaN (how a record or a table says "not measured"); it reads :data:`NA` in Markdown
and terminal text, and as an empty cell in HTML (:func:`html_number`).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

NA = "n/a"


def missing(x: Any) -> bool:
    """True for None and NaN (Python or numpy float). Example: missing(float("nan")) -> True; missing(0) -> False."""
    return x is None or (isinstance(x, (float, np.floating)) and math.isnan(x))


def number(x: Any, spec: str = ".2f", suffix: str = "") -> str:
    """``x`` in the format ``spec`` followed by ``suffix``, or "n/a" when it is missing.
    Example: number(2.4137, ".2f", "×") -> "2.41×"; number(None) -> "n/a"; number(0.0123, "+.1%") -> "+1.2%"."""
    return NA if missing(x) else format(float(x), spec) + suffix


def ratio(x: Any) -> str:
    """A speed-up (a ratio of throughputs). Example: ratio(2.4137) -> "2.41×"; ratio(nan) -> "n/a"."""
    return number(x, ".2f", "×")


def interval(estimate: Any, lo: Any, hi: Any, spec: str = ".2f") -> str:
    """An estimate with its 95% CI, each bound read like :func:`number`.
    Example: interval(2.4137, 2.1, 2.75) -> "2.41 [2.10, 2.75]"; interval(nan, nan, nan) -> "n/a [n/a, n/a]"."""
    return f"{number(estimate, spec)} [{number(lo, spec)}, {number(hi, spec)}]"


def speedup_tau(speedup: Any, tau: Any) -> str:
    """A paper-table cell, "speed-up× / τ". Example: speedup_tau(2.413, 3.517) -> "2.41× / 3.52";
    speedup_tau(nan, 3.5) -> "n/a / 3.50" (no baseline to compare with)."""
    return f"{ratio(speedup)} / {number(tau)}"


def size(n_bytes: Any) -> str:
    """A memory size in GiB from 1 GiB up, else in MiB. Example: size(3 * 2**30) -> "3.00 GiB";
    size(5 * 2**20) -> "5 MiB"; size(None) -> "n/a"."""
    if missing(n_bytes):
        return NA
    x = float(n_bytes)
    return f"{x / 2**30:.2f} GiB" if x >= 2**30 else f"{x / 2**20:.0f} MiB"


def html_number(v: Any) -> str:
    """How a number reads in an HTML table cell: four significant digits below 10⁴, whole above, a missing one
    empty. Example: 2.41367 -> "2.414"; 1234.5 -> "1234"; 12345.6 -> "12346"; 7 -> "7"; True -> "true";
    NaN -> ""."""
    if missing(v):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v)).lower()
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return f"{float(v):.4g}" if abs(float(v)) < 1e4 else f"{float(v):.0f}"


_NOT_ENTITY = re.compile(r"&(?!(?:amp|lt|gt|quot|#\d+);)")


def markdown_escape(text: Any) -> str:
    """Text made safe for one Markdown table cell: a "|" not yet escaped gets a backslash, HTML is shown as text,
    not rendered (``<``, ``>`` and a ``&`` that starts no entity become entities: a label such as
    ``<img src=x onerror=...>`` must not become markup where the Markdown is shown), line breaks become spaces;
    escaping twice changes nothing. Examples: markdown_escape("a|b\\nc") -> "a\\\\|b c"; markdown_escape("<b>&")
    -> "&lt;b&gt;&amp;"."""
    text = _NOT_ENTITY.sub("&amp;", str(text)).replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"(?<!\\)\|", r"\\|", text).replace("\r", " ").replace("\n", " ")


def markdown_cells(row: str) -> list[str]:
    """The cells of one Markdown table row, unescaped (the inverse of :func:`markdown_row`; entities decoded).
    Example: markdown_cells("| a\\\\|b | 1 |") -> ["a|b", "1"]."""
    inner = row.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [html.unescape(c.strip().replace("\\|", "|")) for c in re.split(r"(?<!\\)\|", inner)]


def markdown_row(cells: Sequence[Any]) -> str:
    """One Markdown table row, each cell escaped (:func:`markdown_escape`: a "|" in a label must not split the
    row). Example: markdown_row(["a", "", "b|c"]) -> "| a |  | b\\\\|c |"."""
    return "| " + " | ".join(markdown_escape(c) for c in cells) + " |"


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """A Markdown table as lines: the header, the alignment line (the first ``left`` columns left-aligned, the
    others right-aligned, as numbers read best) and one line per row. Cells are written as given (see
    :func:`markdown_escape`). Example: markdown_table(["method", "mt"], [["pld", "2.41× / 3.52"]]) ->
    ["| method | mt |", "|---|---:|", "| pld | 2.41× / 3.52 |"]."""
    align = "|" + "---|" * left + "---:|" * (len(head) - left)
    return [markdown_row(head), align, *(markdown_row(r) for r in rows)]
