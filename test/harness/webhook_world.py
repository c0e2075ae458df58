"""The operator's webhook server as it ships (handlers, limits, TLS), on loopback, over
offline caches: classes, namespaces, a budget and held claims put straight into the
stores (the webhooks write nothing). Used by the bad-input suite and ``make fuzz``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry

from gpuoperator import cli, settings
from gpuoperator.caches import Caches
from gpuoperator.runtime import admitting, servercerts, serving
from harness.abuse import Target
from harness.offline import store_caches
from localcluster import pki

Obj = dict[str, Any]
NS = "tenant-a"
ORDER_PATH = "/validate-gpuclaim"
VMI_PATH = "/mutate-vmi"
POD_PATH = "/mutate-launcher-pod"


def gpuclass(name: str, mode: str = "passthrough", max_free: int = 4) -> Obj:
    spec: Obj = {
        "vendor": "nvidia",
        "model": name,
        "mode": mode,
        "source": {"devicePlugin": {"resourceName": f"nvidia.com/{name}"}},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if mode == "vgpu":
        spec["profile"] = name
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {"free": 8, "maxFreePerNode": max_free, "nodes": 2},
    }


def claim(name: str, class_name: str = "a10", count: int = 1) -> Obj:
    return {
        "metadata": {"name": name, "namespace": NS, "resourceVersion": "7"},
        "spec": {"className": class_name, "count": count},
        "status": {"phase": "Bound", "nodeName": "n1"},
    }


class NoKubeVirt:
    """An inventory without a KubeVirt table, whose nodes have 8 units of every class."""

    def permitted(self) -> frozenset[str] | None:
        return None

    def largest_allocatable(self, class_name: str) -> int:
        return 8


def caches() -> Caches:
    world = store_caches(
        classes=[gpuclass("a10"), gpuclass("l40s-24q", "vgpu", 1)],
        claims=[claim("hold-a"), claim("hold-b")],
    )
    world.namespaces.store.put({"metadata": {"name": NS}})
    world.quotas.store.put(
        {
            "metadata": {"name": "gpus", "namespace": NS},
            "spec": {"hard": {"gpuclass.cozystack.io/devices": "6"}},
        }
    )
    return world


# -- reviews ----------------------------------------------------------------------------------


def review(obj: Any, *, kind: str, operation: str = "CREATE", **request: Any) -> Obj:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7f0c9a52-3c1e-4d7e-9d6b-1f2e3d4c5b6a",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "operation": operation,
            "namespace": NS,
            "object": obj,
            "userInfo": {"username": "alice", "groups": ["tenants"]},
            "dryRun": False,
            **request,
        },
    }


def order(count: Any = 1, class_name: str = "a10", name: str = "c1") -> Obj:
    obj = {"metadata": {"name": name}, "spec": {"className": class_name, "count": count}}
    return review(obj, kind="GPUClaim", name=name)


def vmi(refs: str = '[{"claim":"hold-a"}]', name: str = "vm1") -> Obj:
    obj = {
        "metadata": {
            "name": name,
            "labels": {"gpu.cozystack.io/claims": "true"},
            "annotations": {"gpu.cozystack.io/claims": refs},
        },
        "spec": {"domain": {"devices": {}}},
    }
    return review(obj, kind="VirtualMachineInstance", name=name)


def launcher_pod(spec: Any = None) -> Obj:
    """A review of a launcher pod as KubeVirt's controller creates it (the default username
    of the setting kubevirtServiceAccount, a controller ownerReference to its VMI)."""
    obj = {
        "metadata": {
            "generateName": "virt-launcher-vm1-",
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": "vm1",
                    "uid": "u-vm1",
                    "controller": True,
                }
            ],
            "labels": {"kubevirt.io": "virt-launcher", "gpu.cozystack.io/claims": "true"},
            "annotations": {"gpu.cozystack.io/claims": '[{"claim":"hold-a"}]'},
        },
        "spec": {"containers": [{"name": "compute"}]} if spec is None else spec,
    }
    out = review(obj, kind="Pod")
    out["request"]["userInfo"] = {
        "username": "system:serviceaccount:kubevirt:kubevirt-controller",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:kubevirt"],
    }
    return out


def body(review_obj: Any) -> bytes:
    return json.dumps(review_obj).encode()


# -- the server -------------------------------------------------------------------------------


@dataclass
class World:
    target: Target
    server: serving.Server
    caches: Caches
    registry: CollectorRegistry = field(repr=False)


def certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA (written as ``ca.crt``) and a loopback serving pair signed by it."""
    ca_cert, ca_key = pki.new_ca("webhook-test-ca")
    ca = directory / "ca.crt"
    ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    certs = pki.write_loopback_serving_pair(ca_cert, ca_key, directory / "certs")
    return ca, certs / "tls.crt", certs / "tls.key"


@contextmanager
def webhook_server(directory: Path, **limits: Any) -> Iterator[World]:
    """The webhooks as ``gpuoperator run`` wires them (``cli.webhooks``, ``cli.webhook_server``
    with ``cli.WEBHOOK_LIMITS``, ``limits`` overriding some), serving on a free loopback port."""
    ca, crt, key = certificates(directory)
    world = caches()
    registry = CollectorRegistry()
    operator_settings = settings.load({}, {}, {})
    hooks = cli.webhooks(world, NoKubeVirt(), operator_settings)  # type: ignore[arg-type]
    server = cli.webhook_server(
        "127.0.0.1:0",
        admitting.app(hooks, ready=lambda: True, registry=registry),
        servercerts.FileCertificates(crt, key),
        registry,
        replace(cli.WEBHOOK_LIMITS, **limits),
    )
    server.start()
    try:
        yield World(Target(server.port, ca), server, world, registry)
    finally:
        server.stop()


def main() -> None:
    """``python -m harness.webhook_world DIR``: serve until standard input closes, the CA
    written to ``DIR/ca.crt`` and the port to ``DIR/port`` (for measuring the server as
    its own process)."""
    import sys

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only
    sys.setswitchinterval(cli.SWITCH_INTERVAL)  # as gpuoperator run sets it
    directory = Path(sys.argv[1])
    with webhook_server(directory) as w:
        (directory / "port").write_text(str(w.target.port))
        sys.stdin.read()


if __name__ == "__main__":
    main()
