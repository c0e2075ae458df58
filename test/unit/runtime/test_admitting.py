"""The admission server's contract: well-formed reviews get an answer from the handler,
malformed bodies a 400 that names the problem, a failing handler or unsynced caches a
clear refusal — and the server goes on serving."""

from __future__ import annotations

import base64
import json
from typing import Any

from prometheus_client import CollectorRegistry

from gpuoperator.runtime import serving
from gpuoperator.runtime.admitting import Admission, AdmissionRequest, app


def review(**request: Any) -> bytes:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"kind": "GPUClaim"},
            "operation": "CREATE",
            "namespace": "t",
            "object": {"metadata": {"name": "c"}},
            "userInfo": {"username": "alice", "groups": ["g"]},
            **request,
        },
    }
    return json.dumps(body).encode()


def call(handler: Any, body: bytes, method: str = "POST", path: str = "/hook") -> tuple[str, Any]:
    response = handler(serving.Request(method, path, body))
    try:
        return str(response.status), json.loads(response.body)
    except ValueError:
        return str(response.status), response.body.decode()


def serve(handler: Any, ready: bool = True) -> Any:
    return app({"/hook": handler}, ready=lambda: ready, registry=CollectorRegistry())


def test_a_refusal_carries_the_uid_code_and_message() -> None:
    seen: list[AdmissionRequest] = []

    def handler(req: AdmissionRequest) -> Admission:
        seen.append(req)
        return Admission.refuse("spec.count: too many")

    status, body = call(serve(handler), review(dryRun=True))
    assert status.startswith("200")
    assert body["response"] == {
        "uid": "u-1",
        "allowed": False,
        "status": {"code": 403, "reason": "Forbidden", "message": "spec.count: too many"},
    }
    req = seen[0]
    assert (req.kind, req.namespace, req.name, req.user, req.dry_run) == (
        "GPUClaim",
        "t",
        "c",
        "alice",
        True,
    )


def test_a_patch_is_base64_json_patch() -> None:
    ops = [{"op": "add", "path": "/spec/x", "value": 1}]
    _, body = call(serve(lambda _r: Admission.allow(patch=ops)), review())
    assert body["response"]["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(body["response"]["patch"])) == ops


def test_malformed_bodies_get_400_naming_the_problem_and_the_server_goes_on() -> None:
    wsgi = serve(lambda _r: Admission.allow())
    for body, fragment in [
        (b"{not json", "not JSON"),
        (json.dumps({"kind": "Pod"}).encode(), "kind: must be 'AdmissionReview'"),
        (
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}
            ).encode(),
            "admission.k8s.io/v1",
        ),
        (
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}
            ).encode(),
            "request.uid",
        ),
        (review(object=None), "request.object"),
    ]:
        status, text = call(wsgi, body)
        assert status.startswith("400") and fragment in text, (status, text)
    status, body = call(wsgi, review())
    assert status.startswith("200") and body["response"]["allowed"] is True


def test_a_failing_handler_is_a_refusal_not_a_crash() -> None:
    def handler(_r: AdmissionRequest) -> Admission:
        raise KeyError("spec")

    _, body = call(serve(handler), review())
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["reason"] == "InternalError"
    assert "KeyError" in body["response"]["status"]["message"]


def test_before_the_caches_sync_every_request_is_refused_saying_why() -> None:
    _, body = call(serve(lambda _r: Admission.allow(), ready=False), review())
    assert body["response"]["allowed"] is False
    assert "caches are not synced" in body["response"]["status"]["message"]


def test_only_post_is_served() -> None:
    status, _ = call(serve(lambda _r: Admission.allow()), b"", method="GET")
    assert status.startswith("405")
