"""Admission webhooks: AdmissionReview v1 over HTTPS, handlers as pure functions.

A handler gets an ``AdmissionRequest`` (the parsed review) and returns an ``Admission``:
allowed or refused with a message, optionally with JSON-patch operations (mutating
webhooks). Handlers read caches only, never write: a dry-run request therefore has no side
effect by construction. The server turns everything else into an answer:

* a body that is not an AdmissionReview v1 gets HTTP 400 with the reason (and the server
  goes on serving);
* before the caches have synced it refuses with a message saying so (the webhooks are fail
  closed: better a clear "try again" than a decision on an empty cache);
* a handler that raises is a refusal with the error's reason, logged — never a crash.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from gpuoperator.runtime import serving
from gpuoperator.runtime.metrics import per_registry

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
MAX_BODY = 3 * 1024 * 1024  # the API server sends at most ~3 MiB objects


@dataclass(frozen=True)
class AdmissionRequest:
    uid: str
    kind: str
    operation: str
    namespace: str
    name: str
    obj: Obj
    old: Obj | None
    user: str
    groups: tuple[str, ...]
    dry_run: bool
    raw: Obj = field(repr=False)


@dataclass(frozen=True)
class Admission:
    allowed: bool
    message: str = ""
    reason: str = ""
    code: int = 200
    patch: list[Obj] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @staticmethod
    def allow(patch: list[Obj] | None = None, warnings: list[str] | None = None) -> Admission:
        return Admission(True, patch=patch or [], warnings=warnings or [])

    @staticmethod
    def refuse(message: str, reason: str = "Forbidden", code: int = 403) -> Admission:
        return Admission(False, message=message, reason=reason, code=code)


Handler = Callable[[AdmissionRequest], Admission]


class MalformedError(ValueError):
    """The body is not an AdmissionReview v1 request."""


def parse(body: bytes) -> AdmissionRequest:
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedError(f"body is not JSON: {exc}") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise MalformedError("body is not an AdmissionReview")
    if review.get("apiVersion") != "admission.k8s.io/v1":
        raise MalformedError(f"apiVersion {review.get('apiVersion')!r} is not admission.k8s.io/v1")
    req = review.get("request")
    if not isinstance(req, dict) or not req.get("uid"):
        raise MalformedError("AdmissionReview has no request.uid")
    obj = req.get("object")
    if req.get("operation") != "DELETE" and not isinstance(obj, dict):
        raise MalformedError("request.object is missing")
    user = req.get("userInfo") or {}
    return AdmissionRequest(
        uid=str(req["uid"]),
        kind=str((req.get("kind") or {}).get("kind", "")),
        operation=str(req.get("operation", "")),
        namespace=str(req.get("namespace") or ""),
        name=str(req.get("name") or ((obj or {}).get("metadata") or {}).get("name") or ""),
        obj=obj or {},
        old=req.get("oldObject"),
        user=str(user.get("username", "")),
        groups=tuple(user.get("groups") or ()),
        dry_run=bool(req.get("dryRun")),
        raw=req,
    )


def review_response(uid: str, admission: Admission) -> Obj:
    response: Obj = {"uid": uid, "allowed": admission.allowed}
    if not admission.allowed:
        response["status"] = {
            "code": admission.code,
            "reason": admission.reason,
            "message": admission.message,
        }
    if admission.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(admission.patch).encode()).decode()
    if admission.warnings:
        response["warnings"] = admission.warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


@per_registry
def _histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "gpuoperator_webhook_duration_seconds",
        "Admission decisions by webhook and result",
        ["webhook", "allowed"],
        registry=registry,
        buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    )


def app(
    webhooks: dict[str, Handler], ready: Callable[[], bool], registry: CollectorRegistry = REGISTRY
) -> serving.WSGIApp:
    """A WSGI app serving each handler at its path."""
    histogram = _histogram(registry)

    def route(path: str, handler: Handler) -> Callable[[serving.Environ], serving.Response]:
        name = path.strip("/")

        def serve(env: serving.Environ) -> serving.Response:
            if env.get("REQUEST_METHOD") != "POST":
                return serving.text(405, "admission reviews are POSTed")
            length = int(env.get("CONTENT_LENGTH") or 0)
            if length > MAX_BODY:
                return serving.text(413, f"body of {length} bytes exceeds {MAX_BODY}")
            try:
                request = parse(env["wsgi.input"].read(length))
            except MalformedError as exc:
                log.warning(
                    "malformed admission request", webhook=name, reason="Malformed", error=str(exc)
                )
                return serving.text(400, str(exc))
            start = time.perf_counter()
            if not ready():
                admission = Admission.refuse(
                    "gpuoperator is starting and its caches are not synced yet; retry shortly",
                    reason="ServiceUnavailable",
                    code=503,
                )
            else:
                try:
                    admission = handler(request)
                except Exception as exc:
                    log.exception(
                        "admission handler failed",
                        webhook=name,
                        reason=type(exc).__name__,
                        uid=request.uid,
                    )
                    admission = Admission.refuse(
                        f"gpuoperator could not decide ({type(exc).__name__}); retry shortly",
                        reason="InternalError",
                        code=500,
                    )
            histogram.labels(name, str(admission.allowed).lower()).observe(
                time.perf_counter() - start
            )
            if not admission.allowed:
                log.info(
                    "admission refused",
                    webhook=name,
                    reason=admission.reason,
                    key=f"{request.namespace}/{request.name}",
                    operation=request.operation,
                    dry_run=request.dry_run,
                    message=admission.message,
                )
            body = json.dumps(review_response(request.uid, admission)).encode()
            return serving.Response(200, body, "application/json")

        return serve

    return serving.app({path: route(path, handler) for path, handler in webhooks.items()})
