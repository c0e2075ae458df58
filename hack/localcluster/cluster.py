"""The local control plane: build (once), start, wait for health, seed, stop.

State lives in ``<cache>/clusters/<name>/`` (PKI, etcd data, logs, pid files, kubeconfig),
outside the repository. Every port is chosen free on 127.0.0.1 at start, so a developer's
cluster and the e2e suite's can run side by side.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from localcluster import deployment
from localcluster import pki as pkimod
from localcluster import profile as profilemod
from localcluster.processes import ClusterError, Process, wait_until

HACK = Path(__file__).resolve().parent.parent
REPO = HACK.parent
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
#: Off-by-default features the local control plane turns on, in every component that reads
#: them: DeviceTaintRules (beta in 1.36, served as resource.k8s.io/v1beta2 only with its API
#: version enabled too), which the operator's DRA inventory reads beside the slices' taints.
FEATURE_GATES = "DRADeviceTaintRules=true"
RUNTIME_CONFIG = "resource.k8s.io/v1beta2/devicetaintrules=true"
SERVICE_CIDR = "10.96.0.0/12"
#: The KubeVirt CRDs the stand-in serves (no KubeVirt runs here).
KUBEVIRT_CRDS = REPO / "test" / "harness" / "crds"
SAMPLES = REPO / "config" / "samples"
#: The DRA driver stand-in's account and DeviceClass (``run_dra_standin``).
DRA_DRIVER = HACK / "localcluster" / "dra-driver.yaml"
#: The API server's audit log records every request of a service account (Metadata level):
#: the e2e suite reads it to prove the operator never got a 403.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


def admission_configuration(kubeconfig: Path) -> dict[str, Any]:
    """The API server's admission configuration: both webhook plugins read the client
    credentials they present to webhooks from ``kubeconfig``."""
    webhooks = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {"name": "ValidatingAdmissionWebhook", "configuration": webhooks},
            {"name": "MutatingAdmissionWebhook", "configuration": webhooks},
        ],
    }


def cache_root() -> Path:
    env = os.environ.get("GPUOP_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gpuoperator"


def versions() -> dict[str, str]:
    out = {}
    for line in (HACK / "versions.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def build_binaries() -> Path:
    """Run ``hack/build-binaries.sh`` (progress on stderr) and return the bin directory."""
    if shutil.which("go") is None and not (cache_root() / "bin").exists():
        raise ClusterError("Go is not installed: it is needed once to build the control plane")
    proc = subprocess.run(
        ["bash", str(HACK / "build-binaries.sh")], stdout=subprocess.PIPE, text=True, check=False
    )
    if proc.returncode != 0:
        raise ClusterError("building the control plane failed (see the build output above)")
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


#: Starts of the operator before ``run_operator`` gives up on ports taken by others.
OPERATOR_PORT_ATTEMPTS = 5


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class LocalCluster:
    """One named local cluster. ``up`` starts it, ``down`` stops exactly what ``up`` started."""

    def __init__(self, name: str = "dev", root: Path | None = None) -> None:
        self.name = name
        self.dir = (root or cache_root()) / "clusters" / name
        self.kubeconfig = self.dir / "kubeconfig"
        self.pki = pkimod.Pki(self.dir / "pki")
        self.procs = {c: Process(c, self.dir) for c in COMPONENTS}
        #: The operator itself, run from this checkout (``up --operator``); not a control-plane
        #: component: clusters for the e2e suite run their own replicas.
        self.operator = Process("gpuoperator", self.dir)
        #: The KubeVirt stand-in (virt-controller's part), for ``make up``.
        self.kubevirt = Process("kubevirt-standin", self.dir)
        #: The DRA driver stand-in (its ResourceSlices), for ``make up``.
        self.dra = Process("dra-standin", self.dir)
        #: The operator as replicas of the built image under podman (``up --operator=image``,
        #: ``localcluster.image``); the names of its containers in ``image_names``.
        self.image_operator = Process("gpuoperator-image", self.dir)
        self.image_names = self.dir / "image-replicas.json"
        self.audit_log = self.dir / "logs" / "audit.log"
        self.v = versions()

    # ---- introspection -------------------------------------------------------------
    def running(self) -> dict[str, bool]:
        return {c: p.running() for c, p in self.procs.items()}

    def ports(self) -> Ports:
        return Ports(**json.loads((self.dir / "ports.json").read_text()))

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def _get(self, url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> str:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:  # noqa: S310
            body: bytes = resp.read()
            return body.decode()

    def healthy(self) -> bool:
        try:
            port = self.ports().apiserver
            return self._get(f"https://127.0.0.1:{port}/readyz", self._ssl()) == "ok"
        except (OSError, ValueError, ssl.SSLError):
            return False

    # ---- lifecycle -----------------------------------------------------------------
    def up(
        self,
        profile: Path,
        crds: Iterable[Path] = (),
        manifests: Iterable[Path] = (),
        bindir: Path | None = None,
        log: Any = print,
    ) -> float:
        """Start the cluster (or reuse it when already running); return seconds taken."""
        t0 = time.monotonic()
        if all(self.running().values()) and self.healthy():
            log(f"cluster {self.name!r} is already running")
            self.apply(crds, manifests, log)
            return time.monotonic() - t0
        self.down(quiet=True)
        bindir = bindir or build_binaries()
        prof = profilemod.load(profile)
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        pkimod.ensure_pki(self.pki.dir)
        pkimod.ensure_webhook_client(self.pki)
        ports = Ports(*free_ports(6))
        (self.dir / "ports.json").write_text(json.dumps(asdict(ports)))
        self._write_kubeconfig(ports.apiserver)
        self._link_kubectl(bindir)
        log(f"starting cluster {self.name!r} (state in {self.dir})")
        try:
            self._start_etcd(bindir, ports, log)
            self._start_apiserver(bindir, ports, log)
            self._start_controller_manager(bindir, ports, log)
            self._start_scheduler(bindir, ports, log)
            self._seed_nodes(prof, log)
            self._start_kwok(bindir, ports, log)
            self.apply(crds, manifests, log)
        except BaseException:
            self.down(quiet=True)
            raise
        return time.monotonic() - t0

    def restart(self, component: str, log: Any = print) -> float:
        """Stop one component and start it again with the same command line (the API
        server's watch cache starts afresh: watches from older versions get 410 Gone)."""
        proc = self.procs[component]
        argv = proc.argv()
        proc.stop()
        proc.start(argv)
        if component == "kube-apiserver":
            took = wait_until("kube-apiserver /readyz after restart", self.healthy, 90, proc)
            wait_servable(self.kubeconfig)  # CRD caches refill: lists get 429 meanwhile
        else:
            took = wait_until(f"{component} running", proc.running, 10, proc)
        log(f"  {component}: restarted in {took:.1f}s")
        return took

    def deploy(self, rendered: deployment.Rendered, log: Any = print) -> None:
        deploy_to(self.kubeconfig, rendered, log)

    def run_operator(
        self,
        log: Any = print,
        extra: tuple[str, ...] = (),
        rendered: deployment.Rendered | None = None,
    ) -> None:
        """(Re)start the operator from this checkout as the dev overlay's Deployment runs
        it (its args and env, a token of its ServiceAccount), wait until it is ready (caches
        synced, serving certificate issued), register its webhooks with the API server (by
        URL on loopback) and wait until it injected their caBundle. ``rendered``: the overlay
        as already deployed (by default it is rendered and deployed first)."""
        self.operator.stop()
        self.stop_image_operator()  # one operator at a time: `make up` after OPERATOR=image
        if rendered is None:
            rendered = deployment.render(kubectl_binary())
            self.deploy(rendered, log)
        token = deployment.token_kubeconfig(
            kubectl_binary(), self.kubeconfig, rendered, self.dir / "gpuoperator.kubeconfig"
        )
        for attempt in range(1, OPERATOR_PORT_ATTEMPTS + 1):
            # The ports stay in its argv (tools read them there), so they are chosen here;
            # another process may take one before the operator binds it: it exits then,
            # and is started again on other ports.
            ports = deployment.Ports(*free_ports(3))
            argv, env = deployment.operator_command(
                rendered, kubeconfig=token, pod_name="gpu-operator-0", ports=ports, extra=extra
            )
            logged = self.operator.log.stat().st_size if self.operator.log.exists() else 0
            self.operator.start(argv, env=env, cwd=REPO)
            log(f"  gpuoperator: started as {rendered.username} (log {self.operator.log})")
            url = f"http://127.0.0.1:{ports.health}/readyz"
            try:
                took = wait_until(
                    "gpuoperator /readyz", partial(self._ready, url), 120, self.operator
                )
                break
            except ClusterError:
                if attempt == OPERATOR_PORT_ATTEMPTS or self.operator.running():
                    raise
                with self.operator.log.open("rb") as f:
                    f.seek(logged)
                    if b"Address already in use" not in f.read():
                        raise
                log("  gpuoperator: one of its ports was taken meanwhile; starting it again")
        log(
            f"  gpuoperator: ready after {took:.1f}s (metrics on https://127.0.0.1:{ports.metrics}"
            "/metrics, authorised by bearer token)"
        )
        configs = register_webhooks(self.kubeconfig, rendered, ports.webhook)
        took = wait_until(
            "the operator to inject its webhooks' caBundle",
            lambda: all(self._injected(c) for c in configs),
            60,
            self.operator,
        )
        log(
            f"  gpuoperator: webhooks registered on https://127.0.0.1:{ports.webhook}, "
            f"caBundle injected after {took:.1f}s"
        )

    def _ready(self, url: str) -> bool:
        return self._get(url) == "ok\n"

    def _injected(self, config: deployment.Obj) -> bool:
        live = json.loads(
            self.kubectl("get", config["kind"], config["metadata"]["name"], "-o", "json")
        )
        return all(w.get("clientConfig", {}).get("caBundle") for w in live.get("webhooks", []))

    def run_kubevirt_standin(self, log: Any = print) -> None:
        """(Re)start the KubeVirt stand-in: what virt-controller does to VMIs (their launcher
        pods and status), live migrations (target pods, ``migrationState``) and
        VirtualMachines (their VMIs by ``runStrategy``), as a process of this cluster
        (``test/harness/kubevirt.py``)."""
        self.kubevirt.stop()
        self.kubevirt.start(
            [sys.executable, "-m", "localcluster.standin", f"--kubeconfig={self.kubeconfig}"],
            env={"PYTHONPATH": os.pathsep.join([str(HACK), str(REPO / "test"), str(REPO)])},
            cwd=REPO,
        )
        wait_until(
            "the KubeVirt stand-in to start",
            lambda: "kubevirt stand-in running" in self.kubevirt.tail(50),
            30,
            self.kubevirt,
        )
        log(f"  kubevirt stand-in: running (log {self.kubevirt.log})")

    def run_dra_standin(self, profile: Path, log: Any = print) -> None:
        """(Re)start the DRA driver stand-in: its account and DeviceClass applied
        (``hack/localcluster/dra-driver.yaml``), then the process that publishes the
        ResourceSlices of the profile's nodes with ``dra`` GPUs (``localcluster.drastandin``)."""
        self.dra.stop()
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(DRA_DRIVER))
        self.dra.start(
            [
                sys.executable,
                "-m",
                "localcluster.drastandin",
                f"--kubeconfig={self.kubeconfig}",
                f"--profile={profile}",
            ],
            env={"PYTHONPATH": os.pathsep.join([str(HACK), str(REPO / "test"), str(REPO)])},
            cwd=REPO,
        )
        wait_until(
            "the DRA driver stand-in to publish",
            lambda: "dra driver stand-in running" in self.dra.tail(50),
            60,
            self.dra,
        )
        log(f"  dra driver stand-in: running (log {self.dra.log})")

    def run_image_operator(self, replicas: int = 2, log: Any = print) -> None:
        """(Re)start the operator as ``replicas`` podman containers of the built image, the
        Deployment's pods without a kubelet (``localcluster.image``), and wait until they
        are ready and the webhooks registered on one."""
        self.stop_image_operator()
        self.operator.stop()  # one operator at a time: `make up OPERATOR=image` after `make up`
        logged = self.image_operator.log.stat().st_size if self.image_operator.log.exists() else 0
        self.image_operator.start(
            [
                sys.executable,
                "-m",
                "localcluster.image",
                f"--name={self.name}",
                f"--replicas={replicas}",
            ],
            env={"PYTHONPATH": os.pathsep.join([str(HACK), str(REPO / "test"), str(REPO)])},
            cwd=REPO,
        )

        def serving() -> str | None:
            with self.image_operator.log.open("rb") as f:
                f.seek(logged)
                lines = f.read().decode(errors="replace").splitlines()
            return next((line for line in lines if " serving: " in line), None)

        took = wait_until(
            "the image's replicas to serve", lambda: bool(serving()), 300, self.image_operator
        )
        line = (serving() or "").partition(" serving: ")[2]
        log(f"  gpuoperator (image): {line} (log {self.image_operator.log}; {took:.1f}s)")

    def stop_image_operator(self) -> list[str]:
        """Stop the image's replicas (each given its grace period), then remove any container
        of them still there (the supervisor killed, say); the names removed that way."""
        self.image_operator.stop(timeout=150)
        try:
            names: list[str] = json.loads(self.image_names.read_text())
        except (OSError, ValueError):
            names = []
        left = []
        for name in names:
            proc = subprocess.run(
                [str(HACK / "image" / "podman.sh"), "rm", "--force", "--ignore", "--time=0", name],
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            if proc.stdout.strip():
                left.append(name)
        self.image_names.unlink(missing_ok=True)
        return left

    def down(self, quiet: bool = False) -> list[str]:
        image_running = self.image_operator.running()
        left = self.stop_image_operator()
        stopped = ["gpuoperator (image)"] if image_running else []
        if left and not quiet:
            print(f"removed containers left running: {', '.join(left)}")
        stopped += ["gpuoperator"] if self.operator.stop() else []
        stopped += ["kubevirt-standin"] if self.kubevirt.stop() else []
        stopped += ["dra-standin"] if self.dra.stop() else []
        stopped += [c for c in reversed(COMPONENTS) if self.procs[c].stop()]
        if stopped and not quiet:
            print(f"stopped {', '.join(stopped)} of cluster {self.name!r}")
        return stopped

    # ---- components ----------------------------------------------------------------
    def _bin(self, bindir: Path, name: str) -> str:
        version = {
            "etcd": self.v["ETCD_VERSION"],
            "kwok": self.v["KWOK_VERSION"],
        }.get(name, self.v["KUBE_VERSION"])
        path = bindir / f"{name}-{version}"
        if not path.exists():
            raise ClusterError(f"{path} is missing: run hack/build-binaries.sh")
        return str(path)

    def _launch(self, name: str, argv: list[str], log: Any) -> Process:
        proc = self.procs[name]
        proc.start(argv)
        log(f"  {name}: started (log {proc.log})")
        return proc

    def _start_etcd(self, bindir: Path, ports: Ports, log: Any) -> None:
        client = f"http://127.0.0.1:{ports.etcd}"
        peer = f"http://127.0.0.1:{ports.etcd_peer}"
        proc = self._launch(
            "etcd",
            [
                self._bin(bindir, "etcd"),
                "--name=local",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=local={peer}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
            log,
        )
        took = wait_until(
            "etcd health", lambda: '"true"' in self._get(f"{client}/health"), 30, proc
        )
        log(f"  etcd: healthy after {took:.1f}s")

    def _start_apiserver(self, bindir: Path, ports: Ports, log: Any) -> None:
        p = self.pki
        proc = self._launch(
            "kube-apiserver",
            [
                self._bin(bindir, "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{ports.etcd}",
                f"--secure-port={ports.apiserver}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--tls-cert-file={p.server_cert}",
                f"--tls-private-key-file={p.server_key}",
                f"--client-ca-file={p.ca_cert}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={p.sa_pub}",
                f"--service-account-signing-key-file={p.sa_key}",
                "--authorization-mode=Node,RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                f"--audit-policy-file={self._audit_policy()}",
                f"--admission-control-config-file={self._admission_configuration()}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                f"--feature-gates={FEATURE_GATES}",
                f"--runtime-config={RUNTIME_CONFIG}",
            ],
            log,
        )
        took = wait_until("kube-apiserver /readyz", self.healthy, 90, proc)
        log(f"  kube-apiserver: ready after {took:.1f}s on https://127.0.0.1:{ports.apiserver}")

    def _admission_configuration(self) -> Path:
        """Every webhook the API server calls is offered the webhook client certificate
        (the kubeconfig's user ``*``: the operator's webhooks are registered by a loopback
        URL whose port is chosen at each start). A webhook server asks for a client
        certificate only with a client CA, so the others see no difference."""
        p = self.pki
        kubeconfig = (self.dir / "webhook-client.kubeconfig").resolve()  # absolute, as required
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "users": [
                        {
                            "name": "*",
                            "user": {
                                "client-certificate": str(p.webhook_client_cert.resolve()),
                                "client-key": str(p.webhook_client_key.resolve()),
                            },
                        }
                    ],
                }
            )
        )
        kubeconfig.chmod(0o600)
        path = (self.dir / "admission-configuration.yaml").resolve()
        path.write_text(yaml.safe_dump(admission_configuration(kubeconfig)))
        return path

    def _audit_policy(self) -> Path:
        path = self.dir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(AUDIT_POLICY))
        return path

    def forbidden(self, username: str, offset: int = 0) -> tuple[int, list[str]]:
        """The requests of ``username`` the API server answered 403 in its audit log from
        byte ``offset`` on, and the offset to read from next time.

        One 403 is not counted: a write into a namespace being deleted (cause
        ``NamespaceTerminating``), which RBAC allowed and namespace lifecycle refused; a
        controller racing a namespace's deletion meets it, whatever its permissions."""
        try:
            with self.audit_log.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:
            return offset, []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        found = []
        for line in complete.splitlines():
            event = json.loads(line)
            status = event.get("responseStatus") or {}
            if event.get("user", {}).get("username") != username or status.get("code") != 403:
                continue
            causes = (status.get("details") or {}).get("causes") or []
            if any(c.get("reason") == "NamespaceTerminating" for c in causes):
                continue
            decision = (event.get("annotations") or {}).get("authorization.k8s.io/decision")
            found.append(f"{event.get('verb')} {event.get('requestURI')} ({decision or '?'})")
        return offset + len(complete), found

    def _start_controller_manager(self, bindir: Path, ports: Ports, log: Any) -> None:
        p = self.pki
        proc = self._launch(
            "kube-controller-manager",
            [
                self._bin(bindir, "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                f"--service-account-private-key-file={p.sa_key}",
                f"--root-ca-file={p.ca_cert}",
                f"--secure-port={ports.controller_manager}",
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--node-monitor-grace-period=20s",
                "--profiling=false",
                f"--feature-gates={FEATURE_GATES}",
            ],
            log,
        )
        url = f"https://127.0.0.1:{ports.controller_manager}/healthz"
        took = wait_until(
            "kube-controller-manager /healthz",
            lambda: self._get(url, self._insecure()) == "ok",
            60,
            proc,
        )
        log(f"  kube-controller-manager: healthy after {took:.1f}s")

    def _start_scheduler(self, bindir: Path, ports: Ports, log: Any) -> None:
        proc = self._launch(
            "kube-scheduler",
            [
                self._bin(bindir, "kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                f"--secure-port={ports.scheduler}",
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
                "--profiling=false",
                f"--feature-gates={FEATURE_GATES}",
            ],
            log,
        )
        url = f"https://127.0.0.1:{ports.scheduler}/healthz"
        took = wait_until(
            "kube-scheduler /healthz", lambda: self._get(url, self._insecure()) == "ok", 60, proc
        )
        log(f"  kube-scheduler: healthy after {took:.1f}s")

    def _start_kwok(self, bindir: Path, ports: Ports, log: Any) -> None:
        proc = self._launch(
            "kwok",
            [
                self._bin(bindir, "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-nodes-with-annotation-selector="
                f"{profilemod.KWOK_ANNOTATION}={profilemod.KWOK_ANNOTATION_VALUE}",
                f"--server-address=127.0.0.1:{ports.kwok}",
                "--node-lease-duration-seconds=40",
                f"--config={HACK / 'kwok' / 'stages.yaml'}",
            ],
            log,
        )
        took = wait_until("the simulated nodes to turn Ready", self._nodes_ready, 60, proc)
        log(f"  kwok: simulated nodes Ready after {took:.1f}s")

    @staticmethod
    def _insecure() -> ssl.SSLContext:
        # Health probes of components that serve a self-signed certificate on loopback.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    # ---- seeding -------------------------------------------------------------------
    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return kubectl(self.kubeconfig, *args, stdin=stdin)

    def _seed_nodes(self, prof: profilemod.Profile, log: Any) -> None:
        docs = profilemod.manifests(prof)
        self.kubectl("create", "-f", "-", stdin=yaml.safe_dump_all(docs))
        log(f"  nodes: created {len(docs)} simulated nodes")

    def _nodes_ready(self) -> bool:
        out = json.loads(
            self.kubectl("get", "nodes", "-l", f"{profilemod.SIMULATED_LABEL}=true", "-o", "json")
        )
        for node in out["items"]:
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            if conds.get("Ready") != "True":
                return False
        return True

    def apply(self, crds: Iterable[Path], manifests: Iterable[Path], log: Any = print) -> None:
        """Apply CRDs, wait until they are Established, then apply the other manifests."""
        for path in crds:
            self.kubectl("apply", "--server-side", "--force-conflicts", *_source(path))
            self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
            wait_servable(self.kubeconfig)
            log(f"  applied {_show(path)} (established)")
        for path in manifests:
            self.kubectl("apply", "--server-side", "--force-conflicts", *_source(path))
            log(f"  applied {_show(path)}")

    def _link_kubectl(self, bindir: Path) -> None:
        """``<state>/bin/kubectl``: the pinned kubectl under its plain name, for PATH."""
        link = self.dir / "bin" / "kubectl"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(self._bin(bindir, "kubectl"))

    def _write_kubeconfig(self, port: int) -> None:
        p = self.pki
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": self.name,
                    "cluster": {
                        "server": f"https://127.0.0.1:{port}",
                        "certificate-authority": str(p.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": f"{self.name}-admin",
                    "user": {
                        "client-certificate": str(p.admin_cert),
                        "client-key": str(p.admin_key),
                    },
                }
            ],
            "contexts": [
                {"name": self.name, "context": {"cluster": self.name, "user": f"{self.name}-admin"}}
            ],
            "current-context": self.name,
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)


def apply_docs(kubeconfig: Path, docs: Iterable[deployment.Obj], *flags: str) -> None:
    """Server-side apply ``docs`` (kubectl, taking over fields other managers set)."""
    docs = list(docs)
    if docs:
        kubectl(
            kubeconfig,
            "apply",
            "--server-side",
            "--force-conflicts",
            *flags,
            "-f",
            "-",
            stdin=yaml.safe_dump_all(docs),
        )


def deploy_to(kubeconfig: Path, rendered: deployment.Rendered, log: Any = print) -> None:
    """Server-side apply every rendered object (CRDs first, then the rest); the webhook
    configurations only as a server-side dry run (``register_webhooks`` applies them once
    an operator serves them: they fail closed)."""
    apply_docs(kubeconfig, rendered.crds)
    kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    wait_servable(kubeconfig)
    apply_docs(kubeconfig, rendered.rest())
    apply_docs(kubeconfig, rendered.webhook_configurations, "--dry-run=server")
    log(f"  applied config/overlays/dev ({len(rendered.objects)} objects)")


def register_webhooks(
    kubeconfig: Path, rendered: deployment.Rendered, port: int
) -> list[deployment.Obj]:
    """Apply the rendered webhook configurations with their URL on ``port``; return them."""
    configs = deployment.loopback_webhooks(rendered, port)
    apply_docs(kubeconfig, configs)
    return configs


def unregister_webhooks(kubeconfig: Path, rendered: deployment.Rendered) -> None:
    for config in rendered.webhook_configurations:
        kubectl(
            kubeconfig, "delete", config["kind"], config["metadata"]["name"], "--ignore-not-found"
        )


def wait_servable(kubeconfig: Path, timeout: float = 60) -> None:
    """Wait until every CRD's resource can be listed: for a moment after Established, lists
    of a new CRD's resource get 429 while its watch cache fills."""
    crds = json.loads(kubectl(kubeconfig, "get", "crd", "-o", "json"))["items"]
    for crd in crds:
        resource = f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"

        def listable(r: str = resource) -> bool:
            return kubectl(kubeconfig, "get", r, "-A", "-o", "name") is not None

        wait_until(f"{resource} to be listable", listable, timeout)


def _source(path: Path) -> tuple[str, str]:
    """kubectl's flag for a manifest path: -k for a kustomization directory, else -f."""
    return ("-k", str(path)) if (path / "kustomization.yaml").exists() else ("-f", str(path))


def _show(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def kubectl_binary() -> str:
    """The kubectl built with the control plane, else the one on PATH."""
    built = cache_root() / "bin" / f"kubectl-{versions()['KUBE_VERSION']}"
    if built.exists():
        return str(built)
    found = shutil.which("kubectl")
    if found is None:
        raise ClusterError("kubectl not found: run hack/build-binaries.sh")
    return found


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [kubectl_binary(), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if proc.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout
