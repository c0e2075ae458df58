"""Launcher pods (docs/design.md §5 "VMs"): which pod of a VM with claims a pod is, and the
patches the pod webhook and the placement controller make to it.

* :func:`launcher_pod_kind`, :func:`gate_patch`, :func:`tolerations_patch` — the pod webhook.
* :func:`pin_and_ungate`, :func:`pinned_node` — the placement controller's single pod update,
  and how it reads the pin back; :func:`ungate` — its update for a VM on claims of DRA
  classes, which kube-scheduler places without a pin.
* :func:`needs_pin`, :func:`maybe_rejected`, :func:`watched`, :func:`vmi_name_of` — which pods
  the placement controller acts on, and for which VMI.

Choices where docs/design.md is silent:

* The temporary WaitForFirstConsumer pod is recognised by the presence of its annotation, as
  KubeVirt itself does; a migration target is recognised first (its label) and gated, pinned
  and deleted when rejected like a launcher pod, on its transient holds' node
  (``model.migration_targets`` says which targets are gated and where they go).
* Tolerations compare by key, operator (default ``Equal``), value and effect.
* The pin is ``matchFields`` ``metadata.name In [node]`` appended to every non-empty
  required term (an empty term matches no node, and stays so).

Every function is pure and idempotent: no I/O, plain dicts in and out (inputs are never
mutated), and applying a result twice changes nothing (the JSON patches come back empty once
applied).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

from gpuoperator import names
from gpuoperator.model import claims, conditions, objects, patches
from gpuoperator.model import classes as gpuclasses
from gpuoperator.model.node_selection import IN, NODE_NAME_FIELD

Obj = dict[str, Any]

#: The label earlier versions pinned on (still read by :func:`pinned_node`).
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"

LauncherPodKind = Literal["launcher", "ephemeral", "migration-target", "other"]

#: The kinds of pod the pod webhook gates and the placement controller pins and deletes when
#: rejected (a migration target only when ``model.migration_targets.gated`` says so).
PLACED_KINDS: Final = ("launcher", "ephemeral", "migration-target")
#: kube-scheduler's reason for a pod it cannot place (``PodScheduled`` False).
UNSCHEDULABLE: Final = "Unschedulable"


def launcher_pod_kind(pod: Mapping[str, Any]) -> LauncherPodKind:
    """Which pod of a VM with claims this is.

    * ``other``: not a virt-launcher pod (label ``kubevirt.io=virt-launcher``) with the claims
      label — nothing to do;
    * ``migration-target``: a migration target (label ``kubevirt.io/migrationJobUID``) —
      gated like the launcher when its claims hold units through the operator
      (``model.migration_targets.gated``), then pinned to their transient holds' node;
    * ``ephemeral``: KubeVirt's temporary pod for WaitForFirstConsumer volumes (annotation
      ``kubevirt.io/ephemeral-provisioning``; like KubeVirt, its presence decides) — gated and
      pinned like the launcher, so the volume is provisioned on the claims' node;
    * ``launcher``: the VMI's launcher pod — gated, given the class tolerations, then pinned.
    """
    labels = objects.labels(pod)
    if (
        labels.get(names.KUBEVIRT_LABEL) != names.VIRT_LAUNCHER
        or labels.get(names.CLAIMS_LABEL) != names.TRUE
    ):
        return "other"
    if names.MIGRATION_LABEL in labels:
        return "migration-target"
    if names.EPHEMERAL_ANNOTATION in objects.annotations(pod):
        return "ephemeral"
    return "launcher"


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _gates(pod: Mapping[str, Any]) -> list[Any] | None:
    gates = _spec(pod).get("schedulingGates")
    return gates if isinstance(gates, list) else None


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod still carries the placement gate."""
    return any(
        isinstance(g, Mapping) and g.get("name") == names.PLACEMENT_GATE for g in _gates(pod) or []
    )


def gate_patch(pod: Mapping[str, Any]) -> list[Obj]:
    """JSON patch ops adding the scheduling gate ``gpu.cozystack.io/placement`` once: ``[]``
    when the pod already has it (a duplicate gate fails pod validation); the whole list when
    the pod has no ``spec.schedulingGates``."""
    if is_gated(pod):
        return []
    gate = {"name": names.PLACEMENT_GATE}
    if "spec" not in pod or not isinstance(pod.get("spec"), Mapping):
        return [
            {
                "op": "add",
                "path": patches.json_pointer("spec"),
                "value": {"schedulingGates": [gate]},
            }
        ]
    if _gates(pod) is None:
        return [
            {"op": "add", "path": patches.json_pointer("spec", "schedulingGates"), "value": [gate]}
        ]
    return [
        {"op": "add", "path": patches.json_pointer("spec", "schedulingGates", "-"), "value": gate}
    ]


def _toleration_key(toleration: Mapping[str, Any]) -> tuple[str, str, str, str]:
    operator = str(toleration.get("operator") or "Equal")
    value = "" if operator == "Exists" else str(toleration.get("value") or "")
    return (str(toleration.get("key") or ""), operator, value, str(toleration.get("effect") or ""))


def _pod_toleration(key: tuple[str, str, str, str]) -> Obj:
    name, operator, value, effect = key
    out: Obj = {}
    if name:
        out["key"] = name
    out["operator"] = operator
    if value:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out


def tolerations_patch(pod: Mapping[str, Any], classes: Iterable[Obj]) -> list[Obj]:
    """JSON patch ops adding each toleration of ``classes`` (the classes of the pod's claims)
    that the pod does not carry yet; ``[]`` when it carries them all.

    Tolerations compare by key, operator (default ``Equal``), value (ignored with ``Exists``)
    and effect; a pod toleration with ``tolerationSeconds`` that matches otherwise counts as
    present (adding ours would not change when the taint manager evicts). Repeats across
    classes are added once.
    """
    existing = _spec(pod).get("tolerations")
    present = {_toleration_key(t) for t in existing or [] if isinstance(t, Mapping)}
    adding: list[Obj] = []
    for cls in classes:
        for toleration in gpuclasses.tolerations(cls):
            key = _toleration_key(toleration)
            if key not in present:
                present.add(key)
                adding.append(_pod_toleration(key))
    if not adding:
        return []
    if not isinstance(_spec(pod).get("tolerations"), list):
        if not isinstance(pod.get("spec"), Mapping):
            return [
                {
                    "op": "add",
                    "path": patches.json_pointer("spec"),
                    "value": {"tolerations": adding},
                }
            ]
        return [{"op": "add", "path": patches.json_pointer("spec", "tolerations"), "value": adding}]
    return [
        {"op": "add", "path": patches.json_pointer("spec", "tolerations", "-"), "value": toleration}
        for toleration in adding
    ]


def _pin(node_name: str) -> Obj:
    return {"key": NODE_NAME_FIELD, "operator": IN, "values": [node_name]}


def _ungate_patch(pod: Mapping[str, Any], spec: Obj) -> Obj:
    """A merge patch body of ``spec`` and the pod's gates without the placement gate, under
    the pod's ``resourceVersion``."""
    gates = [
        copy.deepcopy(g)
        for g in _gates(pod) or []
        if not (isinstance(g, Mapping) and g.get("name") == names.PLACEMENT_GATE)
    ]
    patch: Obj = {"spec": {**spec, "schedulingGates": gates}}
    resource_version = objects.meta(pod).get("resourceVersion")
    if resource_version:
        patch["metadata"] = {"resourceVersion": resource_version}
    return patch


def pin_and_ungate(pod: Mapping[str, Any], node_name: str) -> Obj:
    """The placement controller's ONE pod update, as a JSON merge patch body:
    ``{"metadata": {"resourceVersion": ...}, "spec": {"affinity": ..., "schedulingGates":
    ...}}``. It adds a required node affinity on the node's name (``matchFields``
    ``metadata.name In [node_name]``) and removes the placement gate, keeping every other
    gate. The API server accepts the affinity change only while the pod is gated, hence one
    update. The pin names the Node object itself: the ``kubernetes.io/hostname`` label can
    differ from the node's name (a kubelet hostname override, some clouds), and a pin on it
    would match no node at all.

    The pin is merged with the pod's affinity: kube-scheduler ORs ``nodeSelectorTerms`` and
    ANDs the requirements inside a term, and for a gated pod the API server allows only adding
    requirements to existing terms, so the pin is appended to every term's ``matchFields``
    (a term already carrying it is left alone; an empty term, which matches no node, stays
    empty); without terms, one term with the pin is set. The rest of ``spec.affinity`` is
    carried over unchanged.

    Pass the pod as read from the API server, or as cached while it is gated (the cache
    keeps a gated pod's ``affinity``, ``slimming.slim_pod``), and send the result as
    ``application/merge-patch+json``, or merge its ``spec`` into the full pod for an update:
    a strategic merge patch would merge ``schedulingGates`` by name and keep the gate.
    ``resourceVersion`` makes a stale update fail with a conflict.
    """
    if not node_name:
        raise ValueError("a pod is pinned to a named node")
    spec = _spec(pod)
    affinity: Obj = copy.deepcopy(dict(spec.get("affinity") or {}))
    node_affinity: Obj = dict(affinity.get("nodeAffinity") or {})
    required: Obj = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms: list[Obj] = []
    for term in required.get("nodeSelectorTerms") or []:
        fields = list(term.get("matchFields") or [])
        if (not fields and not term.get("matchExpressions")) or _pin(node_name) in fields:
            terms.append(term)
        else:
            terms.append({**term, "matchFields": [*fields, _pin(node_name)]})
    if not terms:
        terms = [{"matchFields": [_pin(node_name)]}]
    required["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    return _ungate_patch(pod, {"affinity": affinity})


def ungate(pod: Mapping[str, Any]) -> Obj:
    """The placement controller's pod update for a VM whose claims are all of DRA classes,
    as a JSON merge patch body: the placement gate removed (every other gate kept), no pin —
    kube-scheduler places the pod on the node of its allocated ResourceClaims. Sent as
    :func:`pin_and_ungate` is, with the pod's ``resourceVersion``."""
    return _ungate_patch(pod, {})


def _pins(requirements: Any, key: str) -> list[str]:
    return [
        str(r["values"][0])
        for r in (requirements if isinstance(requirements, list) else ())
        if isinstance(r, Mapping)
        and r.get("key") == key
        and r.get("operator") == IN
        and isinstance(r.get("values"), list)
        and len(r["values"]) == 1
    ]


def pinned_node(pod: Mapping[str, Any]) -> str | None:
    """The node the pod is pinned to by :func:`pin_and_ungate` (the node every non-empty
    required term pins with ``matchFields`` ``metadata.name In [node]``), ``None`` when it is
    not. A pin on ``kubernetes.io/hostname In [node]``, the form earlier versions wrote, is
    read too, so a pod pinned before an upgrade is still recognised."""
    affinity = _spec(pod).get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    nodes: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        expressions = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not expressions and not fields:
            continue
        found = _pins(fields, NODE_NAME_FIELD) + _pins(expressions, HOSTNAME_LABEL)
        if not found:
            return None
        nodes.update(found)
    return nodes.pop() if len(nodes) == 1 else None


def creator_refusal(pod: Mapping[str, Any], username: str, kubevirt_service_account: str) -> str:
    """Why a launcher or temporary pod may not get the class tolerations and the placement
    gate from its creator, ``""`` when it may: only KubeVirt's controller service account
    creates such pods, and only for a VirtualMachineInstance that controls them (a
    ``kubevirt.io`` controller ownerReference). Anyone else dressing a pod as a launcher pod
    would be handed the tolerations of the GPU nodes."""
    marks = (
        f"the labels {names.KUBEVIRT_LABEL}={names.VIRT_LAUNCHER} and "
        f"{names.CLAIMS_LABEL}={names.TRUE}"
    )
    allowed = kubevirt_service_account.strip()
    if not allowed or username != allowed:
        who = allowed or "(none: the setting kubevirtServiceAccount is empty)"
        return (
            f"the pod carries {marks}: such pods get the GPU classes' tolerations and the "
            f"placement gate, so only KubeVirt's controller service account {who} may create "
            f"them, for a VirtualMachineInstance that controls them; {username} may not"
        )
    if claims.controlling_vmi(pod) is None:
        return (
            f"the pod carries {marks}: metadata.ownerReferences must hold a controller "
            f"reference to a {names.KUBEVIRT_GROUP} {names.VMI_KIND} (the VM instance it is "
            "rendered for); it holds none"
        )
    return ""


# ---- which pods placement acts on ------------------------------------------------------------


def is_unschedulable(pod: Mapping[str, Any]) -> bool:
    """Whether kube-scheduler reports the pod unschedulable (``PodScheduled`` False with
    reason ``Unschedulable``; a gated pod's reason is ``SchedulingGated``)."""
    status = pod.get("status")
    found = status.get("conditions") if isinstance(status, Mapping) else None
    scheduled = conditions.find(found, "PodScheduled")
    return (
        scheduled is not None
        and scheduled.get("status") == "False"
        and scheduled.get("reason") == UNSCHEDULABLE
    )


def _placed(pod: Mapping[str, Any]) -> bool:
    """A launcher, temporary or migration target pod not being deleted."""
    return launcher_pod_kind(pod) in PLACED_KINDS and not objects.meta(pod).get("deletionTimestamp")


def needs_pin(pod: Mapping[str, Any]) -> bool:
    """A launcher, temporary or migration target pod still held at the placement gate."""
    return _placed(pod) and is_gated(pod)


def maybe_rejected(pod: Mapping[str, Any]) -> bool:
    """A launcher, temporary or migration target pod without the gate that kube-scheduler
    cannot place: its
    node rejects it if the operator pinned it (only the full pod shows the affinity,
    :func:`pinned_node`)."""
    return (
        _placed(pod)
        and not is_gated(pod)
        and not _spec(pod).get("nodeName")
        and is_unschedulable(pod)
    )


def watched(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is one the placement controller acts on."""
    return needs_pin(pod) or maybe_rejected(pod)


def vmi_name_of(pod: Mapping[str, Any]) -> str:
    """The name of the pod's VMI as the pod itself says it ("" when it does not): its
    controller ownerReference, else the ``vm.kubevirt.io/name`` label."""
    owner = claims.controlling_vmi(pod)
    if owner is not None:
        return owner.name
    return str(objects.labels(pod).get(names.VM_NAME_LABEL) or "")
