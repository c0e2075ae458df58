"""The Kubernetes client layer over pykube-ng.

What pykube-ng leaves to its callers, done once here:

* one ``HTTPClient`` per thread (a ``requests.Session`` is not thread-safe), and a separate
  one for watches, whose read timeout outlasts the server-side ``timeoutSeconds`` (pykube's
  default 10 s timeout would cut an idle watch);
* client-side QPS/burst limiting shared by every thread of a client; ``Client.own_limit()``
  is a view with a bucket of its own at the same QPS/burst (as kube-controller-manager
  gives each controller its own client, and kube-scheduler its event recorder);
* retries with tenacity on 429, on 5xx for reads, and on connection errors, honouring
  ``Retry-After``;
* typed errors (``errors.ConflictError``, ``NotFoundError``, ``GoneError``...);
* writes by PUT with the object's resourceVersion (a stale write is a 409, never a silent
  overwrite), status writes through the status subresource, merge and JSON patches;
* credentials: in a pod the service-account token is re-read when the server answers 401
  (bound tokens expire); the configuration itself comes from ``kubeconfig.load_config``;
* fencing: ``Client.fenced(guard, remaining=...)`` returns a view whose writes raise
  ``NotLeaderError`` once ``guard()`` is false, so a replica that lost its Lease stops
  writing at once. The guard is asked before *every* attempt (after the client-side
  throttle's wait, and before each retry after a 429, a 5xx with Retry-After, a 401 or a
  connection error), never only once per request; and with ``remaining`` (seconds before
  another replica may take over) each attempt's timeout is cut to end
  :data:`FENCE_MARGIN` seconds before then, so no write of a replica that stopped leading
  is still waited for when the next leader starts.

Objects are plain dicts (``Obj``); kinds are the pykube classes of ``kinds.py`` or pykube's.

One concept, a little over 600 lines: reads, writes and watches share the client's
per-thread sessions, its throttle, its credential reload and its request metrics; the watch
path could leave only with all of these made public to it.
"""

from __future__ import annotations

import enum
import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import urlencode

import pykube
import requests
import structlog
import tenacity
import urllib3
from prometheus_client import CollectorRegistry, Counter, Histogram

from gpuoperator.runtime import errors, kubeconfig
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.metrics import per_registry
from gpuoperator.runtime.ratelimiting import BucketRateLimiter

Obj = dict[str, Any]
Kind = type[pykube.objects.APIObject]

log = structlog.get_logger(__name__)

#: Server-side watch length; a watch still open this long plus :data:`WATCH_MARGIN_SECONDS`
#: is abandoned by the client (the server should have ended it).
WATCH_TIMEOUT_SECONDS = 300
WATCH_MARGIN_SECONDS = 30.0
#: A watch that delivers nothing (no event, no bookmark) for this long is ended and re-opened
#: from the last resourceVersion: it may sit on a connection that died without a reset (a
#: cut on the way, a server that went away). The API server sends an idle watch a bookmark
#: about once a minute (the first one took two in our measurements), so a healthy watch is
#: seldom re-opened. requests' read timeout is per socket read, which is exactly this limit.
WATCH_IDLE_SECONDS = 150.0
#: The most bytes one read of a watch stream asks for (see :func:`event_lines`).
WATCH_READ_BYTES = 64 * 1024
#: The API server sends a watch's response headers as soon as it registered the watch,
#: before any event; a watch whose headers have not come after this long is a failure
#: (retried with backoff, the cache counted stale), not a quiet watch to wait out
#: :data:`WATCH_IDLE_SECONDS` for while the cache counts as current.
WATCH_HEADERS_SECONDS = 10.0
_RETRY_READ_CODES = frozenset({500, 502, 503, 504})
#: Seconds a fenced write's attempt must end before another replica may take over.
FENCE_MARGIN = 1.0


class PatchType(enum.Enum):
    """Patch media types; custom resources accept MERGE and JSON, not strategic merge."""

    MERGE = "application/merge-patch+json"
    JSON = "application/json-patch+json"
    STRATEGIC = "application/strategic-merge-patch+json"


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        kw: dict[str, Any] = {"registry": registry}
        self.requests = Counter(
            "gpuoperator_rest_client_requests_total",
            "API requests by method, resource (plural, with its subresource) and HTTP code",
            ["method", "resource", "code"],
            **kw,
        )
        self.latency = Histogram(
            "gpuoperator_rest_client_request_duration_seconds",
            "API request latency (to response headers)",
            ["method"],
            **kw,
        )
        self.fenced = Counter(
            "gpuoperator_fenced_writes_total",
            "Writes refused because this replica no longer leads",
            **kw,
        )


_metrics = per_registry(_Metrics)


class _RetryableError(Exception):
    """Internal: a response worth retrying, with the server's Retry-After if any."""

    def __init__(self, error: errors.ApiError, retry_after: float | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


def _wait_strategy(state: tenacity.RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome else None
    if isinstance(exc, _RetryableError) and exc.retry_after is not None:
        return min(exc.retry_after, 30.0)
    # Exponential from 0.2 s, capped at 5 s, with up to 0.2 s of jitter.
    backoff: float = min(5.0, 0.2 * 2.0 ** max(0, state.attempt_number - 1))
    return backoff + random.uniform(0, 0.2)  # noqa: S311 - jitter, not cryptography


class Client:
    """Thread-safe access to the API server. Create one per process; share it."""

    def __init__(
        self,
        config_factory: Callable[[], pykube.KubeConfig],
        *,
        qps: float = 50.0,
        burst: int = 100,
        timeout: float = 30.0,
        retries: int = 5,
        clock: Clock = SYSTEM,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._config_factory = config_factory
        self._config = config_factory()
        self._config_lock = threading.Lock()
        self._local = threading.local()
        self._qps, self._burst = qps, burst
        self._throttle = BucketRateLimiter(qps=qps, burst=burst, clock=clock)
        self._clock = clock
        self._timeout = timeout
        self._retries = retries
        self._fence: Callable[[], bool] | None = None
        self._remaining: Callable[[], float] | None = None
        self._metrics = _metrics(registry)

    # ---- views ----------------------------------------------------------------------
    def fenced(
        self, guard: Callable[[], bool], *, remaining: Callable[[], float] | None = None
    ) -> Client:
        """A view of this client whose writes are refused (``NotLeaderError``) whenever
        ``guard()`` is false, checked before every attempt of a write. ``remaining()``, if
        given, says how many seconds this replica may still write (until another may lead):
        each attempt's timeout ends :data:`FENCE_MARGIN` before that. Reads are never
        fenced."""
        view = object.__new__(Client)
        view.__dict__.update(self.__dict__)
        view._fence = guard
        view._remaining = remaining
        return view

    def own_limit(self) -> Client:
        """A view of this client (same connections, credentials and fence) with a QPS/burst
        bucket of its own at the same rate: one component's burst of writes does not delay
        another's. The API server's own limits still apply to the sum."""
        view = object.__new__(Client)
        view.__dict__.update(self.__dict__)
        view._throttle = BucketRateLimiter(qps=self._qps, burst=self._burst, clock=self._clock)
        return view

    def dedicated_http(self, timeout: float) -> pykube.HTTPClient:
        """A new pykube client for one thread that manages its own requests (the leader
        elector's Lease calls must not wait behind this client's throttle or retries)."""
        return pykube.HTTPClient(self._config, timeout=timeout)

    @property
    def server(self) -> str:
        return str(self._config.cluster["server"])

    @property
    def namespace(self) -> str:
        """The namespace of the kubeconfig context (in a pod: the pod's namespace)."""
        return str(self._config.namespace or "default")

    # ---- plumbing -------------------------------------------------------------------
    def _http(self, watch: bool = False) -> pykube.HTTPClient:
        attr = "watch_http" if watch else "http"
        http: pykube.HTTPClient | None = getattr(self._local, attr, None)
        gen = getattr(self._local, "generation", None)
        if http is None or gen is not self._config:
            http = pykube.HTTPClient(self._config, timeout=self._timeout)
            # The proxy environment is read once here, not on every request (requests
            # looks it up, and netrc, per call: a sixth of a request's CPU). TLS material
            # is pykube's own, per request, so nothing else of the environment is lost.
            proxies = requests.utils.get_environ_proxies(http.url)
            http.session.trust_env = False
            http.session.proxies.update(proxies)
            setattr(self._local, attr, http)
            self._local.generation = self._config
        return http

    def _reload_credentials(self, stale: pykube.KubeConfig) -> None:
        """Rebuild the config (re-reading a rotated service-account token) after a 401."""
        with self._config_lock:
            if self._config is stale:
                self._config = self._config_factory()

    @staticmethod
    def path(
        kind: Kind,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        version: str = kind.version
        parts = ["/api/v1" if version == "v1" else f"/apis/{version}"]
        if namespace:
            parts += ["namespaces", namespace]
        parts.append(kind.endpoint)
        if name:
            parts.append(name)
        if subresource:
            parts.append(subresource)
        return "/".join(parts)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        write: bool | None = None,
    ) -> Any:
        """One API call with throttling, retries and typed errors; returns the JSON body.

        A fenced write is checked before each attempt (see :meth:`fenced`); the
        ``NotLeaderError`` it raises says in ``sent`` whether an earlier attempt reached
        the server (then the write may have landed).
        """
        is_write = method != "GET" if write is None else write
        fenced = is_write and self._fence is not None
        attempts = 0

        def timeout() -> float:
            """This attempt's timeout; raises ``NotLeaderError`` when fenced."""
            if not fenced:
                return self._timeout
            left = self._remaining() - FENCE_MARGIN if self._remaining is not None else None
            if (self._fence is not None and not self._fence()) or (left is not None and left <= 0):
                self._metrics.fenced.inc()
                raise errors.NotLeaderError(
                    f"refused {method} {path}: this replica no longer leads", sent=attempts > 0
                )
            return self._timeout if left is None else min(self._timeout, left)

        timeout()  # refuse at once, before any retry machinery
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self._retries),
            wait=_wait_strategy,
            retry=tenacity.retry_if_exception_type((_RetryableError, requests.ConnectionError)),
            reraise=True,
            sleep=self._clock.sleep,
        )
        try:
            for attempt in retrying:
                with attempt:
                    try:
                        return self._once(method, path, params, body, content_type, timeout)
                    finally:
                        attempts += 1
        except _RetryableError as exc:
            raise exc.error from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None,
        body: Any,
        content_type: str,
        timeout: Callable[[], float],
    ) -> Any:
        config = self._config
        http = self._http()
        delay = self._throttle.when(None)
        if delay > 0:
            self._clock.sleep(delay)
        seconds = timeout()  # after the throttle's wait: leadership may have gone meanwhile
        data = None if body is None else json.dumps(body).encode()
        start = time.monotonic()
        resp = _send(http, method, path, params, data, content_type, seconds)
        self._metrics.latency.labels(method).observe(time.monotonic() - start)
        self._metrics.requests.labels(method, resource_of(path), str(resp.status_code)).inc()
        if resp.ok:
            return resp.json() if resp.content else None
        error = errors.from_status(resp.status_code, _status_body(resp))
        if resp.status_code == 401 and (kubeconfig.SERVICE_ACCOUNT_DIR / "token").exists():
            self._reload_credentials(config)
            raise _RetryableError(error, 0.0)
        retry_after = _retry_after(resp)
        if resp.status_code == 429 or (
            resp.status_code in _RETRY_READ_CODES and (method == "GET" or retry_after is not None)
        ):
            raise _RetryableError(error, retry_after)
        raise error

    # ---- verbs ----------------------------------------------------------------------
    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        obj: Obj = self.request("GET", self.path(kind, namespace, name))
        return obj

    def get_or_none(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return self.get(kind, name, namespace)
        except errors.NotFoundError:
            return None

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        transform: Callable[[Obj], Obj] | None = None,
    ) -> tuple[list[Obj], str]:
        """All objects, page by page, and the list's resourceVersion.

        ``transform``, when given, is applied to each object as its page arrives, so only
        one page of full objects is held at a time (an informer's slimming transform keeps
        a 40,000-pod list from ever being in memory whole).

        An expired continue token (410 while paging) restarts the list from the top, as
        client-go's pager falls back to a full list.
        """
        while True:
            items: list[Obj] = []
            params: dict[str, Any] = {"limit": page_size}
            if label_selector:
                params["labelSelector"] = label_selector
            if field_selector:
                params["fieldSelector"] = field_selector
            try:
                while True:
                    page: Obj = self.request("GET", self.path(kind, namespace), params=params)
                    got = page.pop("items", None) or []
                    items.extend(map(transform, got) if transform is not None else got)
                    del got
                    token = (page.get("metadata") or {}).get("continue")
                    if not token:
                        return items, str(page["metadata"].get("resourceVersion", ""))
                    params["continue"] = token
            except errors.GoneError:
                if "continue" not in params:
                    raise
                log.info("list continue token expired; listing again", kind=kind.kind)

    def create(self, kind: Kind, obj: Obj, *, dry_run: bool = False) -> Obj:
        ns = (obj.get("metadata") or {}).get("namespace")
        params = {"dryRun": "All"} if dry_run else None
        out: Obj = self.request("POST", self.path(kind, ns), params=params, body=obj)
        return out

    def replace(self, kind: Kind, obj: Obj, *, subresource: str | None = None) -> Obj:
        """PUT the whole object; its ``metadata.resourceVersion`` is the precondition."""
        meta = obj["metadata"]
        if not meta.get("resourceVersion"):
            raise ValueError(f"replace of {kind.kind} {meta.get('name')} needs a resourceVersion")
        out: Obj = self.request(
            "PUT", self.path(kind, meta.get("namespace"), meta["name"], subresource), body=obj
        )
        return out

    def replace_status(self, kind: Kind, obj: Obj) -> Obj:
        """Write ``status`` through the status subresource (spec changes are ignored there)."""
        return self.replace(kind, obj, subresource="status")

    def patch(
        self,
        kind: Kind,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = PatchType.MERGE,
        subresource: str | None = None,
    ) -> Obj:
        out: Obj = self.request(
            "PATCH",
            self.path(kind, namespace, name, subresource),
            body=patch,
            content_type=patch_type.value,
        )
        return out

    def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: str | None = None,
    ) -> None:
        """Delete, optionally only if the object is still the one we saw (uid / rv)."""
        opts: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        pre = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if pre:
            opts["preconditions"] = pre
        if propagation:
            opts["propagationPolicy"] = propagation
        self.request("DELETE", self.path(kind, namespace, name), body=opts)

    def create_subresource(
        self,
        kind: Kind,
        name: str,
        namespace: str | None,
        subresource: str,
        body: Obj,
        *,
        write: bool = True,
    ) -> Obj:
        """POST to a subresource (e.g. ``serviceaccounts/<n>/token``, ``pods/<n>/eviction``)."""
        out: Obj = self.request(
            "POST", self.path(kind, namespace, name, subresource), body=body, write=write
        )
        return out

    def review(self, kind: Kind, body: Obj) -> Obj:
        """POST a review (TokenReview, SubjectAccessReview): a question, not a write."""
        out: Obj = self.request("POST", self.path(kind), body=body, write=False)
        return out

    # ---- watch ----------------------------------------------------------------------
    def watch(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        resource_version: str,
        timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
        label_selector: str | None = None,
        field_selector: str | None = None,
        bookmarks: bool = True,
        stop: threading.Event | None = None,
        opened: Callable[[requests.Response], None] | None = None,
        idle_timeout: float = WATCH_IDLE_SECONDS,
        headers_timeout: float = WATCH_HEADERS_SECONDS,
    ) -> Iterator[tuple[str, Obj]]:
        """Stream ``(type, object)`` events from ``resource_version`` until the server ends
        the watch (after ``timeout_seconds``) or ``stop`` is set.

        Two client-side deadlines keep a watch from outliving its connection: after the
        headers, nothing read for ``idle_timeout`` seconds ends the watch as if the server
        had ended it (so does streaming :data:`WATCH_MARGIN_SECONDS` past
        ``timeout_seconds``); no headers within ``headers_timeout`` (or ``idle_timeout``,
        if shorter) is a ``requests.ReadTimeout``.

        Raises ``GoneError`` when the server says the resourceVersion is too old, whether as
        an HTTP 410 or as an in-stream ERROR event (which pykube would yield as an object).
        ``opened`` receives the streaming response, so another thread can close it to end a
        watch that is blocked waiting for the next event.
        """
        params: dict[str, Any] = {
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
            "allowWatchBookmarks": "true" if bookmarks else "false",
        }
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        http = self._http(watch=True)
        delay = self._throttle.when(None)
        if delay > 0:
            self._clock.sleep(delay)
        deadline = time.monotonic() + timeout_seconds + WATCH_MARGIN_SECONDS
        idle = min(idle_timeout, timeout_seconds + WATCH_MARGIN_SECONDS)
        resp = http.session.get(
            http.url + self.path(kind, namespace),
            params=params,
            stream=True,
            timeout=(10.0, min(headers_timeout, idle)),
        )
        # The headers are in: from now on each read may wait up to the idle limit.
        sock = getattr(getattr(resp.raw, "_connection", None), "sock", None)
        if sock is not None:
            sock.settimeout(idle)
        self._metrics.requests.labels(
            "WATCH", resource_of(self.path(kind, namespace)), str(resp.status_code)
        ).inc()
        if opened is not None:
            opened(resp)
        try:
            if not resp.ok:
                if resp.status_code == 401 and (kubeconfig.SERVICE_ACCOUNT_DIR / "token").exists():
                    self._reload_credentials(self._config)
                raise errors.from_status(resp.status_code, _status_body(resp))
            lines = event_lines(resp.iter_content(chunk_size=WATCH_READ_BYTES))
            while True:
                try:
                    line = next(lines)
                except StopIteration:
                    return
                except requests.ConnectionError as exc:
                    if not (
                        exc.args and isinstance(exc.args[0], urllib3.exceptions.ReadTimeoutError)
                    ):
                        raise
                    log.info(
                        "watch idle; reopening",
                        resource=resource_of(self.path(kind, namespace)),
                        idle_seconds=idle_timeout,
                    )
                    return
                if stop is not None and stop.is_set():
                    return
                if time.monotonic() > deadline:
                    log.info(
                        "watch outlived its timeout; reopening",
                        resource=resource_of(self.path(kind, namespace)),
                        timeout_seconds=timeout_seconds,
                    )
                    return
                if not line:
                    continue
                event = json.loads(line)
                etype, obj = event.get("type"), event.get("object") or {}
                if etype == "ERROR":
                    raise errors.from_status(int(obj.get("code") or 500), obj)
                yield etype, obj
        finally:
            resp.close()


def event_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The newline-separated lines of a watch stream, in time linear in their length.

    ``requests.Response.iter_lines`` joins what it has buffered with every new chunk, so a
    line of n bytes costs O(n²/chunk) copying: a watch event of a 1 MiB object (any tenant
    may label such a Secret) took seconds of CPU, and a few of them stalled a cache. Here
    each byte is copied once into its line. A chunked stream (every watch the API server
    sends) yields each chunk as it arrives, so a larger read size never waits for more."""
    parts: list[bytes] = []
    for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                if start < len(chunk):
                    parts.append(chunk[start:])
                break
            parts.append(chunk[start:end])
            yield b"".join(parts)
            parts = []
            start = end + 1
    if parts:
        yield b"".join(parts)


def resource_of(path: str) -> str:
    """The resource an API path names, as the request metrics label it: the plural, and
    ``/<subresource>`` when there is one (``gpuclaims/status``, ``events``)."""
    parts = [p for p in path.split("/") if p]
    # /api/v1/... or /apis/<group>/<version>/...
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    if not rest:
        return ""
    return rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"


def _send(
    http: pykube.HTTPClient,
    method: str,
    path: str,
    params: dict[str, Any] | None,
    data: bytes | None,
    content_type: str,
    timeout: float,
) -> requests.Response:
    """One request, handed straight to the session's adapter (pykube's, which adds the
    credentials and TLS material of the kubeconfig to each request as before).

    ``requests.Session.request`` would first prepare it: parse and re-quote the URL, merge
    cookies, hooks, auth and the environment's settings, then look for redirects — a third
    of the CPU of each of the operator's requests, for nothing it uses: the URL is built
    here from API paths and ``urlencode``d parameters, the session has no cookies, auth or
    hooks of its own, the environment is read once per session (:meth:`Client._http`), and
    the API server answers these calls without redirects. The body is read before
    returning, so the connection goes back to the pool as ``Session.request`` leaves it.
    """
    url = http.url + path
    if params:
        url = f"{url}?{urlencode(params)}"
    session = http.session
    prepared = requests.PreparedRequest()
    prepared.method = method
    prepared.url = url
    headers = requests.structures.CaseInsensitiveDict(session.headers)
    if data is not None:
        headers["Content-Type"] = content_type
        headers["Content-Length"] = str(len(data))
    prepared.headers = headers
    prepared.body = data
    resp: requests.Response = session.get_adapter(url).send(
        prepared,
        stream=False,
        timeout=timeout,
        verify=session.verify,
        cert=session.cert,
        proxies=session.proxies,
    )
    resp.content  # noqa: B018 - read it all: the connection is released to the pool
    return resp


def _status_body(resp: requests.Response) -> dict[str, object] | None:
    try:
        body = resp.json()
    except ValueError:
        return {"message": resp.text[:500]}
    return body if isinstance(body, dict) else None


def _retry_after(resp: requests.Response) -> float | None:
    value = resp.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
