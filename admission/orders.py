"""The order webhook: validating, GPUClaim CREATE, fail closed (docs/design.md §5).

Refuses, with a message a tenant understands, an order whose class does not exist, whose
count exceeds the class's maxCount or its published maxFreePerNode, that would exceed a
budget, or that orders a vGPU class in a namespace without the entitlement. Claims the
operator makes from a VM's claim template (marked) are not judged: they wait for capacity.
The decision reads the shared caches only; a dry-run order is judged the same way and has
no side effect (the webhook writes nothing).
"""

from __future__ import annotations

from gpuoperator.caches import BY_NAMESPACE, Caches
from gpuoperator.model import capacity, echo, orders
from gpuoperator.runtime.admitting import Admission, AdmissionRequest

PATH = "/validate-gpuclaim"


def published_figures(cls: dict[str, object] | None) -> capacity.ClassFigures | None:
    """The figures the class status publishes (what tenants see), None before the first."""
    status = (cls or {}).get("status")
    if not isinstance(status, dict) or "maxFreePerNode" not in status:
        return None
    return capacity.ClassFigures(
        free=int(status.get("free") or 0),
        max_free_per_node=int(status.get("maxFreePerNode") or 0),
        nodes=int(status.get("nodes") or 0),
        reclaimable=int(status.get("reclaimable") or 0),
        max_reclaimable_per_node=int(status.get("maxReclaimablePerNode") or 0),
    )


class OrderWebhook:
    def __init__(self, caches: Caches) -> None:
        self.caches = caches

    def __call__(self, request: AdmissionRequest) -> Admission:
        if request.operation != "CREATE" or orders.is_template_claim(request.obj):
            return Admission.allow()
        # The envelope's parser has checked metadata is an object when present; the
        # namespace is the request's (a create's body may omit it).
        meta = request.obj.get("metadata") or {}
        claim = {**request.obj, "metadata": {"namespace": request.namespace, **meta}}
        class_name = orders.ordered_class(claim)
        cls = self.caches.classes.store.get(("", class_name))
        refusals = orders.order_refusals(
            claim,
            cls,
            self.caches.namespaces.store.get(("", request.namespace)),
            self.caches.quotas.store.by_index(BY_NAMESPACE, request.namespace),
            self.caches.claims.store.by_index(BY_NAMESPACE, request.namespace),
            published_figures(cls),
            known_classes=[k[1] for k in self.caches.classes.store],
        )
        if refusals:
            name = echo.clip(request.name) if request.name else "(generated)"
            who = f"GPUClaim {echo.clip(request.namespace)}/{name}"
            return Admission.refuse(f"{who}: " + "; ".join(refusals), reason="Forbidden")
        return Admission.allow()
