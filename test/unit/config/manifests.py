"""Helpers for the static checks of the shipped manifests: overlays rendered with the
kustomize built into the pinned kubectl (the one the control plane is built with,
hack/versions.env), and the static-check tools built by hack/build-tools.sh.

Every test that reaches one of these Go-built binaries carries the ``needs_tools`` marker
(``make unit`` deselects it and runs on a checkout where nothing is built yet). The helpers
enforce it: a test without the marker that asks for one fails, naming the marker. A marked
test whose binary is missing fails too (``make binaries``/``make tools``); it never skips."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "config"
#: Every installable variant: the base and the overlays.
VARIANTS = ("default", "overlays/dev", "overlays/kind", "overlays/production")

# The deployment's fixed names (docs/design.md §9; the names the operator itself uses are in
# gpuoperator.names and are taken from there).
NAMESPACE = "gpu-operator-system"
SERVICE_ACCOUNT = "gpu-operator"
DEPLOYMENT = "gpu-operator"
METRICS_SERVICE = "gpu-operator-metrics"
PDB = "gpu-operator"

Obj = dict[str, Any]

#: Whether the test being run carries the ``needs_tools`` marker (set by test/conftest.py
#: before each test's setup).
current_test_needs_tools = False


def _require_marker(binary: str) -> None:
    if not current_test_needs_tools:
        pytest.fail(
            f"this test runs {binary}, a Go-built binary: mark it "
            "@pytest.mark.needs_tools (`make unit` leaves such tests out)"
        )


def cache_root() -> Path:
    """Where hack/build-binaries.sh and hack/build-tools.sh keep their binaries."""
    env = os.environ.get("GPUOP_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuoperator"


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def pinned_kubectl() -> Path:
    version = _env_file(REPO / "hack" / "versions.env")["KUBE_VERSION"]
    _require_marker(f"kubectl {version}")
    path = cache_root() / "bin" / f"kubectl-{version}"
    if not path.exists():
        pytest.fail(f"the pinned kubectl {version} is not built: run `make binaries`")
    return path


def tool(name: str) -> Path:
    """A tool from hack/build-tools.sh (cached after the first build, which `make test`
    runs before pytest so its progress is visible)."""
    _require_marker(name)
    proc = subprocess.run(
        [str(REPO / "hack" / "build-tools.sh"), name],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0:
        pytest.fail(f"hack/build-tools.sh {name} failed:\n{proc.stderr}")
    return Path(proc.stdout.strip().splitlines()[-1])


def kustomize(directory: Path) -> list[Obj]:
    """``kubectl kustomize`` of ``directory`` as objects."""
    proc = subprocess.run(
        [str(pinned_kubectl()), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, f"kustomize {directory} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


_rendered: dict[str, list[Obj]] = {}


def render(variant: str) -> list[Obj]:
    """Rendered objects of a variant under config/ (rendered once per test session; callers
    must not modify them)."""
    _require_marker("kubectl kustomize")
    if variant not in _rendered:
        _rendered[variant] = kustomize(CONFIG / variant)
    return _rendered[variant]


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    """The one object of ``kind`` named ``name``."""
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind} {name}, found {len(hits)}"
    return hits[0]


def of_kind(objs: list[Obj], *kinds: str) -> list[Obj]:
    return [o for o in objs if o["kind"] in kinds]


def manager_container(objs: list[Obj]) -> Obj:
    deployment = find(objs, "Deployment", DEPLOYMENT)
    containers = deployment["spec"]["template"]["spec"]["containers"]
    by_name = {c["name"]: c for c in containers}
    assert "manager" in by_name, f"no container named manager in {sorted(by_name)}"
    return by_name["manager"]  # type: ignore[no-any-return]
