"""The admission policies that enforce holds (config/policy), on the real API server, as a
tenant would attack them: a ServiceAccount holding only the built-in ``edit`` role in her
namespace, plus the VMI rights KubeVirt's ``kubevirt.io:edit`` grants.

Each attack is refused with a message naming the field, the value and who may; the
legitimate paths pass: KubeVirt's controller making a VMI's launcher pod, the operator
lifting the placement gate and releasing a claim. The first test runs with no operator
process at all (no webhook registered): the policies alone decide, on the parameters the
operator would have written.
"""

from __future__ import annotations

import copy
import functools
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pykube
import pytest

from gpuoperator import names
from gpuoperator.kinds import GPUClaim, GPUClass, VirtualMachineInstance, Workload
from gpuoperator.runtime.kinds import MutatingWebhookConfiguration
from harness import accounts, kube
from harness.claims import bound_node, create_claim
from harness.fleet import Fleet, published
from harness.kube import Obj, Refusal, refused, replace
from harness.kubevirt import CONTROLLER_USERNAME
from harness.operator import Deployed
from harness.waiting import wait_for

CONVERGE = 60.0
#: The ClusterRole a tenant gets for VMIs, as KubeVirt's kubevirt.io:edit grants them.
VMI_EDIT = "gpuoperator-test:kubevirt-vmi-edit"


# ---- the tenant ----------------------------------------------------------------------------


@dataclass
class Tenant:
    namespace: str
    client: pykube.HTTPClient
    username: str


@pytest.fixture(scope="module")
def vmi_edit_role(api: pykube.HTTPClient) -> str:
    role = {
        "metadata": {"name": VMI_EDIT},
        "rules": [
            {
                "apiGroups": ["kubevirt.io"],
                "resources": ["virtualmachineinstances"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
            }
        ],
    }
    live = pykube.ClusterRole.objects(api).get_or_none(name=VMI_EDIT)
    if live is None:
        pykube.ClusterRole(api, role).create()
    return VMI_EDIT


def tenant_in(api: pykube.HTTPClient, namespace: str, vmi_role: str) -> Tenant:
    """A ServiceAccount ``alice`` in ``namespace`` with ``edit`` and the VMI role there, and
    a client holding her token, once RBAC lets her write what a tenant writes."""
    wait_for(
        f"the default ServiceAccount of {namespace}",
        lambda: pykube.ServiceAccount.objects(api, namespace=namespace).get_or_none(name="default"),
    )
    pykube.ServiceAccount(api, {"metadata": {"name": "alice", "namespace": namespace}}).create()
    for role in ("edit", vmi_role):
        pykube.RoleBinding(
            api,
            {
                "metadata": {"name": f"alice-{role.replace(':', '-')}", "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": namespace}],
            },
        ).create()
    client = accounts.client(api, namespace, "alice")
    wanted = [
        ("", "pods", "create"),
        ("", "pods", "update"),
        (names.GROUP, names.GPU_CLAIMS, "create"),
        (names.GROUP, names.GPU_CLAIMS, "update"),
        (names.KUBEVIRT_GROUP, names.VMIS, "create"),
        (names.KUBEVIRT_GROUP, names.VMIS, "update"),
    ]
    for group, resource, verb in wanted:
        wait_for(
            f"alice may {verb} {resource}",
            functools.partial(allowed, client, namespace, group, resource, verb),
        )
    return Tenant(namespace, client, f"system:serviceaccount:{namespace}:alice")


def allowed(
    client: pykube.HTTPClient, namespace: str, group: str, resource: str, verb: str
) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "namespace": namespace,
                "group": group,
                "resource": resource,
                "verb": verb,
            }
        },
    }
    r = client.post(
        version="authorization.k8s.io/v1", url="selfsubjectaccessreviews", data=json.dumps(review)
    )
    client.raise_for_status(r)
    return r.json()["status"].get("allowed") is True


def says(r: list[Refusal], *fragments: str) -> None:
    assert r[0].code == 403, r[0]
    for fragment in fragments:
        assert fragment in r[0].message, f"{fragment!r} not in refusal: {r[0].message}"


# ---- objects -------------------------------------------------------------------------------


def pod_doc(
    namespace: str,
    name: str,
    *,
    limits: dict[str, str] | None = None,
    init_requests: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owners: list[Obj] | None = None,
    gated: bool = False,
) -> Obj:
    spec: Obj = {
        "automountServiceAccountToken": False,
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "c", "image": "x", "resources": {"limits": limits or {}}}],
    }
    if init_requests:
        spec["initContainers"] = [
            # Extended resources need a limit equal to the request.
            {
                "name": "i",
                "image": "x",
                "resources": {"requests": init_requests, "limits": init_requests},
            }
        ]
    if gated:
        spec["schedulingGates"] = [{"name": names.PLACEMENT_GATE}]
    meta: Obj = {"name": name, "namespace": namespace, "labels": labels or {}}
    if annotations:
        meta["annotations"] = annotations
    if owners:
        meta["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def vmi_owner(name: str, uid: str) -> Obj:
    return {
        "apiVersion": names.KUBEVIRT_API_VERSION,
        "kind": names.VMI_KIND,
        "name": name,
        "uid": uid,
        "controller": True,
    }


def vmi_doc(
    namespace: str,
    name: str,
    *,
    gpus: list[Obj] | None = None,
    host_devices: list[Obj] | None = None,
    refs: list[Obj] | None = None,
) -> Obj:
    devices: Obj = {}
    if gpus is not None:
        devices["gpus"] = gpus
    if host_devices is not None:
        devices["hostDevices"] = host_devices
    meta: Obj = {"name": name, "namespace": namespace}
    if refs is not None:
        meta["labels"] = {names.CLAIMS_LABEL: names.TRUE}
        meta["annotations"] = {names.CLAIMS_ANNOTATION: json.dumps(refs)}
    return {
        "apiVersion": names.KUBEVIRT_API_VERSION,
        "kind": names.VMI_KIND,
        "metadata": meta,
        "spec": {"domain": {"devices": devices, "resources": {"requests": {"memory": "1Gi"}}}},
    }


def claim_doc(namespace: str, name: str, class_name: str, count: int = 1) -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "finalizers": [names.CLAIM_PROTECTION_FINALIZER],
        },
        "spec": {"className": class_name, "count": count},
    }


def policy_params(api: pykube.HTTPClient, deployed: Deployed) -> pykube.ConfigMap:
    found: pykube.ConfigMap = pykube.ConfigMap.objects(api, namespace=deployed.namespace).get(
        name=names.POLICY_PARAMS_CONFIGMAP
    )
    return found


# ---- policies alone: no operator process ----------------------------------------------------


@pytest.fixture
def params_naming(api: pykube.HTTPClient, deployed: Deployed) -> Iterator[str]:
    """The policies' parameter naming one fresh resource as a class's (what the operator
    writes when a class names it), restored afterwards."""
    resource = f"example.com/gpu-{uuid.uuid4().hex[:6]}"
    cm = policy_params(api, deployed)
    before = copy.deepcopy(cm.obj.get("data") or {})
    kube.mutate(cm, lambda o: o.setdefault("data", {}).__setitem__("resourceNames", resource))
    yield resource
    kube.mutate(cm, lambda o: o.__setitem__("data", before))


def test_without_any_operator_the_policies_alone_refuse_every_attack(
    api: pykube.HTTPClient,
    deployed: Deployed,
    namespace: str,
    vmi_edit_role: str,
    kubevirt_controller: pykube.HTTPClient,
    params_naming: str,
) -> None:
    """No operator runs and no webhook is registered (this module's operator starts with its
    first test that asks for it, after this one): the API server alone refuses each attack,
    and KubeVirt's and the operator's own writes pass."""
    assert (
        MutatingWebhookConfiguration.objects(api).get_or_none(
            name=names.MUTATING_WEBHOOK_CONFIGURATION
        )
        is None
    ), "an operator serves webhooks: this test needs none"
    resource = params_naming
    alice = tenant_in(api, namespace, vmi_edit_role)
    wait_for(
        "the new parameters to reach the API server's policies",
        lambda: pykube.Pod(alice.client, pod_doc(namespace, "probe", limits={resource: "1"})),
        until=_refused_dry_run,
    )

    # A pod of her own taking a class's resource, in a container or an init container.
    with refused(403) as r:
        pykube.Pod(alice.client, pod_doc(namespace, "mine", limits={resource: "1"})).create()
    says(
        r,
        f"pod {namespace}/mine requests {resource}",
        "spec.containers[] or spec.initContainers[]",
        f"only KubeVirt's controller service account {CONTROLLER_USERNAME} may create such a pod",
        f"{alice.username} may not",
    )
    with refused(403) as r:
        pykube.Pod(alice.client, pod_doc(namespace, "init", init_requests={resource: "1"})).create()
    says(r, f"requests {resource}", alice.username)

    # A pod dressed as a launcher pod (no webhook runs: the policy alone refuses it).
    dressed = pod_doc(
        namespace,
        "dressed",
        labels={names.KUBEVIRT_LABEL: names.VIRT_LAUNCHER, names.CLAIMS_LABEL: names.TRUE},
        annotations={names.CLAIMS_ANNOTATION: '[{"claim":"someone-elses"}]'},
        owners=[vmi_owner("vm", str(uuid.uuid4()))],
    )
    with refused(403) as r:
        pykube.Pod(alice.client, dressed).create()
    says(r, "carries the label gpu.cozystack.io/claims", CONTROLLER_USERNAME, alice.username)

    # KubeVirt's controller may, for a VMI that controls the pod, and only so.
    made = pykube.Pod(
        kubevirt_controller,
        pod_doc(
            namespace,
            "launcher",
            limits={resource: "1"},
            owners=[vmi_owner("vm", str(uuid.uuid4()))],
        ),
    )
    made.create()
    with refused(403) as r:
        pykube.Pod(
            kubevirt_controller, pod_doc(namespace, "orphan", limits={resource: "1"})
        ).create()
    says(r, "metadata.ownerReferences must hold a controller reference", "VirtualMachineInstance")

    # VMIs naming the resource raw, as gpus (under any name) or host devices.
    for gpus in (
        [{"name": "mine", "deviceName": resource}],
        [{"name": "gpuop-0", "deviceName": resource}],
    ):
        with refused(403) as r:
            VirtualMachineInstance(alice.client, vmi_doc(namespace, "raw", gpus=gpus)).create()
        says(
            r,
            f"VirtualMachineInstance {namespace}/raw: spec.domain.devices.gpus names "
            f"{gpus[0]['name']} (deviceName {resource})",
            "only through claim references",
        )
    with refused(403) as r:
        VirtualMachineInstance(
            alice.client,
            vmi_doc(namespace, "host", host_devices=[{"name": "h", "deviceName": resource}]),
        ).create()
    says(r, "spec.domain.devices.hostDevices names h (deviceName " + resource, "never as host")
    # A resource no class names stays hers to use.
    other = VirtualMachineInstance(
        alice.client,
        vmi_doc(namespace, "other", gpus=[{"name": "g", "deviceName": "example.com/no-class"}]),
    )
    other.create()

    # The claims label and annotation added after create (finding: a template claim ordered
    # without the webhook's checks).
    # A merge patch, as `kubectl label` and `annotate` send it: KubeVirt writes the VMI's
    # status meanwhile, so an update would only meet a conflict, never the policy.
    plain = VirtualMachineInstance(alice.client, vmi_doc(namespace, "plain"))
    plain.create()
    late = {
        "metadata": {
            "labels": {names.CLAIMS_LABEL: names.TRUE},
            "annotations": {
                names.CLAIMS_ANNOTATION: json.dumps(
                    [{"claimTemplate": {"className": "x", "count": 64}}]
                )
            },
        }
    }
    with refused(403) as r:
        plain.patch(late)
    says(
        r,
        f"VirtualMachineInstance {namespace}/plain: the label and annotation "
        "gpu.cozystack.io/claims",
        f"only by the operator {deployed.username} or KubeVirt's controller {CONTROLLER_USERNAME}",
        f"{alice.username} may not",
    )

    # The placement gate: hers to keep, the operator's to lift.
    gated = pykube.Pod(alice.client, pod_doc(namespace, "gated", gated=True))
    gated.create()
    gated.obj["spec"]["schedulingGates"] = []
    with refused(403) as r:
        replace(gated)
    says(
        r,
        f"pod {namespace}/gated: the scheduling gate gpu.cozystack.io/placement in "
        "spec.schedulingGates may be removed only by the operator " + deployed.username,
        f"{alice.username} may not remove it",
    )
    operator = kube.client(deployed.kubeconfig)
    operator_patch(operator, namespace, "gated")
    assert (
        not pykube.Pod.objects(api, namespace=namespace)
        .get(name="gated")
        .obj["spec"]
        .get("schedulingGates")
    )

    # The claim-protection finalizer of her own claim.
    claim = GPUClaim(alice.client, claim_doc(namespace, "hold", "any-class"))
    claim.create()
    claim.obj["metadata"]["finalizers"] = []
    with refused(403) as r:
        replace(claim)
    says(
        r,
        f"GPUClaim {namespace}/hold: the finalizer gpu.cozystack.io/claim-protection in "
        "metadata.finalizers may be removed only by the operator " + deployed.username,
        f"{alice.username} may not remove it",
    )
    stored = GPUClaim.objects(api, namespace=namespace).get(name="hold").obj
    assert names.CLAIM_PROTECTION_FINALIZER in stored["metadata"]["finalizers"]
    # The operator's release passes (its RBAC updates claims).
    by_operator = GPUClaim.objects(operator, namespace=namespace).get(name="hold")
    by_operator.obj["metadata"]["finalizers"] = []
    replace(by_operator)


def _refused_dry_run(pod: pykube.Pod) -> bool:
    r = pod.api.post(
        **pod.api_kwargs(data=json.dumps(pod.obj), obj_list=True, params={"dryRun": "All"})
    )
    return bool(r.status_code == 403)


def operator_patch(operator: pykube.HTTPClient, namespace: str, name: str) -> None:
    """Lift the gate as the placement controller does: a JSON patch of the pod."""
    r = operator.patch(
        version="v1",
        namespace=namespace,
        url=f"pods/{name}",
        data=json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}]),
        headers={"Content-Type": "application/json-patch+json"},
    )
    operator.raise_for_status(r)


# ---- with the operator ----------------------------------------------------------------------


@pytest.fixture
def alice(api: pykube.HTTPClient, tenant: str, vmi_edit_role: str) -> Tenant:
    """A tenant of the module's operator, with the KubeVirt stand-in running."""
    return tenant_in(api, tenant, vmi_edit_role)


def resource_names(api: pykube.HTTPClient, deployed: Deployed) -> list[str]:
    data = policy_params(api, deployed).obj.get("data") or {}
    return [r for r in str(data.get("resourceNames") or "").split(",") if r]


def params_name(api: pykube.HTTPClient, deployed: Deployed, resource: str) -> None:
    wait_for(
        f"the policy parameters to name {resource}",
        lambda: resource_names(api, deployed),
        until=lambda found: resource in found,
        timeout=CONVERGE,
    )


def test_the_operator_keeps_the_policy_parameters_current(
    api: pykube.HTTPClient, deployed: Deployed, hooks: object, fleet: Fleet
) -> None:
    cls = fleet.gpu_class()
    params_name(api, deployed, fleet.resource)
    data = policy_params(api, deployed).obj["data"]
    assert data["operatorServiceAccount"] == deployed.username
    assert data["kubevirtServiceAccount"] == CONTROLLER_USERNAME
    assert data["exemptNamespaces"] == "gpu-hoster"
    found = resource_names(api, deployed)
    assert found == sorted(set(found))
    # A hand edit is put right at once (the controller watches the ConfigMap).
    kube.mutate(policy_params(api, deployed), lambda o: o["data"].__setitem__("resourceNames", ""))
    params_name(api, deployed, fleet.resource)
    # The class gone, its resource is no longer guarded.
    GPUClass.objects(api).get(name=cls).delete()
    wait_for(
        f"{fleet.resource} dropped from the policy parameters",
        lambda: resource_names(api, deployed),
        until=lambda found: fleet.resource not in found,
        timeout=CONVERGE,
    )
    fleet.classes.clear()


def test_a_tenant_cannot_take_a_classs_units_with_a_pod_of_her_own(
    api: pykube.HTTPClient, deployed: Deployed, fleet: Fleet, alice: Tenant
) -> None:
    ns = alice.namespace
    fleet.gpu_class()
    fleet.node(4)
    params_name(api, deployed, fleet.resource)
    with refused(403) as r:
        pykube.Pod(alice.client, pod_doc(ns, "mine", limits={fleet.resource: "2"})).create()
    says(r, f"pod {ns}/mine requests {fleet.resource}", CONTROLLER_USERNAME, alice.username)
    # Dressed as a launcher pod: the pod webhook (which runs first) refuses to dress it.
    dressed = pod_doc(
        ns,
        "dressed",
        labels={names.KUBEVIRT_LABEL: names.VIRT_LAUNCHER, names.CLAIMS_LABEL: names.TRUE},
        annotations={names.CLAIMS_ANNOTATION: '[{"claim":"hold"}]'},
        owners=[vmi_owner("vm", str(uuid.uuid4()))],
    )
    with refused(403) as r:
        pykube.Pod(alice.client, dressed).create()
    says(
        r,
        f"Pod {ns}/dressed",
        f"only KubeVirt's controller service account {CONTROLLER_USERNAME} may create them",
        f"{alice.username} may not",
    )
    assert list(pykube.Pod.objects(api, namespace=ns)) == []


def test_a_vmi_names_a_classs_gpus_only_through_claim_references(
    api: pykube.HTTPClient, deployed: Deployed, fleet: Fleet, alice: Tenant
) -> None:
    ns = alice.namespace
    cls = fleet.gpu_class(maxCount=1)
    fleet.node(4)
    params_name(api, deployed, fleet.resource)
    with refused(403) as r:
        VirtualMachineInstance(
            alice.client, vmi_doc(ns, "raw", gpus=[{"name": "g", "deviceName": fleet.resource}])
        ).create()
    says(r, f"spec.domain.devices.gpus names g (deviceName {fleet.resource})")
    with refused(403) as r:
        VirtualMachineInstance(
            alice.client,
            vmi_doc(ns, "host", host_devices=[{"name": "h", "deviceName": fleet.resource}]),
        ).create()
    says(r, f"spec.domain.devices.hostDevices names h (deviceName {fleet.resource})")
    # Labelled after create, with a template the webhook would refuse (count > maxCount).
    plain = VirtualMachineInstance(alice.client, vmi_doc(ns, "plain"))
    plain.create()
    # A merge patch without a resourceVersion: the KubeVirt stand-in, when an earlier test
    # of the session started it, writes the VMI's status meanwhile, and a stale version
    # would be refused with 409 before the policy is asked.
    template = [{"claimTemplate": {"className": cls, "count": 64}}]
    patch = {
        "metadata": {
            "labels": {names.CLAIMS_LABEL: names.TRUE},
            "annotations": {names.CLAIMS_ANNOTATION: json.dumps(template)},
        }
    }
    with refused(403) as r:
        plain.patch(patch)
    says(r, "the label and annotation gpu.cozystack.io/claims", f"{alice.username} may not")
    assert list(GPUClaim.objects(api, namespace=ns)) == []


def launcher_pod(api: pykube.HTTPClient, namespace: str) -> pykube.Pod:
    pod: pykube.Pod = wait_for(
        "the VM's launcher pod",
        lambda: next(
            iter(
                pykube.Pod.objects(api, namespace=namespace).filter(
                    selector={names.KUBEVIRT_LABEL: names.VIRT_LAUNCHER}
                )
            ),
            None,
        ),
        timeout=CONVERGE,
    )
    return pod


def test_holds_stay_held_against_the_tenants_own_edits_and_the_operator_releases_them(
    api: pykube.HTTPClient,
    deployed: Deployed,
    fleet: Fleet,
    alice: Tenant,
    kubevirt: object,
) -> None:
    """A VM waits gated for units another claim holds; the tenant can neither lift the
    gate, nor rewrite the pod's or the VMI's references or devices, nor drop the other
    claim's finalizer. Deleting that claim (the legitimate way) frees the units: the
    operator releases it, binds the VM's template claim and lifts the gate."""
    ns = alice.namespace
    cls = fleet.gpu_class()
    fleet.node(4)
    published(api, cls, 4)
    params_name(api, deployed, fleet.resource)
    create_claim(alice.client, ns, "other", cls, 2)
    bound_node(api, ns, "other", timeout=CONVERGE)
    VirtualMachineInstance(
        alice.client, vmi_doc(ns, "vm", refs=[{"claimTemplate": {"className": cls, "count": 4}}])
    ).create()
    pod = launcher_pod(api, ns)
    assert pod.obj["spec"].get("schedulingGates") == [{"name": names.PLACEMENT_GATE}]
    mine = pykube.Pod.objects(alice.client, namespace=ns).get(name=pod.name)

    mine.obj["spec"]["schedulingGates"] = []
    with refused(403) as r:
        replace(mine)
    says(r, "the scheduling gate gpu.cozystack.io/placement", f"{alice.username} may not")
    mine.reload()
    mine.obj["metadata"]["annotations"][names.CLAIMS_ANNOTATION] = '[{"claim":"other"}]'
    with refused(403) as r:
        replace(mine)
    says(r, f"{alice.username} may not change the annotation")
    mine.reload()
    del mine.obj["metadata"]["labels"][names.CLAIMS_LABEL]
    with refused(403) as r:
        replace(mine)
    says(r, f"{alice.username} may not remove the label")

    vm = VirtualMachineInstance.objects(alice.client, namespace=ns).get(name="vm")
    gpus = vm.obj["spec"]["domain"]["devices"]["gpus"]
    assert [g["deviceName"] for g in gpus] == [fleet.resource] * 4
    gpus.append({"name": "gpuop-4", "deviceName": fleet.resource})
    with refused(403) as r:
        replace(vm)
    says(r, "spec.domain.devices.gpus", f"{alice.username} may not change them")
    vm.reload()
    del vm.obj["metadata"]["labels"][names.CLAIMS_LABEL]
    with refused(403) as r:
        replace(vm)
    says(r, "the label and annotation gpu.cozystack.io/claims", f"{alice.username} may not")

    other = GPUClaim.objects(alice.client, namespace=ns).get(name="other")
    other.obj["metadata"]["finalizers"] = []
    with refused(403) as r:
        replace(other)
    says(r, f"GPUClaim {ns}/other: the finalizer gpu.cozystack.io/claim-protection")
    wait_for(
        "the claim's usage record, kept",
        lambda: Workload.objects(api, namespace=ns).get_or_none(name=names.workload_name("other")),
        timeout=CONVERGE,
    )
    stored = GPUClaim.objects(api, namespace=ns).get(name="other").obj
    assert names.CLAIM_PROTECTION_FINALIZER in stored["metadata"]["finalizers"]

    # The legitimate path: the tenant deletes her claim, the operator does the rest.
    other.reload()
    other.delete()
    wait_for(
        "the released claim gone",
        lambda: GPUClaim.objects(api, namespace=ns).get_or_none(name="other") is None,
        timeout=CONVERGE,
    )
    wait_for(
        "the launcher pod pinned and its gate lifted by the operator",
        lambda: pykube.Pod.objects(api, namespace=ns).get(name=pod.name).obj["spec"],
        until=lambda spec: not spec.get("schedulingGates"),
        timeout=CONVERGE,
    )
