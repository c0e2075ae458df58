"""Slow clients hold nothing up: with 200 idle sockets (never starting TLS), 50 slowloris
connections (a header byte every half second) and 20 half-sent bodies held open, good
reviews are still answered, each within the answer deadline, none failing. Nor do busy
ones: with 128 kept-alive connections posting forged VMI reviews as fast as they are
answered, genuine reviews from another address are all answered, and the flood's requests
wait for the turns of their own sources (or are answered 429, or lose connections).

The figures (p50/p99 of the good requests, failures, how many abusive connections were
still open at the end) are printed; the test asserts only that none failed. Abusive
connections come from 127.0.0.2-4 (within the per-source limit, so they really are held),
good ones from 127.0.0.1, as the API server's would come from its own address.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from gpuoperator import cli
from harness import abuse, objects
from harness.waiting import wait_for
from harness.webhook_world import ORDER_PATH, VMI_PATH, World, body, order, vmi

GOOD_REQUESTS = 200
CLIENTS = 2
ANSWER_DEADLINE = 5.0  # half the API server's webhook timeout


def test_good_reviews_are_answered_while_slow_clients_hold_connections(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    data = body(order())
    abusers = abuse.Abusers(
        world.target,
        idle=200,
        slowloris=50,
        half_bodies=20,
        path=ORDER_PATH,
        sources=("127.0.0.2", "127.0.0.3", "127.0.0.4"),
    )
    times: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        for _ in range(n):
            try:
                answer = abuse.post(world.target, ORDER_PATH, data, timeout=ANSWER_DEADLINE)
                ok = answer.status == 200 and json.loads(answer.body)["response"]["allowed"]
                with lock:
                    if ok:
                        times.append(answer.seconds)
                    else:
                        failures.append(f"{answer.status} {answer.body[:200]!r}")
            except OSError as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")

    try:
        held_at_start = abusers.held
        start = time.perf_counter()
        threads = [
            threading.Thread(target=client, args=(GOOD_REQUESTS // CLIENTS,))
            for _ in range(CLIENTS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        elapsed = time.perf_counter() - start
        still_trickling = len(abusers.slow)
    finally:
        abusers.close()
    with capsys.disabled():
        print(
            f"\nslow clients: {held_at_start} abusive connections held "
            f"(setup failures {abusers.setup_failures}, slowloris still open at the end "
            f"{still_trickling}/50); {len(times)} good reviews in {elapsed:.2f}s from "
            f"{CLIENTS} clients on fresh TLS connections: "
            f"p50 {abuse.percentile(times, 50) * 1000:.1f} ms, "
            f"p99 {abuse.percentile(times, 99) * 1000:.1f} ms, "
            f"max {max(times, default=0) * 1000:.1f} ms, failures {len(failures)}"
        )
    assert abusers.setup_failures == 0 and held_at_start == 270
    assert failures == [], failures[:5]
    assert len(times) == GOOD_REQUESTS


FLOOD = 128
GENUINE = 100
FLOOD_SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


def genuine_reviews(world: World, data: bytes, n: int) -> tuple[list[float], list[str]]:
    """``n`` reviews from 127.0.0.1 on fresh TLS connections: their times, and what failed."""
    times: list[float] = []
    failures: list[str] = []
    for _ in range(n):
        try:
            answer = abuse.post(world.target, VMI_PATH, data, timeout=ANSWER_DEADLINE)
        except OSError as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
            continue
        if answer.status == 200 and json.loads(answer.body)["response"]["allowed"]:
            times.append(answer.seconds)
        else:
            failures.append(f"{answer.status} {answer.body[:200]!r}")
    return times, failures


@pytest.fixture
def switch_interval() -> Iterator[None]:
    """The interpreter's switch interval as ``gpuoperator run`` sets it: the flood's thread
    and the server's share this process, as the operator's threads share its own."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(cli.SWITCH_INTERVAL)
    yield
    sys.setswitchinterval(saved)


@pytest.mark.usefixtures("switch_interval")
def test_genuine_reviews_are_answered_while_busy_connections_post_forged_ones(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    genuine = body(vmi('[{"claim":"hold-b"}]', name="vm-genuine"))
    quiet, quiet_failures = genuine_reviews(world, genuine, GENUINE // 2)
    waits_before = turn_waits(world)
    # Another tenant's held claim, named by reviews nobody asked the API server for.
    flood = abuse.Flood(
        world.target,
        connections=FLOOD,
        path=VMI_PATH,
        body=body(vmi('[{"claim":"hold-a"}]', name="forged")),
        sources=FLOOD_SOURCES,
    )
    try:
        wait_for("the flood to be answered", flood.answers, until=lambda n: n >= FLOOD)
        loud, loud_failures = genuine_reviews(world, genuine, GENUINE)
        statuses = dict(flood.statuses)
    finally:
        flood.close()
    with capsys.disabled():
        print(
            f"\nbusy clients: {FLOOD} kept-alive connections of forged VMI reviews from "
            f"{len(FLOOD_SOURCES)} addresses, answered {statuses} (connections closed by the "
            f"server {flood.closed}); genuine VMI reviews on fresh TLS connections: without "
            f"the flood p50 {abuse.percentile(quiet, 50) * 1000:.1f} ms, "
            f"p99 {abuse.percentile(quiet, 99) * 1000:.1f} ms; with it "
            f"p50 {abuse.percentile(loud, 50) * 1000:.1f} ms, "
            f"p99 {abuse.percentile(loud, 99) * 1000:.1f} ms, "
            f"max {max(loud, default=0) * 1000:.1f} ms; failures {len(loud_failures)}"
        )
    assert flood.setup_failures == 0
    assert quiet_failures == [] and loud_failures == [], (quiet_failures + loud_failures)[:5]
    assert len(loud) == GENUINE
    # The flood's own requests are the ones held back: they waited for their sources'
    # turns (or got 429s, or lost connections).
    held_back = turn_waits(world) - waits_before
    assert held_back > 0 or statuses.get(429, 0) > 0 or flood.closed > 0, statuses
    assert set(statuses) <= {200, 429}, statuses


def turn_waits(world: World) -> float:
    value = world.registry.get_sample_value(
        "gpuoperator_http_source_turn_waits_total", {"server": "webhooks", "phase": "request"}
    )
    return value or 0.0


def review_size(obj: objects.Obj, kind: str) -> int:
    request = {
        "uid": "7f0c9a52-3c1e-4d7e-9d6b-1f2e3d4c5b6a",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "operation": "CREATE",
        "namespace": objects.NS,
        "object": obj,
        "userInfo": {
            "username": "system:serviceaccount:kubevirt:kubevirt-controller",
            "groups": ["system:serviceaccounts", "system:authenticated"],
        },
    }
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return len(json.dumps(review))


#: The API server's limit on all of an object's annotations together.
ANNOTATIONS_CEILING = 256 * 1024


def test_each_webhooks_body_limit_fits_its_reviews_with_room_to_spare() -> None:
    limits = cli.WEBHOOK_BODY_LIMITS
    assert set(limits) == {ORDER_PATH, VMI_PATH, "/mutate-launcher-pod"}
    typical = {
        ORDER_PATH: review_size(objects.claim("c1"), "GPUClaim"),
        VMI_PATH: review_size(objects.vmi(refs=[{"claim": "hold-a"}]), "VirtualMachineInstance"),
        "/mutate-launcher-pod": review_size(objects.launcher_pod(), "Pod"),
    }
    for path, size in typical.items():
        assert size * 32 <= limits[path], (path, size, limits[path])
    # A claim's review never waits for the memory budget.
    assert limits[ORDER_PATH] <= cli.WEBHOOK_LIMITS.small_body
    # A VMI (and so its launcher pod) may carry the API server's ceiling of annotations.
    padded = {"pad": "x" * (ANNOTATIONS_CEILING - 3)}
    big_vmi = objects.vmi(refs=[{"claim": "hold-a"}], annotations=padded)
    assert review_size(big_vmi, "VirtualMachineInstance") * 3 <= limits[VMI_PATH]
    big_pod = objects.launcher_pod()
    big_pod["metadata"]["annotations"].update(padded)
    assert review_size(big_pod, "Pod") * 3 <= limits["/mutate-launcher-pod"]


def test_a_claim_review_beyond_its_limit_is_a_413_naming_it(world: World) -> None:
    review = order()
    limit = cli.WEBHOOK_BODY_LIMITS[ORDER_PATH]
    review["request"]["object"]["metadata"]["annotations"] = {"pad": "x" * limit}
    answer = abuse.post(world.target, ORDER_PATH, body(review))
    assert answer.status == 413
    assert f"exceeds the limit of {limit} bytes for POST {ORDER_PATH}".encode() in answer.body
    # The same body is within the VMI webhook's limit: it is judged there (a 200 answer).
    assert abuse.post(world.target, VMI_PATH, body(review)).status == 200
