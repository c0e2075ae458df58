"""Admission webhooks: AdmissionReview v1 over HTTPS, handlers as pure functions.

A handler gets an ``AdmissionRequest`` (the parsed review) and returns an ``Admission``:
allowed or refused with a message, optionally with JSON-patch operations (mutating
webhooks). Handlers read caches only, never write: a request therefore has no side effect
by construction, dry run or not. The server turns everything else into an answer, and
never into a 5xx:

* a body that is not an AdmissionReview v1 request gets HTTP 400 naming the first fields
  that are wrong, what they held and what is allowed (:func:`parse`, strict: ``dryRun``
  must be ``true`` or ``false``, ``uid`` a non-empty string, ``userInfo.groups`` a list of
  strings, ``object`` and its ``metadata`` objects, …), and the server goes on serving;
* before the caches have synced it refuses with a message saying so (the webhooks are fail
  closed: better a clear "try again" than a decision on an empty cache);
* a handler that finds a field it cannot read raises :class:`FieldError`: a refusal with
  code 400 naming the field;
* a handler that raises anything else is a refusal naming the error, logged once with a
  bounded traceback — never a crash.

Every message and log line repeats tenant input only through ``model.echo`` (cut with an
ellipsis), and a whole refusal message is at most ``echo.MAX_MESSAGE`` characters.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuoperator.model import echo
from gpuoperator.runtime import serving
from gpuoperator.runtime.metrics import per_registry

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
MAX_BODY = 3 * 1024 * 1024  # the API server sends at most ~3 MiB objects
#: At most this many field errors are named in one 400 (the first ones, in body order).
MAX_FIELD_ERRORS = 3


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
    """The body is not an AdmissionReview v1 request; the message names the field."""


class FieldError(ValueError):
    """A field of the reviewed object that a handler cannot read: ``field`` (a path such
    as ``spec.tolerations``), what it held, and what is allowed. The server answers a
    refusal with code 400 and this message."""

    def __init__(self, field: str, got: Any, allowed: str) -> None:
        self.field = field
        super().__init__(f"{field}: {allowed}, got {echo.shown(got)}")


def field_error(field: str, got: Any, allowed: str) -> NoReturn:
    raise FieldError(field, got, allowed)


# -- the envelope -----------------------------------------------------------------------------

_STRICT = ConfigDict(strict=True, extra="ignore", frozen=True)


class _GroupVersionKind(BaseModel):
    model_config = _STRICT
    group: str = ""
    version: str = ""
    kind: str = ""


class _UserInfo(BaseModel):
    model_config = _STRICT
    username: str = ""
    uid: str = ""
    groups: list[str] = Field(default_factory=list)
    extra: dict[str, list[str]] = Field(default_factory=dict)


class _Metadata(BaseModel):
    """What every handler reads of an object's metadata; the rest is not judged here."""

    model_config = _STRICT
    name: str = ""
    generateName: str = ""  # noqa: N815 - the API's field name
    namespace: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class _Request(BaseModel):
    model_config = _STRICT
    uid: str = Field(min_length=1, max_length=128)
    kind: _GroupVersionKind
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    namespace: str = ""
    name: str = ""
    object: dict[str, Any] | None = None
    oldObject: dict[str, Any] | None = None  # noqa: N815
    userInfo: _UserInfo = Field(default_factory=_UserInfo)  # noqa: N815
    dryRun: bool = False  # noqa: N815


class _Review(BaseModel):
    model_config = _STRICT
    apiVersion: Literal["admission.k8s.io/v1"]  # noqa: N815
    kind: Literal["AdmissionReview"]
    request: _Request


_WORDS = {
    "missing": "is required",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "list_type": "must be a list",
    "string_too_short": "must not be empty",
    "string_too_long": "is too long",
}


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(error: Any) -> str:
    words = _WORDS.get(error["type"])
    if words is None:
        words = str(error["msg"]).replace("Input should be", "must be")
    elif error["type"] == "string_too_long":
        words = f"has more than {error.get('ctx', {}).get('max_length')} characters"
    where = _path(tuple(error["loc"])) or "body"
    if error["type"] == "missing":
        return f"{where} {words}"
    return f"{where}: {words}, got {echo.shown(error.get('input'))}"


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def parse(body: bytes) -> AdmissionRequest:
    """The AdmissionReview v1 in ``body`` as a typed request; :class:`MalformedError`
    naming what is wrong otherwise."""
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise MalformedError("body nests too deeply to be an AdmissionReview") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedError(f"body is not JSON: {echo.clip(str(exc))}") from None
    if not isinstance(data, dict):
        raise MalformedError(f"body: must be an AdmissionReview object, got {echo.shown(data)}")
    try:
        review = _Review.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        named = "; ".join(_describe(e) for e in errors[:MAX_FIELD_ERRORS])
        more = len(errors) - MAX_FIELD_ERRORS
        raise MalformedError(named + (f" (and {more} more)" if more > 0 else "")) from None
    req = review.request
    obj = req.object
    if req.operation in ("CREATE", "UPDATE") and obj is None:
        raise MalformedError(f"request.object is required for {req.operation} (an object)")
    meta = _metadata(obj, "request.object")
    _metadata(req.oldObject, "request.oldObject")
    return AdmissionRequest(
        uid=req.uid,
        kind=req.kind.kind,
        operation=req.operation,
        namespace=req.namespace,
        name=req.name or meta.name,
        obj=obj if obj is not None else {},
        old=req.oldObject,
        user=req.userInfo.username,
        groups=tuple(req.userInfo.groups),
        dry_run=req.dryRun,
        raw=data["request"],
    )


def _metadata(obj: Obj | None, where: str) -> _Metadata:
    if obj is None:
        return _Metadata()
    if "metadata" not in obj:
        return _Metadata()
    try:
        return _Metadata.model_validate(obj["metadata"])
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ("metadata", *first["loc"]) if first["loc"] else ("metadata",)
        raise MalformedError(_describe({**first, "loc": (where, *loc)})) from None


def review_response(uid: str, admission: Admission) -> Obj:
    response: Obj = {"uid": uid, "allowed": admission.allowed}
    if not admission.allowed:
        response["status"] = {
            "code": admission.code,
            "reason": admission.reason,
            "message": echo.clip(admission.message, echo.MAX_MESSAGE),
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


@per_registry
def _malformed(registry: CollectorRegistry) -> Counter:
    return Counter(
        "gpuoperator_webhook_malformed_total",
        "Requests to a webhook that were not an AdmissionReview v1 (answered 400)",
        ["webhook"],
        registry=registry,
    )


def decide(name: str, handler: Handler, request: AdmissionRequest, ready: bool) -> Admission:
    """The handler's answer, or the refusal that stands for it (not ready, a field the
    handler cannot read, a handler error)."""
    if not ready:
        return Admission.refuse(
            "gpuoperator is starting, or catching up with the API server after losing its "
            "watches, and its caches are not synced yet; retry shortly",
            reason="ServiceUnavailable",
            code=503,
        )
    try:
        return handler(request)
    except FieldError as exc:
        return Admission.refuse(f"{_what(request)}: {exc}", reason="BadRequest", code=400)
    except Exception as exc:
        log.error(
            "admission handler failed",
            webhook=name,
            reason=type(exc).__name__,
            uid=request.uid,
            key=_who(request),
            error=echo.clip(str(exc), 200),
            traceback=serving.bounded_traceback(exc),
        )
        return Admission.refuse(
            f"{_what(request)}: gpuoperator could not judge it "
            f"({type(exc).__name__}: {echo.clip(str(exc))}); if the object is valid, this is "
            "a gpuoperator bug",
            reason="InternalError",
            code=500,
        )


def _what(request: AdmissionRequest) -> str:
    return f"{echo.clip(request.kind) if request.kind else 'object'} {_who(request)}"


def _who(request: AdmissionRequest) -> str:
    name = echo.clip(request.name) if request.name else "(generated)"
    return f"{echo.clip(request.namespace)}/{name}" if request.namespace else name


def app(
    webhooks: dict[str, Handler], ready: Callable[[], bool], registry: CollectorRegistry = REGISTRY
) -> serving.App:
    """The webhooks' HTTP app: each handler at its path."""
    histogram = _histogram(registry)
    malformed = _malformed(registry)

    def route(path: str, handler: Handler) -> serving.Handler:
        name = path.strip("/")

        def serve(http: serving.Request) -> serving.Response:
            if http.method != "POST":
                return serving.text(405, "admission reviews are POSTed")
            try:
                request = parse(http.body)
            except MalformedError as exc:
                malformed.labels(name).inc()
                message = echo.clip(str(exc), echo.MAX_MESSAGE)
                log.warning(
                    "malformed admission request",
                    webhook=name,
                    reason="Malformed",
                    peer=http.peer,
                    error=message,
                )
                return serving.text(400, message)
            start = time.perf_counter()
            admission = decide(name, handler, request, ready())
            histogram.labels(name, str(admission.allowed).lower()).observe(
                time.perf_counter() - start
            )
            if not admission.allowed:
                log.info(
                    "admission refused",
                    webhook=name,
                    reason=admission.reason,
                    key=_who(request),
                    operation=request.operation,
                    dry_run=request.dry_run,
                    message=echo.clip(admission.message, echo.MAX_MESSAGE),
                )
            body = json.dumps(review_response(request.uid, admission)).encode()
            return serving.Response(200, body, "application/json")

        return serve

    return serving.app({path: route(path, handler) for path, handler in webhooks.items()})
