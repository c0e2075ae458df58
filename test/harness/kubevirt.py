"""A stand-in for KubeVirt's virt-controller, for the e2e suite (docs/design.md §8).

The e2e cluster has no KubeVirt, only its two CRDs (``test/harness/crds/``). This module
does to a ``kubevirt.io/v1`` VirtualMachineInstance what virt-controller does and what
gpuoperator depends on, and nothing more:

* it renders the VMI's launcher pod the way KubeVirt v1.7 does in the respects the operator
  reads (name prefix, labels, annotations, controller ownerReference, the ``compute``
  container first with one unit of each ``gpus[].deviceName``, tolerations, affinity,
  node selector) and creates it once; a VMI's ``spec.resourceClaims`` (KubeVirt's
  ``GPUsWithDRA``) become the pod's, and the compute container's ``resources.claims`` name
  each one a ``gpus[].claimName`` uses, as virt-controller renders them;
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
``vmi_status``, ``find_launcher_pod``, ``permitted_devices``, ``vmi_key_of_pod``):
idempotent, no I/O, so the unit tests pin them down. ``KubeVirtSimulator`` is the I/O shell,
shaped like virt-controller's VMI controller:

* watch caches (informers: list, then watch from its resourceVersion, relist on 410 or any
  failure) of VMIs, launcher pods (``kubevirt.io=virt-launcher``) and KubeVirt CRs;
* one rate-limited work queue keyed by VMI namespace/name (the product's generic
  ``gpuoperator.runtime.queueing.WorkQueue``, client-go's semantics): a VMI event queues
  its key, a pod event its owning VMI's key (controller ownerReference, else the
  ``vm.kubevirt.io/name`` label), a KubeVirt CR event every VMI's key, and every
  ``RESYNC_SECONDS`` all of them; a key is queued once however many events arrive while it
  waits, never synced by two workers at once, and a failed sync is retried with backoff;
* ``WORKERS`` worker threads, each syncing one key from the caches;
* expectations, as KubeVirt's ``ControllerExpectations``: after creating a pod for a VMI
  no sync creates another until the pod cache has shown it (or ``EXPECTATION_SECONDS``
  pass and the API server, asked directly, says it is gone).

``KubeVirtSimulator.settle()`` waits until the simulator has acted on everything the API
server holds at call time, for tests that assert that something did *not* happen.

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import prometheus_client
import pykube

from gpuoperator.kinds import KubeVirt, VirtualMachineInstance
from gpuoperator.runtime.queueing import WorkQueue
from gpuoperator.runtime.ratelimiting import ItemExponentialFailureRateLimiter
from harness import accounts

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

#: Worker threads syncing VMI keys. virt-controller runs several per controller (its
#: ``--vmi-controller-threadiness``, 10 by default); three keep a 2-core test machine's
#: stand-in from waiting on one slow write while not competing with the operator.
WORKERS: Final = 3
#: How often every VMI key (and the orphan sweep) is queued without any event: the
#: informers' resync, a safety net only, since every change arrives as an event.
RESYNC_SECONDS: Final = 5.0
#: How long a created pod may stay unseen by the pod cache before the API server is asked
#: whether it still exists (KubeVirt's expectations time out after five minutes).
EXPECTATION_SECONDS: Final = 30.0
#: The longest backoff between retries of a key whose sync keeps failing.
BACKOFF_CAP: Final = 5.0
#: How often ``settle()`` looks at the caches and the syncs it waits for.
SETTLE_POLL_SECONDS: Final = 0.02
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
        if "deviceName" not in gpu:
            continue  # a DRA entry (claimName/requestName): no extended resource
        name = str(gpu["deviceName"])
        units[name] = units.get(name, 0) + 1
    return units


def _gpu_claims(vmi: Mapping[str, Any]) -> list[str]:
    """The ``spec.resourceClaims`` names the ``gpus`` entries use, in first-use order."""
    used: list[str] = []
    gpus = (((vmi.get("spec") or {}).get("domain") or {}).get("devices") or {}).get("gpus")
    for gpu in gpus or []:
        claim = gpu.get("claimName")
        if claim and claim not in used:
            used.append(str(claim))
    return used


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
    claims = _gpu_claims(vmi)
    if claims:
        compute["resources"]["claims"] = [{"name": claim} for claim in claims]
    pod_spec: Obj = {
        "containers": [compute],
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
    }
    for field in ("tolerations", "affinity", "nodeSelector", "schedulerName", "resourceClaims"):
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


def _version(obj: Mapping[str, Any]) -> int:
    """The object's resourceVersion as a number (etcd's revision), 0 if it has none."""
    text = str(_meta(obj).get("resourceVersion") or "")
    return int(text) if text.isdigit() else 0


#: A VMI's key in the work queue, as virt-controller's: (namespace, name).
Key = tuple[str, str]
#: The key of the orphan sweep over every cached launcher pod (no VMI has an empty name).
SWEEP: Final[Key] = ("", "")
#: Called with (old, new) for every change a cache sees; None for "absent".
Handler = Callable[[Obj | None, Obj | None], None]


def _key(obj: Mapping[str, Any]) -> Key:
    meta = _meta(obj)
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _owner_uid(pod: Mapping[str, Any]) -> str:
    """The uid of the VMI that created ``pod``: the ``kubevirt.io/created-by`` label."""
    return str((_meta(pod).get("labels") or {}).get(CREATED_BY_LABEL) or "")


def vmi_key_of_pod(pod: Mapping[str, Any]) -> Key:
    """The key of the VMI a launcher pod belongs to, as virt-controller maps a pod event:
    its controller ownerReference to a VMI, else the ``vm.kubevirt.io/name`` label; a pod
    with neither goes to the orphan sweep."""
    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "")
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == VMI_KIND and ref.get("name"):
            return (namespace, str(ref["name"]))
    name = (meta.get("labels") or {}).get(VM_NAME_LABEL)
    return (namespace, str(name)) if name else SWEEP


class _Cache:
    """A watch cache (informer) of one kind, kept in a thread of its own.

    It lists, then watches from the list's resourceVersion; a watch request lives
    ``WATCH_SECONDS`` on the server and is re-opened from the last resourceVersion seen; an
    in-stream ERROR (410 Gone) or any failure starts over with a fresh list, which is
    compared with the cache so that ``handler`` hears of every difference (a deletion
    missed meanwhile included). ``handler`` runs in the cache's thread after the cache has
    changed and must be quick (it enqueues keys). The thread owns its client (a pykube
    client is not thread-safe); ``interrupt()``, called from another thread, shuts the open
    stream's socket so the thread notices ``stopping`` without waiting for the server.
    """

    def __init__(
        self,
        kind: type[Any],
        selector: dict[str, str] | None,
        config: Any,
        handler: Handler,
        stopping: threading.Event,
    ) -> None:
        self.kind = kind
        self.selector = selector
        self.config = config
        self.handler = handler
        self.stopping = stopping
        self.synced = threading.Event()
        self._items: dict[Key, Obj] = {}
        self._lock = threading.Lock()
        self.current: Any = None
        self.thread = threading.Thread(
            target=self._run, name=f"kubevirt-sim-watch-{kind.endpoint}", daemon=True
        )

    # ---- reading (any thread) ---------------------------------------------------------
    def get(self, key: Key) -> Obj | None:
        with self._lock:
            return self._items.get(key)

    def values(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def all_keys(self) -> list[Key]:
        with self._lock:
            return list(self._items)

    def in_namespace(self, namespace: str) -> list[Obj]:
        with self._lock:
            return [obj for key, obj in self._items.items() if key[0] == namespace]

    def query(self, client: pykube.HTTPClient) -> Any:
        query = self.kind.objects(client, namespace=pykube.all)
        return query.filter(selector=self.selector) if self.selector else query

    def covers(self, listing: Obj) -> bool:
        """Whether the cache has caught up with ``listing`` (a list response read from the
        API server): it holds each listed object at that version or newer, and nothing the
        list lacks unless it was written after the list."""
        listed_at = int(str(listing["metadata"]["resourceVersion"]))
        items = cast("list[Obj]", listing.get("items") or [])
        listed = {_key(obj) for obj in items}
        with self._lock:
            for obj in items:
                cached = self._items.get(_key(obj))
                if cached is None or _version(cached) < _version(obj):
                    return False
            return all(
                _version(obj) > listed_at for key, obj in self._items.items() if key not in listed
            )

    # ---- the thread -------------------------------------------------------------------
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

    def _replace(self, items: list[Obj]) -> None:
        fresh = {_key(obj): obj for obj in items}
        with self._lock:
            old, self._items = self._items, fresh
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None or _version(before) != _version(obj):
                self.handler(before, obj)
        for key, obj in old.items():
            if key not in fresh:
                self.handler(obj, None)

    def _apply(self, kind: str, obj: Obj) -> None:
        key = _key(obj)
        with self._lock:
            before = self._items.get(key)
            if kind == "DELETED":
                self._items.pop(key, None)
            else:
                self._items[key] = obj
        if kind == "DELETED":
            self.handler(before or obj, None)
        else:
            self.handler(before, obj)

    def _run(self) -> None:
        client = pykube.HTTPClient(self.config, timeout=WATCH_SECONDS + WATCH_READ_SLACK)
        version: str | None = None
        while not self.stopping.is_set():
            try:
                if version is None:
                    listing = self.query(client).execute().json()
                    version = str(listing["metadata"]["resourceVersion"])
                    self._replace(cast("list[Obj]", listing.get("items") or []))
                    self.synced.set()
                self.current = self.query(client).watch(
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
                    obj = cast("Obj", event.object.obj)
                    version = str(obj["metadata"]["resourceVersion"])
                    if event.type != "BOOKMARK":
                        self._apply(str(event.type), obj)
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


@dataclass
class _Expectation:
    """A launcher pod this simulator created for a VMI and its pod cache has not shown yet
    (KubeVirt's ControllerExpectations, for one creation): ``pod`` is the create's answer
    (None while the create is in flight), ``since`` when it was made (monotonic)."""

    pod: Obj | None
    since: float


# ---- KubeVirt's identity ----------------------------------------------------------------

#: virt-controller's ServiceAccount: the admission policies (config/policy) let only it create
#: pods that request a GPU class's resource, for a VMI that controls them.
CONTROLLER_NAMESPACE: Final = "kubevirt"
CONTROLLER_SERVICE_ACCOUNT: Final = "kubevirt-controller"
CONTROLLER_USERNAME: Final = (
    f"system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER_SERVICE_ACCOUNT}"
)
#: What the stand-in calls, as KubeVirt's own ClusterRole for virt-controller grants it (a
#: subset): VMIs read and written (status through the main resource, as the stand-in CRD
#: has no status subresource), launcher pods made and removed, the KubeVirt CR read; the
#: launcher pod's ownerReference blocks its VMI's deletion, which needs update on the VMI's
#: finalizers.
CONTROLLER_RULES: Final = (
    {
        "apiGroups": ["kubevirt.io"],
        "resources": ["virtualmachineinstances"],
        "verbs": ["get", "list", "watch", "update"],
    },
    {
        "apiGroups": ["kubevirt.io"],
        "resources": ["virtualmachineinstances/finalizers"],
        "verbs": ["update"],
    },
    {"apiGroups": ["kubevirt.io"], "resources": ["kubevirts"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
)
#: Lifetime asked of the stand-in's token (the API server may cap it).
TOKEN_SECONDS: Final = 48 * 3600


def _apply(api: pykube.HTTPClient, kind: type[pykube.objects.APIObject], obj: Obj) -> None:
    """Create ``obj``, or replace what is there (its spec or rules) when it exists."""
    meta = obj["metadata"]
    query = (
        kind.objects(api, namespace=meta["namespace"]) if "namespace" in meta else kind.objects(api)
    )
    live = query.get_or_none(name=meta["name"])
    if live is None:
        kind(api, obj).create()
        return
    live.obj.update({k: v for k, v in obj.items() if k != "metadata"})
    live.update()


def controller_client(api: pykube.HTTPClient) -> pykube.HTTPClient:
    """A client of ``api``'s cluster that authenticates as KubeVirt's controller service
    account (``CONTROLLER_USERNAME``), with the RBAC the stand-in needs; made with ``api``
    (an admin), idempotent. The test cluster's setup, not the product's: config/ never ships
    KubeVirt's identity."""
    _apply(api, pykube.Namespace, {"metadata": {"name": CONTROLLER_NAMESPACE}})
    _apply(
        api,
        pykube.ServiceAccount,
        {"metadata": {"name": CONTROLLER_SERVICE_ACCOUNT, "namespace": CONTROLLER_NAMESPACE}},
    )
    role = f"gpuoperator-test:{CONTROLLER_SERVICE_ACCOUNT}"
    _apply(api, pykube.ClusterRole, {"metadata": {"name": role}, "rules": list(CONTROLLER_RULES)})
    _apply(
        api,
        pykube.ClusterRoleBinding,
        {
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": CONTROLLER_SERVICE_ACCOUNT,
                    "namespace": CONTROLLER_NAMESPACE,
                }
            ],
        },
    )
    return accounts.client(api, CONTROLLER_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT, TOKEN_SECONDS)


class KubeVirtSimulator:
    """Does what virt-controller does to VMIs, in background threads, until ``stop()``.

    ``start()`` launches three watch caches (VMIs, launcher pods, KubeVirt CRs), ``WORKERS``
    worker threads and a resync thread. Cache events put keys in one work queue (the
    product's generic ``WorkQueue``: a key waits there at most once however many events
    arrive, and is never synced by two workers at once): a VMI event its own key, a pod
    event its VMI's key (``vmi_key_of_pod``), a KubeVirt CR event every VMI's key, and every
    ``RESYNC_SECONDS`` all keys and the orphan sweep. A worker syncs one key from the caches
    (level-triggered: it never acts on an event's content); a failed sync is retried with
    per-key exponential backoff. Each thread has its own client built from ``api``'s
    configuration, so the caller keeps ``api`` to itself.

    Invariants:

    * At most one launcher pod per VMI. Before creating a pod the worker records an
      expectation for the VMI's uid; until the pod cache shows a launcher pod of that uid no
      sync creates another, and the create's answer stands for the pod. After
      ``EXPECTATION_SECONDS`` without it the worker asks the API server for the pod by name
      (still there: keep expecting; gone: the pod was deleted).
    * A VMI whose pod was deleted or terminated fails and never gets a new pod: the uids of
      VMIs launched are remembered (``vmi_status(launched=True)``), so a pod deleted before
      the status said Scheduling still fails the VMI instead of being replaced.
    * A launcher pod whose VMI is gone (or being deleted, or replaced by a VMI of the same
      name) is deleted, by its VMI key's sync or by the sweep.
    * Status is written by replacing the VMI under the resourceVersion it was decided on;
      a 409 re-reads the VMI from the API server and decides again.
    """

    def __init__(self, api: pykube.HTTPClient) -> None:
        self._config = api.config
        self._timeout = float(api.timeout)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        #: Uids of VMIs this simulator created a launcher pod for.
        self._launched: set[str] = set()
        #: VMI uid → the pod created for it that the pod cache has not shown yet.
        self._expected: dict[str, _Expectation] = {}
        #: Syncs started so far, and per key the number of the latest one that succeeded.
        self._started = 0
        self._finished: dict[Key, int] = {}
        self._threads: list[threading.Thread] = []
        #: The work queue's metrics (depth, wait, work time) live here, not in the global
        #: registry, so the stand-in never mixes with an operator in the same process.
        self.registry = prometheus_client.CollectorRegistry()
        self._queue: WorkQueue[Key] = WorkQueue(
            "kubevirt-simulator",
            ItemExponentialFailureRateLimiter[Key](base_delay=0.005, max_delay=BACKOFF_CAP),
            registry=self.registry,
        )
        self._vmis = _Cache(
            VirtualMachineInstance, None, self._config, self._on_vmi, self._stopping
        )
        self._pods = _Cache(
            pykube.Pod, {APP_LABEL: LAUNCHER}, self._config, self._on_pod, self._stopping
        )
        self._kubevirts = _Cache(KubeVirt, None, self._config, self._on_kubevirt, self._stopping)
        self._caches = (self._vmis, self._pods, self._kubevirts)

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the threads (once). Workers begin once every cache has listed its kind."""
        if self._threads:
            raise RuntimeError("the KubeVirt simulator is already started")
        self._threads = [c.thread for c in self._caches]
        self._threads += [
            threading.Thread(target=self._work, name=f"kubevirt-sim-worker-{i}", daemon=True)
            for i in range(WORKERS)
        ]
        self._threads.append(
            threading.Thread(target=self._resync, name="kubevirt-sim-resync", daemon=True)
        )
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every thread, waiting at most ``timeout`` seconds in all.

        Threads still busy then (e.g. a request the API server does not answer) are daemon
        threads that exit at their next step; a warning names them.
        """
        self._stopping.set()
        self._queue.shutdown()
        deadline = time.monotonic() + timeout
        while any(t.is_alive() for t in self._threads) and time.monotonic() < deadline:
            for c in self._caches:
                c.interrupt()
            for t in self._threads:
                t.join(timeout=0.05)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            log.warning("KubeVirt simulator threads still running after stop(): %s", alive)

    def settle(self, timeout: float = 30.0) -> None:
        """Return once the simulator has acted on everything in the cluster at call time.

        That is: the caches hold what the API server lists now (every VMI, launcher pod and
        KubeVirt CR at that version or newer, and none it no longer lists), and after that
        every VMI key in them, every launcher pod's VMI key and the orphan sweep have been
        synced by a worker, successfully. Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        client = pykube.HTTPClient(self._config, timeout=self._timeout)
        listings = [(c, c.query(client).execute().json()) for c in self._caches]
        self._until(
            deadline,
            "the caches to catch up",
            lambda: all(c.covers(listing) for c, listing in listings),
        )
        with self._lock:
            mark = self._started
        keys = {*self._vmis.all_keys(), *map(vmi_key_of_pod, self._pods.values()), SWEEP}
        for key in keys:
            self._queue.add(key)

        def synced() -> bool:
            with self._lock:
                return all(self._finished.get(k, 0) > mark for k in keys)

        self._until(deadline, "a sync of every key", synced)

    def _until(self, deadline: float, what: str, condition: Callable[[], bool]) -> None:
        while not condition():
            if self._stopping.is_set() or time.monotonic() > deadline:
                raise TimeoutError(f"the KubeVirt simulator: waiting for {what}")
            self._stopping.wait(SETTLE_POLL_SECONDS)

    # ---- events: keys into the queue (cache threads; quick) ----------------------------
    def _on_vmi(self, old: Obj | None, new: Obj | None) -> None:
        self._queue.add(_key(cast("Obj", new or old)))

    def _on_pod(self, old: Obj | None, new: Obj | None) -> None:
        pod = cast("Obj", new or old)
        with self._lock:  # the cache shows (or showed) this pod: the expectation is met
            self._expected.pop(_owner_uid(pod), None)
        self._queue.add(vmi_key_of_pod(pod))

    def _on_kubevirt(self, old: Obj | None, new: Obj | None) -> None:
        for key in self._vmis.all_keys():
            self._queue.add(key)

    def _resync(self) -> None:
        while not self._stopping.wait(RESYNC_SECONDS):
            for key in [*self._vmis.all_keys(), SWEEP]:
                self._queue.add(key)

    # ---- workers -----------------------------------------------------------------------
    def _work(self) -> None:
        client = pykube.HTTPClient(self._config, timeout=self._timeout)
        for cache in self._caches:
            while not cache.synced.wait(0.1):
                if self._stopping.is_set():
                    return
        while not self._stopping.is_set():
            key = self._queue.get(timeout=0.5)
            if key is None:
                if self._queue.shutting_down:
                    return
                continue
            try:
                if self._stopping.is_set():
                    continue
                with self._lock:
                    self._started += 1
                    number = self._started
                self._sync(client, key)
            except Exception as exc:
                _log_failure(exc, "syncing VMI %s/%s failed", *key)
                self._queue.add_rate_limited(key)
            else:
                self._queue.forget(key)
                with self._lock:
                    self._finished[key] = max(self._finished.get(key, 0), number)
            finally:
                self._queue.done(key)

    def _sync(self, client: pykube.HTTPClient, key: Key) -> None:
        if key == SWEEP:
            self._sweep(client)
            return
        vmi = self._vmis.get(key)
        live = vmi is not None and not _meta(vmi).get("deletionTimestamp")
        uid = str(_meta(vmi).get("uid") or "") if vmi is not None else ""
        pods = [p for p in self._pods.in_namespace(key[0]) if vmi_key_of_pod(p) == key]
        for pod in pods:
            owner = _owner_uid(pod)
            if owner and (not live or owner != uid):
                self._tear_down(client, pod)
        if vmi is None or not live:
            return
        self._reconcile(client, key, vmi, pods)

    def _sweep(self, client: pykube.HTTPClient) -> None:
        """As KubeVirt does when a VMI goes: its launcher pod is shut down (deleted). The
        garbage collector would do it too, but only once it watches the VMI kind, which a
        kube-controller-manager started before the CRD learns at its next discovery. The
        VMI key's sync does it for pods that name their VMI; this catches the rest."""
        vmis = self._vmis.values()
        with self._lock:
            self._launched &= {str(_meta(v).get("uid")) for v in vmis}
        live = {str(_meta(v).get("uid")) for v in vmis if not _meta(v).get("deletionTimestamp")}
        for pod in self._pods.values():
            owner = _owner_uid(pod)
            if owner and owner not in live:
                self._tear_down(client, pod)

    @staticmethod
    def _tear_down(client: pykube.HTTPClient, pod: Obj) -> None:
        if _meta(pod).get("deletionTimestamp"):
            return
        try:
            pykube.Pod(client, dict(pod)).delete()
        except pykube.exceptions.HTTPError as exc:
            if exc.code != 404:
                raise

    def _expected_pod(self, client: pykube.HTTPClient, uid: str, namespace: str) -> Obj | None:
        """The pod created for VMI ``uid`` that the pod cache does not show yet, if any.

        While the expectation is younger than ``EXPECTATION_SECONDS`` that is the create's
        answer, and the key is looked at again when the expectation runs out; after that
        the API server says whether the pod still exists."""
        with self._lock:
            expected = self._expected.get(uid)
        if expected is None:
            return None
        waited = time.monotonic() - expected.since
        if expected.pod is None or waited < EXPECTATION_SECONDS:
            return expected.pod
        name = str(expected.pod["metadata"]["name"])
        found = pykube.Pod.objects(client, namespace=namespace).get_or_none(name=name)
        with self._lock:
            if found is None:
                self._expected.pop(uid, None)
            elif uid in self._expected:
                self._expected[uid] = _Expectation(cast("Obj", found.obj), time.monotonic())
        return cast("Obj", found.obj) if found is not None else None

    def _reconcile(self, client: pykube.HTTPClient, key: Key, vmi: Obj, pods: list[Obj]) -> None:
        permitted = permitted_devices(self._kubevirts.values())
        for _ in range(STATUS_ATTEMPTS):
            meta = _meta(vmi)
            if meta.get("deletionTimestamp"):
                return
            uid = str(meta["uid"])
            phase = (vmi.get("status") or {}).get("phase")
            pod = find_launcher_pod(vmi, pods)
            if pod is None:
                pod = self._expected_pod(client, uid, key[0])
                with self._lock:
                    waiting = self._expected.get(uid)
                if waiting is not None:  # look again when the expectation runs out
                    left = EXPECTATION_SECONDS - (time.monotonic() - waiting.since)
                    self._queue.add_after(key, max(left, 0.0) + 0.1)
            with self._lock:
                launched = uid in self._launched or phase in LAUNCHED_PHASES
            error: SyncError | None = None
            if pod is None and not launched and phase not in FINAL_PHASES:
                rendered = render_launcher_pod(vmi, permitted)
                if isinstance(rendered, SyncError):
                    error = rendered
                else:
                    pod, error = self._launch(client, uid, rendered)
                    if pod is not None:  # look again should the expectation run out
                        self._queue.add_after(key, EXPECTATION_SECONDS + 0.1)
            status = vmi_status(vmi, pod, launched=launched, error=error, now=_now())
            if status == (vmi.get("status") or {}):
                return
            updated = copy.deepcopy(vmi)
            updated["status"] = status
            if self._write_status(client, updated):
                return
            # Someone else wrote the VMI: re-read it and its pods, decide again.
            fresh = VirtualMachineInstance.objects(client, namespace=meta["namespace"])
            found = fresh.get_or_none(name=meta["name"])
            if found is None:
                return
            vmi = cast("Obj", found.obj)
            pods = [p for p in self._pods.in_namespace(key[0]) if vmi_key_of_pod(p) == key]
        log.warning("VMI %s/%s: status kept conflicting", key[0], key[1])

    def _launch(
        self, client: pykube.HTTPClient, uid: str, manifest: Obj
    ) -> tuple[Obj | None, SyncError | None]:
        """Create the launcher pod under an expectation (set before the create, so that a
        pod event that beats the create's answer meets it)."""
        since = time.monotonic()
        with self._lock:
            self._launched.add(uid)
            self._expected[uid] = _Expectation(None, since)
        pod, error = self._create_pod(client, manifest)
        with self._lock:
            if pod is None:
                self._launched.discard(uid)
                self._expected.pop(uid, None)
            elif uid in self._expected:
                self._expected[uid] = _Expectation(pod, since)
        return pod, error

    @staticmethod
    def _write_status(client: pykube.HTTPClient, vmi: Obj) -> bool:
        """Replace ``vmi`` (status included) under its resourceVersion; False on 409."""
        obj = VirtualMachineInstance(client, vmi)
        response = client.put(**obj.api_kwargs(data=json.dumps(vmi)))
        if response.status_code == 409:
            return False
        client.raise_for_status(response)
        return True

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
