"""The tamper policy (docs/design.md §2, §6) on the real API server: only the operator's service
account may set, change or remove the template-claim mark on a GPUClaim.

The shipped policy and binding (``config/policy``, rendered with kustomize) are
cluster-scoped, so this module applies copies under unique names: each binding reads a
``gpu-operator-settings`` ConfigMap in a namespace of its own and is scoped with a
namespace label unique to this module, so no other test is affected. Tenant and operator
act as real service accounts, with tokens from the TokenRequest API.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pykube
import pytest
import yaml
from pykube.objects import APIObject

from gpuoperator import names
from gpuoperator.kinds import GPUClaim
from gpuoperator.runtime.kinds import ValidatingAdmissionPolicy
from harness import accounts
from harness.kube import Obj, Refusal, mutate, refused, replace
from harness.operator import Deployed
from harness.waiting import WaitTimeoutError, wait_for
from localcluster.cluster import REPO, kubectl

POLICY_DIR = REPO / "config" / "policy"
MARK = names.TEMPLATE_CLAIM_LABEL
#: The namespace label a test binding selects (its value names the binding).
SCOPE = "gpuoperator.test/tamper-policy"
RUN = uuid.uuid4().hex[:6]


class ValidatingAdmissionPolicyBinding(APIObject):  # type: ignore[misc]
    version = "admissionregistration.k8s.io/v1"
    endpoint = "validatingadmissionpolicybindings"
    kind = "ValidatingAdmissionPolicyBinding"


# ---- the shipped manifests --------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped(kubeconfig: Path) -> dict[str, Obj]:
    """The policy and binding as the kustomization renders them, by kind."""
    docs = [d for d in yaml.safe_load_all(kubectl(kubeconfig, "kustomize", str(POLICY_DIR))) if d]
    mark = [d for d in docs if d["metadata"]["name"] == "gpu-operator-template-claim-mark"]
    by_kind = {d["kind"]: d for d in mark}
    assert len(mark) == 2
    assert set(by_kind) == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    return by_kind


def test_the_shipped_binding_reads_the_operator_settings_and_denies(
    shipped: dict[str, Obj],
) -> None:
    policy = shipped["ValidatingAdmissionPolicy"]
    binding = shipped["ValidatingAdmissionPolicyBinding"]
    assert policy["metadata"]["name"] == binding["metadata"]["name"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["paramRef"] == {
        "name": names.SETTINGS_CONFIGMAP,
        "namespace": "gpu-operator",
        "parameterNotFoundAction": "Deny",
    }


# ---- copies of the policy on the cluster ------------------------------------------------


@dataclass
class Binding:
    """One copy of the shipped binding, with its own settings namespace."""

    name: str
    #: The namespace holding this binding's ``gpu-operator-settings`` ConfigMap.
    params_namespace: str
    #: Whether that ConfigMap exists.
    has_settings: bool
    #: The username the ConfigMap names as the operator (whether or not it names one).
    operator: str = field(init=False)

    def __post_init__(self) -> None:
        self.operator = f"system:serviceaccount:{self.params_namespace}:gpu-operator"


Bind = Callable[[str, dict[str, str] | None], Binding]


@pytest.fixture(scope="module", autouse=True)
def deployed_binding_steps_aside(
    api: pykube.HTTPClient, shipped: dict[str, Obj], deployed: Deployed
) -> Iterator[None]:
    """The e2e session deploys the shipped binding too (config/overlays/dev); in this
    module's namespaces (labelled ``SCOPE``) only the copies decide. The deployed binding is
    narrowed for the module and restored after, never deleted: Kubernetes 1.36 stops its
    ConfigMap param informer for good once no such binding is left (see ``enforce``)."""
    name = shipped["ValidatingAdmissionPolicyBinding"]["metadata"]["name"]
    live = ValidatingAdmissionPolicyBinding.objects(api).get_or_none(name=name)
    if live is None:
        yield
        return
    original = copy.deepcopy(live.obj["spec"].get("matchResources"))
    outside = {"matchExpressions": [{"key": SCOPE, "operator": "DoesNotExist"}]}

    def narrow(obj: Obj) -> None:
        obj["spec"].setdefault("matchResources", {})["namespaceSelector"] = outside

    def restore(obj: Obj) -> None:
        obj["spec"]["matchResources"] = copy.deepcopy(original)

    mutate(live, narrow)
    try:
        yield
    finally:
        mutate(live, restore)


@pytest.fixture(scope="module")
def policy(api: pykube.HTTPClient, shipped: dict[str, Obj]) -> Iterator[str]:
    """A copy of the shipped policy under a unique name; yields the name."""
    doc = copy.deepcopy(shipped["ValidatingAdmissionPolicy"])
    doc["metadata"] = {"name": f"{doc['metadata']['name']}-{RUN}"}
    p = ValidatingAdmissionPolicy(api, doc)
    p.create()
    yield p.name
    p.delete()


@pytest.fixture(scope="module")
def bind(api: pykube.HTTPClient, shipped: dict[str, Obj], policy: str) -> Iterator[Bind]:
    """``bind(tag, settings)``: a copy of the shipped binding whose parameter is a
    ``gpu-operator-settings`` ConfigMap with ``settings`` as data (None: no ConfigMap; a
    value's ``{operator}`` becomes the binding's operator username), in a namespace of its
    own holding the service account ``gpu-operator``. It applies to namespaces labelled
    ``SCOPE=<binding name>``. Everything it made is deleted when the module ends."""
    made: list[APIObject] = []

    def create(tag: str, settings: dict[str, str] | None) -> Binding:
        b = Binding(f"{policy}-{tag}", f"tamper-{RUN}-{tag}", settings is not None)
        ns = pykube.Namespace(api, {"metadata": {"name": b.params_namespace}})
        ns.create()
        made.append(ns)
        sa = {"metadata": {"name": "gpu-operator", "namespace": b.params_namespace}}
        pykube.ServiceAccount(api, sa).create()
        if settings is not None:
            cm = {
                "metadata": {"name": names.SETTINGS_CONFIGMAP, "namespace": b.params_namespace},
                "data": {k: v.format(operator=b.operator) for k, v in settings.items()},
            }
            pykube.ConfigMap(api, cm).create()
        doc = copy.deepcopy(shipped["ValidatingAdmissionPolicyBinding"])
        doc["metadata"] = {"name": b.name}
        doc["spec"]["policyName"] = policy
        doc["spec"]["paramRef"]["namespace"] = b.params_namespace
        doc["spec"]["matchResources"]["namespaceSelector"] = {"matchLabels": {SCOPE: b.name}}
        binding = ValidatingAdmissionPolicyBinding(api, doc)
        binding.create()
        made.insert(0, binding)
        return b

    yield create
    for obj in made:
        obj.delete()


@pytest.fixture(scope="module")
def operator_bound(bind: Bind) -> Binding:
    """The binding as deployed: the settings name the operator's service account."""
    return bind("op", {"operatorServiceAccount": "{operator}", "placementPolicy": "binpack"})


def test_the_policy_type_checks_clean_against_the_gpuclaim_schema(
    api: pykube.HTTPClient, policy: str
) -> None:
    """The API server type-checks the expressions against the CRD's schema in the
    background; a field the schema lacks or a type mismatch shows up as a warning."""
    seen = wait_for(
        "the policy's type-checking status",
        lambda: dict(ValidatingAdmissionPolicy.objects(api).get(name=policy).obj),
        until=lambda p: (
            p.get("status", {}).get("observedGeneration") == p["metadata"]["generation"]
        ),
        # The API server's policy status controller works through a queue of its own: on a
        # loaded machine the first check of a new policy has been seen to take over 30 s.
        timeout=120,
    )
    assert seen["status"].get("typeChecking", {}).get("expressionWarnings", []) == []


# ---- acting as service accounts ---------------------------------------------------------


def claim_doc(name: str, namespace: str, labels: dict[str, str] | None = None) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace}
    if labels is not None:
        meta["labels"] = labels
    return {
        "apiVersion": names.API_VERSION,
        "kind": "GPUClaim",
        "metadata": meta,
        "spec": {"className": "a10", "count": 1},
    }


def dry_run_marked_create(api: pykube.HTTPClient, namespace: str) -> str:
    """The refusal message for a (dry-run) marked claim, '' when it is admitted."""
    r = api.post(
        version=names.API_VERSION,
        namespace=namespace,
        url=names.GPU_CLAIMS,
        params={"dryRun": "All"},
        data=json.dumps(claim_doc("probe", namespace, {MARK: "true"})),
    )
    return "" if r.ok else str(r.json().get("message", r.text))


def enforce(
    api: pykube.HTTPClient, namespace: str, binding: Binding, until: Callable[[str], bool]
) -> str:
    """Put ``namespace`` in the binding's scope and wait until the policy refuses the admin
    a marked claim there with a message ``until`` accepts (a new binding, a relabelled
    namespace and a new ConfigMap each take a moment to reach the admission plugin)."""
    ns = pykube.Namespace.objects(api).get(name=namespace)
    ns.obj["metadata"].setdefault("labels", {})[SCOPE] = binding.name
    ns.update()
    try:
        return wait_for(
            f"binding {binding.name} to refuse marked claims in {namespace}",
            lambda: dry_run_marked_create(api, namespace),
            until=lambda msg: f"binding '{binding.name}'" in msg and until(msg),
        )
    except WaitTimeoutError as exc:
        if binding.has_settings and "no params found" in str(exc):
            raise AssertionError(
                f"{exc}\nThe ConfigMap {binding.params_namespace}/{names.SETTINGS_CONFIGMAP}"
                " exists, yet the API server finds no params. Kubernetes 1.36 stops its"
                " ConfigMap param informer for good once no binding of a policy with a"
                " ConfigMap paramKind is left (kubernetes/kubernetes#130887, #133827; the fix"
                " #134423 is not in v1.36.5): restart kube-apiserver, or run on a fresh"
                " cluster."
            ) from exc
        raise


@dataclass
class Actors:
    namespace: str
    binding: Binding
    tenant: pykube.HTTPClient
    tenant_user: str
    operator: pykube.HTTPClient

    def claim(self, as_: pykube.HTTPClient, name: str, labels: dict[str, str] | None) -> GPUClaim:
        c = GPUClaim(as_, claim_doc(name, self.namespace, labels))
        c.create()
        return c

    def as_tenant(self, c: GPUClaim) -> GPUClaim:
        """The same claim, freshly read through the tenant's client."""
        fresh: GPUClaim = GPUClaim.objects(self.tenant, namespace=self.namespace).get(name=c.name)
        return fresh


def actors_for(
    api: pykube.HTTPClient, kubeconfig: Path, namespace: str, binding: Binding
) -> Actors:
    """A tenant service account in ``namespace`` and the binding's operator service
    account, both allowed by RBAC to write GPUClaims in ``namespace``."""
    pykube.ServiceAccount(api, {"metadata": {"name": "tenant", "namespace": namespace}}).create()
    pykube.Role(
        api,
        {
            "metadata": {"name": "gpuclaims-writer", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": [names.GROUP],
                    "resources": [names.GPU_CLAIMS],
                    "verbs": ["create", "update", "patch", "get", "list"],
                }
            ],
        },
    ).create()
    pykube.RoleBinding(
        api,
        {
            "metadata": {"name": "gpuclaims-writer", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "gpuclaims-writer",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "tenant", "namespace": namespace},
                {
                    "kind": "ServiceAccount",
                    "name": "gpu-operator",
                    "namespace": binding.params_namespace,
                },
            ],
        },
    ).create()
    return Actors(
        namespace=namespace,
        binding=binding,
        tenant=accounts.client(api, namespace, "tenant", 600),
        tenant_user=f"system:serviceaccount:{namespace}:tenant",
        operator=accounts.client(api, binding.params_namespace, "gpu-operator", 600),
    )


@pytest.fixture
def actors(
    api: pykube.HTTPClient, kubeconfig: Path, namespace: str, operator_bound: Binding
) -> Actors:
    a = actors_for(api, kubeconfig, namespace, operator_bound)
    enforce(api, namespace, operator_bound, lambda msg: MARK in msg)
    return a


def assert_mark_refusal(r: list[Refusal], actors: Actors, who: str, change: str) -> None:
    assert r[0].code == 403, r[0]
    for fragment in (f"label {MARK}", actors.binding.operator, f"{who} may not {change} it"):
        assert fragment in r[0].message, f"{fragment!r} not in refusal: {r[0].message}"


# ---- the tenant ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["true", "false", ""])
def test_a_tenant_cannot_create_a_claim_carrying_the_mark(actors: Actors, value: str) -> None:
    """The key is guarded whatever its value."""
    with refused(403) as r:
        actors.claim(actors.tenant, "marked", {MARK: value, "team": "a"})
    assert_mark_refusal(r, actors, actors.tenant_user, "set")
    assert (
        GPUClaim.objects(actors.operator, namespace=actors.namespace).get_or_none(name="marked")
        is None
    )


def test_a_tenant_cannot_add_the_mark_to_an_existing_claim(actors: Actors) -> None:
    c = actors.claim(actors.tenant, "hold", None)
    c.obj["metadata"]["labels"] = {MARK: "true"}
    with refused(403) as r:
        c.update()  # merge patch
    assert_mark_refusal(r, actors, actors.tenant_user, "set")
    c = actors.as_tenant(c)
    c.obj["metadata"]["labels"] = {MARK: "true"}
    with refused(403) as r:
        replace(c)  # PUT
    assert_mark_refusal(r, actors, actors.tenant_user, "set")
    assert MARK not in actors.as_tenant(c).labels


def test_a_tenant_cannot_remove_the_mark(actors: Actors) -> None:
    made = actors.claim(actors.operator, "vm-template", {MARK: "true", "team": "a"})
    c = actors.as_tenant(made)
    c.obj["metadata"]["labels"][MARK] = None
    with refused(403) as r:
        c.update()  # merge patch deleting the key
    assert_mark_refusal(r, actors, actors.tenant_user, "remove")
    c = actors.as_tenant(made)
    del c.obj["metadata"]["labels"]
    with refused(403) as r:
        replace(c)  # PUT without any labels
    assert_mark_refusal(r, actors, actors.tenant_user, "remove")
    assert actors.as_tenant(made).labels[MARK] == "true"


@pytest.mark.parametrize("value", ["false", "True", ""])
def test_a_tenant_cannot_change_the_marks_value(actors: Actors, value: str) -> None:
    made = actors.claim(actors.operator, "vm-template", {MARK: "true"})
    c = actors.as_tenant(made)
    c.obj["metadata"]["labels"][MARK] = value
    with refused(403) as r:
        c.update()
    assert_mark_refusal(r, actors, actors.tenant_user, "change")
    assert actors.as_tenant(made).labels[MARK] == "true"


def test_a_tenant_labels_claims_freely_and_may_relabel_a_marked_one(actors: Actors) -> None:
    """Only the mark is guarded: other labels come and go, on marked claims too (those
    requests reach the policy, which must let them pass)."""
    c = actors.claim(actors.tenant, "hold", {"team": "a"})
    c.obj["metadata"]["labels"] = {"team": "b", "cost-center": "42"}
    c.update()
    assert actors.as_tenant(c).labels == {"team": "b", "cost-center": "42"}
    c = actors.as_tenant(c)
    del c.obj["metadata"]["labels"]
    replace(c)
    assert actors.as_tenant(c).labels == {}

    made = actors.claim(actors.operator, "vm-template", {MARK: "true"})
    m = actors.as_tenant(made)
    m.obj["metadata"]["labels"]["team"] = "a"
    m.update()
    m = actors.as_tenant(made)
    m.obj["metadata"]["labels"] = {MARK: "true"}
    replace(m)
    assert actors.as_tenant(made).labels == {MARK: "true"}


# ---- the operator and other users ---------------------------------------------------------


def test_the_operator_sets_and_removes_the_mark(actors: Actors) -> None:
    made = actors.claim(actors.operator, "vm-template", {MARK: "true"})
    assert made.labels == {MARK: "true"}
    c = GPUClaim.objects(actors.operator, namespace=actors.namespace).get(name=made.name)
    del c.obj["metadata"]["labels"]
    replace(c)  # removes the mark
    assert MARK not in actors.as_tenant(made).labels
    c.reload()
    c.obj["metadata"]["labels"] = {MARK: "true"}
    c.update()  # sets it on an existing claim
    assert actors.as_tenant(made).labels == {MARK: "true"}


def test_a_cluster_admin_is_not_the_operator(api: pykube.HTTPClient, actors: Actors) -> None:
    """RBAC does not decide it: the mark is the operator's alone, whoever else asks."""
    review = api.post(
        version="authentication.k8s.io/v1",
        url="selfsubjectreviews",
        data=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
    )
    api.raise_for_status(review)
    admin = review.json()["status"]["userInfo"]["username"]
    assert admin != actors.binding.operator
    with refused(403) as r:
        GPUClaim(api, claim_doc("marked", actors.namespace, {MARK: "true"})).create()
    assert_mark_refusal(r, actors, admin, "set")


def test_the_operators_name_must_match_exactly(
    api: pykube.HTTPClient, kubeconfig: Path, actors: Actors
) -> None:
    """A service account called gpu-operator in another namespace is not the operator."""
    pykube.ServiceAccount(
        api, {"metadata": {"name": "gpu-operator", "namespace": actors.namespace}}
    ).create()
    pykube.RoleBinding(
        api,
        {
            "metadata": {"name": "impostor", "namespace": actors.namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "gpuclaims-writer",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "gpu-operator", "namespace": actors.namespace}
            ],
        },
    ).create()
    impostor = accounts.client(api, actors.namespace, "gpu-operator", 600)
    with refused(403) as r:
        actors.claim(impostor, "marked", {MARK: "true"})
    assert_mark_refusal(r, actors, f"system:serviceaccount:{actors.namespace}:gpu-operator", "set")


# ---- the settings ----------------------------------------------------------------------


def test_without_the_setting_nobody_may_mark_and_the_refusal_says_so(
    api: pykube.HTTPClient, kubeconfig: Path, namespace: str, bind: Bind
) -> None:
    b = bind("unset", {"placementPolicy": "binpack"})
    actors = actors_for(api, kubeconfig, namespace, b)
    missing = "operatorServiceAccount is missing from the operator's settings ConfigMap"
    enforce(api, namespace, b, lambda msg: missing in msg)
    for who in (actors.operator, actors.tenant):
        with refused(403) as r:
            actors.claim(who, "marked", {MARK: "true"})
        for fragment in (
            f"label {MARK}",
            missing,
            f"{b.params_namespace}/{names.SETTINGS_CONFIGMAP}",
            "nobody may set the mark",
        ):
            assert fragment in r[0].message, f"{fragment!r} not in refusal: {r[0].message}"
    c = actors.claim(actors.tenant, "hold", {"team": "a"})
    assert c.labels == {"team": "a"}


def test_without_the_settings_configmap_marked_claims_are_refused_and_others_admitted(
    api: pykube.HTTPClient, kubeconfig: Path, namespace: str, bind: Bind
) -> None:
    """parameterNotFoundAction Deny fails closed, but only for requests that could touch
    the mark (the binding's objectSelector): a tenant's ordinary orders do not depend on
    the operator's ConfigMap."""
    b = bind("absent", None)
    actors = actors_for(api, kubeconfig, namespace, b)
    enforce(api, namespace, b, lambda msg: "no params found" in msg)
    with refused(422) as r:
        actors.claim(actors.operator, "marked", {MARK: "true"})
    assert "no params found" in r[0].message
    c = actors.claim(actors.tenant, "hold", {"team": "a"})
    c.obj["metadata"]["labels"]["team"] = "b"
    c.update()
    assert actors.as_tenant(c).labels == {"team": "b"}
