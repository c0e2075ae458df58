"""Fixtures of the image tests: the built image, and a local control plane with the dev
overlay deployed (as the e2e suite deploys it) for the image's container to run against.

Every test here carries the ``image`` marker (``make image-test`` runs them; ``make unit``
and ``make test`` leave them out). Nothing is skipped: without podman or the built image a
test fails, naming the command to run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.containers import MissingPrerequisiteError, image_name, require_image
from localcluster import deployment
from localcluster.cluster import (
    KUBEVIRT_CRDS,
    REPO,
    LocalCluster,
    deploy_to,
    kubectl_binary,
    wait_servable,
)

PROFILE = REPO / "hack" / "profiles" / "default.yaml"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.image)


@pytest.fixture(scope="session")
def image() -> str:
    try:
        return require_image(image_name())
    except MissingPrerequisiteError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """The local control plane (``E2E_CLUSTER_NAME``, default ``image``), stopped at the end."""
    local = LocalCluster(os.environ.get("E2E_CLUSTER_NAME", "image"))
    local.up(PROFILE, crds=[KUBEVIRT_CRDS], log=lambda _msg: None)
    try:
        yield local
    finally:
        local.down(quiet=True)


@pytest.fixture(scope="session")
def rendered(cluster: LocalCluster) -> deployment.Rendered:
    """``config/overlays/dev`` rendered and applied (the webhook configurations only once a
    replica serves them)."""
    out = deployment.render(kubectl_binary())
    deploy_to(cluster.kubeconfig, out, log=lambda _msg: None)
    wait_servable(cluster.kubeconfig)
    return out
