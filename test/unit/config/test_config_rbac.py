"""The shipped RBAC, as rendered: no wildcards anywhere, and the operator's permissions are
exactly what its code calls.

The calls are found by reading the code (``ast``), not by asking it: every
``manager.informer(Kind)`` needs list and watch, every client or writer call its verb
(``create`` POST, ``get``/``get_or_none`` GET, ``replace`` PUT = update, ``replace_status``
update on ``/status``, ``patch``, ``delete``, ``review`` create, ``list``), on the kind's
resource (``subresource=`` picks the subresource). The few calls that go through pykube
directly (the Lease) and the permissions admission plugins demand beyond the call itself
are listed by hand below, each with its reason. The other direction holds too: a permission
nobody needs fails the test.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pykube
import pytest
from unit.config.manifests import NAMESPACE, REPO, SERVICE_ACCOUNT, VARIANTS, Obj, find, render

from gpuoperator import kinds as product_kinds
from gpuoperator import names
from gpuoperator.runtime import kinds

#: (scope, apiGroup, resource, verb, resourceName): scope is "cluster" or a namespace,
#: resourceName "" for any.
Permission = tuple[str, str, str, str, str]

#: Code that never runs under the operator's ServiceAccount: `gpuoperator status` is a
#: command for people, with their own credentials.
NOT_THE_OPERATOR = {REPO / "gpuoperator" / "report.py"}
SOURCES = ("gpuoperator", "controllers", "admission")

_METHOD_VERBS = {
    "create": "create",
    "get": "get",
    "get_or_none": "get",
    "list": "list",
    "replace": "update",
    "replace_status": "update",
    "patch": "patch",
    "delete": "delete",
    "review": "create",
}
_CALLERS = {"client", "writer", "_client", "_writer"}

#: Needed beyond the calls ast finds, each with its reason.
BY_HAND: dict[Permission, str] = {
    # gpuoperator/runtime/leases.py (the elector's Lease store) talks to pykube directly: get,
    # then create or update.
    (NAMESPACE, "coordination.k8s.io", "leases", "create", ""): "leader election: first Lease",
    (NAMESPACE, "coordination.k8s.io", "leases", "get", "gpu-operator"): "leader election",
    (NAMESPACE, "coordination.k8s.io", "leases", "update", "gpu-operator"): "leader election",
    # blockOwnerDeletion on the owner reference needs update on the owner's finalizers
    # (OwnerReferencesPermissionEnforcement): usage records owned by claims, template
    # claims owned by VMIs.
    ("cluster", "cozystack.io", "gpuclaims/finalizers", "update", ""): "blockOwnerDeletion",
    ("cluster", "kubevirt.io", "virtualmachineinstances/finalizers", "update", ""): (
        "blockOwnerDeletion"
    ),
    # The API server lets a writer of a ResourceClaim's status.allocation through only with
    # update on the virtual resourceclaims/binding subresource (the binder allocates holds).
    ("cluster", "resource.k8s.io", "resourceclaims/binding", "update", ""): "DRA allocation",
}

#: --certificates=self-managed (config/default; controllers/webhook_certificates.py): the
#: leader keeps the CA and serving certificate in the shipped Secret and the webhook
#: configurations' caBundle current. Its informers list and watch by name (a metadata.name
#: field selector) and it PUTs; the webhook configurations' kind is a variable there, out of
#: the scan's reach, so they are listed here.
SELF_MANAGED: dict[Permission, str] = {
    **{
        (NAMESPACE, "", "secrets", verb, names.WEBHOOK_CERT_SECRET): "self-managed certificate"
        for verb in ("list", "watch", "update")
    },
    **{
        ("cluster", "admissionregistration.k8s.io", resource, verb, name): "caBundle"
        for resource in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations")
        for name in (names.VALIDATING_WEBHOOK_CONFIGURATION, names.MUTATING_WEBHOOK_CONFIGURATION)
        for verb in ("list", "watch", "update")
    },
}


# ---- what the code calls -------------------------------------------------------------------
def _kind(node: ast.expr) -> Any:
    """The pykube class an argument names (``pykube.Secret``, ``GPUClaim``), or None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "pykube":
            return getattr(pykube, node.attr, None)
        if node.value.id == "kinds":
            return getattr(kinds, node.attr, None) or getattr(product_kinds, node.attr, None)
    if isinstance(node, ast.Name):
        return (
            getattr(kinds, node.id, None)
            or getattr(product_kinds, node.id, None)
            or getattr(pykube, node.id, None)
        )
    return None


def _caller(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _resource(kind: Any, call: ast.Call, method: str) -> tuple[str, str]:
    version = str(kind.version)
    group = version.split("/", maxsplit=1)[0] if "/" in version else ""
    resource = str(kind.endpoint)
    sub = next((k.value for k in call.keywords if k.arg == "subresource"), None)
    if method == "replace_status":
        resource += "/status"
    elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value:
        resource += f"/{sub.value}"
    return group, resource


def calls() -> Iterator[tuple[str, str, str, str]]:
    """(file:line, apiGroup, resource, verb) for every API call found in the code."""
    for top in SOURCES:
        for path in sorted((REPO / top).rglob("*.py")):
            if path in NOT_THE_OPERATOR:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call):
                    continue
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                func, args = node.func, list(node.args)
                # functools.partial(self._client.create, pykube.Event, body)
                if isinstance(func, ast.Name) and func.id == "partial" and args:
                    func, args = args[0], args[1:]
                if not isinstance(func, ast.Attribute) or not args:
                    continue
                kind = _kind(args[0])
                if kind is None:
                    continue
                if func.attr == "informer":
                    group, resource = _resource(kind, node, "informer")
                    yield where, group, resource, "list"
                    yield where, group, resource, "watch"
                elif func.attr in _METHOD_VERBS and _caller(func.value) in _CALLERS:
                    group, resource = _resource(kind, node, func.attr)
                    yield where, group, resource, _METHOD_VERBS[func.attr]


def test_the_code_scan_finds_the_calls_it_must() -> None:
    """The scanner itself: a few calls known to exist are found (if the code moves, update
    these, not the scanner's reach)."""
    found = {(g, r, v) for _, g, r, v in calls()}
    assert {
        ("", "pods", "watch"),
        ("", "pods", "patch"),
        ("", "events", "create"),
        ("", "secrets", "create"),
        ("cozystack.io", "gpuclaims/status", "patch"),
        ("cozystack.io", "gpunodes/status", "update"),
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("", "configmaps", "get"),
    } <= found


# ---- what the manifests grant ----------------------------------------------------------------
def _roles(objs: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in objs
        if o["kind"] in ("Role", "ClusterRole")
    }


def _expand(rules: Iterable[Obj], scope: str) -> set[Permission]:
    out = set()
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [""]:
                        out.add((scope, group, resource, verb, name))
    return out


def granted(
    objs: list[Obj], user_ns: str = NAMESPACE, user: str = SERVICE_ACCOUNT
) -> set[Permission]:
    """What the ServiceAccount may do, by its bindings."""
    roles = _roles(objs)
    out: set[Permission] = set()
    for b in objs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subject = {"kind": "ServiceAccount", "name": user, "namespace": user_ns}
        if subject not in b["subjects"]:
            continue
        ref = b["roleRef"]
        ns = b["metadata"].get("namespace", "")
        role = roles[(ref["kind"], ns if ref["kind"] == "Role" else "", ref["name"])]
        scope = ns if b["kind"] == "RoleBinding" else "cluster"
        out |= _expand(role.get("rules", []), scope)
    return out


def _allows(perms: set[Permission], group: str, resource: str, verb: str) -> bool:
    """Whether some permission allows the call (in any scope; names are not known here)."""
    return any(p[1:4] == (group, resource, verb) for p in perms)


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_operator_may_make_every_call_its_code_makes(variant: str) -> None:
    perms = granted(render(variant))
    missing = sorted(
        f"{where}: {verb} {group or 'core'}/{resource}"
        for where, group, resource, verb in calls()
        if not _allows(perms, group, resource, verb)
    )
    assert missing == []
    assert set(BY_HAND) <= perms


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_operator_has_no_permission_its_code_does_not_need(variant: str) -> None:
    perms = granted(render(variant))
    needed = {(g, r, v) for _, g, r, v in calls()}
    expected_extra = set(BY_HAND)
    if variant != "overlays/production":  # cert-manager does this work there
        expected_extra |= set(SELF_MANAGED)
    unneeded = sorted(p for p in perms if p[1:4] not in needed and p not in expected_extra)
    assert unneeded == []


@pytest.mark.needs_tools
def test_cert_manager_mode_drops_the_self_managed_permissions() -> None:
    assert not set(SELF_MANAGED) & granted(render("overlays/production"))
    assert set(SELF_MANAGED) <= granted(render("default"))


@pytest.mark.needs_tools
def test_the_settings_and_policy_params_configmaps_are_reachable_by_name_only() -> None:
    """The settings are read; the policies' parameter is watched and updated, never created
    (it ships with the manifests) and no other ConfigMap is reachable."""
    configmaps = {p for p in granted(render("default")) if p[2] == "configmaps"}
    assert configmaps == {(NAMESPACE, "", "configmaps", "get", names.SETTINGS_CONFIGMAP)} | {
        (NAMESPACE, "", "configmaps", verb, names.POLICY_PARAMS_CONFIGMAP)
        for verb in ("list", "watch", "update")
    }


# ---- no wildcards --------------------------------------------------------------------------
def wildcards(objs: list[Obj]) -> list[str]:
    found = []
    for role in objs:
        if role["kind"] not in ("Role", "ClusterRole"):
            continue
        for i, rule in enumerate(role.get("rules") or []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                for value in rule.get(field) or []:
                    if "*" in value:
                        found.append(f"{role['metadata']['name']} rule {i} {field}: {value}")
        if role.get("aggregationRule"):
            found.append(f"{role['metadata']['name']} aggregates other roles")
    return found


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_no_role_has_a_wildcard(variant: str) -> None:
    assert wildcards(render(variant)) == []


@pytest.mark.needs_tools
def test_the_wildcard_check_catches_one_in_any_field() -> None:
    for field, value in [
        ("verbs", "*"),
        ("resources", "*"),
        ("apiGroups", "*"),
        ("resources", "pods/*"),
    ]:
        role = copy.deepcopy(find(render("default"), "ClusterRole", "gpu-operator"))
        role["rules"][0][field] = [value]
        assert wildcards([role]) != [], (field, value)


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_nothing_grants_escalation(variant: str) -> None:
    for role in _roles(render(variant)).values():
        for rule in role.get("rules") or []:
            assert not {"bind", "escalate", "impersonate"} & set(rule["verbs"])
            assert not {"roles", "clusterroles", "rolebindings", "clusterrolebindings"} & set(
                rule.get("resources", [])
            )


# ---- the roles for people ----------------------------------------------------------------------
@pytest.mark.needs_tools
def test_tenants_with_edit_order_claims_and_with_view_read_them() -> None:
    objs = render("default")
    editor = find(objs, "ClusterRole", "gpu-operator-gpuclaim-editor")
    viewer = find(objs, "ClusterRole", "gpu-operator-gpuclaim-viewer")
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    edit = _expand(editor["rules"], "ns")
    view = _expand(viewer["rules"], "ns")
    for verb in ("create", "delete", "get", "list", "watch"):
        assert ("ns", "cozystack.io", "gpuclaims", verb, "") in edit
    assert {p[3] for p in view} == {"get", "list", "watch"}
    # The status is the operator's: no tenant role writes it.
    assert not {p for p in edit | view if p[2] == "gpuclaims/status" and p[3] != "get"} - {
        ("ns", "cozystack.io", "gpuclaims/status", v, "") for v in ("list", "watch")
    }


@pytest.mark.needs_tools
def test_hosters_manage_classes_and_read_the_inventory() -> None:
    editor = find(render("default"), "ClusterRole", "gpu-operator-gpuclass-editor")
    perms = _expand(editor["rules"], "cluster")
    for verb in ("create", "update", "patch", "delete"):
        assert ("cluster", "cozystack.io", "gpuclasses", verb, "") in perms
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    assert {p[2] for p in perms if p[3] in writes} == {"gpuclasses"}
    assert "rbac.authorization.k8s.io/aggregate-to-admin" not in editor["metadata"]["labels"]


@pytest.mark.needs_tools
def test_scrapers_may_read_metrics_and_nothing_else() -> None:
    reader = find(render("default"), "ClusterRole", "gpu-operator-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_rbac_files_are_all_rendered() -> None:
    listed = {
        line.strip("- ").strip()
        for line in (REPO / "config" / "rbac" / "kustomization.yaml").read_text().splitlines()
        if line.startswith("- ")
    }
    on_disk = {p.name for p in Path(REPO / "config" / "rbac").glob("*.yaml")} - {
        "kustomization.yaml"
    }
    assert listed == on_disk
