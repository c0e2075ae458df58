"""A pod's use of extended resources (docs/design.md §5 "Capacity"), counted as kube-scheduler
counts it, so the operator's free units agree with what the scheduler will admit.

For each resource: iterate the init containers in order; a restartable init container
(``restartPolicy: Always``, a sidecar) keeps running, so it adds to a running sidecar total
and to the pod's steady state; a regular init container runs alone next to the sidecars
started before it, so its peak is its request plus that running total. The pod's usage is
``max(Σ regular containers + Σ sidecars, max over init containers of their peak) + overhead``
(kube-scheduler's ``PodRequests``, with the sidecar's own peak being the running total).

Quantities are read by :mod:`gpuoperator.model.quantities`: extended resources only, whole
units (an invalid quantity counts as 0), a limit without a request counting as the request.

A pod that has terminated (``Succeeded``/``Failed``) uses nothing. A pod being deleted still
uses its units until it is gone, as it does for the scheduler. Which of a pod's units a claim
already holds is decided by ownership, never by a label a tenant can set (docs/design.md §5, §10):
:func:`launcher_vmi` names the VMI controlling a virt-launcher pod, and the ledger
(:mod:`gpuoperator.model.capacity`) subtracts only the units that VMI's Bound claims hold on
the pod's node. A migration target pod (``kubevirt.io/migrationJobUID``) is a launcher pod of
its VMI too: :func:`migration_job` names its migration, whose transient hold covers it on its
target node (docs/design.md §5 "Live migration"); without one it is covered by nothing
there, its claims being bound to the source node.

Pods are the slim dicts of :func:`gpuoperator.model.slimming.slim_pod` (whole pods work
too). Every function is pure and idempotent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from gpuoperator import names
from gpuoperator.model import claims, quantities

Obj = dict[str, Any]

SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
RESTART_ALWAYS: Final = "Always"


def _requests(container: Obj) -> dict[str, int]:
    """A container's requests of extended resources (:func:`quantities.requested`: a limit
    without a request counts as the request)."""
    out: dict[str, int] = {}
    for resource, quantity in quantities.requested(container.get("resources")).items():
        if quantities.is_extended(resource):
            units = quantities.parse_count(quantity)
            if units:
                out[resource] = units
    return out


def _add(into: dict[str, int], more: dict[str, int]) -> None:
    for resource, units in more.items():
        into[resource] = into.get(resource, 0) + units


def _max(into: dict[str, int], other: dict[str, int]) -> None:
    for resource, units in other.items():
        into[resource] = max(into.get(resource, 0), units)


def requests(pod: Obj) -> dict[str, int]:
    """The pod's effective request of each extended resource by kube-scheduler's rule (see
    the module docstring), whatever its phase or labels. Resources at 0 are left out."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for container in _containers(spec.get("containers")):
        _add(total, _requests(container))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in _containers(spec.get("initContainers")):
        own = _requests(container)
        if container.get("restartPolicy") == RESTART_ALWAYS:
            _add(total, own)
            _add(sidecars, own)
            peak = dict(sidecars)
        else:
            peak = dict(own)
            _add(peak, sidecars)
        _max(init_peak, peak)
    _max(total, init_peak)
    overhead = _requests({"resources": {"requests": spec.get("overhead") or {}}})
    _add(total, overhead)
    return {resource: units for resource, units in total.items() if units}


def _containers(items: Any) -> Iterable[Obj]:
    if not isinstance(items, list):
        return ()
    return (c for c in items if isinstance(c, dict))


def is_terminated(pod: Obj) -> bool:
    """Whether the pod has finished (phase ``Succeeded`` or ``Failed``): it uses nothing."""
    return (pod.get("status") or {}).get("phase") in (SUCCEEDED, FAILED)


def launcher_vmi(pod: Obj) -> claims.Key | None:
    """``(namespace, VMI UID)`` of the VMI that controls this virt-launcher pod, the one
    whose claims may account for its units; ``None`` for every other pod.

    A pod qualifies only when it carries KubeVirt's ``kubevirt.io=virt-launcher`` label and
    has a controller ownerReference to a ``kubevirt.io`` VirtualMachineInstance with a UID; a
    migration target pod qualifies too (which hold covers it is the ledger's:
    :func:`migration_job`). The claims label plays no part: anyone who can create a pod can
    set it.
    """
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(names.KUBEVIRT_LABEL) != names.VIRT_LAUNCHER:
        return None
    owner = claims.controlling_vmi(pod)
    if owner is None or not owner.uid:
        return None
    return (str(meta.get("namespace") or ""), owner.uid)


def migration_job(pod: Obj) -> str:
    """The UID of the migration whose target pod this is (its ``kubevirt.io/migrationJobUID``
    label), ``""`` for any other pod."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    job = labels.get(names.MIGRATION_LABEL) if isinstance(labels, dict) else None
    return job if isinstance(job, str) else ""


def pod_usage(pod: Obj) -> dict[str, int]:
    """The units of each extended resource the pod takes on its node: nothing once it has
    terminated, else :func:`requests` (whatever its labels; what claims cover is the
    ledger's to subtract)."""
    if is_terminated(pod):
        return {}
    return requests(pod)


def node_name(pod: Obj) -> str:
    """The node the pod is bound to (``spec.nodeName``), ``""`` while unscheduled."""
    return str((pod.get("spec") or {}).get("nodeName") or "")
