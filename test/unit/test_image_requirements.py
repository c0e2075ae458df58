"""The image's lock files (requirements/) against pyproject.toml and the Dockerfile, so the
lock cannot silently go stale: every runtime dependency is pinned at a version pyproject
allows, every pin carries hashes, nothing is pinned that nothing needs, the build backend
satisfies the build-system, and the Dockerfile installs from these files with hashes
required, on the Python the lock was resolved for.

Regenerate after a change of dependencies (pip-tools is in the dev extras):

    pip-compile --generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links \
        --output-file requirements/runtime.txt pyproject.toml
    pip-compile --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
        --no-emit-find-links --output-file requirements/build.txt requirements/build.in
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "requirements" / "runtime.txt"
BUILD = REPO / "requirements" / "build.txt"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DOCKERFILE = (REPO / "Dockerfile").read_text()


@dataclass
class Pin:
    name: str
    version: Version
    hashes: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)


def pins(path: Path) -> dict[str, Pin]:
    """pip-compile's output: ``name==version \\`` lines, their ``--hash=`` continuations
    and ``# via`` comments (on one line, or one name a line below ``# via``)."""
    out: dict[str, Pin] = {}
    current: Pin | None = None
    in_via = False
    for raw in path.read_text().splitlines():
        line = raw.strip()
        entry = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s\\;]+)\s*\\?", line)
        if entry and not raw.startswith(" "):
            current = Pin(canonicalize_name(entry[1]), Version(entry[2]))
            out[current.name] = current
            in_via = False
        elif current is not None and line.startswith("--hash="):
            current.hashes.append(line.removeprefix("--hash=").rstrip(" \\"))
        elif current is not None and line.startswith("# via"):
            rest = line.removeprefix("# via").strip()
            in_via = not rest
            if rest:
                current.via.append(rest)
        elif current is not None and in_via and line.startswith("#   "):
            current.via.append(line.removeprefix("#").strip())
        elif line and not line.startswith("#"):
            raise AssertionError(f"{path.name}: a line that is no pin: {raw!r}")
    return out


RUNTIME_PINS = pins(RUNTIME)
BUILD_PINS = pins(BUILD)


@pytest.mark.parametrize("spec", PYPROJECT["project"]["dependencies"])
def test_every_runtime_dependency_is_locked_at_an_allowed_version(spec: str) -> None:
    req = Requirement(spec)
    pin = RUNTIME_PINS.get(canonicalize_name(req.name))
    assert pin is not None, f"{req.name} is not in {RUNTIME.name}: regenerate the lock"
    assert req.specifier.contains(pin.version, prereleases=False), (
        f"{RUNTIME.name} pins {req.name}=={pin.version}, pyproject.toml wants {req.specifier}"
    )


def test_every_pin_has_sha256_hashes() -> None:
    for pin in [*RUNTIME_PINS.values(), *BUILD_PINS.values()]:
        assert pin.hashes, f"{pin.name} has no --hash"
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in pin.hashes), pin


def test_nothing_is_locked_that_nothing_needs() -> None:
    """Each pin is wanted by pyproject.toml or by another pin (pip-compile's ``# via``): a
    dependency dropped from pyproject.toml leaves no orphan in the image."""
    for pin in RUNTIME_PINS.values():
        assert pin.via, f"{pin.name} says nothing about what needs it"
        for who in pin.via:
            name = who.split()[0]
            assert name == "gpuoperator" or canonicalize_name(name) in RUNTIME_PINS, (
                f"{pin.name} is there for {who}, which is neither gpuoperator nor locked"
            )


def test_the_build_backend_satisfies_the_build_system() -> None:
    for spec in [
        *PYPROJECT["build-system"]["requires"],
        *(
            line
            for line in (REPO / "requirements" / "build.in").read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ),
    ]:
        req = Requirement(spec)
        pin = BUILD_PINS.get(canonicalize_name(req.name))
        assert pin is not None, f"{req.name} is not in {BUILD.name}"
        assert req.specifier.contains(pin.version), f"{pin.name}=={pin.version} vs {spec}"


def test_the_dockerfile_installs_from_the_locks_with_hashes_required() -> None:
    body = DOCKERFILE.replace("\\\n", " ")
    for lock in ("requirements/build.txt", "requirements/runtime.txt"):
        name = lock.rpartition("/")[2]
        installs = [line for line in body.splitlines() if "pip install" in line and name in line]
        assert installs, f"the Dockerfile does not install {lock}"
        assert all("--require-hashes" in line for line in installs), installs
    # gpuoperator's own wheel brings no dependency of its own: they are the lock's.
    own = [line for line in body.splitlines() if "gpuoperator-*.whl" in line]
    assert own
    assert all("--no-deps" in line and "--no-index" in line for line in own), own


def test_the_lock_was_resolved_for_the_images_python() -> None:
    base = re.search(r"^ARG BASE=python:(\d+\.\d+)", DOCKERFILE, re.MULTILINE)
    assert base is not None, "the Dockerfile's default BASE is not a python:X.Y image"
    for lock in (RUNTIME, BUILD):
        header = re.search(r"autogenerated by pip-compile with Python (\d+\.\d+)", lock.read_text())
        assert header is not None, f"{lock.name} has no pip-compile header"
        assert header[1] == base[1], f"{lock.name} was resolved for Python {header[1]}"
    # Debian's python3 (the local base of hack/image/base.sh) is the same minor version.
    assert "bookworm" in (REPO / "hack" / "image" / "base.sh").read_text()
    assert base[1] == "3.11", "bookworm's python3 is 3.11: change the local base's suite too"
