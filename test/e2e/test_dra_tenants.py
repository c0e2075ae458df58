"""One allocator per device, on the real control plane (docs/design.md §5 "DRA classes", §6;
``config/policy/dra-claims.yaml``): the API server lets any allocator give a device to a
ResourceClaim, so a DRA class's devices are handed out by the binder alone.

* A tenant (the built-in ``edit`` role) is refused a ResourceClaim or ResourceClaimTemplate
  naming the class's DeviceClass (``exactly`` or a ``firstAvailable`` alternative), with the
  field, the DeviceClass and what to do instead; so is a cluster administrator in her
  namespace; a claim or template of another DeviceClass is hers; a template's spec cannot be
  changed afterwards to name the class's DeviceClass; a template admitted before its
  DeviceClass became a class's yields no claim (kube-controller-manager is refused too).
* In the exempt hoster namespace a pod on a template for the class's DeviceClass is placed
  by kube-scheduler on a free device, never on one a hold has; the device it takes is
  counted as used (an order for it waits) and the class's ``DevicesHeldOutside`` condition
  names it; with every device held a second such pod stays unschedulable; once the pod is
  gone the waiting order gets the device.
* Deleting a GPUClaim frees its device: its ResourceClaim goes, and an order waiting for a
  device gets that one.
* A DeviceClass's ``extendedResourceName`` joins the guarded resource names: a tenant's pod
  asking for it by name is refused as a pod asking for a device-plugin resource.

The oracle is what the API server holds (the ResourceClaims' allocations, the pods, the
GPUClaims and GPUClass as stored) and kube-scheduler's own conditions, never the ledger."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path

import pykube
import pytest

from gpuoperator import names
from gpuoperator.kinds import DeviceClass, GPUClaim, GPUClass, ResourceClaim
from gpuoperator.model import dra_holds
from gpuoperator.runtime.kinds import ValidatingAdmissionPolicy
from harness import dra_driver, kube, objects
from harness.claims import create_claim
from harness.dra_claims import DraClaims
from harness.dra_driver import DRIVER, DraNodeGroup, GpuGroup
from harness.kube import Obj, refused
from harness.operator import Deployed, Start
from harness.tenancy import as_tenant, tenant_user
from harness.waiting import wait_for

pytestmark = pytest.mark.operator_process  # it starts its own replicas

TAG = uuid.uuid4().hex[:5]
#: One node with two A10s: with one held by a GPUClaim, the other is the last free device.
NODE = f"dratenant-{TAG}-a"
PROFILE = [DraNodeGroup(name=NODE, gpus=[GpuGroup(model="A10", count=2)])]
DEVICES = {"gpu-0", "gpu-1"}
DEVICE_CLASS = f"a10-tenants-{TAG}.example.com"
#: Selects the same devices, but no GPU class names it: not the catalog's.
OTHER_CLASS = f"a10-tenants-other-{TAG}.example.com"
SELECTOR = f'device.attributes["{DRIVER}"].uuid.startsWith("GPU-{NODE}-")'
CLASS = f"dra-tenants-{TAG}"
TIMEOUT = 90.0
RESOURCE_CLAIM_TEMPLATE = "ResourceClaimTemplate"


class World(DraClaims):
    def __init__(self, api: pykube.HTTPClient, namespace: str) -> None:
        super().__init__(api, namespace, TIMEOUT)

    def allocations(self, *namespaces: str) -> dict[tuple[str, str], list[str]]:
        """The devices of this module's node that each ResourceClaim of ``namespaces`` (the
        module's own by default) holds, by ResourceClaim."""
        out: dict[tuple[str, str], list[str]] = {}
        for ns in namespaces or (self.namespace,):
            for c in ResourceClaim.objects(self.api, namespace=ns):
                held = [r.device for r in dra_holds.allocated(c.obj) if r.pool == NODE]
                if held:
                    out[(ns, c.obj["metadata"]["name"])] = held
        return out

    def gpu_class(self) -> Obj:
        obj: Obj = GPUClass.objects(self.api).get(name=CLASS).obj
        return obj


def held_outside(cls: Obj) -> Obj | None:
    for c in (cls.get("status") or {}).get("conditions") or []:
        if c.get("type") == "DevicesHeldOutside":
            found: Obj = c
            return found
    return None


@pytest.fixture(scope="module")
def world(api: pykube.HTTPClient) -> Iterator[World]:
    ns = f"dratenant-{TAG}"
    device_classes = [
        dra_driver.device_class(DEVICE_CLASS, SELECTOR),
        dra_driver.device_class(OTHER_CLASS, SELECTOR),
    ]
    with dra_driver.installed(api, ns, PROFILE, device_classes):
        source = {"dra": {"deviceClassName": DEVICE_CLASS}}
        cls = GPUClass(api, objects.gpuclass(CLASS, source=source, vendor="nvidia", model="A10"))
        cls.create()
        try:
            yield World(api, ns)
        finally:
            for claim in GPUClaim.objects(api, namespace=ns):
                claim.delete()
            cls.delete()


def params_name_the_device_class(api: pykube.HTTPClient, deployed: Deployed) -> None:
    def listed() -> list[str]:
        found = pykube.ConfigMap.objects(api, namespace=deployed.namespace).get(
            name=names.POLICY_PARAMS_CONFIGMAP
        )
        return str((found.obj.get("data") or {}).get("deviceClassNames") or "").split(",")

    wait_for(f"the policy parameters to name {DEVICE_CLASS}", listed, lambda d: DEVICE_CLASS in d)


def request(device_class: str) -> Obj:
    return {"name": "gpu", "exactly": {"deviceClassName": device_class}}


def resource_claim(namespace: str, name: str, *requests: Obj) -> Obj:
    return {
        "apiVersion": names.DRA_API_VERSION,
        "kind": names.RESOURCE_CLAIM_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": list(requests)}},
    }


def template(namespace: str, name: str, *requests: Obj) -> Obj:
    return {
        "apiVersion": names.DRA_API_VERSION,
        "kind": RESOURCE_CLAIM_TEMPLATE,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": list(requests)}}},
    }


def template_kind(client: pykube.HTTPClient) -> type[pykube.objects.APIObject]:
    kind: type[pykube.objects.APIObject] = pykube.object_factory(
        client, names.DRA_API_VERSION, RESOURCE_CLAIM_TEMPLATE
    )
    return kind


def pod_on_template(namespace: str, name: str, template_name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


def scheduled(pod: pykube.Pod) -> Obj | None:
    """kube-scheduler's PodScheduled condition on the pod, once it has judged it."""
    pod.reload()
    for c in (pod.obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            found: Obj = c
            return found
    return None


def gone(api: pykube.HTTPClient, namespace: str, name: str) -> None:
    wait_for(
        f"pod {namespace}/{name} to be gone",
        lambda: pykube.Pod.objects(api, namespace=namespace).get_or_none(name=name),
        lambda p: p is None,
        timeout=TIMEOUT,
    )


def delete_claim(world: World, name: str) -> None:
    GPUClaim.objects(world.api, namespace=world.namespace).get(name=name).delete()
    wait_for(
        f"claim {name} and its ResourceClaim to be gone",
        lambda: (world.claim(name), world.hold(name)),
        lambda both: both == (None, None),
        timeout=TIMEOUT,
    )


# ---- the tenant ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["gpu-operator-dra-claims", "gpu-operator-dra-claim-templates"])
def test_the_policy_type_checks_clean_against_its_kind(
    api: pykube.HTTPClient, deployed: Deployed, policy: str
) -> None:
    """The API server type-checks the expressions against the kind's schema in the
    background; a field the schema lacks or a type mismatch shows up as a warning."""
    seen = wait_for(
        f"{policy}'s type-checking status",
        lambda: dict(ValidatingAdmissionPolicy.objects(api).get(name=policy).obj),
        until=lambda p: (
            p.get("status", {}).get("observedGeneration") == p["metadata"]["generation"]
        ),
        timeout=120,
    )
    assert seen["status"].get("typeChecking", {}).get("expressionWarnings", []) == []


def test_a_tenant_is_refused_claims_and_templates_of_the_class_device_class_but_not_others(
    world: World,
    start_operator: Start,
    deployed: Deployed,
    api: pykube.HTTPClient,
    kubeconfig: Path,
) -> None:
    start_operator()
    params_name_the_device_class(api, deployed)
    ns = world.namespace
    tenant = as_tenant(kubeconfig, api, ns)
    user = tenant_user(ns)

    with refused(403) as direct:
        ResourceClaim(tenant, resource_claim(ns, "direct", request(DEVICE_CLASS))).create()
    assert direct[0].names(
        f"ResourceClaim {ns}/direct spec.devices.requests[0].exactly.deviceClassName names"
        f" DeviceClass {DEVICE_CLASS}",
        f"{user} may not create such a ResourceClaim here",
        f"order a GPUClaim of the GPUClass that serves DeviceClass {DEVICE_CLASS}",
        deployed.username,
    ), direct[0].message

    # An alternative of a prioritized list is an ask for the DeviceClass too.
    alternatives = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "other", "deviceClassName": OTHER_CLASS},
            {"name": "catalog", "deviceClassName": DEVICE_CLASS},
        ],
    }
    with refused(403) as listed:
        ResourceClaim(
            tenant, resource_claim(ns, "listed", request(OTHER_CLASS) | {"name": "a"}, alternatives)
        ).create()
    assert listed[0].names(
        "spec.devices.requests[1].firstAvailable[1].deviceClassName names DeviceClass "
        + DEVICE_CLASS
    ), listed[0].message

    kind = template_kind(tenant)
    with refused(403) as templated:
        kind(tenant, template(ns, "templated", request(DEVICE_CLASS))).create()
    assert templated[0].names(
        f"ResourceClaimTemplate {ns}/templated spec.spec.devices.requests[0].exactly"
        f".deviceClassName names DeviceClass {DEVICE_CLASS}",
        f"order a GPUClaim of the GPUClass that serves DeviceClass {DEVICE_CLASS}",
    ), templated[0].message

    # A cluster administrator gets no pass in a tenant's namespace: hers would be a second
    # allocator too.
    with refused(403) as admin:
        ResourceClaim(api, resource_claim(ns, "admins", request(DEVICE_CLASS))).create()
    assert admin[0].names(f"DeviceClass {DEVICE_CLASS}"), admin[0].message

    # Another DeviceClass is hers to ask for, in a claim or a template.
    ResourceClaim(tenant, resource_claim(ns, "hers", request(OTHER_CLASS))).create()
    mine = kind(tenant, template(ns, "hers", request(OTHER_CLASS)))
    mine.create()
    # The API server keeps a template's spec immutable: it cannot be turned into an ask for
    # the class's DeviceClass afterwards (the policy backs this up on UPDATE).
    changed = copy.deepcopy(mine.obj)
    changed["spec"]["spec"]["devices"]["requests"] = [request(DEVICE_CLASS)]
    with refused(422) as immutable:
        kube.replace(kind(tenant, changed))
    assert immutable[0].names("spec", "immutable"), immutable[0].message
    stored = template_kind(api).objects(api, namespace=ns).get(name="hers").obj
    [kept] = stored["spec"]["spec"]["devices"]["requests"]
    assert kept["exactly"]["deviceClassName"] == OTHER_CLASS
    # Nothing was made for the refused asks.
    assert {c.obj["metadata"]["name"] for c in ResourceClaim.objects(api, namespace=ns)} == {"hers"}
    ResourceClaim.objects(tenant, namespace=ns).get(name="hers").delete()
    mine.delete()


# ---- the exempt namespace -----------------------------------------------------------------


def test_an_exempt_pod_gets_a_free_device_never_a_held_one_and_is_counted_as_used(
    world: World, start_operator: Start, hoster_namespace: str
) -> None:
    start_operator()
    create_claim(world.api, world.namespace, "first", CLASS, 1)
    [held] = [d["device"] for d in world.bound("first")["status"]["devices"]]
    wait_for(
        "the hold to be allocated",
        world.allocations,
        lambda a: a == {(world.namespace, "first"): [held]},
        timeout=TIMEOUT,
    )
    [free] = DEVICES - {held}

    # The hoster's job: a pod on a template for the class's DeviceClass, admitted there.
    hoster = hoster_namespace
    template_kind(world.api)(world.api, template(hoster, "catalog", request(DEVICE_CLASS))).create()
    job = pykube.Pod(world.api, pod_on_template(hoster, "job", "catalog"))
    job.create()
    wait_for(
        "kube-scheduler to run the job on the node",
        lambda: (job.reload(), job.obj)[1],
        lambda p: p["spec"].get("nodeName") == NODE and p["status"].get("phase") == "Running",
        timeout=TIMEOUT,
    )
    taken = world.allocations(world.namespace, hoster)
    [job_claim] = [k for k in taken if k[0] == hoster]
    assert taken == {(world.namespace, "first"): [held], job_claim: [free]}  # never the held one

    # The device it took is counted as used and named on the class.
    def named(cls: Obj) -> bool:
        condition = held_outside(cls)
        return (
            condition is not None
            and condition["status"] == "True"
            and f"{DRIVER}/{NODE}/{free} on node {NODE} by ResourceClaim {hoster}/{job_claim[1]}"
            in condition["message"]
        )

    cls = wait_for("the class to name the job's device", world.gpu_class, named, timeout=TIMEOUT)
    assert cls["status"]["free"] == 0
    assert held_outside(cls) is not None
    reasons = wait_for(
        "a DevicesHeldOutside Event on the class",
        lambda: {
            e.obj.get("reason")
            for e in pykube.Event.objects(world.api, namespace="default").filter(
                field_selector={"involvedObject.name": CLASS}
            )
        },
        lambda found: "DevicesHeldOutside" in found,
        timeout=TIMEOUT,
    )
    assert "DevicesHeldOutside" in reasons

    # An order for the last device waits: the binder never hands out the job's device.
    create_claim(world.api, world.namespace, "second", CLASS, 1)
    waiting = world.waiting("second")
    assert waiting["status"].get("phase") == "Pending" and not waiting["status"].get("devices")

    # With every device held, a second job stays unschedulable.
    second_job = pykube.Pod(world.api, pod_on_template(hoster, "job-2", "catalog"))
    second_job.create()
    judged = wait_for("kube-scheduler to judge job-2", lambda: scheduled(second_job))
    assert judged is not None
    assert (judged["status"], judged.get("reason")) == ("False", "Unschedulable")
    assert not second_job.obj["spec"].get("nodeName")
    second_job.delete()
    gone(world.api, hoster, "job-2")
    after = world.allocations(world.namespace, hoster)
    assert after == {(world.namespace, "first"): [held], job_claim: [free]}

    # The job gone, its claim goes with it and the waiting order gets the device.
    job.delete()
    gone(world.api, hoster, "job")
    second = world.bound("second")
    assert [d["device"] for d in second["status"]["devices"]] == [free]
    cleared = wait_for(
        "the class condition to clear",
        world.gpu_class,
        lambda c: (held_outside(c) or {}).get("status") == "False",
        timeout=TIMEOUT,
    )
    assert held_outside(cleared) is not None
    delete_claim(world, "first")
    delete_claim(world, "second")


# ---- freeing a device ---------------------------------------------------------------------


def test_deleting_a_gpuclaim_frees_its_device_and_a_waiting_order_gets_it(
    world: World, start_operator: Start
) -> None:
    start_operator()
    create_claim(world.api, world.namespace, "a", CLASS, 1)
    create_claim(world.api, world.namespace, "b", CLASS, 1)
    a = world.bound("a")
    b = world.bound("b")
    [a_device] = [d["device"] for d in a["status"]["devices"]]
    assert {a_device, *(d["device"] for d in b["status"]["devices"])} == DEVICES
    create_claim(world.api, world.namespace, "c", CLASS, 1)
    world.waiting("c")

    delete_claim(world, "a")  # its ResourceClaim is gone with it
    c = world.bound("c")
    assert [d["device"] for d in c["status"]["devices"]] == [a_device]
    held = world.allocations()
    assert held[(world.namespace, "c")] == [a_device]
    assert sorted(d for ds in held.values() for d in ds) == sorted(DEVICES)
    delete_claim(world, "b")
    delete_claim(world, "c")


# ---- DRA extended resources -----------------------------------------------------------------


def test_a_dra_device_class_extended_resource_name_is_guarded_as_a_class_resource(
    world: World,
    start_operator: Start,
    deployed: Deployed,
    api: pykube.HTTPClient,
    kubeconfig: Path,
    namespace: str,
) -> None:
    """A DeviceClass with spec.extendedResourceName lets a pod ask kube-scheduler for its
    devices by resource name: the operator adds the name to the guarded resource names, so
    a tenant's pod asking for it is refused as a pod asking for a device-plugin resource."""
    del world  # the module's node and driver, whose devices the DeviceClass selects
    device_class = f"a10-tenants-ext-{TAG}.example.com"
    resource = f"example.com/a10-ext-{TAG}"
    obj = dra_driver.device_class(device_class, SELECTOR)
    obj["spec"]["extendedResourceName"] = resource
    dc = DeviceClass(api, obj)
    dc.create()
    cls = GPUClass(
        api,
        objects.gpuclass(
            f"{CLASS}-ext",
            source={"dra": {"deviceClassName": device_class}},
            vendor="nvidia",
            model="A10",
        ),
    )
    cls.create()
    try:
        assert dc.obj["spec"].get("extendedResourceName") == resource, (
            "the API server dropped spec.extendedResourceName (DRA extended resources off)"
        )
        start_operator()

        def resource_names() -> list[str]:
            found = pykube.ConfigMap.objects(api, namespace=deployed.namespace).get(
                name=names.POLICY_PARAMS_CONFIGMAP
            )
            return str((found.obj.get("data") or {}).get("resourceNames") or "").split(",")

        wait_for(
            f"the policy parameters to name {resource}", resource_names, lambda r: resource in r
        )
        ns = namespace
        tenant = as_tenant(kubeconfig, api, ns)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "by-name", "namespace": ns},
            "spec": {
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"limits": {resource: "1"}}}
                ]
            },
        }
        with refused(403) as by_name:
            pykube.Pod(tenant, pod).create()
        assert by_name[0].names(f"pod {ns}/by-name requests {resource}"), by_name[0].message
    finally:
        cls.delete()
        dc.delete()


def test_a_template_admitted_before_its_device_class_was_a_class_yields_no_claim(
    world: World,
    start_operator: Start,
    deployed: Deployed,
    api: pykube.HTTPClient,
    kubeconfig: Path,
    namespace: str,
) -> None:
    """The control plane gets no pass outside the exempt namespaces: kube-controller-manager's
    resource-claim controller is refused the claim of a template admitted before its
    DeviceClass became a class's, the refusal is in its Event on the pod, and the pod stays
    unscheduled with no ResourceClaim (kube-scheduler has nothing to allocate)."""
    del world  # the module's node and driver, whose devices the DeviceClass selects
    late = f"a10-tenants-late-{TAG}.example.com"
    dc = DeviceClass(api, dra_driver.device_class(late, SELECTOR))
    dc.create()
    tenant = as_tenant(kubeconfig, api, namespace)
    template_kind(tenant)(tenant, template(namespace, "early", request(late))).create()
    cls = GPUClass(
        api,
        objects.gpuclass(
            f"{CLASS}-late", source={"dra": {"deviceClassName": late}}, vendor="nvidia", model="A10"
        ),
    )
    cls.create()
    try:
        start_operator()

        def device_classes() -> list[str]:
            found = pykube.ConfigMap.objects(api, namespace=deployed.namespace).get(
                name=names.POLICY_PARAMS_CONFIGMAP
            )
            return str((found.obj.get("data") or {}).get("deviceClassNames") or "").split(",")

        wait_for(f"the policy parameters to name {late}", device_classes, lambda d: late in d)
        pod = pykube.Pod(tenant, pod_on_template(namespace, "on-early", "early"))
        pod.create()
        messages = wait_for(
            "the resource-claim controller's refusal on the pod",
            lambda: [
                str(e.obj.get("message") or "")
                for e in pykube.Event.objects(api, namespace=namespace).filter(
                    field_selector={"involvedObject.name": "on-early"}
                )
            ],
            lambda found: any(f"names DeviceClass {late}" in m for m in found),
            timeout=TIMEOUT,
        )
        assert any("may not create such a ResourceClaim here" in m for m in messages), messages
        assert list(ResourceClaim.objects(api, namespace=namespace)) == []
        pod.reload()
        assert not pod.obj["spec"].get("nodeName")
        pod.delete()
    finally:
        cls.delete()
        dc.delete()
