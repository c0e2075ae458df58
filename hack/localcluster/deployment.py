"""The dev overlay (``config/overlays/dev``) deployed to a local control plane, and the
operator run from the checkout exactly as its Deployment would run it.

* **Render** with the kustomize built into the pinned kubectl; nothing is assembled by hand.
* **Apply** every rendered object with server-side apply, so the real API server accepts
  each of them (CRDs first, then the rest). The webhook configurations are applied only
  while an operator serves them (``register_webhooks``): they fail closed, and a
  configuration pointing at a stopped process would refuse every GPUClaim of the cluster.
  Their ``clientConfig.url`` is the rendered loopback URL with the port of the process; the
  caBundle is the operator's to inject (``--certificates=self-managed``). Nothing else of
  them changes.
* **Run** the Deployment's container (``manager``) as a local process: its command and
  args, its env with the downward API filled in as the kubelet would (the pod's name is the
  replica's identity), its listen addresses moved to 127.0.0.1 (each pod has its own IP;
  local processes share one; port 0 lets each server bind a port the kernel picks and say
  which in its log, ``serving_ports``), and a kubeconfig holding a token of the rendered
  ServiceAccount (TokenRequest), never the cluster admin's — so the shipped RBAC is what
  the operator runs with.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster.processes import ClusterError

Obj = dict[str, Any]

HACK = Path(__file__).resolve().parent.parent
REPO = HACK.parent
DEV_OVERLAY = REPO / "config" / "overlays" / "dev"
WEBHOOK_KINDS = frozenset({"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"})
CONTAINER = "manager"
#: The flags whose value is an address to listen on (moved to 127.0.0.1:<free port>).
ADDRESS_FLAGS = ("--health-address", "--metrics-address", "--webhook-address")
#: How long a token of the operator's ServiceAccount lasts (the API server may shorten it).
TOKEN_SECONDS = 48 * 3600


@dataclass(frozen=True)
class Rendered:
    """The objects ``kubectl kustomize`` renders, in order."""

    objects: tuple[Obj, ...]

    def find(self, kind: str, name: str | None = None) -> list[Obj]:
        return [
            o
            for o in self.objects
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
        ]

    def one(self, kind: str, name: str | None = None) -> Obj:
        found = self.find(kind, name)
        if len(found) != 1:
            raise ClusterError(f"the rendering has {len(found)} {kind} {name or ''}, not one")
        return found[0]

    @property
    def deployment(self) -> Obj:
        return self.one("Deployment")

    @property
    def namespace(self) -> str:
        return str(self.deployment["metadata"]["namespace"])

    @property
    def service_account(self) -> str:
        spec = self.deployment["spec"]["template"]["spec"]
        return str(spec.get("serviceAccountName") or "default")

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def container(self) -> Obj:
        containers = self.deployment["spec"]["template"]["spec"]["containers"]
        for c in containers:
            if c["name"] == CONTAINER:
                return dict(c)
        raise ClusterError(f"the Deployment has no container {CONTAINER!r}")

    @property
    def webhook_configurations(self) -> list[Obj]:
        return [o for o in self.objects if o["kind"] in WEBHOOK_KINDS]

    @property
    def crds(self) -> list[Obj]:
        return self.find("CustomResourceDefinition")

    def rest(self) -> list[Obj]:
        """Everything but the CRDs and the webhook configurations."""
        return [
            o
            for o in self.objects
            if o["kind"] not in WEBHOOK_KINDS and o["kind"] != "CustomResourceDefinition"
        ]


def render(kubectl: str, overlay: Path = DEV_OVERLAY) -> Rendered:
    proc = subprocess.run(
        [kubectl, "kustomize", str(overlay)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if proc.returncode != 0:
        raise ClusterError(f"kubectl kustomize {overlay}: {proc.stderr.strip()}")
    return Rendered(tuple(d for d in yaml.safe_load_all(proc.stdout) if d))


def loopback_webhooks(rendered: Rendered, port: int) -> list[Obj]:
    """The rendered webhook configurations with each ``clientConfig.url`` pointing at
    ``port`` on loopback; nothing else changes."""
    out = []
    for rendered_config in rendered.webhook_configurations:
        config = copy.deepcopy(rendered_config)
        for webhook in config.get("webhooks") or []:
            client_config = webhook.get("clientConfig") or {}
            url = client_config.get("url")
            if not url:
                raise ClusterError(
                    f"{config['kind']} {config['metadata']['name']}: webhook "
                    f"{webhook.get('name')} has no clientConfig.url (the dev overlay rewrites "
                    "the Service reference to a loopback URL)"
                )
            parts = urllib.parse.urlsplit(url)
            client_config["url"] = urllib.parse.urlunsplit(
                parts._replace(netloc=f"{parts.hostname}:{port}")
            )
        out.append(config)
    return out


def token_kubeconfig(kubectl: str, admin_kubeconfig: Path, rendered: Rendered, path: Path) -> Path:
    """A kubeconfig for the rendered ServiceAccount: the admin's cluster entry and a token
    from the TokenRequest API (``kubectl create token``)."""
    proc = subprocess.run(
        [
            kubectl,
            f"--kubeconfig={admin_kubeconfig}",
            "create",
            "token",
            rendered.service_account,
            f"--namespace={rendered.namespace}",
            f"--duration={TOKEN_SECONDS}s",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if proc.returncode != 0:
        raise ClusterError(f"a token for {rendered.username}: {proc.stderr.strip()}")
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c["context"] for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    user = rendered.service_account
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": proc.stdout.strip()}}],
        "contexts": [
            {
                "name": user,
                "context": {
                    "cluster": cluster["name"],
                    "user": user,
                    "namespace": rendered.namespace,
                },
            }
        ],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(config))
    return path


@dataclass(frozen=True)
class Ports:
    health: int
    metrics: int
    webhook: int


#: Every server binds a port the kernel picks and names it in its "serving" log line
#: (:func:`serving_ports`): no other process of the machine can take a port between its
#: choice and the bind.
ANY_PORTS = Ports(0, 0, 0)
#: The name each address flag's server gives itself in its "serving" log line.
SERVERS = {
    "--health-address": "health",
    "--metrics-address": "metrics",
    "--webhook-address": "webhooks",
}


def servers(argv: Iterable[str]) -> set[str]:
    """The servers ``argv`` starts: each address flag whose last value is not empty."""
    addresses: dict[str, str] = {}
    for arg in argv:
        flag, sep, value = arg.partition("=")
        if sep and flag in SERVERS:
            addresses[flag] = value
    return {SERVERS[flag] for flag, value in addresses.items() if value}


def serving_ports(log: str) -> dict[str, int]:
    """The port each server of an operator process bound, by server name, from the
    ``serving`` lines of its JSON log."""
    found: dict[str, int] = {}
    for line in log.splitlines():
        if '"serving"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == "serving":
            port = entry.get("port")
            if isinstance(port, int) and isinstance(entry.get("server"), str):
                found[entry["server"]] = port
    return found


def operator_command(
    rendered: Rendered,
    *,
    kubeconfig: Path,
    pod_name: str,
    ports: Ports,
    extra: Iterable[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the Deployment's container, as a local process.

    The image's entry point ``gpuoperator`` is this checkout's ``python -m gpuoperator.cli``;
    ``--kubeconfig`` (the ServiceAccount's token) stands for the token the kubelet would
    mount; ``--identity`` is the pod's name (the default identity is the hostname, which in
    a pod is its name). ``extra`` args come last, so a test can override one flag."""
    container = rendered.container
    command = list(container.get("command") or [])
    if not command or Path(command[0]).name != "gpuoperator":
        raise ClusterError(f"the {CONTAINER} container's command {command} is not gpuoperator")
    listen = {
        "--health-address": ports.health,
        "--metrics-address": ports.metrics,
        "--webhook-address": ports.webhook,
    }
    args = []
    for arg in [*command[1:], *(container.get("args") or [])]:
        flag, sep, value = arg.partition("=")
        args.append(f"{flag}=127.0.0.1:{listen[flag]}" if sep and flag in listen and value else arg)
    argv = [
        sys.executable,
        "-m",
        "gpuoperator.cli",
        *args,
        f"--kubeconfig={kubeconfig}",
        f"--identity={pod_name}",
        *extra,
    ]
    env = {**os.environ, **container_env(rendered, pod_name)}
    env.pop("KUBECONFIG", None)
    return argv, env


def container_env(rendered: Rendered, pod_name: str) -> dict[str, str]:
    """The container's env: plain values, the downward API as the kubelet fills it for
    this pod, and ConfigMap/Secret keys from the rendered objects."""
    pod = {
        "metadata.name": pod_name,
        "metadata.namespace": rendered.namespace,
        "spec.serviceAccountName": rendered.service_account,
        "spec.nodeName": "localhost",
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    out: dict[str, str] = {}
    for var in rendered.container.get("env") or []:
        name, source = var["name"], var.get("valueFrom")
        if source is None:
            out[name] = str(var.get("value", ""))
        elif "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path not in pod:
                raise ClusterError(f"env {name}: the downward API field {path} is not simulated")
            out[name] = pod[path]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            out[name] = str(rendered.one("ConfigMap", ref["name"]).get("data", {})[ref["key"]])
        else:
            raise ClusterError(f"env {name}: {json.dumps(source)} is not simulated")
    return out
