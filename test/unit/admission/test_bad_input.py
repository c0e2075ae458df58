"""Bad input against the real webhook server over TLS on loopback: every malformed review
is a 400 naming the field, every refusal names a field, no input gets a 5xx, and no peer
holds up another's answer.

Case names follow the categories of what the webhooks must withstand: the envelope,
handler input, counts, echo, the transport (deadlines, limits)."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog

from gpuoperator.runtime import serving
from harness import abuse
from harness.waiting import wait_for
from harness.webhook_world import (
    NS,
    ORDER_PATH,
    POD_PATH,
    VMI_PATH,
    World,
    body,
    launcher_pod,
    order,
    vmi,
    webhook_server,
)

Obj = dict[str, Any]

#: A good request must be answered within this: half the API server's webhook timeout.
ANSWER_DEADLINE = 5.0


def answered(world: World, path: str, data: bytes, **kwargs: Any) -> abuse.Answer:
    return abuse.post(world.target, path, data, timeout=ANSWER_DEADLINE, **kwargs)


def reviewed(world: World, path: str, review_obj: Any) -> Obj:
    answer = answered(world, path, body(review_obj))
    assert answer.status == 200, answer.body
    response: Obj = json.loads(answer.body)["response"]
    return response


def with_request(base: Obj, **changes: Any) -> Obj:
    out: Obj = json.loads(json.dumps(base))
    out["request"].update(changes)
    return out


def with_object(base: Obj, **changes: Any) -> Obj:
    out: Obj = json.loads(json.dumps(base))
    out["request"]["object"].update(changes)
    return out


def nested(depth: int) -> bytes:
    """An order whose spec carries a value nested ``depth`` objects deep (built as text:
    the encoder would recurse as deep)."""
    deep = b'{"a":' * depth + b"1" + b"}" * depth
    return body(order()).replace(b'"count": 1', b'"count": 1, "deep": ' + deep)


# -- the envelope: 400 naming the field ------------------------------------------------------

ENVELOPE: list[tuple[str, Callable[[], bytes], str]] = [
    ("not-json", lambda: b"{not json", "body is not JSON"),
    ("json-but-a-list", lambda: b"[1, 2]", "body: must be an AdmissionReview object"),
    ("nan-constant", lambda: body(order()).replace(b'"count": 1', b'"count": NaN'), "NaN"),
    ("wrong-kind", lambda: json.dumps({"kind": "Pod"}).encode(), "kind: must be"),
    (
        "wrong-api-version",
        lambda: body({**order(), "apiVersion": "admission.k8s.io/v1beta1"}),
        "apiVersion: must be 'admission.k8s.io/v1'",
    ),
    ("request-missing", lambda: body({**order(), "request": None}), "request: must be an object"),
    ("request-kind-a-string", lambda: body(with_request(order(), kind="GPUClaim")), "request.kind"),
    (
        "user-info-a-string",
        lambda: body(with_request(order(), userInfo="alice")),
        "request.userInfo",
    ),
    (
        "groups-a-number",
        lambda: body(with_request(order(), userInfo={"username": "a", "groups": 5})),
        "request.userInfo.groups: must be a list",
    ),
    (
        "group-a-number",
        lambda: body(with_request(order(), userInfo={"username": "a", "groups": [5]})),
        "request.userInfo.groups[0]: must be a string",
    ),
    ("uid-missing", lambda: body(with_request(order(), uid=None)), "request.uid: must be a string"),
    ("uid-a-number", lambda: body(with_request(order(), uid=5)), "request.uid: must be a string"),
    ("uid-empty", lambda: body(with_request(order(), uid="")), "request.uid: must not be empty"),
    ("uid-huge", lambda: body(with_request(order(), uid="u" * 10_000)), "request.uid: has more"),
    (
        "dry-run-a-string",
        lambda: body(with_request(order(), dryRun="false")),
        'request.dryRun: must be true or false, got "false"',
    ),
    ("dry-run-a-number", lambda: body(with_request(order(), dryRun=0)), "request.dryRun"),
    (
        "operation-unknown",
        lambda: body(with_request(order(), operation="PATCH")),
        "request.operation",
    ),
    (
        "object-missing-on-create",
        lambda: body(with_request(order(), object=None)),
        "request.object",
    ),
    (
        "metadata-a-string",
        lambda: body(with_object(order(), metadata="c1")),
        "request.object.metadata: must be an object",
    ),
    ("metadata-a-list", lambda: body(with_object(order(), metadata=[])), "request.object.metadata"),
    (
        "metadata-a-number",
        lambda: body(with_object(order(), metadata=5)),
        "request.object.metadata",
    ),
    ("metadata-null", lambda: body(with_object(order(), metadata=None)), "request.object.metadata"),
    (
        "labels-not-strings",
        lambda: body(with_object(order(), metadata={"name": "c", "labels": {"a": 1}})),
        "request.object.metadata.labels.a: must be a string",
    ),
    (
        "name-a-number",
        lambda: body(with_object(order(), metadata={"name": 5})),
        "request.object.metadata.name: must be a string",
    ),
    (
        "delete-with-a-string-object",
        lambda: body(with_request(order(), operation="DELETE", object="gone")),
        "request.object: must be an object",
    ),
    ("nested-1000-levels", lambda: nested(1000), "nests too deeply"),
    (
        "nested-100000-levels",
        lambda: b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "nests too deeply",
    ),
]


@pytest.mark.parametrize(
    ("data", "fragment"), [c[1:] for c in ENVELOPE], ids=[c[0] for c in ENVELOPE]
)
def test_a_malformed_review_is_a_400_naming_the_field(
    world: World, data: Callable[[], bytes], fragment: str
) -> None:
    # The VMI webhook's path: its body limit admits the deepest nesting here (600 kB).
    answer = answered(world, VMI_PATH, data())
    assert answer.status == 400, answer.body
    assert fragment in answer.body.decode(), answer.body


@pytest.mark.parametrize("path", [ORDER_PATH, VMI_PATH, POD_PATH])
def test_every_webhook_path_parses_the_envelope_alike(world: World, path: str) -> None:
    answer = answered(world, path, body(with_request(order(), dryRun="yes")))
    assert (answer.status, b"request.dryRun" in answer.body) == (400, True)


def test_the_server_goes_on_serving_after_each_malformed_review(world: World) -> None:
    for _, data, _fragment in ENVELOPE[:5]:
        answered(world, ORDER_PATH, data())
    assert reviewed(world, ORDER_PATH, order())["allowed"] is True


def test_a_dry_run_flag_is_read_as_the_boolean_it_is(world: World) -> None:
    # Judged alike either way: the webhooks write nothing, dry run or not.
    dry = reviewed(world, VMI_PATH, with_request(vmi(), dryRun=True))
    real = reviewed(world, VMI_PATH, with_request(vmi(), dryRun=False))
    assert dry["allowed"] is real["allowed"] is True
    assert dry["patch"] == real["patch"]


def test_the_uid_comes_back_as_it_was_sent(world: World) -> None:
    assert reviewed(world, ORDER_PATH, with_request(order(), uid="abc-123"))["uid"] == "abc-123"


# -- the transport: 4xx, never 5xx -----------------------------------------------------------


def head(path: str, headers: str, data: bytes = b"") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode() + data


TRANSPORT: list[tuple[str, bytes, int]] = [
    ("negative-content-length", head(ORDER_PATH, "Content-Length: -5\r\n"), 400),
    ("garbage-content-length", head(ORDER_PATH, "Content-Length: ten\r\n"), 400),
    ("two-content-lengths", head(ORDER_PATH, "Content-Length: 1\r\nContent-Length: 2\r\n"), 400),
    ("body-beyond-the-limit", head(ORDER_PATH, "Content-Length: 3145729\r\n"), 413),
    ("not-http", b"\x16\x03\x01 hello\r\n\r\n", 400),
    ("huge-header", head(ORDER_PATH, "X-A: " + "a" * 70_000 + "\r\n"), 431),
    ("get-on-a-webhook", b"GET /validate-gpuclaim HTTP/1.1\r\nHost: x\r\n\r\n", 405),
    ("unknown-path", head("/nope", "Content-Length: 2\r\n", b"{}"), 404),
    ("empty-body", head(ORDER_PATH, "Content-Length: 0\r\n"), 400),
    (
        "chunked-body",
        head(ORDER_PATH, "Transfer-Encoding: chunked\r\n", b"2\r\n{}\r\n0\r\n\r\n"),
        400,
    ),
]


@pytest.mark.parametrize(
    ("data", "status"), [c[1:] for c in TRANSPORT], ids=[c[0] for c in TRANSPORT]
)
def test_a_malformed_http_request_gets_a_4xx_and_no_5xx(
    world: World, data: bytes, status: int
) -> None:
    assert (
        abuse.status_of(abuse.raw_exchange(world.target, data, timeout=ANSWER_DEADLINE)) == status
    )


def test_a_half_sent_body_gets_a_408_once_its_deadline_passes(hasty: World) -> None:
    raw = abuse.raw_exchange(
        hasty.target, head(ORDER_PATH, "Content-Length: 100\r\n", b'{"kind":'), timeout=5
    )
    assert abuse.status_of(raw) == 408 and b"did not arrive within" in raw


def test_a_slowloris_head_is_cut_off_at_its_deadline(hasty: World) -> None:
    with abuse.tls_connect(hasty.target) as sock:
        sock.sendall(b"POST /validate-gpuclaim HTTP/1.1\r\nX-Slow: ")
        deadline = time.monotonic() + 5
        closed = False
        while time.monotonic() < deadline and not closed:
            try:
                sock.sendall(b"x")
                sock.settimeout(0.1)
                data = sock.recv(4096)
                closed = data == b"" or abuse.status_of(data) == 408
            except TimeoutError:
                continue
            except (OSError, ssl.SSLError):
                closed = True
        assert closed, "the server kept a trickling request head open past its deadline"


def test_a_socket_that_never_starts_tls_is_closed_at_the_handshake_deadline(hasty: World) -> None:
    with abuse.connect(hasty.target) as sock:
        sock.settimeout(5)
        assert sock.recv(1) == b""  # the server hung up


def test_idle_sockets_do_not_delay_good_requests(world: World) -> None:
    idle = [abuse.connect(world.target) for _ in range(3)]
    try:
        for _ in range(5):
            assert reviewed(world, ORDER_PATH, order())["allowed"] is True
    finally:
        for sock in idle:
            sock.close()


def test_a_kept_alive_connection_serves_several_reviews(world: World) -> None:
    import http.client

    conn = http.client.HTTPSConnection(
        "127.0.0.1", world.target.port, timeout=ANSWER_DEADLINE, context=world.target.context()
    )
    try:
        for i in range(3):
            conn.request("POST", ORDER_PATH, body(with_request(order(), uid=f"u{i}")))
            resp = conn.getresponse()
            assert (resp.status, json.loads(resp.read())["response"]["uid"]) == (200, f"u{i}")
    finally:
        conn.close()


def test_a_source_at_its_connection_limit_loses_its_oldest_idle_sockets_not_its_requests(
    tmp_path: Path,
) -> None:
    with webhook_server(tmp_path, max_connections_per_source=4) as w:
        idle = [abuse.connect(w.target, source="127.0.0.2") for _ in range(4)]
        try:
            wait_for(
                "the four idle sockets to be accepted",
                lambda: w.server.open_connections,
                until=lambda n: n == 4,
                timeout=5,
            )
            # A good request from the same address is answered: the oldest idle one goes.
            answer = abuse.post(
                w.target, ORDER_PATH, body(order()), timeout=ANSWER_DEADLINE, source="127.0.0.2"
            )
            assert answer.status == 200
            idle[0].settimeout(5)
            assert idle[0].recv(1) == b""
            assert reviewed(w, ORDER_PATH, order())["allowed"] is True  # another address
        finally:
            for sock in idle:
                sock.close()


# -- handler input: refusals naming the field ------------------------------------------------


def test_a_launcher_pod_with_tolerations_not_a_list_is_refused_naming_the_field(
    world: World,
) -> None:
    response = reviewed(world, POD_PATH, launcher_pod({"containers": [], "tolerations": 5}))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "spec.tolerations: must be a list of objects, got 5" in response["status"]["message"]


def test_a_launcher_pod_with_a_gate_not_an_object_is_refused_naming_it(world: World) -> None:
    response = reviewed(world, POD_PATH, launcher_pod({"schedulingGates": ["x"]}))
    assert "spec.schedulingGates[0]: must be an object" in response["status"]["message"]


def test_a_good_launcher_pod_is_gated(world: World) -> None:
    response = reviewed(world, POD_PATH, launcher_pod())
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"


# -- counts ----------------------------------------------------------------------------------

BAD_COUNTS: list[Any] = [2**63, 2**31, 1e30, 5.0, -1, 0, True, None, "x", "2", [], {}]


@pytest.mark.parametrize("count", BAD_COUNTS, ids=[json.dumps(c) for c in BAD_COUNTS])
def test_a_count_that_is_not_a_whole_int32_is_refused_naming_spec_count(
    world: World, count: Any
) -> None:
    response = reviewed(world, ORDER_PATH, order(count))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "spec.count" in message and "allowed: a whole number from 1 to 2147483647" in message


def test_a_missing_count_is_refused_as_required(world: World) -> None:
    obj = order()
    del obj["request"]["object"]["spec"]["count"]
    assert "spec.count is required" in reviewed(world, ORDER_PATH, obj)["status"]["message"]


def test_a_good_count_is_admitted(world: World) -> None:
    assert reviewed(world, ORDER_PATH, order(2))["allowed"] is True


def test_a_budget_refusal_names_spec_count(world: World) -> None:
    response = reviewed(world, ORDER_PATH, order(4))  # 2 held + 4 ordered > 6? no: = 6
    assert response["allowed"] is True
    response = reviewed(world, ORDER_PATH, order(5))
    assert response["allowed"] is False
    assert response["status"]["message"].startswith(f"GPUClaim {NS}/c1: spec.count: ")
    assert "budget exceeded" in response["status"]["message"]


# -- echo ------------------------------------------------------------------------------------


def test_a_huge_name_is_echoed_cut(world: World) -> None:
    name = "v" * 900_000  # within the VMI webhook's body limit
    refused = vmi('[{"claim":"ghost"}]', name=name)
    with structlog.testing.capture_logs() as logs:
        answer = answered(world, VMI_PATH, body(with_request(refused, name="")))
    response = json.loads(answer.body)["response"]
    assert response["allowed"] is False
    assert "claim ghost: no such GPUClaim" in response["status"]["message"]
    assert len(answer.body) < 4096
    assert logs and all(len(json.dumps(line, default=str)) < 8192 for line in logs)


def test_a_huge_class_name_is_echoed_cut(world: World) -> None:
    # As long as a claim's review may be.
    response = reviewed(world, ORDER_PATH, order(1, class_name="k" * 60_000))
    message = response["status"]["message"]
    assert response["allowed"] is False and "spec.className: class kkk" in message
    assert "…" in message and len(message) <= 2048


def test_a_huge_invalid_value_is_echoed_cut_in_a_400(world: World) -> None:
    answer = answered(world, ORDER_PATH, body(with_request(order(), dryRun="t" * 60_000)))
    assert answer.status == 400 and len(answer.body) < 1024 and "…".encode() in answer.body


# -- handler errors --------------------------------------------------------------------------


def test_a_failing_handler_is_a_refusal_naming_the_error_with_one_bounded_traceback(
    tmp_path: Path,
) -> None:
    from gpuoperator.runtime import admitting

    def broken(_request: admitting.AdmissionRequest) -> admitting.Admission:
        raise KeyError("spec" * 10_000)

    def recurse(depth: int) -> None:
        recurse(depth + 1)

    def deep(_request: admitting.AdmissionRequest) -> admitting.Admission:
        recurse(0)
        raise AssertionError

    from prometheus_client import CollectorRegistry

    from harness.webhook_world import certificates

    ca, crt, key = certificates(tmp_path)
    server = serving.Server(
        "t",
        "127.0.0.1:0",
        admitting.app(
            {"/broken": broken, "/deep": deep}, ready=lambda: True, registry=CollectorRegistry()
        ),
        tls=(crt, key),
    )
    server.start()
    try:
        target = abuse.Target(server.port, ca)
        for path, error in (("/broken", "KeyError"), ("/deep", "RecursionError")):
            with structlog.testing.capture_logs() as logs:
                answer = abuse.post(target, path, body(order()), timeout=ANSWER_DEADLINE)
            response = json.loads(answer.body)["response"]
            assert answer.status == 200 and response["allowed"] is False
            assert error in response["status"]["message"]
            assert len(response["status"]["message"]) <= 2048
            failures = [line for line in logs if line["event"] == "admission handler failed"]
            assert len(failures) == 1
            assert error in failures[0]["traceback"]
            assert len(failures[0]["traceback"]) <= serving.MAX_TRACEBACK
    finally:
        server.stop()


def test_the_handshake_with_an_untrusted_client_context_fails_cleanly(world: World) -> None:
    ctx = ssl.create_default_context()  # does not trust the test CA
    with (
        socket.create_connection(("127.0.0.1", world.target.port), timeout=5) as raw,
        pytest.raises(ssl.SSLError),
    ):
        ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    wait_for(
        "the server answering after a failed handshake",
        lambda: reviewed(world, ORDER_PATH, order())["allowed"],
        until=lambda ok: ok is True,
        timeout=5,
    )


def test_malformed_reviews_and_dropped_connections_are_counted(hasty: World) -> None:
    def sample(name: str, **labels: str) -> float:
        return hasty.registry.get_sample_value(name, labels) or 0.0

    malformed = sample("gpuoperator_webhook_malformed_total", webhook="validate-gpuclaim")
    answered(hasty, ORDER_PATH, b"{not json")
    assert sample("gpuoperator_webhook_malformed_total", webhook="validate-gpuclaim") == (
        malformed + 1
    )
    timeouts = sample(
        "gpuoperator_http_connections_dropped_total", server="webhooks", reason="HandshakeTimeout"
    )
    with abuse.connect(hasty.target) as sock:
        sock.settimeout(5)
        assert sock.recv(1) == b""
    wait_for(
        "the handshake timeout counted",
        lambda: sample(
            "gpuoperator_http_connections_dropped_total",
            server="webhooks",
            reason="HandshakeTimeout",
        ),
        until=lambda n: n == timeouts + 1,
        timeout=5,
    )


def test_large_bodies_held_half_sent_do_not_stall_small_reviews(world: World) -> None:
    """Bodies announced so that together they take the server's whole body memory budget
    but for a few bytes, sent but for their last kilobyte and held; a small review is
    answered all the same (and promptly: within the answer deadline)."""
    limits = world.server.limits
    largest = world.server.body_limits[VMI_PATH]  # the largest a webhook path accepts
    count = -(-limits.max_buffered_bytes // largest)  # as few bodies as it takes
    length = limits.max_buffered_bytes // count
    head = f"POST {VMI_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
    held: list[ssl.SSLSocket] = []
    try:
        for i in range(count):
            sock = abuse.tls_connect(world.target, source=f"127.0.0.{10 + i}")
            sock.sendall(head.encode() + b" " * (length - 1024))
            held.append(sock)
        assert reviewed(world, ORDER_PATH, order())["allowed"] is True
    finally:
        for sock in held:
            sock.close()
