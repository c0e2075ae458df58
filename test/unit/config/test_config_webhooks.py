"""The webhook configurations exist once, under config/webhook: every variant renders them
from there; dev only rewrites clientConfig to the loopback URL, and cert-manager mode only
adds the CA-injection annotation."""

from __future__ import annotations

import copy
from urllib.parse import urlsplit

import pytest
from unit.config.manifests import NAMESPACE, VARIANTS, Obj, find, manager_container, render

from admission import orders, pods, vmis
from gpuoperator import names

#: Every test here renders the manifests with the pinned kubectl.
pytestmark = pytest.mark.needs_tools

KINDS = {
    "ValidatingWebhookConfiguration": names.VALIDATING_WEBHOOK_CONFIGURATION,
    "MutatingWebhookConfiguration": names.MUTATING_WEBHOOK_CONFIGURATION,
}
#: Each webhook's path, as the operator serves it.
PATHS = {
    f"orders.{names.DOMAIN}": orders.PATH,
    f"vmis.{names.DOMAIN}": vmis.PATH,
    f"launcher-pods.{names.DOMAIN}": pods.PATH,
    f"hold-vmis.{names.DOMAIN}": vmis.PATH,
    f"hold-pods.{names.DOMAIN}": pods.PATH,
}
SERVICE_VARIANTS = [v for v in VARIANTS if v != "overlays/dev"]


def _configurations(variant: str) -> list[Obj]:
    return [find(render(variant), kind, name) for kind, name in KINDS.items()]


def _without(conf: Obj, *, client_config: bool = True, annotations: bool = False) -> Obj:
    out = copy.deepcopy(conf)
    if client_config:
        for webhook in out["webhooks"]:
            del webhook["clientConfig"]
    if annotations:
        out["metadata"].pop("annotations", None)
    return out


@pytest.mark.parametrize("variant", SERVICE_VARIANTS)
def test_each_webhook_calls_the_service_at_the_path_the_operator_serves(variant: str) -> None:
    for conf in _configurations(variant):
        for webhook in conf["webhooks"]:
            assert webhook["clientConfig"] == {
                "service": {
                    "name": names.WEBHOOK_SERVICE,
                    "namespace": NAMESPACE,
                    "path": PATHS[webhook["name"]],
                    "port": 443,
                }
            }


def test_dev_rewrites_only_the_client_config_to_a_loopback_url() -> None:
    default, dev = _configurations("default"), _configurations("overlays/dev")
    assert [_without(c) for c in dev] == [_without(c) for c in default]
    port = manager_container(render("overlays/dev"))["args"]
    webhook_port = next(a for a in port if a.startswith("--webhook-address=")).rsplit(":", 1)[1]
    for conf in dev:
        for webhook in conf["webhooks"]:
            assert set(webhook["clientConfig"]) == {"url"}
            url = urlsplit(webhook["clientConfig"]["url"])
            assert (url.scheme, url.hostname, str(url.port)) == ("https", "127.0.0.1", webhook_port)
            assert url.path == PATHS[webhook["name"]]
            assert not url.query and not url.fragment


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_carries_the_same_rules_as_config_webhook(variant: str) -> None:
    default = _configurations("default")
    assert [_without(c, annotations=True) for c in _configurations(variant)] == [
        _without(c, annotations=True) for c in default
    ]


def test_every_webhook_fails_closed_and_names_its_side_effects() -> None:
    by_name = {w["name"]: w for c in _configurations("default") for w in c["webhooks"]}
    assert set(by_name) == set(PATHS)
    for webhook in by_name.values():
        assert webhook["failurePolicy"] == "Fail"
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["timeoutSeconds"] == 10
        assert webhook["namespaceSelector"] == {}
        assert [r["operations"] for r in webhook["rules"]] == [["CREATE"]]
    # No webhook writes anything but its answer; the VMI webhook's patch is final.
    assert {w["sideEffects"] for w in by_name.values()} == {"None"}
    assert by_name[f"vmis.{names.DOMAIN}"]["reinvocationPolicy"] == "Never"
    assert by_name[f"vmis.{names.DOMAIN}"]["objectSelector"] == {
        "matchLabels": {names.CLAIMS_LABEL: names.TRUE}
    }
    assert by_name[f"launcher-pods.{names.DOMAIN}"]["sideEffects"] == "None"
    assert by_name[f"launcher-pods.{names.DOMAIN}"]["reinvocationPolicy"] == "IfNeeded"
    assert by_name[f"orders.{names.DOMAIN}"]["sideEffects"] == "None"
    # The hold-naming entries select by matchConditions what the first two do not select.
    for name in (f"hold-vmis.{names.DOMAIN}", f"hold-pods.{names.DOMAIN}"):
        assert "objectSelector" not in by_name[name]
        conditions = by_name[name]["matchConditions"]
        assert conditions[0]["name"] == "names-a-resource-claim"
        assert by_name[name]["reinvocationPolicy"] == "Never"


def test_cert_manager_injects_the_ca_of_the_certificate_for_the_service() -> None:
    objs = render("overlays/production")
    certificate = find(objs, "Certificate", "gpu-operator-webhook")
    issuer = find(objs, "Issuer", certificate["spec"]["issuerRef"]["name"])
    assert issuer["metadata"]["namespace"] == certificate["metadata"]["namespace"] == NAMESPACE
    service = find(objs, "Service", names.WEBHOOK_SERVICE)
    svc = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert certificate["spec"]["dnsNames"] == [svc, f"{svc}.cluster.local"]
    for conf in _configurations("overlays/production"):
        assert conf["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{certificate['metadata']['name']}"
        }
