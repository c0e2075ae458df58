"""Reading a namespace's DRA claims and their holds back from the API server, for the e2e
tests of DRA classes: a claim, the claim once Bound to devices or once it waits, and the
ResourceClaim that holds it."""

from __future__ import annotations

import pykube

from gpuoperator.kinds import GPUClaim, ResourceClaim
from harness.kube import Obj
from harness.waiting import wait_for


def bound_reason(claim: Obj) -> str | None:
    """The reason of the claim's ``Bound`` condition."""
    for condition in (claim.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Bound":
            return str(condition.get("reason"))
    return None


class DraClaims:
    """The GPUClaims of ``namespace`` and their holds, waited for up to ``timeout`` s."""

    def __init__(self, api: pykube.HTTPClient, namespace: str, timeout: float) -> None:
        self.api = api
        self.namespace = namespace
        self.timeout = timeout

    def claim(self, name: str) -> Obj | None:
        found = GPUClaim.objects(self.api, namespace=self.namespace).get_or_none(name=name)
        return found.obj if found is not None else None

    def bound(self, name: str) -> Obj:
        """The claim once Bound, with the devices its status names."""
        claim = wait_for(
            f"claim {name} to be bound to devices",
            lambda: self.claim(name),
            lambda c: (
                c is not None
                and (c.get("status") or {}).get("phase") == "Bound"
                and bool(c["status"].get("devices"))
            ),
            timeout=self.timeout,
        )
        assert claim is not None
        return claim

    def waiting(self, name: str) -> Obj:
        """The claim once the binder has said it waits for capacity."""
        claim = wait_for(
            f"claim {name} to wait for a device",
            lambda: self.claim(name),
            lambda c: c is not None and bound_reason(c) == "NoCapacity",
            timeout=self.timeout,
        )
        assert claim is not None
        return claim

    def hold(self, name: str) -> Obj | None:
        """The ResourceClaim of ``name`` in the namespace (the claim's hold), if any."""
        found = ResourceClaim.objects(self.api, namespace=self.namespace).get_or_none(name=name)
        return found.obj if found is not None else None
