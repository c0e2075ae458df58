"""podman as the image tests run it: hack/image/podman.sh (the repository's containers.conf)."""

from __future__ import annotations

import os
import subprocess

from localcluster.cluster import REPO

PODMAN = REPO / "hack" / "image" / "podman.sh"


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    """Run hack/image/podman.sh (podman with the repository's containers.conf); its stdout."""
    proc = subprocess.run(
        [str(PODMAN), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc.stdout


def image_name() -> str:
    """The image `make image` builds (IMAGE overrides, as for make)."""
    version = next(
        line.split('"')[1]
        for line in (REPO / "pyproject.toml").read_text().splitlines()
        if line.startswith("version = ")
    )
    name = os.environ.get("IMAGE", f"gpuoperator:{version}")
    return name if "/" in name.partition(":")[0] else f"localhost/{name}"
