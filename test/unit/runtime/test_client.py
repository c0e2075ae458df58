"""The client layer against a scripted HTTP server on loopback: retries, Retry-After,
typed errors, pagination, watch errors, fencing, client-side limits and proxies."""

from __future__ import annotations

import json
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pykube
import pytest
import requests

from gpuoperator.kinds import GPUClaim
from gpuoperator.runtime import client as clientmod
from gpuoperator.runtime import errors
from gpuoperator.runtime.client import FENCE_MARGIN, Client, PatchType, resource_of
from gpuoperator.runtime.clock import FakeClock
from harness import objects

Reply = tuple[int, dict[str, str], Any]


class Script:
    """Replies in order; records each request (method, path, query, body, content type)."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.released = threading.Event()  # set at teardown: slow replies answer at once

    def reply(self, code: int, body: Any = None, **headers: str) -> None:
        self.replies.append((code, headers, body))


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class _QuietServer(ThreadingHTTPServer):
    """A client that timed out has closed its end: the late answer's broken pipe is what
    the test arranged, not an error to print on stderr (socketserver's default)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture
def script() -> Iterator[Script]:
    s = Script()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            with s.lock:
                path, _, query = self.path.partition("?")
                s.requests.append(
                    {
                        "method": self.command,
                        "path": path,
                        "query": query,
                        "body": json.loads(body) if body else None,
                        "type": self.headers.get("Content-Type"),
                    }
                )
                code, headers, reply = s.replies.pop(0) if s.replies else (500, {}, None)
            delay = float(headers.pop("Delay", 0) or 0)
            if delay:
                s.released.wait(delay)  # a slow server: answers after ``delay`` seconds
            data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            for k, v in headers.items():
                self.send_header(k.replace("_", "-"), v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815

        def log_message(self, *_args: Any) -> None:
            pass

    server = _QuietServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    s.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield s
    s.released.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def client(script: Script, clock: FakeClock) -> Client:
    doc = {
        "clusters": [{"name": "c", "cluster": {"server": script.url}}],  # type: ignore[attr-defined]
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
        "current-context": "x",
    }
    return Client(lambda: pykube.KubeConfig(doc), clock=clock, qps=1000, burst=1000)


def claim(rv: str | None = "5") -> dict[str, Any]:
    return objects.claim("hold", namespace="t", rv=rv)


def test_paths_for_core_and_group_kinds() -> None:
    assert Client.path(pykube.Pod, "t", "p", "status") == "/api/v1/namespaces/t/pods/p/status"
    assert Client.path(GPUClaim, "t") == "/apis/cozystack.io/v1alpha1/namespaces/t/gpuclaims"
    assert Client.path(pykube.Node, None, "n") == "/api/v1/nodes/n"


def test_request_metrics_name_the_resource_and_its_subresource() -> None:
    assert resource_of(Client.path(GPUClaim, "t", "c", "status")) == "gpuclaims/status"
    assert resource_of(Client.path(pykube.Event, "t")) == "events"
    assert resource_of(Client.path(pykube.Node, None, "n")) == "nodes"
    assert resource_of(Client.path(pykube.Namespace, None, "t")) == "namespaces"
    assert resource_of(Client.path(pykube.Namespace)) == "namespaces"


def test_a_read_is_retried_on_503_then_succeeds(script: Script, client: Client) -> None:
    script.reply(503, status(503, "ServiceUnavailable", "etcd leader changed"))
    script.reply(200, claim())
    assert client.get(GPUClaim, "hold", "t")["metadata"]["name"] == "hold"
    assert [r["method"] for r in script.requests] == ["GET", "GET"]


def test_429_waits_for_retry_after_then_retries(
    script: Script, client: Client, clock: FakeClock
) -> None:
    start = clock.monotonic()
    script.reply(429, status(429, "TooManyRequests", "slow down"), Retry_After="3")
    script.reply(201, claim())
    client.create(GPUClaim, claim(None))
    assert len(script.requests) == 2
    assert clock.monotonic() - start >= 3.0


def test_a_write_is_not_retried_on_500_without_retry_after(script: Script, client: Client) -> None:
    script.reply(500, status(500, "InternalError", "boom"))
    with pytest.raises(errors.ApiError) as err:
        client.create(GPUClaim, claim(None))
    assert err.value.code == 500 and "boom" in str(err.value)
    assert len(script.requests) == 1


def test_retries_give_up_after_the_configured_attempts(script: Script, client: Client) -> None:
    for _ in range(5):
        script.reply(503, status(503, "ServiceUnavailable", "down"))
    with pytest.raises(errors.ApiError):
        client.get(GPUClaim, "hold", "t")
    assert len(script.requests) == 5


@pytest.mark.parametrize(
    ("code", "reason", "error"),
    [
        (404, "NotFound", errors.NotFoundError),
        (409, "Conflict", errors.ConflictError),
        (409, "AlreadyExists", errors.AlreadyExistsError),
        (410, "Expired", errors.GoneError),
        (422, "Invalid", errors.InvalidError),
        (403, "Forbidden", errors.ForbiddenError),
    ],
)
def test_errors_are_typed(
    script: Script, client: Client, code: int, reason: str, error: type[errors.ApiError]
) -> None:
    script.reply(code, status(code, reason, f"spec.count: {reason}"))
    with pytest.raises(error) as err:
        client.replace(GPUClaim, claim())
    assert err.value.reason == reason and err.value.message == f"spec.count: {reason}"


def test_replace_puts_the_whole_object_with_its_resource_version(
    script: Script, client: Client
) -> None:
    script.reply(200, claim("6"))
    client.replace_status(GPUClaim, claim("5"))
    req = script.requests[0]
    assert (req["method"], req["path"]) == (
        "PUT",
        "/apis/cozystack.io/v1alpha1/namespaces/t/gpuclaims/hold/status",
    )
    assert req["body"]["metadata"]["resourceVersion"] == "5"


def test_replace_without_a_resource_version_is_refused_before_sending(client: Client) -> None:
    with pytest.raises(ValueError, match="resourceVersion"):
        client.replace(GPUClaim, claim(None))


def test_patches_carry_their_media_type(script: Script, client: Client) -> None:
    script.reply(200, claim())
    script.reply(200, claim())
    client.patch(GPUClaim, "hold", {"metadata": {"labels": {"a": "b"}}}, "t")
    client.patch(
        GPUClaim,
        "hold",
        [{"op": "remove", "path": "/metadata/labels/a"}],
        "t",
        patch_type=PatchType.JSON,
    )
    assert [r["type"] for r in script.requests] == [
        "application/merge-patch+json",
        "application/json-patch+json",
    ]


def test_delete_sends_preconditions(script: Script, client: Client) -> None:
    script.reply(200, status(200, "", ""))
    client.delete(GPUClaim, "hold", "t", uid="u-1", propagation="Background")
    assert script.requests[0]["body"]["preconditions"] == {"uid": "u-1"}
    assert script.requests[0]["body"]["propagationPolicy"] == "Background"


def test_list_follows_continue_tokens(script: Script, client: Client) -> None:
    script.reply(200, {"metadata": {"continue": "tok", "resourceVersion": "9"}, "items": [claim()]})
    script.reply(200, {"metadata": {"resourceVersion": "10"}, "items": [claim(), claim()]})
    items, rv = client.list(GPUClaim, "t", page_size=1)
    assert len(items) == 3 and rv == "10"
    assert "continue=tok" in script.requests[1]["query"]


def test_selectors_and_bodies_arrive_as_sent(script: Script, client: Client) -> None:
    """The request is built by the client itself, not by requests' preparation: query
    values are quoted, a body of any characters arrives whole, with its length."""
    script.reply(200, {"metadata": {"resourceVersion": "9"}, "items": []})
    script.reply(200, claim("6"))
    selector = "gpu.cozystack.io/claims in (true,yes),tier!=spot"
    client.list(GPUClaim, "t", label_selector=selector, field_selector="status.phase=Bound")
    obj = claim("5")
    obj["status"] = {"message": "bound to nöde µ-1 → 2 unit(s) & more?"}
    client.replace_status(GPUClaim, obj)
    query = urllib.parse.parse_qs(script.requests[0]["query"])
    assert query["labelSelector"] == [selector]
    assert query["fieldSelector"] == ["status.phase=Bound"]
    assert query["limit"] == ["500"]
    assert script.requests[1]["body"]["status"] == obj["status"]
    assert script.requests[1]["type"] == "application/json"


def test_an_expired_continue_token_restarts_the_list(script: Script, client: Client) -> None:
    script.reply(200, {"metadata": {"continue": "old"}, "items": [claim()]})
    script.reply(410, status(410, "Expired", "continue token expired"))
    script.reply(200, {"metadata": {"resourceVersion": "20"}, "items": [claim(), claim()]})
    items, rv = client.list(GPUClaim, "t")
    assert (len(items), rv) == (2, "20")
    assert "continue" not in script.requests[2]["query"]


def test_watch_yields_events_and_raises_gone_on_an_in_stream_410(
    script: Script, client: Client
) -> None:
    lines = [
        {"type": "ADDED", "object": claim("11")},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
        {"type": "ERROR", "object": status(410, "Expired", "too old resource version")},
    ]
    script.reply(200, b"\n".join(json.dumps(x).encode() for x in lines))
    seen = []
    with pytest.raises(errors.GoneError):
        for etype, obj in client.watch(GPUClaim, "t", resource_version="10"):
            seen.append((etype, obj["metadata"]["resourceVersion"]))
    assert seen == [("ADDED", "11"), ("BOOKMARK", "12")]
    query = script.requests[0]["query"]
    assert "allowWatchBookmarks=true" in query and "resourceVersion=10" in query


def test_a_fenced_view_refuses_writes_and_sends_nothing(script: Script, client: Client) -> None:
    leading = threading.Event()
    writer = client.fenced(leading.is_set)
    with pytest.raises(errors.NotLeaderError, match="no longer leads"):
        writer.create(GPUClaim, claim(None))
    with pytest.raises(errors.NotLeaderError):
        writer.delete(GPUClaim, "hold", "t")
    assert script.requests == []
    script.reply(200, claim())
    writer.get(GPUClaim, "hold", "t")  # reads are never fenced
    leading.set()
    script.reply(201, claim())
    writer.create(GPUClaim, claim(None))
    assert [r["method"] for r in script.requests] == ["GET", "POST"]


def test_a_write_being_retried_is_not_sent_again_once_leadership_is_lost(
    script: Script, client: Client, clock: FakeClock
) -> None:
    start = clock.monotonic()
    writer = client.fenced(lambda: clock.monotonic() < start + 1.0)
    script.reply(429, status(429, "TooManyRequests", "slow down"), Retry_After="3")
    script.reply(201, claim())
    with pytest.raises(errors.NotLeaderError) as refused:
        writer.create(GPUClaim, claim(None))
    assert len(script.requests) == 1, "the retry after the Retry-After wait was not fenced"
    assert refused.value.sent, "the refusal says an earlier attempt reached the server"


def test_a_write_refused_before_any_attempt_says_nothing_was_sent(client: Client) -> None:
    with pytest.raises(errors.NotLeaderError) as refused:
        client.fenced(lambda: False).create(GPUClaim, claim(None))
    assert not refused.value.sent


def test_a_fenced_write_is_refused_when_too_little_lease_is_left(
    script: Script, client: Client
) -> None:
    writer = client.fenced(lambda: True, remaining=lambda: FENCE_MARGIN / 2)
    with pytest.raises(errors.NotLeaderError):
        writer.create(GPUClaim, claim(None))
    assert script.requests == []


def test_a_fenced_write_gives_up_before_the_lease_may_pass_to_another_replica(
    script: Script, client: Client
) -> None:
    """The server answers after 5 s; the lease leaves this replica 0.2 s past the margin:
    the attempt is abandoned at the margin, not waited for."""
    writer = client.fenced(lambda: True, remaining=lambda: FENCE_MARGIN + 0.2)
    script.reply(201, claim(), Delay="5")
    with pytest.raises(requests.Timeout):
        writer.create(GPUClaim, claim(None))


def test_a_view_with_its_own_limit_does_not_wait_behind_the_client_bucket(
    script: Script, clock: FakeClock
) -> None:
    doc = {
        "clusters": [{"name": "c", "cluster": {"server": script.url}}],  # type: ignore[attr-defined]
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    shared = Client(lambda: pykube.KubeConfig(doc), clock=clock, qps=1, burst=1)
    own = shared.own_limit()
    for _ in range(3):
        script.reply(200, claim())
    start = clock.monotonic()
    shared.get(GPUClaim, "hold", "t")  # the shared bucket's one token
    own.get(GPUClaim, "hold", "t")  # a bucket of its own: no wait
    assert clock.monotonic() == start
    shared.get(GPUClaim, "hold", "t")  # the shared bucket is empty: waits 1/qps
    assert clock.monotonic() - start == pytest.approx(1.0)


def test_the_proxy_environment_is_read_once_per_connection_not_per_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    doc = {
        "clusters": [{"name": "c", "cluster": {"server": "https://api.example:6443"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    session = Client(lambda: pykube.KubeConfig(doc))._http().session
    assert session.trust_env is False
    assert session.proxies["https"] == "http://proxy.example:3128"
    monkeypatch.setenv("NO_PROXY", "api.example")
    assert "https" not in Client(lambda: pykube.KubeConfig(doc))._http().session.proxies


@pytest.mark.parametrize("size", [1, 7, 512, 65536])
def test_watch_lines_are_split_alike_whatever_the_chunks(size: int) -> None:
    stream = b'{"a":1}\n\n{"b":"' + b"x" * 200_000 + b'"}\n{"c":3}'
    chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
    assert list(clientmod.event_lines(chunks)) == stream.split(b"\n")


def test_a_line_of_a_mebibyte_in_small_chunks_is_one_line() -> None:
    line = b'{"type":"ADDED","object":{"data":"' + b"y" * (1 << 20) + b'"}}'
    chunks = [line[i : i + 512] for i in range(0, len(line), 512)] + [b"\n"]
    assert list(clientmod.event_lines(chunks)) == [line]
