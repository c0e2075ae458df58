"""The DRA rows of the benchmark suite (``suite.py --only P1-DRA,P4-DRA``), each printed
beside its device-plugin row in the same table (docs/design.md §5 "DRA classes").

* **P1-DRA** claims of a DRA class bound per second by the operator ÷ pods allocated and
  scheduled per second by a second kube-scheduler, each on its own pool of ``--nodes``
  nodes of 8 devices published in ResourceSlices by a driver of its own (two drivers, two
  DeviceClasses: neither can take the other's devices). The operator's orders are created
  while the suite holds its Lease; the peer's pods, each with a ResourceClaimTemplate for one
  device, are created before its scheduler starts and once the control plane made their
  ResourceClaims. Both run first binding to last, as P1 does. A bound claim has its devices
  in an allocated ResourceClaim; a scheduled pod has its ResourceClaim allocated by the
  scheduler.
* **P4-DRA** one replica at ``--big-nodes`` nodes each publishing one ResourceSlice of 8
  devices (and ``--big-pods`` pods, as P4): resident memory and time from start to caches
  synced.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykube
import yaml

from gpuoperator import names
from gpuoperator.kinds import DeviceClass, GPUClaim, GPUClass, ResourceClaim
from harness import dra_driver
from localcluster.cluster import REPO, cache_root
from localcluster.processes import wait_until

ROWS = {"P1-DRA", "P4-DRA"}
OPERATOR_DRIVER = "gpu.bench-operator.example.com"
PEER_DRIVER = "gpu.bench-peer.example.com"
OPERATOR_DEVICES = "gpus.bench-operator.example.com"
PEER_DEVICES = "gpus.bench-peer.example.com"
CLASS = "bench-dra-a10"  # not the sample class of the same devices (config/samples)
PEER_SCHEDULER = "bench-peer-dra"
DEVICES = 8
Obj = dict[str, Any]


def _suite() -> Any:
    import suite  # noqa: PLC0415 - late: suite.py imports this module

    return suite


def run(args: argparse.Namespace, rows: list[Any], notes: list[str]) -> None:
    if "P1-DRA" in args.only_set:
        _place(rows, p1(args, notes), "P1 binds/s")
    if "P4-DRA" in args.only_set:
        for row in p4(args, notes):
            _place(rows, row, row.figure.split(" (")[0].replace("P4-DRA", "P4"))


def _place(rows: list[Any], row: Any, peer_prefix: str) -> None:
    """Print ``row`` right after the device-plugin row it stands beside, if measured."""
    at = [i for i, r in enumerate(rows) if r.figure.startswith(peer_prefix)]
    rows.insert(at[-1] + 1 if at else len(rows), row)


def _pykube(kubeconfig: Path) -> pykube.HTTPClient:
    return pykube.HTTPClient(pykube.KubeConfig.from_file(str(kubeconfig)), timeout=60)


def _nodes_profile(path: Path, pools: dict[str, int]) -> Path:
    """Nodes without extended resources: their GPUs are DRA devices."""
    path.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": f"{pool}-{{i}}", "count": n, "labels": {"bench/pool": pool}}
                    for pool, n in pools.items()
                ]
            }
        )
    )
    return path


def publish(kubeconfig: Path, driver: str, nodes: list[str], threads: int = 8) -> float:
    """One ResourceSlice of ``DEVICES`` A10s over two PCIe roots per node, from ``threads``
    clients; returns the seconds taken."""
    gpus = [dra_driver.GpuGroup(model="A10", count=DEVICES, pcieRoots=2)]

    def make() -> Callable[[int], None]:
        publisher = dra_driver.DraDriver(_pykube(kubeconfig), driver=driver)
        return lambda i: publisher.publish(nodes[i], dra_driver.gpus_of(nodes[i], gpus))

    took: float = _suite().parallel(len(nodes), threads, make)
    return took


def _device_classes(api: pykube.HTTPClient) -> None:
    for name, driver in ((OPERATOR_DEVICES, OPERATOR_DRIVER), (PEER_DEVICES, PEER_DRIVER)):
        DeviceClass(api, dra_driver.device_class(name, f'device.driver == "{driver}"')).create()


def _dra_class(api: pykube.HTTPClient) -> None:
    GPUClass(
        api,
        {
            "apiVersion": names.API_VERSION,
            "kind": names.GPU_CLASS,
            "metadata": {"name": CLASS},
            "spec": {
                "vendor": "nvidia",
                "model": "A10",
                "mode": "passthrough",
                "source": {
                    "dra": {"deviceClassName": OPERATOR_DEVICES, "topologyAttribute": "pcieRoot"}
                },
            },
        },
    ).create()


def _allocated(obj: Obj) -> bool:
    return bool(((obj.get("status") or {}).get("allocation") or {}).get("devices"))


def p1(args: argparse.Namespace, notes: list[str]) -> Any:
    suite = _suite()
    name = f"{args.cluster}-dra"
    cluster = suite.BigCluster(name)
    profile = _nodes_profile(
        cache_root() / f"{name}-profile.yaml", {"dra-op": args.nodes, "dra-peer": args.nodes}
    )
    took = cluster.up(
        profile,
        crds=[REPO / "config" / "crd", REPO / "test" / "harness" / "crds"],
        manifests=[REPO / "config" / "samples"],
        log=suite.log,
    )
    suite.log(f"P1-DRA: cluster {name}: {2 * args.nodes} nodes up in {took:.0f}s")
    try:
        client = suite.client_for(cluster.kubeconfig)
        api = _pykube(cluster.kubeconfig)
        suite.wait_nodes_ready(client, 2 * args.nodes)
        _device_classes(api)
        ops = [f"dra-op-{i}" for i in range(args.nodes)]
        peers = [f"dra-peer-{i}" for i in range(args.nodes)]
        took = publish(cluster.kubeconfig, OPERATOR_DRIVER, ops)
        took += publish(cluster.kubeconfig, PEER_DRIVER, peers)
        suite.log(f"P1-DRA: {2 * args.nodes} ResourceSlices published in {took:.0f}s")
        _dra_class(api)
        # A first run leads and publishes the class (the steady state a replica that takes
        # over meets); the measured replica starts while the suite holds its Lease.
        cluster.run_operator(log=suite.log, extra=("--metrics-insecure",))
        wait_until(
            f"class {CLASS} published on {args.nodes} nodes",
            lambda: (
                ((GPUClass.objects(api).get(name=CLASS).obj.get("status") or {}).get("nodes"))
                == args.nodes
            ),
            600,
            cluster.operator,
            interval=1.0,
        )
        cluster.operator.stop()
        suite.hold_lease(client)
        cluster.run_operator(log=suite.log, extra=("--metrics-insecure",))
        watch, writes, op_start, cpu = _operator(suite, cluster, client, args.orders)
        bound = len(watch.at)
        held = sum(
            1 for c in ResourceClaim.objects(api, namespace="bench-dra-orders") if _allocated(c.obj)
        )
        peer, peer_start, peer_cpu, allocated = _peer(suite, cluster, client, api, args.orders)
        qps, burst = suite.operator_defaults()
        notes.append(
            f"P1-DRA: {bound}/{args.orders} claims bound ({held} ResourceClaims allocated), "
            f"{len(peer.at)}/{args.orders} peer pods scheduled ({allocated} ResourceClaims "
            f"allocated by the peer); QPS/burst {qps:g}/{burst} for both; first bind "
            f"{op_start:.1f}s after the Lease was released, first peer bind {peer_start:.1f}s "
            f"after its scheduler started; from the first: operator {watch.spans()}, peer "
            f"{peer.spans()}"
        )
        notes.append(
            f"P1-DRA writes per bound claim: {suite._per_claim(writes, bound)}; CPU while "
            f"binding: operator {cpu[0]:.1f}s + API server/etcd {cpu[1]:.1f}s; peer scheduler "
            f"{peer_cpu[0]:.1f}s (with its start) + API server/etcd {peer_cpu[1]:.1f}s"
        )
        return suite.Row(
            f"P1-DRA binds/s ({args.nodes}x{DEVICES} devices, {args.orders} waiting)",
            watch.rate(),
            peer.rate(),
            "/s",
            ">= 1.0",
            False,
            1.0,
        )
    finally:
        if not args.keep:
            cluster.down(quiet=True)


def _operator(
    suite: Any, cluster: Any, client: Any, orders: int
) -> tuple[Any, dict[str, float], float, tuple[float, float]]:
    ns = "bench-dra-orders"
    suite.ensure_namespace(client, ns)
    suite.log(f"P1-DRA: creating {orders} orders (the operator does not lead yet)")
    took = suite.parallel(
        orders,
        8,
        lambda: lambda i: client.create(GPUClaim, suite.claim_body(f"order-{i:05d}", ns, CLASS)),
    )
    suite.log(f"P1-DRA: {orders} orders created in {took:.1f}s")
    watch = suite.Watch(
        client,
        GPUClaim,
        ns,
        lambda c: (
            (c.get("status") or {}).get("phase") == "Bound"
            and bool((c.get("status") or {}).get("devices"))
        ),
    )
    port = int(suite._flag(cluster.operator.argv(), "metrics-address").rsplit(":", 1)[1])
    before = suite.writes_by_resource(suite.scrape(port))
    cpu_before = suite.cpu_seconds(cluster.operator.pid()), suite.apiserver_cpu(cluster)
    released = time.monotonic()
    suite.release_lease(client)
    if not watch.wait(orders, 900):
        suite.log(f"P1-DRA: only {len(watch.at)} of {orders} bound within 900 s")
    first = min(watch.at.values()) if watch.at else released
    cpu = (
        suite.cpu_seconds(cluster.operator.pid()) - cpu_before[0],
        suite.apiserver_cpu(cluster) - cpu_before[1],
    )
    suite.quiesce(port)
    after = suite.writes_by_resource(suite.scrape(port))
    watch.stop()
    writes = {r: after.get(r, 0.0) - before.get(r, 0.0) for r in after}
    return watch, {r: n for r, n in writes.items() if n}, first - released, cpu


def _peer(
    suite: Any, cluster: Any, client: Any, api: pykube.HTTPClient, pods: int
) -> tuple[Any, float, tuple[float, float], int]:
    ns = "bench-dra-peer"
    suite.ensure_namespace(client, ns)
    template = {
        "apiVersion": names.DRA_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": ns},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": PEER_DEVICES, "count": 1},
                        }
                    ]
                }
            }
        },
    }
    response = api.post(
        url=f"namespaces/{ns}/resourceclaimtemplates", version=names.DRA_API_VERSION, json=template
    )
    api.raise_for_status(response)

    def pod(i: int) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"peer-{i:05d}", "namespace": ns},
            "spec": {
                "schedulerName": PEER_SCHEDULER,
                "automountServiceAccountToken": False,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                "containers": [
                    {"name": "c", "image": "bench", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        }

    suite.log(f"P1-DRA peer: creating {pods} pods for the second scheduler (not started yet)")
    suite.parallel(pods, 8, lambda: lambda i: client.create(pykube.Pod, pod(i)))
    wait_until(
        f"the control plane to make the {pods} pods' ResourceClaims",
        lambda: len(ResourceClaim.objects(api, namespace=ns)) >= pods,
        600,
        interval=1.0,
    )
    watch = suite.Watch(
        client, pykube.Pod, ns, lambda p: bool((p.get("spec") or {}).get("nodeName"))
    )
    api_before = suite.apiserver_cpu(cluster)
    started = time.monotonic()
    proc = suite.start_peer_scheduler(cluster, "bench-peer-dra-scheduler", PEER_SCHEDULER)
    try:
        if not watch.wait(pods, 900):
            suite.log(f"P1-DRA peer: only {len(watch.at)} of {pods} scheduled within 900 s")
        cpu = (suite.cpu_seconds(proc.pid()), suite.apiserver_cpu(cluster) - api_before)
    finally:
        proc.stop()
        watch.stop()
    allocated = sum(1 for c in ResourceClaim.objects(api, namespace=ns) if _allocated(c.obj))
    first = min(watch.at.values()) if watch.at else started
    return watch, first - started, cpu, allocated


def p4(args: argparse.Namespace, notes: list[str]) -> list[Any]:
    """P4 with every node's devices published as a ResourceSlice (and the same pods)."""
    suite = _suite()
    name = f"{args.big_cluster}-dra"
    cluster = suite.BigCluster(name)
    profile = _nodes_profile(cache_root() / f"{name}-profile.yaml", {"gpu": args.big_nodes})
    took = cluster.up(
        profile,
        crds=[REPO / "config" / "crd"],
        manifests=[REPO / "config" / "samples"],
        log=suite.log,
    )
    try:
        client = suite.client_for(cluster.kubeconfig)
        api = _pykube(cluster.kubeconfig)
        suite.wait_nodes_ready(client, args.big_nodes)
        suite.log(f"P4-DRA: {args.big_nodes} nodes Ready ({took:.0f}s to start the cluster)")
        for ns in ("bench-pods", "bench-claims", suite.operator_namespace()):
            suite.ensure_namespace(client, ns)
        client.create(
            pykube.Secret,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": names.WEBHOOK_CERT_SECRET,
                    "namespace": suite.operator_namespace(),
                },
            },
        )
        _device_classes(api)
        _dra_class(api)
        nodes = [f"gpu-{i}" for i in range(args.big_nodes)]
        published = publish(cluster.kubeconfig, OPERATOR_DRIVER, nodes, threads=16)
        gen = suite.generate(cluster.kubeconfig, args.big_nodes, args.big_pods, 0, args.procs)
        suite.log(
            f"P4-DRA: {args.big_nodes} ResourceSlices published in {published:.0f}s, "
            f"{args.big_pods} pods created in {gen:.0f}s"
        )
        # A first run leads and settles (GPUNodes, the class's status); the measured run is
        # the second, as in P4.
        proc, _pid, _ = suite.start_operator(cluster, "bench-operator-dra-first")

        def settled() -> bool:
            status = GPUClass.objects(api).get(name=CLASS).obj.get("status") or {}
            return bool(status.get("nodes") == args.big_nodes)

        took = wait_until(f"class {CLASS} published on every node", settled, 1200, proc, 5.0)
        suite.log(f"P4-DRA: the first run published the class in {took:.0f}s")
        proc.stop()
        proc, pid, sync = suite.start_operator(cluster, "bench-operator-dra")
        synced_rss = suite.rss_mib(pid)
        peak = synced_rss
        settle_until = time.monotonic() + args.settle
        while time.monotonic() < settle_until:
            peak = max(peak, suite.rss_mib(pid))
            time.sleep(0.5)  # sampling memory over a fixed window
        with contextlib.suppress(Exception):
            proc.stop()
        notes.append(
            f"P4-DRA: RSS {synced_rss:.0f} MiB at sync, peak {peak:.0f} MiB over "
            f"{args.settle:.0f}s as leader; {args.big_nodes} ResourceSlices of {DEVICES} "
            f"devices, {args.big_pods} pods, no claims"
        )
        return [
            suite.Row(
                f"P4-DRA RSS ({args.big_nodes} nodes' slices, {args.big_pods} pods)",
                peak,
                400.0,
                "MiB",
                "<= 400 MiB",
                True,
                1.0,
            ),
            suite.Row("P4-DRA caches synced from start", sync, 15.0, "s", "<= 15 s", True, 1.0),
        ]
    finally:
        if not args.keep:
            cluster.down(quiet=True)
