"""Authorising scrapes of the metrics (and debug) endpoints as kube-rbac-proxy does.

The bearer token is checked with a TokenReview (who is this?), then a SubjectAccessReview
asks whether that user may ``get`` the non-resource path (``/metrics``). No token is a 401;
a token the API server does not accept is a 401; a user without RBAC is a 403. Decisions
are cached briefly (by token digest and path) so a scrape every few seconds costs no
API calls; when the API server cannot answer, the scrape is refused (fail closed) and
nothing is cached.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import structlog

from gpuoperator.runtime import errors
from gpuoperator.runtime.client import Client
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.kinds import SubjectAccessReview, TokenReview

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Decision:
    status: int  # 200, 401 or 403
    reason: str
    user: str = ""


class Authorizer:
    def __init__(self, client: Client, *, ttl: float = 10.0, clock: Clock = SYSTEM) -> None:
        self._client = client
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[tuple[str, str, str], tuple[float, Decision]] = {}
        self._lock = threading.Lock()

    def authorize(self, authorization: str | None, path: str, verb: str = "get") -> Decision:
        token = _bearer(authorization)
        if not token:
            return Decision(401, "no bearer token")
        digest = hashlib.sha256(token.encode()).hexdigest()
        key = (digest, path, verb)
        now = self._clock.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        try:
            decision = self._decide(token, path, verb)
        except errors.ApiError as exc:
            log.warning("scrape authorisation failed", reason=exc.reason, error=exc.message)
            return Decision(403, f"authorisation unavailable: {exc.reason}")
        with self._lock:
            if len(self._cache) > 1024:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            self._cache[key] = (now + self._ttl, decision)
        return decision

    def _decide(self, token: str, path: str, verb: str) -> Decision:
        review = self._client.review(
            TokenReview,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Decision(401, status.get("error") or "token not authenticated")
        user = status.get("user") or {}
        sar = self._client.review(
            SubjectAccessReview,
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user.get("username", ""),
                    "uid": user.get("uid", ""),
                    "groups": user.get("groups") or [],
                    "extra": user.get("extra") or {},
                    "nonResourceAttributes": {"path": path, "verb": verb},
                },
            },
        )
        allowed = (sar.get("status") or {}).get("allowed", False)
        name = user.get("username", "")
        if not allowed:
            return Decision(403, f"{name} may not {verb} {path}", name)
        return Decision(200, "allowed", name)


def _bearer(header: str | None) -> str:
    if not header:
        return ""
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
