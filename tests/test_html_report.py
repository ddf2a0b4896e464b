"""report.html: self-contained, loads from file:// in headless Chromium with no console error, shows the numbers of
summary.csv, sorts, and has the divergence viewer. The run is the literal one of tests/support/ablation_run.py.

Chromium: Debian's ``chromium``; when it is missing and the tests run as root with apt, the fixture installs it.
Otherwise the browser tests skip, unless ``DRAFTBENCH_REQUIRE_BROWSER=1`` (set by .ci/run), where they fail.
``DRAFTBENCH_SCREENSHOT=path.png`` keeps the page's screenshot there.
"""

import math
import os
import re
import shutil
import subprocess

import pandas as pd
import pytest

from harness.report import html as H
from harness.report.report import write_report
from tests.support.ablation_run import write_run
from tests.support.browser import Browser, find_chromium


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = write_run(tmp_path_factory.mktemp("html"))
    write_report(run)
    return run


@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if path is None and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        for cmd in (["apt-get", "install", "-y", "-q", "chromium"], ["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "chromium"]):
            if subprocess.run(cmd, capture_output=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                              timeout=900).returncode == 0 and cmd[1] == "install":
                break
        path = find_chromium()
    if path is None:
        reason = "no Chromium (apt-get install -y chromium, or set DRAFTBENCH_CHROMIUM)"
        if os.environ.get("DRAFTBENCH_REQUIRE_BROWSER") == "1":
            pytest.fail(reason + "; DRAFTBENCH_REQUIRE_BROWSER=1 requires it")
        pytest.skip(reason)
    return path


def test_page_is_self_contained_and_has_the_divergence_viewer(run):
    """Nothing may be fetched from the network (a CDN script or font would break the page offline / as a CI
    artifact), and the one turn that differs from vanilla (D, q3) must be shown with its first differing token."""
    page = (run / "report.html").read_text()
    external = [m for m in re.findall(r'(?:src|href)="([^"]*)"', page) if not m.startswith(("data:", "#"))]
    assert external == []
    assert "http://" not in page and "https://" not in page
    assert "1 turn(s) differ from the baseline." in page
    assert "mt / q3 turn 0: first differing token 2 (of 4 vs 4)" in page
    assert "Once up<mark>On a midnight</mark>" in page and "Once up<mark>on a time there was</mark>" in page
    assert page.count('<img class="plot"') == len(list((run / "plots").glob("*.png")))


def test_divergences_literal():
    """first_token / first_char come from metrics.first_difference; an off-by-one would show the wrong spot."""
    from harness.report.tables import turns_table
    from tests.support.ablation_run import RECORDS

    div = H.divergences(turns_table(RECORDS), "vanilla")
    assert div[["label", "question_id", "first_token", "first_char"]].values.tolist() == [["D", "q3", 2, 7]]


def test_tables_page_for_other_commands():
    """The compare / reproduction seam: DataFrames in, a page whose number cells carry their exact value."""
    page = H.render_tables_page("compare", {"Runs": pd.DataFrame({"label": ["a"], "tau": [2.41367]})}, notes="**x**")
    assert '<td class="n" data-v="2.41367">2.414</td>' in page and "<strong>x</strong>" in page


def _rows(browser, table_id):
    return browser.evaluate(
        f"(() => {{ const t = document.getElementById('{table_id}');"
        "const head = [...t.tHead.rows[0].cells].map(c => c.textContent);"
        "return [...t.tBodies[0].rows].map(r => Object.fromEntries([...r.cells].map((c, i) => "
        "[head[i], {v: c.getAttribute('data-v'), t: c.textContent}]))); })()")


def test_report_in_headless_chromium(run, chromium, tmp_path):
    """Loaded from file:// the page must raise no console error, its summary table must show exactly the numbers of
    summary.csv (exact value in data-v, 4 significant digits on screen), and a header click must sort rows."""
    summary = pd.read_csv(run / "tables" / "summary.csv")
    shot = os.environ.get("DRAFTBENCH_SCREENSHOT") or str(tmp_path / "report.png")
    with Browser(chromium, width=1280, height=1000) as b:
        b.open((run / "report.html").resolve().as_uri())
        assert b.errors == []
        assert b.evaluate("document.title") == "draftbench: ablation-1"
        rows = {r["label"]["t"]: r for r in _rows(b, "summary-table")}
        assert sorted(rows) == sorted(summary["label"])
        checked = 0
        for rec in summary.to_dict("records"):
            for col, value in rec.items():
                if isinstance(value, float) and not isinstance(value, bool):
                    cell = rows[rec["label"]][col]
                    if math.isnan(value):
                        assert cell["t"] == "", (rec["label"], col)
                        continue
                    assert float(cell["v"]) == pytest.approx(value, rel=1e-12, abs=1e-12), (rec["label"], col)
                    assert float(cell["t"]) == pytest.approx(value, rel=5e-4, abs=5e-4), (rec["label"], col)
                    checked += 1
        assert checked >= 5 * 10
        assert rows["D"]["speedup"]["t"] == "2.833" and rows["D"]["opt.mode"]["t"] == "ar"
        # the ablation pivot (mode rows x total_tokens columns) shows D's "tau / speed-up"
        assert "2.17 / 2.83" in b.evaluate("document.getElementById('ablation').textContent")

        b.evaluate("[...document.querySelectorAll('#summary-table th')].find(h => h.textContent === 'tau').click()")
        taus = [float(r["tau"]["v"]) for r in _rows(b, "summary-table")]
        assert taus == sorted(taus) and taus != [float(rows[k]["tau"]["v"]) for k in rows]
        b.screenshot(shot)
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_console_errors_are_caught(chromium, tmp_path):
    """The error collector itself: a page that logs an error and throws must be reported (else the check above
    could never fail)."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><head><link rel='icon' href='data:,'></head><body>"
                    "<script>console.error('boom'); undefinedFunction();</script></body></html>")
    with Browser(chromium) as b:
        b.open(page.resolve().as_uri())
    assert any("boom" in e for e in b.errors) and any("undefinedFunction" in e for e in b.errors)
