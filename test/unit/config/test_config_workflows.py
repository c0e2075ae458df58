"""The GitHub Actions workflows pass actionlint (built by hack/build-tools.sh), and the kind
workflow runs what `make e2e-kind` runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from unit.config.manifests import REPO, tool

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.y*ml"))


@pytest.fixture(scope="module")
def actionlint() -> Path:
    return tool("actionlint")


def _lint(actionlint: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(actionlint), "-no-color", "-oneline", *map(str, files)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_there_are_workflows() -> None:
    assert [p.name for p in WORKFLOWS] == ["e2e-kind.yaml"]


@pytest.mark.needs_tools
def test_actionlint_passes_every_workflow(actionlint: Path) -> None:
    proc = _lint(actionlint, *WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.needs_tools
def test_actionlint_catches_a_broken_workflow(actionlint: Path, tmp_path: Path) -> None:
    text = WORKFLOWS[0].read_text()
    broken = text.replace(
        "- uses: actions/checkout@v4\n",
        "- uses: actions/checkout@v4\n      with:\n        no-such-input: x\n",
    ).replace("runs-on: ubuntu-24.04", "runs-on: ${{ matrix.os }}")
    assert broken.count("no-such-input") == 1 and "matrix.os" in broken
    path = tmp_path / "broken.yaml"
    path.write_text(broken)
    proc = _lint(actionlint, path)
    assert proc.returncode == 1
    assert "no-such-input" in proc.stdout
    assert 'property "os" is not defined' in proc.stdout


def test_the_kind_workflow_runs_make_e2e_kind() -> None:
    workflow = yaml.safe_load(WORKFLOWS[0].read_text())
    runs = [s.get("run", "") for s in workflow["jobs"]["e2e-kind"]["steps"]]
    assert any(r.startswith("make e2e-kind") for r in runs)
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\ne2e-kind:", 1)[1].split("\n\n", 1)[0]
    assert "config/overlays/kind" in recipe
    assert "E2E_KUBECONFIG=" in recipe
