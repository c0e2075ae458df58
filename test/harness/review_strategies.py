"""Hypothesis strategies for AdmissionReview-shaped input, by category, and the oracle
every answer must satisfy. Shared by the bounded sweep in ``test/unit/admission`` and
``make fuzz`` (``test/fuzz``).

Each category starts from a well-formed review and replaces some of its fields with
arbitrary JSON (or arbitrary bytes for ``bytes``), so most examples are close to what
the API server sends and reach the handlers' decisions, not only the parser.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
from typing import Any

from hypothesis import strategies as st

from harness import abuse
from harness.abuse import Target
from harness.webhook_world import (
    ORDER_PATH,
    POD_PATH,
    VMI_PATH,
    launcher_pod,
    order,
    vmi,
)

Obj = dict[str, Any]

#: Any JSON value, small.
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

#: Strings a tenant might put where a name or a reference goes.
names = st.one_of(
    st.sampled_from(["a10", "l40s-24q", "hold-a", "hold-b", "missing", "", "A10", "-x"]),
    st.text(max_size=40),
    st.text(alphabet="ab-", min_size=250, max_size=300),
)


def _at(obj: Obj, path: tuple[str, ...], value: Any) -> Obj:
    """A copy of ``obj`` with ``value`` at ``path`` (parents made objects as needed)."""
    out: Obj = json.loads(json.dumps(obj))
    node = out
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return out


def _mutated(
    base: Obj, paths: list[tuple[str, ...]], values: st.SearchStrategy[Any]
) -> st.SearchStrategy[Obj]:
    @st.composite
    def build(draw: st.DrawFn) -> Obj:
        out = base
        for path in draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3, unique=True)):
            out = _at(out, path, draw(values))
        return out

    strategy: st.SearchStrategy[Obj] = build()
    return strategy


ENVELOPE_PATHS = [
    ("apiVersion",),
    ("kind",),
    ("request",),
    ("request", "uid"),
    ("request", "kind"),
    ("request", "kind", "kind"),
    ("request", "operation"),
    ("request", "namespace"),
    ("request", "name"),
    ("request", "object"),
    ("request", "oldObject"),
    ("request", "userInfo"),
    ("request", "userInfo", "username"),
    ("request", "userInfo", "groups"),
    ("request", "dryRun"),
    ("request", "object", "metadata"),
    ("request", "object", "metadata", "name"),
    ("request", "object", "metadata", "labels"),
    ("request", "object", "metadata", "annotations"),
]
ORDER_PATHS = [
    ("request", "object", "spec"),
    ("request", "object", "spec", "count"),
    ("request", "object", "spec", "className"),
    ("request", "object", "metadata", "labels", "gpu.cozystack.io/template-claim"),
    ("request", "object", "status"),
]
VMI_PATHS = [
    ("request", "object", "metadata", "annotations", "gpu.cozystack.io/claims"),
    ("request", "object", "metadata", "name"),
    ("request", "object", "spec"),
    ("request", "object", "spec", "domain"),
    ("request", "object", "spec", "domain", "devices"),
    ("request", "object", "spec", "domain", "devices", "gpus"),
    ("request", "object", "spec", "domain", "devices", "hostDevices"),
]
POD_PATHS = [
    ("request", "object", "spec"),
    ("request", "object", "spec", "tolerations"),
    ("request", "object", "spec", "schedulingGates"),
    ("request", "object", "spec", "containers"),
    ("request", "object", "metadata", "annotations", "gpu.cozystack.io/claims"),
    ("request", "object", "metadata", "annotations", "kubevirt.io/ephemeral-provisioning"),
    ("request", "object", "metadata", "labels", "kubevirt.io/migrationJobUID"),
]


def _refs() -> st.SearchStrategy[str]:
    ref = st.one_of(
        st.builds(lambda n: {"claim": n}, names),
        st.builds(
            lambda c, n: {"claimTemplate": {"className": c, "count": n}},
            names,
            json_values | st.integers(min_value=-2, max_value=5),
        ),
        json_values,
    )
    return st.one_of(st.lists(ref, max_size=4).map(json.dumps), st.text(max_size=30))


def _encoded(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return strategy.map(lambda obj: json.dumps(obj).encode())


#: Category name -> (webhook path, strategy of request bodies).
CATEGORIES: dict[str, tuple[str, st.SearchStrategy[bytes]]] = {
    "envelope": (
        ORDER_PATH,
        _encoded(_mutated(order(), ENVELOPE_PATHS, json_values)),
    ),
    "order": (
        ORDER_PATH,
        _encoded(_mutated(order(), ORDER_PATHS, json_values | names)),
    ),
    "vmi": (
        VMI_PATH,
        _encoded(
            st.one_of(
                _refs().map(lambda refs: vmi(refs=refs)),
                _mutated(vmi(), VMI_PATHS, json_values | names | _refs()),
            )
        ),
    ),
    "pod": (
        POD_PATH,
        _encoded(_mutated(launcher_pod(), POD_PATHS, json_values | _refs())),
    ),
    "bytes": (
        ORDER_PATH,
        st.one_of(
            st.binary(max_size=200),
            st.just(json.dumps(order()).encode()).flatmap(
                lambda b: st.integers(min_value=0, max_value=len(b)).map(lambda n: b[:n])
            ),
        ),
    ),
}

#: A refusal names a field: a path into the object or the review, or the annotation.
FIELD = re.compile(r"(spec|metadata|status|request|annotation|body|apiVersion|kind)\b[.\[: ]")


def check_answer(status: int, answer: bytes, sent: bytes) -> str:
    """The oracle: raise ``AssertionError`` unless the answer is one the webhooks may give;
    return a label of the outcome (``400``, ``allowed``, ``refused``) for the counts."""
    assert status in (200, 400, 413), (status, answer[:300], sent[:300])
    if status != 200:
        text = answer.decode()
        assert text.strip() and len(text) <= 2100, text[:300]
        assert "Traceback" not in text, text[:300]
        return str(status)
    response = json.loads(answer)["response"]
    assert response["uid"] == json.loads(sent)["request"]["uid"]
    if response["allowed"]:
        return "allowed"
    message = response["status"]["message"]
    assert response["status"]["code"] != 500, message  # a handler crashed
    assert len(message) <= 2048, len(message)
    assert FIELD.search(message), message
    return f"refused {response['status']['code']}"


#: How a kept-alive connection the server closed between requests shows on the next one: the
#: close read before the answer, a reset or broken pipe on the send, or the TLS close alert
#: arriving as the request goes out.
CLOSED_BETWEEN_REQUESTS = (
    http.client.RemoteDisconnected,
    ConnectionResetError,
    BrokenPipeError,
    ssl.SSLEOFError,
)


class KeptAlive:
    """One kept-alive HTTPS connection (as the API server keeps them, ``abuse.KeptAlive``),
    reopened when the server closed it between requests: a request that finds the
    connection closed is sent once more on a new one, and fails if that one is closed too."""

    def __init__(self, target: Target, timeout: float = 5.0) -> None:
        self._conn = abuse.KeptAlive(target, timeout=timeout)

    def send(self, path: str, data: bytes) -> tuple[int, bytes]:
        try:
            answer = self._conn.post(path, data)
        except CLOSED_BETWEEN_REQUESTS:
            answer = self._conn.post(path, data)
        return answer.status, answer.body

    def connection(self) -> socket.socket | None:
        """The socket of the connection open now, if one is."""
        return self._conn.socket()

    def close(self) -> None:
        self._conn.close()
