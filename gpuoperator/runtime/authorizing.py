"""Authorising scrapes of the metrics (and debug) endpoints as kube-rbac-proxy does.

The bearer token is checked with a TokenReview (who is this?), then a SubjectAccessReview
asks whether that user may ``get`` the non-resource path (``/metrics``). Answers:

* 401: no bearer token, or a token the API server does not accept. The body says only
  that a valid token is required: nothing of the reviewer's own words reaches a caller
  who has not proven who they are (they go to the log);
* 403: an authenticated user without RBAC for the path (the body names the user and
  the path: they are the caller's own);
* 429: the caller's source address asked about too many unknown tokens (each costs a
  TokenReview): ``per_source_burst`` at once, then ``per_source_rate`` per second; all
  sources together are held to ``total_burst``/``total_rate`` in the same way;
* 503: the API server could not answer (any error: refused, dropped, not JSON, an API
  error). Fail closed, never a 500. For ``outage`` seconds after such a failure, tokens
  not in the cache are refused at once without asking again, so a storm of scrapes
  during an outage costs one review, not one (with retries) each.

Decisions are cached by token digest, path and verb for ``ttl`` seconds, refusals (401,
403) as well as grants, so a scrape every few seconds costs no API calls and replaying a
rejected token costs none either. The cache holds at most ``max_cached`` decisions (the
oldest go first) and the per-source buckets at most as many sources, so memory stays
bounded whatever tokens and addresses arrive. Unavailability is never cached per token.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from gpuoperator.model import echo
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.kinds import SubjectAccessReview, TokenReview

log = structlog.get_logger(__name__)

UNAUTHENTICATED = "unauthorized: a valid bearer token is required"
UNAVAILABLE = "authorisation is unavailable right now; retry shortly"
TOO_MANY = "too many unknown tokens from this address; retry later"


class Reviewer(Protocol):
    """What asks the API server (``runtime.client.Client.review``)."""

    def review(self, kind: Any, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Decision:
    status: int  # 200, 401, 403, 429 or 503
    #: Why, for the log (may carry the reviewer's words).
    reason: str
    user: str = ""
    #: What the caller is told.
    message: str = ""


class _Bucket:
    """A token bucket on the injected clock (not thread-safe: the authorizer locks)."""

    __slots__ = ("at", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens, self.at = tokens, at

    def take(self, now: float, rate: float, burst: float) -> bool:
        self.tokens = min(burst, self.tokens + (now - self.at) * rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class Authorizer:
    def __init__(
        self,
        client: Reviewer,
        *,
        ttl: float = 10.0,
        clock: Clock = SYSTEM,
        max_cached: int = 4096,
        per_source_rate: float = 1.0,
        per_source_burst: int = 10,
        total_rate: float = 20.0,
        total_burst: int = 50,
        outage: float = 2.0,
    ) -> None:
        self._client = client
        self._ttl = ttl
        self._clock = clock
        self._max = max_cached
        self._source_limits = (per_source_rate, float(per_source_burst))
        self._total_limits = (total_rate, float(total_burst))
        self._outage = outage
        self._cache: OrderedDict[tuple[str, str, str], tuple[float, Decision]] = OrderedDict()
        self._sources: OrderedDict[str, _Bucket] = OrderedDict()
        self._total = _Bucket(float(total_burst), clock.monotonic())
        self._down_until = float("-inf")
        self._lock = threading.Lock()

    def authorize(
        self, authorization: str | None, path: str, verb: str = "get", source: str = ""
    ) -> Decision:
        token = _bearer(authorization)
        if not token:
            return Decision(401, "no bearer token", message=UNAUTHENTICATED)
        digest = hashlib.sha256(token.encode()).hexdigest()
        key = (digest, path, verb)
        now = self._clock.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
            if now < self._down_until:
                return Decision(
                    503, "authorisation unavailable (recent failure)", message=UNAVAILABLE
                )
            refusal = self._take(source, now)
        if refusal is not None:
            return refusal
        try:
            decision = self._decide(token, path, verb)
        except Exception as exc:
            with self._lock:
                self._down_until = self._clock.monotonic() + self._outage
            log.warning(
                "scrape authorisation failed",
                reason=type(exc).__name__,
                error=echo.clip(str(exc), 300),
            )
            return Decision(
                503, f"authorisation unavailable: {type(exc).__name__}", message=UNAVAILABLE
            )
        with self._lock:
            self._cache[key] = (now + self._ttl, decision)
            self._cache.move_to_end(key)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return decision

    def _take(self, source: str, now: float) -> Decision | None:
        """Spend one review from the source's and the shared bucket (lock held)."""
        bucket = self._sources.get(source)
        if bucket is None:
            bucket = self._sources[source] = _Bucket(self._source_limits[1], now)
            while len(self._sources) > self._max:
                self._sources.popitem(last=False)
        self._sources.move_to_end(source)
        if not bucket.take(now, *self._source_limits):
            return Decision(
                429, f"review budget of {source or 'unknown source'} spent", message=TOO_MANY
            )
        if not self._total.take(now, *self._total_limits):
            return Decision(429, "review budget of all sources spent", message=TOO_MANY)
        return None

    def _decide(self, token: str, path: str, verb: str) -> Decision:
        review = self._client.review(
            TokenReview,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = _mapping(_mapping(review).get("status"))
        if status.get("authenticated") is not True:
            why = status.get("error")
            return Decision(
                401,
                echo.clip(str(why), 300) if why else "token not authenticated",
                message=UNAUTHENTICATED,
            )
        user = _mapping(status.get("user"))
        name = user.get("username")
        if not isinstance(name, str) or not name:
            raise ValueError("TokenReview answered authenticated without a username")
        groups = user.get("groups")
        extra = user.get("extra")
        sar = self._client.review(
            SubjectAccessReview,
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": name,
                    "uid": str(user.get("uid") or ""),
                    "groups": groups if isinstance(groups, list) else [],
                    "extra": extra if isinstance(extra, dict) else {},
                    "nonResourceAttributes": {"path": path, "verb": verb},
                },
            },
        )
        allowed = _mapping(_mapping(sar).get("status")).get("allowed") is True
        if not allowed:
            what = f"{echo.clip(name)} may not {verb} {path}"
            return Decision(403, what, name, message=what)
        return Decision(200, "allowed", name)


def _mapping(value: Any) -> dict[str, Any]:
    """``value`` when it is an object; anything else reads as an empty one."""
    return value if isinstance(value, dict) else {}


def _bearer(header: str | None) -> str:
    if not header:
        return ""
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
