"""GPUClaims on a real API server, for end-to-end tests: order one, read its status, wait
for it to be Bound; make a VMI (or a VirtualMachine) on claims and wait for it to run; read
the Events about an object; print ``gpuoperator status --node``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pykube

from gpuoperator import names
from gpuoperator.kinds import GPUClaim, VirtualMachine, VirtualMachineInstance
from harness.kube import Obj
from harness.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


def create_claim(api: pykube.HTTPClient, ns: str, name: str, cls: str, count: int) -> GPUClaim:
    """Order ``count`` units of class ``cls`` as claim ``ns/name``."""
    c = GPUClaim(
        api,
        {
            "apiVersion": names.API_VERSION,
            "kind": names.GPU_CLAIM,
            "metadata": {"name": name, "namespace": ns},
            "spec": {"className": cls, "count": count},
        },
    )
    c.create()
    return c


def claim_status(api: pykube.HTTPClient, ns: str, name: str) -> Obj:
    """The claim's status as stored now (``{}`` before its first write)."""
    found: Obj = GPUClaim.objects(api, namespace=ns).get(name=name).obj.get("status") or {}
    return found


def bound_node(
    api: pykube.HTTPClient, ns: str, name: str, node: str | None = None, *, timeout: float = 30.0
) -> str:
    """The node the claim is Bound to, waiting up to ``timeout`` seconds for it to be Bound
    (to ``node`` when given)."""
    s = wait_for(
        f"{ns}/{name} Bound" + (f" to {node}" if node else ""),
        lambda: claim_status(api, ns, name),
        until=lambda s: s.get("phase") == "Bound" and node in (None, s.get("nodeName")),
        timeout=timeout,
    )
    return str(s["nodeName"])


def vmi_metadata(ns: str, name: str, refs: list[Obj]) -> Obj:
    """A VMI's metadata carrying the claim references ``refs`` (label and annotation)."""
    return {
        "name": name,
        "namespace": ns,
        "labels": {names.CLAIMS_LABEL: "true"},
        "annotations": {names.CLAIMS_ANNOTATION: json.dumps(refs)},
    }


def vmi_spec(**spec: Any) -> Obj:
    """A VMI's spec: 1Gi of memory and no devices; ``spec`` adds to it."""
    return {"domain": {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}}, **spec}


def create_vmi(
    api: pykube.HTTPClient, ns: str, name: str, refs: list[Obj], **spec: Any
) -> VirtualMachineInstance:
    """A VMI with the claim references ``refs`` (label and annotation), 1Gi of memory and no
    devices; ``spec`` adds to its spec."""
    v = VirtualMachineInstance(
        api,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": vmi_metadata(ns, name, refs),
            "spec": vmi_spec(**spec),
        },
    )
    v.create()
    return v


def create_virtual_machine(
    api: pykube.HTTPClient, ns: str, name: str, refs: list[Obj], run: Obj, **spec: Any
) -> VirtualMachine:
    """A VirtualMachine that runs as ``run`` says (``{"runStrategy": ...}`` or the
    deprecated ``{"running": ...}``), its template the VMI ``create_vmi`` would make."""
    template = vmi_metadata(ns, name, refs)
    del template["name"], template["namespace"]
    vm = VirtualMachine(
        api,
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": ns},
            "spec": {**run, "template": {"metadata": template, "spec": vmi_spec(**spec)}},
        },
    )
    vm.create()
    return vm


def start_vm(
    api: pykube.HTTPClient,
    ns: str,
    name: str,
    claim: str,
    *,
    timeout: float = 30.0,
    run: Obj | None = None,
    **spec: Any,
) -> None:
    """A VMI on ``claim``, once the KubeVirt stand-in says it is ``Scheduled``; with ``run``
    a VirtualMachine (``create_virtual_machine``) whose VMI that is. ``spec`` adds to the
    VMI's spec."""
    if run is None:
        create_vmi(api, ns, name, [{"claim": claim}], **spec)
    else:
        create_virtual_machine(api, ns, name, [{"claim": claim}], run, **spec)
    wait_for(
        f"VM {name} running",
        lambda: _found(VirtualMachineInstance.objects(api, namespace=ns).get_or_none(name=name)),
        until=lambda v: v is not None and (v.get("status") or {}).get("phase") == "Scheduled",
        timeout=timeout,
    )


def _found(obj: Any) -> Obj | None:
    return None if obj is None else dict(obj.obj)


def event_messages(api: pykube.HTTPClient, ns: str, name: str, reason: str) -> list[str]:
    """The messages of the Events of ``reason`` about the object ``ns/name``."""
    found = pykube.Event.objects(api, namespace=ns).filter(
        field_selector={"involvedObject.name": name, "reason": reason}
    )
    return [str(e.obj.get("message")) for e in found]


def node_report(kubeconfig: Path, node: str) -> str:
    """What ``gpuoperator status --node`` of this checkout prints about ``node``."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gpuoperator.cli import main; sys.exit(main(sys.argv[1:]))",
            "status",
            f"--kubeconfig={kubeconfig}",
            f"--node={node}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout
