"""The CI workflows (.github/workflows) pass actionlint and run exactly the commands docs/ci.md documents.

actionlint comes with the dev extras (pyproject.toml); without it the lint tests skip, except under CI (CI=true),
where a missing linter is a failure rather than a silently skipped check.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.support.helpers import dev_tool

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"
CI_DOC = REPO / "docs" / "ci.md"
CI_SECTION = "## Regression tracking in CI"
PROJECT_COMMAND = re.compile(r"^(make |\.ci/|\.venv/bin/)")


def workflow(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(wf: dict) -> dict:
    return wf.get("on", wf.get(True))  # YAML 1.1 reads the bare key `on` as true


def steps(wf: dict) -> list[dict]:
    return [s for job in wf["jobs"].values() for s in job["steps"]]


def commands(wf: dict) -> list[str]:
    """The project's own commands (make, .ci/, .venv/bin/) in the order the workflow runs them."""
    lines = [line.strip() for s in steps(wf) for line in str(s.get("run", "")).splitlines()]
    return [line.split(" || ")[0] for line in lines if PROJECT_COMMAND.match(line)]  # without a failure handler


def documented_commands() -> set[str]:
    """Every line of the fenced code blocks in docs/ci.md's regression-tracking section, comments removed."""
    text = CI_DOC.read_text()
    assert CI_SECTION in text, f"docs/ci.md has no section {CI_SECTION!r}"
    section = text.split(CI_SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```[a-z]*\n(.*?)```", section, flags=re.S)
    return {line.split("  #")[0].strip() for block in blocks for line in block.splitlines() if line.strip()}


def test_workflows_pass_actionlint():
    """A workflow with a syntax, expression or runner-label error fails on GitHub only after it is merged."""
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert [Path(f).name for f in files] == ["gpu-regression.yml", "sentinel.yml", "tests.yml"]
    done = subprocess.run([dev_tool("actionlint"), *files], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """Negative control: an undefined property in an expression must be reported, else the check above is empty."""
    wf = tmp_path / ".github" / "workflows" / "bad.yml"
    wf.parent.mkdir(parents=True)
    wf.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                  "      - if: ${{ github.event_nme == 'push' }}\n        run: echo hi\n")
    done = subprocess.run([dev_tool("actionlint"), str(wf)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "event_nme" in done.stdout


def test_the_workflows_run_the_documented_commands():
    """A workflow that ran something docs/ci.md does not document (or documented differently) would make its setup
    instructions wrong for whoever copies them onto a runner."""
    documented = documented_commands()
    for name in ("tests.yml", "gpu-regression.yml", "sentinel.yml"):
        used = commands(workflow(name))
        assert used, name
        assert [c for c in used if c not in documented] == [], name


def test_tests_workflow_is_ci_run():
    """GitHub's CPU job and .ci/run must gate the same way: vLLM's venv for the engine tests, the whole suite, then
    the CPU gate without speed."""
    used = commands(workflow("tests.yml"))
    assert used == ["make setup", ".venv/bin/draftbench data fetch --if-missing", "make vllm-setup", "make test",
                    ".ci/gate ci_gate cpu --no-speed"]
    ci_run = [line.split(" || ")[0] for line in (REPO / ".ci" / "run").read_text().splitlines()
              if PROJECT_COMMAND.match(line)]
    assert ci_run == used[2:]


def test_gpu_workflow_shape():
    """The GPU job must run on the self-hosted GPU runner, on pull requests and nightly, check the GPU before
    anything is measured, gate each event with its preset on CUDA, and keep the run directory."""
    wf = workflow("gpu-regression.yml")
    assert set(triggers(wf)) == {"pull_request", "schedule", "workflow_dispatch"}
    (job,) = wf["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "linux", "gpu"]
    used = commands(wf)
    assert used.index("make gpu-check") < used.index(".ci/gate gpu_gate cuda") < used.index(
        ".ci/gate nightly_vicuna cuda")
    by_run = {s.get("run"): s for s in steps(wf)}
    assert by_run[".ci/gate gpu_gate cuda"]["if"] == "github.event_name != 'schedule'"
    assert by_run[".ci/gate nightly_vicuna cuda"]["if"] == "github.event_name == 'schedule'"
    uploads = [s["with"]["path"] for s in steps(wf) if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert uploads == ["results/gate/", "results/baselines/"]


def test_sentinel_workflow_shape():
    """The sentinel must run on a schedule on CPU, calibrate a missing baseline from 6 repeats (a one-repeat baseline
    fits no tolerance), bisect only after its gate failed, with the history that bisecting needs, and keep the run
    and the (newly calibrated) baseline."""
    wf = workflow("sentinel.yml")
    assert set(triggers(wf)) == {"schedule", "workflow_dispatch"}
    (job,) = wf["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    assert job["steps"][0]["with"]["fetch-depth"] == 0
    used = commands(wf)
    assert used == ["make setup", ".ci/gate sentinel cpu --no-speed",
                    '.ci/bisect "$good" HEAD -- "$PWD/.ci/sentinel-step" sentinel --no-speed']
    gate = next(s for s in steps(wf) if ".ci/gate sentinel" in str(s.get("run")))
    assert 'GATE_RUN_ARGS="--repeats 6"' in gate["run"]
    bisect = next(s for s in steps(wf) if ".ci/bisect" in str(s.get("run")))
    assert bisect["if"] == f"failure() && steps.{gate['id']}.outcome == 'failure'"
    uploads = [s["with"]["path"] for s in steps(wf) if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert uploads == ["results/gate/", "results/baselines/"]


def test_the_lease_script_parses_and_names_its_calls():
    """.ci/lease (a lent GPU machine's calls, docs/gpus.md) is valid bash, and a call it does not know is one usage
    line naming the calls and exit 2, never a half-run lease on a machine that costs minutes to start."""
    script = Path(__file__).resolve().parent.parent / ".ci" / "lease"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    proc = subprocess.run(["bash", str(script), "nonsense"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("usage: .ci/lease prepare | part-a | part-b | checks | quick "
                                   "(see the header of .ci/lease)")
