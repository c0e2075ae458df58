"""The load of the chaos suite: tenants ordering GPUs in racing bursts, releasing some, and
VMs started and stopped through the KubeVirt stand-in.

Every client call that fails without an answer from the API server (it is restarting, a
connection was cut) is retried until ``RETRY_SECONDS``, as a tenant's tooling would; a
create that landed before its answer was lost shows up as 409 AlreadyExists on the retry and
counts as placed. What the API server answers with a decision — a webhook refusal — is
recorded as the order's outcome, with its message.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pykube
import requests

from gpuoperator import names
from gpuoperator.kinds import GPUClaim, VirtualMachineInstance
from harness.waiting import wait_for

Obj = dict[str, Any]
T = TypeVar("T")
RETRY_SECONDS = 90.0
#: Pause between retries.
RETRY_PAUSE = 0.5
#: HTTP statuses that are the API server not answering yet (not a decision).
_TRANSIENT = {429, 500, 502, 503, 504}
#: What a webhook says when its replica's caches do not follow the API server yet (right
#: after the API server came back, before the operator's watches are open again): "retry
#: shortly", not a decision. Every other answer a webhook gives is one.
WEBHOOK_NOT_READY = "caches are not synced yet; retry shortly"


@dataclass
class Outcome:
    namespace: str
    name: str
    class_name: str
    count: int
    placed: bool = False
    refusal: str = ""


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    retries: int = 0
    #: Of the retries, those a webhook asked for while its caches caught up.
    not_ready: int = 0
    errors: list[str] = field(default_factory=list)

    def retried(self, not_ready: bool = False) -> None:
        with self.lock:
            self.retries += 1
            self.not_ready += not_ready

    def error(self, what: str) -> None:
        with self.lock:
            self.errors.append(what)


def retrying(tally: Tally, what: str, call: Callable[[], T]) -> T:
    """``call()`` until it gets an answer that is not a transient failure."""
    deadline = time.monotonic() + RETRY_SECONDS
    while True:
        not_ready = False
        try:
            return call()
        except pykube.exceptions.HTTPError as exc:
            not_ready = exc.code == 503 and WEBHOOK_NOT_READY in str(exc)
            if exc.code not in _TRANSIENT or ("denied the request" in str(exc) and not not_ready):
                raise
            failure = f"HTTP {exc.code}: {exc}"
        except requests.HTTPError as exc:
            # pykube raises requests' own error for a list (``Query.execute``) and for an
            # answer that is not a JSON Status: a restarted API server answers 503 for custom
            # resources until it serves their CRDs again.
            status = exc.response.status_code if exc.response is not None else 0
            if status not in _TRANSIENT:
                raise
            failure = f"HTTP {status}: {exc}"
        except (requests.ConnectionError, requests.Timeout) as exc:
            failure = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: no answer for {RETRY_SECONDS:.0f}s; last: {failure}")
        tally.retried(not_ready)
        time.sleep(RETRY_PAUSE)


def claim_body(namespace: str, name: str, class_name: str, count: int) -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.GPU_CLAIM,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"className": class_name, "count": count},
    }


def place(api: pykube.HTTPClient, outcome: Outcome, tally: Tally) -> Outcome:
    """Order one claim; the outcome says placed, or refused with the API server's message."""
    body = claim_body(outcome.namespace, outcome.name, outcome.class_name, outcome.count)

    def create() -> None:
        try:
            GPUClaim(api, json.loads(json.dumps(body))).create()
        except pykube.exceptions.HTTPError as exc:
            if exc.code != 409:  # 409: an earlier attempt landed
                raise

    try:
        retrying(tally, f"ordering {outcome.name}", create)
        outcome.placed = True
    except pykube.exceptions.HTTPError as exc:
        outcome.refusal = str(exc)
    return outcome


class Clients:
    """One API client per thread (requests sessions are not shared between threads)."""

    def __init__(self, api: pykube.HTTPClient) -> None:
        self._config = api.config
        self._local = threading.local()

    def get(self) -> pykube.HTTPClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = pykube.HTTPClient(self._config, timeout=30)
            self._local.client = client
        return client


def burst(clients: Clients, orders: list[Outcome], tally: Tally, parallel: int = 8) -> None:
    """Send ``orders`` at once from ``parallel`` clients."""
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(lambda o: place(clients.get(), o, tally), orders))


def release(
    api: pykube.HTTPClient, namespace: str, share: float, rng: random.Random, tally: Tally
) -> int:
    """Delete ``share`` of the namespace's Bound claims (the tenant gives GPUs back)."""
    claims = retrying(
        tally, "listing claims", lambda: list(GPUClaim.objects(api, namespace=namespace))
    )
    bound = [c for c in claims if (c.obj.get("status") or {}).get("phase") == "Bound"]
    victims = rng.sample(bound, int(len(bound) * share))
    for claim in victims:
        try:
            retrying(tally, f"deleting {claim.name}", claim.delete)
        except pykube.exceptions.HTTPError as exc:
            if exc.code != 404:
                raise
    return len(victims)


# ---- VMs ---------------------------------------------------------------------------------


def vmi_body(namespace: str, name: str, refs: list[Obj]) -> Obj:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {names.CLAIMS_LABEL: "true"},
            "annotations": {names.CLAIMS_ANNOTATION: json.dumps(refs)},
        },
        "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}}},
    }


def read(api: pykube.HTTPClient, kind: Any, namespace: str, name: str) -> Obj | None:
    """The object of ``kind`` named ``namespace/name`` as the API server has it, or ``None``."""
    found = kind.objects(api, namespace=namespace).get_or_none(name=name)
    return None if found is None else dict(found.obj)


@dataclass
class VmRun:
    name: str
    template: bool
    node: str = ""
    claim_nodes: list[str] = field(default_factory=list)
    problem: str = ""
    #: times the hold's order was refused because no node had a unit free (then ordered again)
    capacity_refusals: int = 0


def vm_cycle(
    api: pykube.HTTPClient, namespace: str, vm_class: str, run: VmRun, tally: Tally, converge: float
) -> VmRun:
    """Start one VM (on a held claim, or with a claim template), wait until its launcher pod
    is scheduled, check it runs where its claims are bound, stop it, wait until it is gone
    (and, for a held claim, give the claim back)."""
    hold = f"{run.name}-hold"
    if run.template:
        refs: list[Obj] = [{"claimTemplate": {"className": vm_class, "count": 1}}]
    else:
        refs = [{"claim": hold}]
        _order_hold(api, namespace, hold, vm_class, run, tally, converge)
        wait_for(
            f"{hold} Bound",
            lambda: (
                (
                    retrying(tally, "reading", lambda: read(api, GPUClaim, namespace, hold)) or {}
                ).get("status")
                or {}
            ),
            until=lambda s: s.get("phase") == "Bound",
            timeout=converge,
        )
    retrying(
        tally,
        f"starting {run.name}",
        lambda: create(VirtualMachineInstance(api, vmi_body(namespace, run.name, refs))),
    )
    status = wait_for(
        f"VM {run.name} Scheduled",
        lambda: (
            (
                retrying(
                    tally, "reading", lambda: read(api, VirtualMachineInstance, namespace, run.name)
                )
                or {}
            ).get("status")
            or {}
        ),
        until=lambda s: s.get("phase") in ("Scheduled", "Failed"),
        timeout=converge,
    )
    if status.get("phase") != "Scheduled":
        run.problem = f"VM {run.name} {status.get('phase')}: {status}"
    run.node = str(status.get("nodeName") or "")
    vmi = retrying(tally, "reading", lambda: read(api, VirtualMachineInstance, namespace, run.name))
    uid = (vmi or {}).get("metadata", {}).get("uid", "")
    claims = retrying(tally, "listing", lambda: list(GPUClaim.objects(api, namespace=namespace)))
    said: list[str] = []
    for c in claims:
        owners = {r.get("uid") for r in c.obj["metadata"].get("ownerReferences") or []}
        if c.name == hold or uid in owners:
            claim_status = c.obj.get("status") or {}
            run.claim_nodes.append(str(claim_status.get("nodeName") or ""))
            bound: Obj = next(
                (x for x in claim_status.get("conditions") or [] if x.get("type") == "Bound"), {}
            )
            said.append(f"{c.name}: {bound.get('reason')}: {bound.get('message')}")
    if not run.problem and (not run.claim_nodes or set(run.claim_nodes) != {run.node}):
        run.problem = (
            f"VM {run.name} on {run.node!r}, its claims on {run.claim_nodes} ({'; '.join(said)})"
        )
    retrying(
        tally,
        f"stopping {run.name}",
        lambda: delete(VirtualMachineInstance(api, vmi or vmi_body(namespace, run.name, refs))),
    )
    wait_for(
        f"VM {run.name} gone",
        lambda: retrying(
            tally, "reading", lambda: read(api, VirtualMachineInstance, namespace, run.name)
        ),
        until=lambda v: v is None,
        timeout=converge,
    )
    if not run.template:
        retrying(
            tally,
            f"releasing {hold}",
            lambda: delete(GPUClaim(api, claim_body(namespace, hold, vm_class, 1))),
        )
    return run


#: The order webhook's words when no node has the units free now (``model.orders``).
NO_FREE_UNIT = "free GPU"


def _order_hold(
    api: pykube.HTTPClient,
    namespace: str,
    hold: str,
    vm_class: str,
    run: VmRun,
    tally: Tally,
    converge: float,
) -> None:
    """Order the VM's hold, ordering again while it is refused because no node has a unit
    free, as a tenant would: the VM class's units are all held for a while when claims of
    stopped VMs are not released yet (their finalizer waits for a leader)."""
    failed: list[Exception] = []

    def admitted() -> bool:
        try:
            retrying(
                tally,
                f"ordering {hold}",
                lambda: create(GPUClaim(api, claim_body(namespace, hold, vm_class, 1))),
            )
        except pykube.exceptions.HTTPError as exc:
            if NO_FREE_UNIT not in str(exc):
                failed.append(exc)  # any other refusal ends the wait
                return True
            run.capacity_refusals += 1
            return False
        return True

    wait_for(f"{hold} admitted", admitted, timeout=converge, interval=0.5)
    if failed:
        raise failed[0]


def create(obj: pykube.objects.APIObject) -> None:
    try:
        obj.create()
    except pykube.exceptions.HTTPError as exc:
        if exc.code != 409:
            raise


def create_retrying(api: pykube.HTTPClient, tally: Tally, kind: Any, body: Obj) -> None:
    """Create ``body`` as a ``kind``, retried while the API server does not answer yet (an
    attempt that landed is no error: :func:`create`)."""
    name = body["metadata"]["name"]
    retrying(tally, f"creating {name}", lambda: create(kind(api, body)))


def delete(obj: pykube.objects.APIObject) -> None:
    try:
        obj.delete()
    except pykube.exceptions.HTTPError as exc:
        if exc.code != 404:
            raise
