"""GPUClaims on a real API server, for end-to-end tests: order one, read its status, wait
for it to be Bound."""

from __future__ import annotations

import pykube

from gpuoperator import names
from gpuoperator.kinds import GPUClaim
from harness.kube import Obj
from harness.waiting import wait_for


def create_claim(api: pykube.HTTPClient, ns: str, name: str, cls: str, count: int) -> GPUClaim:
    """Order ``count`` units of class ``cls`` as claim ``ns/name``."""
    c = GPUClaim(
        api,
        {
            "apiVersion": names.API_VERSION,
            "kind": names.GPU_CLAIM,
            "metadata": {"name": name, "namespace": ns},
            "spec": {"className": cls, "count": count},
        },
    )
    c.create()
    return c


def claim_status(api: pykube.HTTPClient, ns: str, name: str) -> Obj:
    """The claim's status as stored now (``{}`` before its first write)."""
    found: Obj = GPUClaim.objects(api, namespace=ns).get(name=name).obj.get("status") or {}
    return found


def bound_node(
    api: pykube.HTTPClient, ns: str, name: str, node: str | None = None, *, timeout: float = 30.0
) -> str:
    """The node the claim is Bound to, waiting up to ``timeout`` seconds for it to be Bound
    (to ``node`` when given)."""
    s = wait_for(
        f"{ns}/{name} Bound" + (f" to {node}" if node else ""),
        lambda: claim_status(api, ns, name),
        until=lambda s: s.get("phase") == "Bound" and node in (None, s.get("nodeName")),
        timeout=timeout,
    )
    return str(s["nodeName"])
