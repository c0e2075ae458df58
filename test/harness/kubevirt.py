"""A stand-in for KubeVirt's virt-controller, for the e2e suite (DESIGN.md §8).

The e2e cluster has no KubeVirt, only its two CRDs (``test/harness/crds/``). This module
does to a ``kubevirt.io/v1`` VirtualMachineInstance what virt-controller does and what
gpuoperator depends on, and nothing more:

* it renders the VMI's launcher pod the way KubeVirt v1.7 does in the respects the operator
  reads (name prefix, labels, annotations, controller ownerReference, the ``compute``
  container first with one unit of each ``gpus[].deviceName``, tolerations, affinity,
  node selector) and creates it once;
* it refuses, as virt-controller does while rendering, a GPU that the ``KubeVirt`` CR's
  ``permittedHostDevices`` does not list when that table is set, and records the refusal on
  the VMI instead of creating a pod;
* it mirrors the pod into the VMI status: Pending → Scheduling once the pod exists →
  Scheduled (with ``status.nodeName``) once the pod runs; Failed once the pod is deleted or
  terminates before the VMI is final. A Failed VMI never gets a new pod.

Like virt-controller it finds its pod by the ``kubevirt.io=virt-launcher`` label and the
controller ownerReference, and it never compares the live pod with what it rendered nor
rewrites it: the scheduling gate and node affinity that gpuoperator's webhook and placement
controller add stay as they are.

The rendering and status decisions are pure functions (``render_launcher_pod``,
``vmi_status``, ``find_launcher_pod``, ``permitted_devices``): idempotent, no I/O, so the unit
tests pin them down. ``KubeVirtSimulator`` is the I/O shell: watches that only wake a
level-triggered reconcile loop, which re-reads everything on each wake and at least every
``RESYNC_SECONDS``.

Simplifications, on purpose: no virt-handler (a VMI never becomes Running), no memory
overhead on the compute container, no VirtualMachine controller (nothing restarts a Failed
VMI), no migrations. CPU and memory go where KubeVirt puts them: the VMI's
``spec.domain.resources.requests`` into the compute container's requests, its ``limits``
into its limits. The VMI stand-in CRD has no status subresource, so status is written by
replacing the whole object under its resourceVersion.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import pykube

from gpuoperator.kinds import KubeVirt, VirtualMachineInstance

Obj = dict[str, Any]

log = logging.getLogger(__name__)

# KubeVirt's names (its API, not gpuoperator's).
KUBEVIRT_API_VERSION: Final = "kubevirt.io/v1"
VMI_KIND: Final = "VirtualMachineInstance"
APP_LABEL: Final = "kubevirt.io"
LAUNCHER: Final = "virt-launcher"
CREATED_BY_LABEL: Final = "kubevirt.io/created-by"
VM_NAME_LABEL: Final = "vm.kubevirt.io/name"
DOMAIN_ANNOTATION: Final = "kubevirt.io/domain"
#: Annotations KubeVirt does not copy from the VMI onto its pods.
FILTERED_ANNOTATION_PREFIX: Final = "kubectl.kubernetes.io/"
COMPUTE: Final = "compute"
LAUNCHER_IMAGE: Final = "quay.io/kubevirt/virt-launcher:v1.7.0"

# VMI phases (KubeVirt's VirtualMachineInstancePhase).
PENDING: Final = "Pending"
SCHEDULING: Final = "Scheduling"
SCHEDULED: Final = "Scheduled"
RUNNING: Final = "Running"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
FINAL_PHASES: Final = frozenset({SUCCEEDED, FAILED})
#: Phases in which the VMI has had a launcher pod: if it is gone now, the VMI fails.
LAUNCHED_PHASES: Final = frozenset({SCHEDULING, SCHEDULED, RUNNING})

SYNCHRONIZED: Final = "Synchronized"
FAILED_CREATE: Final = "FailedCreate"

#: How often the simulator re-reads and reconciles every VMI without any event.
RESYNC_SECONDS: Final = 1.0
#: Server-side lifetime of one watch request; the client's read timeout is a bit longer.
WATCH_SECONDS: Final = 60
WATCH_READ_SLACK: Final = 15
#: Pause after a failed list or watch before trying again.
WATCH_BACKOFF_SECONDS: Final = 1.0
#: Attempts to write one VMI's status when the write keeps conflicting.
STATUS_ATTEMPTS: Final = 5


@dataclass(frozen=True)
class SyncError:
    """Why the VMI has no launcher pod: recorded as its ``Synchronized=False`` condition."""

    reason: str
    message: str


# ---- pure decisions --------------------------------------------------------------------


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return cast("Mapping[str, Any]", obj.get("metadata") or {})


def permitted_devices(kubevirts: Iterable[Mapping[str, Any]]) -> frozenset[str] | None:
    """The resource names the cluster's ``KubeVirt`` CR permits for GPUs, or None for "all".

    KubeVirt honours one KubeVirt CR; with several, the oldest live one decides (KubeVirt
    marks the later ones as failed). No CR, or a CR without
    ``spec.configuration.permittedHostDevices``, permits everything; a table that is set but
    lists nothing permits nothing. Both ``pciHostDevices`` and ``mediatedDevices`` count.
    """
    live = [kv for kv in kubevirts if not _meta(kv).get("deletionTimestamp")]
    if not live:
        return None
    oldest = min(
        live,
        key=lambda kv: (
            str(_meta(kv).get("creationTimestamp") or ""),
            str(_meta(kv).get("namespace") or ""),
            str(_meta(kv).get("name") or ""),
        ),
    )
    table = ((oldest.get("spec") or {}).get("configuration") or {}).get("permittedHostDevices")
    if table is None:
        return None
    names: set[str] = set()
    for section in ("pciHostDevices", "mediatedDevices"):
        for device in table.get(section) or []:
            if device.get("resourceName"):
                names.add(str(device["resourceName"]))
    return frozenset(names)


def _gpu_units(vmi: Mapping[str, Any]) -> dict[str, int]:
    """Units per resource name, in the order the ``gpus`` entries first name them."""
    units: dict[str, int] = {}
    gpus = (((vmi.get("spec") or {}).get("domain") or {}).get("devices") or {}).get("gpus")
    for gpu in gpus or []:
        name = str(gpu["deviceName"])
        units[name] = units.get(name, 0) + 1
    return units


def render_launcher_pod(
    vmi: Mapping[str, Any], permitted: frozenset[str] | None
) -> Obj | SyncError:
    """The launcher pod virt-controller would create for ``vmi``, or why it creates none.

    ``permitted`` is ``permitted_devices(...)`` of the cluster's KubeVirt CRs (None: all).
    The pod has no name, only ``generateName``, as KubeVirt's; it is never re-rendered
    against a live pod.
    """
    meta = _meta(vmi)
    spec = cast("Mapping[str, Any]", vmi.get("spec") or {})
    name = str(meta["name"])
    units = _gpu_units(vmi)
    if permitted is not None:
        for device in units:
            if device not in permitted:
                return SyncError(
                    FAILED_CREATE,
                    f"GPU {device} is not permitted in permittedHostDevices configuration",
                )

    labels = dict(meta.get("labels") or {})
    labels.update(
        {
            APP_LABEL: LAUNCHER,
            CREATED_BY_LABEL: str(meta["uid"]),
            VM_NAME_LABEL: name,
        }
    )
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not k.startswith(FILTERED_ANNOTATION_PREFIX)
    }
    annotations[DOMAIN_ANNOTATION] = name

    vmi_resources = (spec.get("domain") or {}).get("resources") or {}
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    for key in ("cpu", "memory"):
        if key in (vmi_resources.get("requests") or {}):
            requests[key] = str(vmi_resources["requests"][key])
        if key in (vmi_resources.get("limits") or {}):
            limits[key] = str(vmi_resources["limits"][key])
    for device, count in units.items():
        requests[device] = str(count)
        limits[device] = str(count)

    compute: Obj = {
        "name": COMPUTE,
        "image": LAUNCHER_IMAGE,
        "command": ["/usr/bin/virt-launcher-monitor"],
        "resources": {"requests": requests, "limits": limits},
    }
    pod_spec: Obj = {
        "containers": [compute],
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
    }
    for field in ("tolerations", "affinity", "nodeSelector", "schedulerName"):
        if spec.get(field):
            pod_spec[field] = copy.deepcopy(spec[field])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{LAUNCHER}-{name}-",
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": KUBEVIRT_API_VERSION,
                    "kind": VMI_KIND,
                    "name": name,
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": pod_spec,
    }


def _controlled_by(pod: Mapping[str, Any], uid: str) -> bool:
    return any(
        ref.get("controller") and ref.get("uid") == uid
        for ref in _meta(pod).get("ownerReferences") or []
    )


def find_launcher_pod(
    vmi: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The VMI's launcher pod among ``pods``, found as KubeVirt finds it.

    A pod counts when it carries ``kubevirt.io=virt-launcher`` and a controller
    ownerReference to the VMI's uid. Should there be several, a live one is preferred over
    one being deleted, then the newest.
    """
    uid = str(_meta(vmi).get("uid") or "")
    mine = [
        p
        for p in pods
        if (_meta(p).get("labels") or {}).get(APP_LABEL) == LAUNCHER and _controlled_by(p, uid)
    ]
    if not mine:
        return None
    return max(
        mine,
        key=lambda p: (
            not _meta(p).get("deletionTimestamp"),
            str(_meta(p).get("creationTimestamp") or ""),
        ),
    )


def _pod_down(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return bool(_meta(pod).get("deletionTimestamp")) or phase in ("Succeeded", "Failed")


def _pod_running(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and bool(
        (pod.get("spec") or {}).get("nodeName")
    )


def vmi_status(
    vmi: Mapping[str, Any],
    pod: Mapping[str, Any] | None,
    *,
    launched: bool = False,
    error: SyncError | None = None,
    now: str = "",
) -> Obj:
    """The VMI's status after mirroring ``pod`` (its launcher pod, or None if it has none).

    ``launched`` says a pod was created for this VMI before (even if the VMI's phase does
    not show it yet), so a missing pod means a deleted one. ``error`` is why no pod could be
    created, recorded as ``Synchronized=False``; without it that condition is removed.
    ``now`` stamps a condition that changes. Fields the simulator does not own are kept; a
    final VMI (Failed, Succeeded) is returned unchanged. Idempotent: feeding the result back
    in with the same pod gives the same status.
    """
    old = cast("Mapping[str, Any]", vmi.get("status") or {})
    status: Obj = copy.deepcopy(dict(old))
    phase = str(status.get("phase") or "")
    if phase in FINAL_PHASES:
        return status

    if pod is None:
        phase = FAILED if launched or phase in LAUNCHED_PHASES else PENDING
    elif _pod_down(pod):
        phase = FAILED
    elif _pod_running(pod):
        phase = SCHEDULED
        status["nodeName"] = pod["spec"]["nodeName"]
    elif phase not in (SCHEDULED, RUNNING):
        phase = SCHEDULING
    status["phase"] = phase

    conditions = [c for c in status.get("conditions") or [] if c.get("type") != SYNCHRONIZED]
    if error is not None:
        previous = next(
            (c for c in old.get("conditions") or [] if c.get("type") == SYNCHRONIZED), None
        )
        condition: Obj = {
            "type": SYNCHRONIZED,
            "status": "False",
            "reason": error.reason,
            "message": error.message,
            "lastProbeTime": None,
            "lastTransitionTime": now,
        }
        if previous is not None and previous.get("status") == "False":
            condition["lastTransitionTime"] = previous.get("lastTransitionTime", now)
        conditions.append(condition)
    if conditions or "conditions" in status:
        status["conditions"] = conditions
    return status


# ---- the I/O shell ---------------------------------------------------------------------


def _log_failure(exc: Exception, message: str, *args: object) -> None:
    """Log a failure to retry: briefly when the API server asks to retry later (HTTP 429, as
    a freshly registered CRD does while its watch cache initialises), else with the trace."""
    code = getattr(exc, "code", None) or getattr(getattr(exc, "response", None), "status_code", 0)
    if code == 429:
        log.info(message + ": %s", *args, exc)
    else:
        log.warning(message, *args, exc_info=exc)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class _Watcher:
    """One kind watched in a thread of its own; each event only wakes the reconciler.

    A watch request lives ``WATCH_SECONDS`` on the server and is then re-opened from the
    last resourceVersion seen; an in-stream ERROR (e.g. 410 Gone) or any failure starts
    over with a fresh list. The thread owns its client (a pykube client is not
    thread-safe); ``interrupt()``, called from another thread, shuts the open stream's
    socket so the thread notices ``stopping`` without waiting for the server.
    """

    def __init__(
        self,
        kind: type[Any],
        selector: dict[str, str] | None,
        config: Any,
        wake: threading.Event,
        stopping: threading.Event,
    ) -> None:
        self.kind = kind
        self.selector = selector
        self.config = config
        self.wake = wake
        self.stopping = stopping
        self.current: Any = None
        self.thread = threading.Thread(
            target=self._run, name=f"kubevirt-sim-watch-{kind.endpoint}", daemon=True
        )

    def interrupt(self) -> None:
        query = self.current
        response = getattr(query, "response", None) if query is not None else None
        raw = getattr(response, "raw", None)
        try:
            if raw is not None and hasattr(raw, "shutdown"):
                raw.shutdown()
            elif response is not None:
                response.close()
        except Exception:  # the stream may be closing on its own right now
            log.debug("interrupting the %s watch", self.kind.endpoint, exc_info=True)

    def _query(self, client: pykube.HTTPClient) -> Any:
        query = self.kind.objects(client, namespace=pykube.all)
        return query.filter(selector=self.selector) if self.selector else query

    def _run(self) -> None:
        client = pykube.HTTPClient(self.config, timeout=WATCH_SECONDS + WATCH_READ_SLACK)
        version: str | None = None
        while not self.stopping.is_set():
            try:
                if version is None:
                    listing = self._query(client).execute().json()
                    version = str(listing["metadata"]["resourceVersion"])
                    self.wake.set()
                self.current = self._query(client).watch(
                    since=version,
                    params={"timeoutSeconds": WATCH_SECONDS, "allowWatchBookmarks": "true"},
                )
                for event in self.current:
                    if self.stopping.is_set():
                        break
                    if event.type == "ERROR":
                        log.info("%s watch: %s; relisting", self.kind.endpoint, event.object.obj)
                        version = None
                        break
                    version = str(event.object.obj["metadata"]["resourceVersion"])
                    if event.type != "BOOKMARK":
                        self.wake.set()
            except Exception as exc:
                if self.stopping.is_set():
                    break
                _log_failure(exc, "the %s watch failed; relisting", self.kind.endpoint)
                version = None
                self.stopping.wait(WATCH_BACKOFF_SECONDS)
            finally:
                query, self.current = self.current, None
                response = getattr(query, "response", None) if query is not None else None
                if response is not None:
                    response.close()


class KubeVirtSimulator:
    """Does what virt-controller does to VMIs, in background threads, until ``stop()``.

    ``start()`` launches one reconcile thread and three watch threads (VMIs, launcher pods,
    KubeVirt CRs). The reconcile loop is level-triggered: on every watch event and at least
    every ``RESYNC_SECONDS`` it re-reads all VMIs, launcher pods and KubeVirt CRs and
    reconciles each VMI; it never acts on an event's content. Each thread has its own
    client built from ``api``'s configuration, so the caller keeps ``api`` to itself.

    Invariant: at most one launcher pod per VMI. The reconcile thread is the only writer and
    lists pods afresh (not from a cache) before deciding to create one, and it remembers the
    uids of VMIs it launched, so a pod deleted before the VMI's status said Scheduling still
    fails the VMI instead of being replaced.
    """

    def __init__(self, api: pykube.HTTPClient) -> None:
        self._config = api.config
        self._timeout = float(api.timeout)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._launched: set[str] = set()
        self._thread: threading.Thread | None = None
        self._watchers: list[_Watcher] = []
        #: Passes that read the whole cluster (every VMI, launcher pod and KubeVirt CR) and
        #: reconciled each VMI: a test waits for it to grow by two to know the simulator has
        #: acted on everything that was there when it started waiting.
        self.passes = 0

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the threads (once). The first pass runs at once."""
        if self._thread is not None:
            raise RuntimeError("the KubeVirt simulator is already started")
        self._watchers = [
            _Watcher(VirtualMachineInstance, None, self._config, self._wake, self._stopping),
            _Watcher(pykube.Pod, {APP_LABEL: LAUNCHER}, self._config, self._wake, self._stopping),
            _Watcher(KubeVirt, None, self._config, self._wake, self._stopping),
        ]
        self._thread = threading.Thread(target=self._run, name="kubevirt-sim", daemon=True)
        self._wake.set()
        self._thread.start()
        for w in self._watchers:
            w.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every thread, waiting at most ``timeout`` seconds in all.

        Threads still busy then (e.g. a request the API server does not answer) are daemon
        threads that exit at their next step; a warning names them.
        """
        self._stopping.set()
        self._wake.set()
        threads = [w.thread for w in self._watchers]
        if self._thread is not None:
            threads.append(self._thread)
        deadline = time.monotonic() + timeout
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            for w in self._watchers:
                w.interrupt()
            for t in threads:
                t.join(timeout=0.05)
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            log.warning("KubeVirt simulator threads still running after stop(): %s", alive)

    # ---- reconciling -------------------------------------------------------------------
    def _run(self) -> None:
        client = pykube.HTTPClient(self._config, timeout=self._timeout)
        while not self._stopping.is_set():
            self._wake.wait(RESYNC_SECONDS)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                self._pass(client)
            except Exception as exc:
                _log_failure(exc, "a KubeVirt simulator pass failed")
            else:
                self.passes += 1

    @staticmethod
    def _items(query: Any) -> list[Obj]:
        return cast("list[Obj]", query.execute().json().get("items") or [])

    def _pods(self, client: pykube.HTTPClient, namespace: Any) -> list[Obj]:
        query = pykube.Pod.objects(client, namespace=namespace)
        return self._items(query.filter(selector={APP_LABEL: LAUNCHER}))

    def _pass(self, client: pykube.HTTPClient) -> None:
        permitted = permitted_devices(self._items(KubeVirt.objects(client, namespace=pykube.all)))
        vmis = self._items(VirtualMachineInstance.objects(client, namespace=pykube.all))
        pods = self._pods(client, pykube.all)
        self._launched &= {str(_meta(v).get("uid")) for v in vmis}
        self._tear_down_orphans(client, vmis, pods)
        for vmi in vmis:
            if self._stopping.is_set():
                return
            try:
                self._reconcile(client, vmi, pods, permitted)
            except Exception as exc:
                meta = _meta(vmi)
                _log_failure(
                    exc, "reconciling VMI %s/%s failed", meta.get("namespace"), meta.get("name")
                )

    def _tear_down_orphans(
        self, client: pykube.HTTPClient, vmis: list[Obj], pods: list[Obj]
    ) -> None:
        """As KubeVirt does when a VMI goes: its launcher pod is shut down (deleted). The
        garbage collector would do it too, but only once it watches the VMI kind, which a
        kube-controller-manager started before the CRD learns at its next discovery."""
        live = {str(_meta(v).get("uid")) for v in vmis if not _meta(v).get("deletionTimestamp")}
        for pod in pods:
            meta = _meta(pod)
            owner = str((meta.get("labels") or {}).get("kubevirt.io/created-by") or "")
            if owner and owner not in live and not meta.get("deletionTimestamp"):
                try:
                    pykube.Pod(client, dict(pod)).delete()
                except pykube.exceptions.HTTPError as exc:
                    if exc.code != 404:
                        raise

    def _reconcile(
        self,
        client: pykube.HTTPClient,
        vmi: Obj,
        pods: list[Obj],
        permitted: frozenset[str] | None,
    ) -> None:
        for _ in range(STATUS_ATTEMPTS):
            meta = _meta(vmi)
            if meta.get("deletionTimestamp"):
                return
            uid = str(meta["uid"])
            phase = (vmi.get("status") or {}).get("phase")
            launched = uid in self._launched or phase in LAUNCHED_PHASES
            pod = find_launcher_pod(vmi, pods)
            error: SyncError | None = None
            if pod is None and not launched and phase not in FINAL_PHASES:
                rendered = render_launcher_pod(vmi, permitted)
                if isinstance(rendered, SyncError):
                    error = rendered
                else:
                    pod, error = self._create_pod(client, rendered)
                    if pod is not None:
                        self._launched.add(uid)
            status = vmi_status(vmi, pod, launched=launched, error=error, now=_now())
            if status == (vmi.get("status") or {}):
                return
            updated = copy.deepcopy(vmi)
            updated["status"] = status
            obj = VirtualMachineInstance(client, updated)
            response = client.put(**obj.api_kwargs(data=json.dumps(updated)))
            if response.status_code != 409:
                client.raise_for_status(response)
                return
            # Someone else wrote the VMI: re-read it and its pods, decide again.
            fresh = VirtualMachineInstance.objects(client, namespace=meta["namespace"])
            found = fresh.get_or_none(name=meta["name"])
            if found is None:
                return
            vmi = cast("Obj", found.obj)
            pods = self._pods(client, meta["namespace"])
        log.warning("VMI %s/%s: status kept conflicting", vmi["metadata"]["namespace"], uid)

    @staticmethod
    def _create_pod(
        client: pykube.HTTPClient, manifest: Obj
    ) -> tuple[Obj | None, SyncError | None]:
        pod = pykube.Pod(client, manifest)
        try:
            pod.create()
        except pykube.exceptions.HTTPError as exc:
            meta = manifest["metadata"]
            log.info("creating pod %s in %s: %s", meta["generateName"], meta["namespace"], exc)
            return None, SyncError(FAILED_CREATE, f"failed to create virtual machine pod: {exc}")
        return cast("Obj", pod.obj), None
