"""The pod webhook: mutating, Pod CREATE, fail closed (docs/design.md §5 "VMs").

Registered with an objectSelector on ``kubevirt.io=virt-launcher`` and the claims label, so
it sees the pods KubeVirt renders for a VMI with claim references: the launcher pod, the
temporary pod for WaitForFirstConsumer volumes, and migration targets. KubeVirt copies every
VMI label and annotation onto them, so the references are read from the pod itself.

* A launcher or temporary pod gets the scheduling gate ``gpu.cozystack.io/placement`` (the
  placement controller pins the pod to its claims' node and removes the gate in one update)
  and the tolerations of its claims' classes (held claims' classes and template classes), so
  it may land on GPU nodes tainted for the classes.
* A migration target (label ``kubevirt.io/migrationJobUID``, docs/design.md §5 "Live
  migration") of a VMI whose claims hold units through the operator (any claim not of a DRA
  class, ``model.migration_targets.gated``) is gated and given its classes' tolerations
  exactly as the launcher pod is: the placement controller pins it to the node of the
  claims' transient holds. A target of a VMI without claims, or with claims of DRA classes
  only, is admitted untouched.
* Anything else (not selected by the registration) is admitted untouched.

Any pod (the registration's second entry selects every pod naming a ResourceClaim) that
names a DRA hold in ``spec.resourceClaims`` is refused unless it is KubeVirt's pod of the
VMI the hold's claim serves (``model.hold_admission.pod_refusals``); namespaces in
``exemptNamespaces`` are left alone, as the policies leave them.

Only KubeVirt's controller makes launcher pods: a launcher, temporary or target pod is refused
(403, ``model.launcher_pods.creator_refusal``) unless the requester is the setting
``kubevirtServiceAccount`` and the pod has a controller ownerReference to a VMI. Anyone else
dressing a pod as a launcher pod would be handed the GPU nodes' tolerations; refusing (rather
than admitting it untouched) is the fail-closed answer and says why. The admission policy
``gpu-operator-gpu-pods`` refuses the same pods inside the API server, even while this
webhook is down; this check is the second line.

Re-invocation (``reinvocationPolicy: IfNeeded``) is harmless: the gate is added once (a
duplicate gate fails pod validation) and a toleration the pod carries is not added again.

Choices where docs/design.md is silent:

* A launcher pod whose annotation is missing or malformed is refused with the parser's
  message (fail closed: the VMI webhook refused such a VMI, so the pod can only come from an
  annotation changed after admission; admitting it ungated would place GPU work the
  operator never judged).
* A pod whose ``spec``, ``spec.tolerations`` or ``spec.schedulingGates`` is not of the
  API's shape (an object, lists of objects) is refused with code 400 naming the field:
  the patches extend those lists, and the API server would refuse such a pod anyway.
* A class that is not (or no longer) in the cache adds no toleration; the gate still holds
  the pod, and the placement controller decides what becomes of it.
* The pod is gated whatever the ``gpuForVMs`` switch says: the switch is enforced when the
  VMI is created, and a pod of a VMI admitted earlier must not escape placement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuoperator import settings
from gpuoperator.caches import BY_NAMESPACE, Caches
from gpuoperator.model import (
    echo,
    hold_admission,
    launcher_pods,
    migration_targets,
    patches,
    references,
)
from gpuoperator.runtime import admitting
from gpuoperator.runtime.admitting import Admission, AdmissionRequest

Obj = dict[str, Any]
PATH = "/mutate-launcher-pod"


#: The pod's lists the patches extend: each must be a list of objects when present.
_PATCHED_LISTS = ("tolerations", "schedulingGates")


def _check_lists(pod: Obj) -> None:
    """Raise ``FieldError`` (a 400 naming the field) when a list the patches extend is
    not a list of objects: the API server would refuse such a pod anyway, and patching
    it cannot be judged."""
    spec = pod.get("spec")
    if spec is None:
        return
    if not isinstance(spec, Mapping):
        admitting.field_error("spec", spec, "must be an object")
    for key in _PATCHED_LISTS:
        value = spec.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            admitting.field_error(f"spec.{key}", value, "must be a list of objects")
        for index, item in enumerate(value):
            if not isinstance(item, Mapping):
                admitting.field_error(f"spec.{key}[{index}]", item, "must be an object")


class PodWebhook:
    def __init__(self, caches: Caches, operator_settings: settings.Settings) -> None:
        self.caches = caches
        self.kubevirt_service_account = operator_settings.kubevirt_service_account
        self.exempt_namespaces = frozenset(operator_settings.exempt_namespaces)

    def __call__(self, request: AdmissionRequest) -> Admission:
        if request.operation != "CREATE":
            return Admission.allow()
        pod = request.obj
        namespace = request.namespace
        name = request.name or str((pod.get("metadata") or {}).get("generateName") or "")
        who = f"{echo.clip(namespace)}/{echo.clip(name) if name else '(generated)'}"
        if namespace not in self.exempt_namespaces:
            held = hold_admission.pod_refusals(
                pod,
                bool(self.kubevirt_service_account.strip())
                and request.user == self.kubevirt_service_account.strip(),
                self.caches.hold_finder(namespace),
            )
            if held:
                return Admission.refuse(f"Pod {who}: " + "; ".join(held))
        kind = launcher_pods.launcher_pod_kind(pod)
        if kind not in launcher_pods.PLACED_KINDS:
            return Admission.allow()
        refusal = launcher_pods.creator_refusal(pod, request.user, self.kubevirt_service_account)
        if refusal:
            return Admission.refuse(f"Pod {who}: {refusal}")
        _check_lists(pod)
        try:
            refs = references.from_object(pod)
        except references.AnnotationError as exc:
            return Admission.refuse(f"Pod {who}: {exc}")
        claims = {
            str((c.get("metadata") or {}).get("name") or ""): c
            for c in self.caches.claims.store.by_index(BY_NAMESPACE, namespace)
        }
        looked = {
            name: self.caches.classes.store.get(("", name))
            for name in references.class_names(refs, claims)
        }
        if kind == "migration-target" and not migration_targets.gated(refs, claims, looked):
            return Admission.allow()
        classes = [cls for cls in looked.values() if cls is not None]
        patch: list[Obj] = []
        if not isinstance(pod.get("spec"), Mapping):
            # Both patches below would add /spec; add it once, then fill it.
            patch.append({"op": "add", "path": patches.json_pointer("spec"), "value": {}})
            pod = {**pod, "spec": {}}
        patch += launcher_pods.gate_patch(pod)
        patch += launcher_pods.tolerations_patch(pod, classes)
        return Admission.allow(patch=patch)
