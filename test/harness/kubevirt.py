"""A stand-in for KubeVirt's virt-controller, for the e2e suite (docs/design.md §8).

The e2e cluster has no KubeVirt, only stand-ins of its CRDs (``test/harness/crds/``:
VirtualMachineInstance, VirtualMachineInstanceMigration, VirtualMachine, KubeVirt). This
module does to a ``kubevirt.io/v1`` VirtualMachineInstance, its migrations and its
VirtualMachine what virt-controller does (and, for migrations, virt-handler) and what
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
* it live-migrates a VMI for a ``VirtualMachineInstanceMigration`` (``spec.vmiName``) as
  virt-controller's migration controller, through KubeVirt's phases (Pending, Scheduling,
  Scheduled, PreparingTarget, TargetReady, Running, then Succeeded or Failed, each in
  ``status.phaseTransitionTimestamps``): a target pod rendered like the launcher pod plus
  the ``kubevirt.io/migrationJobUID`` label and KubeVirt's required anti-affinity to the
  VMI's pods per hostname; once it runs, the hand-off writes the VMI's
  ``status.migrationState`` (migrationUid, sourceNode, sourcePod, targetNode, targetPod),
  then, as virt-handler, ``startTimestamp``, and at once ``endTimestamp`` and ``completed``
  with the VMI's ``status.nodeName`` and ``kubevirt.io/nodeName`` label on the target; then
  the source pod is deleted and the migration Succeeded. A target pod pending past KubeVirt's
  timeouts (unschedulable: 5 minutes, else 15; the constructor's arguments, and per
  migration the annotations ``kubevirt.io/migrationUnschedulablePodTimeoutSeconds`` and
  ``kubevirt.io/migrationPendingPodTimeoutSeconds``) is deleted, and a target pod gone or
  down fails the migration. A migration deleted before it ends is aborted: its target pod
  deleted and, if it was handed off, ``migrationState.abortStatus: Succeeded``. A VMI
  KubeVirt would not migrate fails its migration at once, with virt-handler's
  ``LiveMigratable`` reason in a ``FailedMigration`` Event (``live_migratable``: host
  devices; more than one GPU; a GPU only with the ``VGPULiveMigration`` feature gate and a
  ``mediatedDevices`` entry of ``permittedHostDevices``, so never a passthrough or DRA GPU),
  as does one that is not running or has an older migration unfinished. As KubeVirt, the
  VMI's migrationState is written only at the hand-off: a migration that fails before
  (timeout, cancel) leaves it as it was.
* it runs a ``VirtualMachine`` as virt-controller's VM controller: ``runStrategy: Always``
  (or ``RerunOnFailure``, or the deprecated ``running: true``) creates the VMI from
  ``spec.template`` (the VM's name, a controller ownerReference to the VM); ``Halted`` (or
  ``running: false``) deletes it; ``status.created``, ``ready`` and ``printableStatus``
  (Starting, Running, Migrating, Stopping, Stopped, Terminating) follow the VMI.

Like virt-controller it finds its pod by the ``kubevirt.io=virt-launcher`` label and the
controller ownerReference, and it never compares the live pod with what it rendered nor
rewrites it: the scheduling gate and node affinity that gpuoperator's webhook and placement
controller add stay as they are.

The rendering and status decisions are pure functions (``render_launcher_pod``,
``vmi_status``, ``find_launcher_pod``, ``permitted_devices``, ``vmi_key_of_pod``):
idempotent, no I/O, so the unit tests pin them down. ``KubeVirtSimulator`` is the I/O shell,
shaped like virt-controller's VMI controller:

* watch caches (informers: list, then watch from its resourceVersion, relist on 410 or any
  failure) of VMIs, launcher pods (``kubevirt.io=virt-launcher``, migration targets
  included), KubeVirt CRs, migrations and VMs;
* one rate-limited work queue keyed by VMI namespace/name (the product's generic
  ``gpuoperator.runtime.queueing.WorkQueue``, client-go's semantics): a VMI event queues
  its key, a pod event its owning VMI's key (controller ownerReference, else the
  ``vm.kubevirt.io/name`` label), a KubeVirt CR event every VMI's key, and every
  ``RESYNC_SECONDS`` all of them; a key is queued once however many events arrive while it
  waits, never synced by two workers at once, and a failed sync is retried with backoff;
  migrations and VMs have queues (and a worker each) of their own, fed by their own events
  and by those of their VMI and its pods;
* ``WORKERS`` worker threads, each syncing one key from the caches;
* expectations, as KubeVirt's ``ControllerExpectations``: after creating a pod for a VMI
  no sync creates another until the pod cache has shown it (or ``EXPECTATION_SECONDS``
  pass and the API server, asked directly, says it is gone).

``KubeVirtSimulator.settle()`` waits until the simulator has acted on everything the API
server holds at call time, for tests that assert that something did *not* happen.

Simplifications, on purpose: no virt-handler (a VMI never becomes Running; where KubeVirt
asks whether a VMI runs, for a migration or a VM's ``ready``, ``Scheduled`` counts), no
memory overhead on the compute container, nothing restarts a final VMI (no start-failure
backoff: a VM's Failed VMI stays, Stopped), a migration's transfer takes no time (it
completes in the sync after it starts), no migration finalizer (a deleted migration is gone
at once; the VMI's sync removes its target pod), no limits on parallel migrations, no
garbage collection of finished migrations. CPU and memory go where KubeVirt puts them: the VMI's
``spec.domain.resources.requests`` into the compute container's requests, its ``limits``
into its limits. The VMI stand-in CRD has no status subresource, so status is written by
replacing the whole object under its resourceVersion.
"""

from __future__ import annotations

import copy
import datetime
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import prometheus_client
import pykube

from gpuoperator.kinds import (
    KubeVirt,
    VirtualMachine,
    VirtualMachineInstance,
    VirtualMachineInstanceMigration,
)
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


def _configuration(kubevirts: Iterable[Mapping[str, Any]]) -> Mapping[str, Any]:
    """``spec.configuration`` of the KubeVirt CR that KubeVirt honours (the oldest live one;
    KubeVirt marks later ones as failed), ``{}`` without one."""
    live = [kv for kv in kubevirts if not _meta(kv).get("deletionTimestamp")]
    if not live:
        return {}
    oldest = min(
        live,
        key=lambda kv: (
            str(_meta(kv).get("creationTimestamp") or ""),
            str(_meta(kv).get("namespace") or ""),
            str(_meta(kv).get("name") or ""),
        ),
    )
    return cast("Mapping[str, Any]", (oldest.get("spec") or {}).get("configuration") or {})


def permitted_devices(kubevirts: Iterable[Mapping[str, Any]]) -> frozenset[str] | None:
    """The resource names the cluster's ``KubeVirt`` CR permits for GPUs, or None for "all".

    KubeVirt honours one KubeVirt CR; with several, the oldest live one decides (KubeVirt
    marks the later ones as failed). No CR, or a CR without
    ``spec.configuration.permittedHostDevices``, permits everything; a table that is set but
    lists nothing permits nothing. Both ``pciHostDevices`` and ``mediatedDevices`` count.
    """
    table = _configuration(kubevirts).get("permittedHostDevices")
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
    ownerReference to the VMI's uid and, once the VMI has a ``status.nodeName``, runs on
    that node (KubeVirt's ``CurrentVMIPod``: a migration's target pod on another node is
    not the VMI's pod until the VMI has moved there). Should there be several, a live one
    is preferred over one being deleted, then the newest.
    """
    uid = str(_meta(vmi).get("uid") or "")
    node = str((vmi.get("status") or {}).get("nodeName") or "")
    mine = [
        p
        for p in pods
        if (_meta(p).get("labels") or {}).get(APP_LABEL) == LAUNCHER
        and _controlled_by(p, uid)
        and (not node or (p.get("spec") or {}).get("nodeName") == node)
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


# ---- live migration (virt-controller's migration controller, virt-handler's part) ------

#: KubeVirt's names for migrations.
MIGRATION_KIND: Final = "VirtualMachineInstanceMigration"
MIGRATION_JOB_LABEL: Final = "kubevirt.io/migrationJobUID"
MIGRATION_JOB_NAME_ANNOTATION: Final = "kubevirt.io/migrationJobName"
NODE_NAME_LABEL: Final = "kubevirt.io/nodeName"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
#: Per-migration overrides of the target pod's pending timeouts, in seconds (KubeVirt's).
UNSCHEDULABLE_TIMEOUT_ANNOTATION: Final = "kubevirt.io/migrationUnschedulablePodTimeoutSeconds"
PENDING_TIMEOUT_ANNOTATION: Final = "kubevirt.io/migrationPendingPodTimeoutSeconds"
#: KubeVirt's defaults: a target pod unschedulable for 5 minutes, or pending for any reason
#: for 15, is deleted and its migration fails.
UNSCHEDULABLE_TIMEOUT_SECONDS: Final = 300.0
PENDING_TIMEOUT_SECONDS: Final = 900.0

# Migration phases (KubeVirt's VirtualMachineInstanceMigrationPhase; "" is unset).
MIGRATION_PENDING: Final = "Pending"
MIGRATION_SCHEDULING: Final = "Scheduling"
MIGRATION_SCHEDULED: Final = "Scheduled"
MIGRATION_PREPARING_TARGET: Final = "PreparingTarget"
MIGRATION_TARGET_READY: Final = "TargetReady"
MIGRATION_RUNNING: Final = "Running"
MIGRATION_SUCCEEDED: Final = "Succeeded"
MIGRATION_FAILED: Final = "Failed"
MIGRATION_FINAL: Final = frozenset({MIGRATION_SUCCEEDED, MIGRATION_FAILED})
#: Phases after the target pod was created: if it is gone now, the migration fails.
TARGET_CREATED_PHASES: Final = frozenset(
    {
        MIGRATION_SCHEDULING,
        MIGRATION_SCHEDULED,
        MIGRATION_PREPARING_TARGET,
        MIGRATION_TARGET_READY,
        MIGRATION_RUNNING,
    }
)
ABORT_REQUESTED: Final = "migrationAbortRequested"
ABORT_SUCCEEDED: Final = "Succeeded"
#: The VMI condition saying whether KubeVirt would live-migrate it, and its reason here.
LIVE_MIGRATABLE: Final = "LiveMigratable"
HOST_DEVICE_NOT_MIGRATABLE: Final = "HostDeviceNotLiveMigratable"
VGPU_LIVE_MIGRATION: Final = "VGPULiveMigration"
# Event reasons virt-controller gives migrations.
FAILED_MIGRATION: Final = "FailedMigration"
SUCCESSFUL_MIGRATION: Final = "SuccessfulMigration"
TARGET_UNSCHEDULABLE: Final = "migrationTargetPodUnschedulable"
SUCCESSFUL_DELETE: Final = "SuccessfulDelete"
#: What the stand-in's virt-handler reports as the target's migration address.
TARGET_ADDRESS: Final = "127.0.0.1"


def vmi_runs(vmi: Mapping[str, Any]) -> bool:
    """Whether the VMI runs, where KubeVirt asks ``vmi.IsRunning()``. With no virt-handler
    the stand-in's VMIs never reach ``Running``: ``Scheduled`` (its pod runs) counts."""
    phase = (vmi.get("status") or {}).get("phase")
    return phase in (SCHEDULED, RUNNING) and not _meta(vmi).get("deletionTimestamp")


def vgpu_migration_config(namespace: str, resource: str, profile: str) -> Obj:
    """The KubeVirt CR as a hoster sets it for vGPU live migration, which the stand-in reads
    as KubeVirt does: ``resource`` a mediated device of ``profile``, the
    ``VGPULiveMigration`` feature gate on."""
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": namespace},
        "spec": {
            "configuration": {
                "developerConfiguration": {"featureGates": ["VGPULiveMigration"]},
                "permittedHostDevices": {
                    "mediatedDevices": [{"mdevNameSelector": profile, "resourceName": resource}]
                },
            }
        },
    }


def live_migratable(
    vmi: Mapping[str, Any], kubevirts: Iterable[Mapping[str, Any]]
) -> SyncError | None:
    """Why KubeVirt would not live-migrate ``vmi`` (its ``LiveMigratable`` condition's
    reason and message), None when it would, by virt-handler's host-device rules: no
    ``hostDevices``; at most one GPU; a GPU only with the ``VGPULiveMigration`` feature gate
    and when its ``deviceName`` is a mediated device of ``permittedHostDevices`` (so never a
    passthrough GPU, nor a DRA GPU, which has no ``deviceName``)."""
    devices = ((vmi.get("spec") or {}).get("domain") or {}).get("devices") or {}
    gpus = list(devices.get("gpus") or [])
    config = _configuration(kubevirts)
    reason = ""
    if devices.get("hostDevices"):
        reason = "VMI specifies non-migratable generic PCI host device"
    elif len(gpus) > 1:
        reason = "VMI specifies too many GPUs"
    elif gpus:
        gates = (config.get("developerConfiguration") or {}).get("featureGates") or []
        mediated = {
            str(d.get("resourceName"))
            for d in (config.get("permittedHostDevices") or {}).get("mediatedDevices") or []
        }
        if VGPU_LIVE_MIGRATION not in gates:
            reason = f"VMI specifies a GPU but feature gate {VGPU_LIVE_MIGRATION} is not enabled"
        elif gpus[0].get("deviceName") not in mediated:
            reason = "VMI specifies non-migratable GPU device"
    return SyncError(HOST_DEVICE_NOT_MIGRATABLE, reason) if reason else None


def render_target_pod(
    vmi: Mapping[str, Any], migration: Mapping[str, Any], permitted: frozenset[str] | None
) -> Obj | SyncError:
    """The migration's target pod: the launcher pod ``render_launcher_pod`` renders, plus
    the ``kubevirt.io/migrationJobUID`` label and ``kubevirt.io/migrationJobName``
    annotation, and KubeVirt's required pod anti-affinity to every pod of the VMI
    (``kubevirt.io/created-by``) per hostname, so it never lands on the source's node."""
    pod = render_launcher_pod(vmi, permitted)
    if isinstance(pod, SyncError):
        return pod
    meta = _meta(migration)
    pod["metadata"]["labels"][MIGRATION_JOB_LABEL] = str(meta["uid"])
    pod["metadata"]["annotations"][MIGRATION_JOB_NAME_ANNOTATION] = str(meta["name"])
    term = {
        "labelSelector": {
            "matchExpressions": [
                {"key": CREATED_BY_LABEL, "operator": "In", "values": [str(_meta(vmi)["uid"])]}
            ]
        },
        "topologyKey": HOSTNAME_LABEL,
    }
    anti = pod["spec"].setdefault("affinity", {}).setdefault("podAntiAffinity", {})
    anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
    return pod


def target_pod(
    vmi: Mapping[str, Any], migration_uid: str, pods: Iterable[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The migration's target pod among ``pods``: a launcher pod of the VMI labelled with
    the migration's uid (a live one first, then the newest)."""
    uid = str(_meta(vmi).get("uid") or "")
    mine = [
        p
        for p in pods
        if (_meta(p).get("labels") or {}).get(MIGRATION_JOB_LABEL) == migration_uid
        and _controlled_by(p, uid)
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


def _timeout(migration: Mapping[str, Any], annotation: str, default: float) -> float:
    """The migration's override of a timeout (an annotation of whole seconds), else
    ``default``; a value that is not a number is ignored, as KubeVirt does."""
    text = (_meta(migration).get("annotations") or {}).get(annotation)
    try:
        return float(int(str(text))) if text is not None else default
    except ValueError:
        return default


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _seconds(timestamp: Any) -> float | None:
    """An RFC 3339 timestamp as epoch seconds, None when absent or malformed."""
    try:
        return datetime.datetime.fromisoformat(str(timestamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _stamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


@dataclass(frozen=True)
class MigrationStep:
    """What one sync of a migration does. ``status`` is the migration's status after it;
    ``vmi`` the VMI's new status and labels (``{"status": ..., "labels": ...}``, written
    before the migration's), None to leave it; ``create_target`` asks for the target pod;
    ``delete_pods`` names pods to delete (after the writes); ``delete_migration`` deletes
    the migration itself (its VMI is gone); ``events`` are (type, reason, message) on the
    migration; ``recheck_after`` asks for another sync that many seconds later."""

    status: Obj
    vmi: Obj | None = None
    create_target: bool = False
    delete_pods: tuple[str, ...] = ()
    delete_migration: bool = False
    events: tuple[tuple[str, str, str], ...] = ()
    recheck_after: float | None = None


def _with_phase(status: Obj, phase: str, now: float) -> Obj:
    if status.get("phase") != phase:
        status["phase"] = phase
        stamps = list(status.get("phaseTransitionTimestamps") or [])
        stamps.append({"phase": phase, "phaseTransitionTimestamp": _stamp(now)})
        status["phaseTransitionTimestamps"] = stamps
    return status


def _migration_state(vmi: Mapping[str, Any]) -> Mapping[str, Any]:
    return cast("Mapping[str, Any]", (vmi.get("status") or {}).get("migrationState") or {})


def _vmi_change(vmi: Mapping[str, Any], state: Obj, node: str | None = None) -> Obj:
    """The VMI's status with ``state`` as its migrationState (and, with ``node``, moved to
    that node), and its labels (the ``kubevirt.io/nodeName`` label following the node)."""
    status = copy.deepcopy(dict(vmi.get("status") or {}))
    status["migrationState"] = state
    labels = dict(_meta(vmi).get("labels") or {})
    if node is not None:
        status["nodeName"] = node
        labels[NODE_NAME_LABEL] = node
    return {"status": status, "labels": labels}


def _fail(
    status: Obj, now: float, message: str, *pods: str, vmi: Obj | None = None
) -> MigrationStep:
    return MigrationStep(
        _with_phase(status, MIGRATION_FAILED, now),
        vmi=vmi,
        delete_pods=tuple(pods),
        events=(("Warning", FAILED_MIGRATION, message),),
    )


def _failed_state(state: Mapping[str, Any], now: float, reason: str, *, abort: bool) -> Obj:
    """A handed-off migrationState marked failed (and aborted), as virt-handler marks it."""
    out = dict(state)
    out.update({"failed": True, "completed": True})
    out.setdefault("startTimestamp", _stamp(now))
    out.setdefault("endTimestamp", _stamp(now))
    out.setdefault("failureReason", reason)
    if abort:
        out["abortStatus"] = ABORT_SUCCEEDED
    return out


def migration_step(
    migration: Mapping[str, Any],
    vmi: Mapping[str, Any] | None,
    pods: Iterable[Mapping[str, Any]],
    *,
    kubevirts: Iterable[Mapping[str, Any]] = (),
    busy: bool = False,
    now: float,
    unschedulable_timeout: float = UNSCHEDULABLE_TIMEOUT_SECONDS,
    pending_timeout: float = PENDING_TIMEOUT_SECONDS,
) -> MigrationStep:
    """One sync of ``migration`` (a VirtualMachineInstanceMigration) of ``vmi`` (None: no
    such VMI), given the VMI's launcher pods ``pods``; ``busy`` says an older unfinished
    migration of the VMI exists. Pure: the caller writes what the step says.

    Phases, one step per sync as virt-controller: unset → Pending (or Failed when the VMI
    does not run, would not be live-migrated, or is busy) → the target pod is created →
    Scheduling → (target pod runs) Scheduled → the hand-off writes the VMI's
    ``migrationState`` (migrationUid, sourceNode, targetNode, targetPod, sourcePod) →
    PreparingTarget → as virt-handler: the target's address and ``startTimestamp`` →
    TargetReady → Running → as virt-handler: ``endTimestamp``, ``completed`` and the VMI's
    ``status.nodeName`` and ``kubevirt.io/nodeName`` label moved to the target → Succeeded,
    the source pod deleted. A target pod pending past its timeout (unschedulable:
    ``unschedulable_timeout``, any other reason: ``pending_timeout``; the migration's
    annotations override both) is deleted, and a target pod gone or down before the end
    fails the migration. A migration being deleted before the hand-off gets the
    ``migrationAbortRequested`` condition and fails, its target pod deleted; after the
    hand-off the VMI's ``migrationState`` says ``abortStatus: Succeeded``, ``failed``.
    """
    meta = _meta(migration)
    uid = str(meta.get("uid") or "")
    status: Obj = copy.deepcopy(dict(migration.get("status") or {}))
    phase = str(status.get("phase") or "")
    if vmi is None:
        if meta.get("deletionTimestamp") or phase in MIGRATION_FINAL:
            return MigrationStep(status)
        return MigrationStep(status, delete_migration=True)
    pods = list(pods)
    target = target_pod(vmi, uid, pods)
    target_name = str(_meta(target)["name"]) if target is not None else ""
    live_target = (
        target_name if target is not None and not _meta(target).get("deletionTimestamp") else ""
    )
    state = _migration_state(vmi)
    handed_off = state.get("migrationUid") == uid
    vmi_phase = str((vmi.get("status") or {}).get("phase") or "")

    if phase in MIGRATION_FINAL:
        if phase == MIGRATION_FAILED and live_target:
            return MigrationStep(status, delete_pods=(live_target,))
        return MigrationStep(status)
    if vmi_phase in FINAL_PHASES:
        return _fail(status, now, "Migration failed vmi shutdown during migration.", live_target)
    if meta.get("deletionTimestamp"):
        conditions = list(status.get("conditions") or [])
        if not any(c.get("type") == ABORT_REQUESTED for c in conditions):
            conditions.append(
                {"type": ABORT_REQUESTED, "status": "True", "lastProbeTime": _stamp(now)}
            )
        status["conditions"] = conditions
        change = None
        if handed_off and not state.get("completed"):
            aborted = _failed_state(state, now, "Live migration has been aborted", abort=True)
            change = _vmi_change(vmi, aborted)
        return _fail(
            status,
            now,
            "Migration failed due to being canceled",
            *([live_target] if live_target else []),
            vmi=change,
        )
    if phase in TARGET_CREATED_PHASES and target is None:
        change = None
        if handed_off and not state.get("completed"):
            change = _vmi_change(vmi, _failed_state(state, now, "Target pod is down", abort=False))
        return _fail(
            status, now, "Migration target pod was removed during active migration.", vmi=change
        )
    if target is not None and (target.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        change = None
        if handed_off and not state.get("completed"):
            change = _vmi_change(vmi, _failed_state(state, now, "Target pod is down", abort=False))
        return _fail(
            status,
            now,
            "Migration failed because target pod shutdown during migration",
            *([live_target] if live_target else []),
            vmi=change,
        )

    if phase == "":
        if not vmi_runs(vmi):
            return _fail(status, now, "Cannot migrate VMI, VMI is not running")
        refusal = live_migratable(vmi, kubevirts)
        if refusal is not None:
            return _fail(
                status,
                now,
                f"Cannot migrate VMI, Reason: {refusal.reason}, Message: {refusal.message}",
            )
        if busy:
            return _fail(
                status,
                now,
                "VMI is not eligible for migration because another migration job is in progress.",
            )
        return MigrationStep(_with_phase(status, MIGRATION_PENDING, now))
    if phase == MIGRATION_PENDING:
        if target is None:
            return MigrationStep(status, create_target=True)
        return MigrationStep(_with_phase(status, MIGRATION_SCHEDULING, now))
    if phase == MIGRATION_SCHEDULING:
        assert target is not None
        if _pod_running(target):
            return MigrationStep(_with_phase(status, MIGRATION_SCHEDULED, now))
        return _pending_timeout(
            migration, vmi, target, status, now, unschedulable_timeout, pending_timeout
        )
    if phase == MIGRATION_SCHEDULED:
        assert target is not None
        if handed_off and state.get("targetNode"):
            return MigrationStep(_with_phase(status, MIGRATION_PREPARING_TARGET, now))
        source = find_launcher_pod(vmi, pods)
        handoff: Obj = {
            "migrationUid": uid,
            "sourceNode": str((vmi.get("status") or {}).get("nodeName") or ""),
            "targetNode": str((target.get("spec") or {}).get("nodeName") or ""),
            "targetPod": target_name,
        }
        if source is not None:
            handoff["sourcePod"] = str(_meta(source)["name"])
        return MigrationStep(status, vmi=_vmi_change(vmi, handoff))
    if phase == MIGRATION_PREPARING_TARGET:
        if state.get("targetNodeAddress"):
            return MigrationStep(_with_phase(status, MIGRATION_TARGET_READY, now))
        started = dict(state)
        started.update(
            {
                "targetNodeAddress": TARGET_ADDRESS,
                "targetNodeDomainDetected": True,
                "startTimestamp": _stamp(now),
                "mode": "PreCopy",
            }
        )
        return MigrationStep(status, vmi=_vmi_change(vmi, started))
    if phase == MIGRATION_TARGET_READY:
        return MigrationStep(_with_phase(status, MIGRATION_RUNNING, now))
    # Running: the stand-in's virt-handlers finish the transfer at once.
    if state.get("completed"):
        status["migrationState"] = copy.deepcopy(dict(state))
        source_pod = str(state.get("sourcePod") or "")
        return MigrationStep(
            _with_phase(status, MIGRATION_SUCCEEDED, now),
            delete_pods=tuple(p for p in [source_pod] if p and p != target_name),
            events=(("Normal", SUCCESSFUL_MIGRATION, "Source node reported migration succeeded"),),
        )
    done = dict(state)
    done.update(
        {
            "completed": True,
            "endTimestamp": _stamp(now),
            "targetNodeDomainReadyTimestamp": _stamp(now),
        }
    )
    return MigrationStep(status, vmi=_vmi_change(vmi, done, node=str(state.get("targetNode"))))


def _pending_timeout(
    migration: Mapping[str, Any],
    vmi: Mapping[str, Any],
    target: Mapping[str, Any],
    status: Obj,
    now: float,
    unschedulable_timeout: float,
    pending_timeout: float,
) -> MigrationStep:
    """virt-controller's ``handlePendingPodTimeout``: a target pod pending past its timeout
    is deleted (the next sync fails the migration), else the migration is looked at again
    when the timeout runs out."""
    created = _seconds(_meta(target).get("creationTimestamp"))
    phase = (target.get("status") or {}).get("phase")
    if created is None or phase not in (None, "Pending") or _meta(target).get("deletionTimestamp"):
        return MigrationStep(status)  # only a pending pod not being deleted times out
    waited = now - created
    name, namespace = str(_meta(target)["name"]), str(_meta(target).get("namespace") or "")
    vmi_key = f"{_meta(vmi).get('namespace')}/{_meta(vmi).get('name')}"
    events: list[tuple[str, str, str]] = []
    limits = [_timeout(migration, PENDING_TIMEOUT_ANNOTATION, pending_timeout)]
    what = "pending"
    if _unschedulable(target):
        events.append(
            (
                "Warning",
                TARGET_UNSCHEDULABLE,
                f"Migration target pod for VMI [{vmi_key}] is currently unschedulable.",
            )
        )
        unschedulable = _timeout(migration, UNSCHEDULABLE_TIMEOUT_ANNOTATION, unschedulable_timeout)
        if waited >= unschedulable:
            what = "unschedulable"
        limits.append(unschedulable)
    if what == "unschedulable" or waited >= limits[0]:
        message = f"{what} pod {namespace}/{name} timeout period exceeded"
        return MigrationStep(
            status, delete_pods=(name,), events=(*events, ("Normal", SUCCESSFUL_DELETE, message))
        )
    return MigrationStep(status, events=tuple(events), recheck_after=min(limits) - waited)


# ---- VirtualMachines (virt-controller's VM controller) ----------------------------------

VM_KIND: Final = "VirtualMachine"
ALWAYS: Final = "Always"
HALTED: Final = "Halted"
RERUN_ON_FAILURE: Final = "RerunOnFailure"
# printableStatus values (KubeVirt's VirtualMachinePrintableStatus).
VM_STOPPED: Final = "Stopped"
VM_STARTING: Final = "Starting"
VM_RUNNING: Final = "Running"
VM_STOPPING: Final = "Stopping"
VM_TERMINATING: Final = "Terminating"
VM_MIGRATING: Final = "Migrating"
VM_UNKNOWN: Final = "Unknown"


def run_strategy(vm: Mapping[str, Any]) -> str:
    """The VM's run strategy as KubeVirt reads it: the deprecated ``spec.running`` when set
    (true: Always, false: Halted), else ``spec.runStrategy``, else Halted."""
    spec = vm.get("spec") or {}
    if spec.get("running") is not None:
        return ALWAYS if spec["running"] else HALTED
    return str(spec.get("runStrategy") or HALTED)


def controlled_vmi(vm: Mapping[str, Any], vmi: Mapping[str, Any] | None) -> bool:
    """Whether ``vmi`` (the VMI of the VM's name) is the VM's: controlled by its uid."""
    return vmi is not None and _controlled_by(vmi, str(_meta(vm).get("uid") or ""))


def render_vmi(vm: Mapping[str, Any]) -> Obj:
    """The VMI the VM starts: ``spec.template``'s metadata and spec, the VM's name and
    namespace, a controller ownerReference to the VM."""
    meta = _meta(vm)
    template = cast("Mapping[str, Any]", (vm.get("spec") or {}).get("template") or {})
    vmi_meta: Obj = copy.deepcopy(dict(template.get("metadata") or {}))
    vmi_meta.pop("generateName", None)
    vmi_meta.update(
        {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "ownerReferences": [
                {
                    "apiVersion": KUBEVIRT_API_VERSION,
                    "kind": VM_KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
    )
    return {
        "apiVersion": KUBEVIRT_API_VERSION,
        "kind": VMI_KIND,
        "metadata": vmi_meta,
        "spec": copy.deepcopy(dict(template.get("spec") or {})),
    }


@dataclass(frozen=True)
class VMStep:
    """What one sync of a VM does: create ``create`` (a VMI), delete its VMI
    (``delete_vmi``), and write ``status`` (the VM's status after the step)."""

    status: Obj
    create: Obj | None = None
    delete_vmi: bool = False


def _migrating(vmi: Mapping[str, Any]) -> bool:
    state = _migration_state(vmi)
    return bool(state.get("startTimestamp")) and not state.get("endTimestamp")


def vm_step(vm: Mapping[str, Any], vmi: Mapping[str, Any] | None, *, launched: bool) -> VMStep:
    """One sync of the VirtualMachine ``vm`` whose namespace holds ``vmi`` under its name
    (None: none). ``launched`` says this simulator created a VMI for the VM's uid whose
    creation the VMI cache has not shown yet (expectations). Pure.

    Always and RerunOnFailure start a VMI when the VM has none; Halted deletes the VM's
    VMI; Manual and Once are left as they are. A VMI of the name that the VM does not
    control is left alone (and none is created). ``status.created`` says the VM's VMI
    exists, ``ready`` that it runs (``vmi_runs``), ``printableStatus`` is KubeVirt's first
    match of Terminating, Stopping, Migrating, Running, Starting, Stopped (else Unknown).
    """
    strategy = run_strategy(vm)
    mine = vmi if controlled_vmi(vm, vmi) else None
    deleting = bool(_meta(vm).get("deletionTimestamp"))
    create: Obj | None = None
    delete = False
    if not deleting and strategy in (ALWAYS, RERUN_ON_FAILURE) and vmi is None and not launched:
        create = render_vmi(vm)
    if strategy == HALTED and mine is not None and not _meta(mine).get("deletionTimestamp"):
        delete = True
    start_expected = strategy in (ALWAYS, RERUN_ON_FAILURE) and not deleting
    vmi_final = mine is not None and (mine.get("status") or {}).get("phase") in FINAL_PHASES
    if deleting:
        printable = VM_TERMINATING
    elif (
        mine is not None
        and not vmi_final
        and (_meta(mine).get("deletionTimestamp") or strategy == HALTED)
    ):
        printable = VM_STOPPING
    elif mine is not None and _migrating(mine):
        printable = VM_MIGRATING
    elif mine is not None and vmi_runs(mine):
        printable = VM_RUNNING
    elif (mine is None and (start_expected or launched)) or (
        mine is not None
        and (mine.get("status") or {}).get("phase") in ("", None, PENDING, SCHEDULING)
    ):
        printable = VM_STARTING
    elif vmi_final or (mine is None and not start_expected):
        printable = VM_STOPPED
    else:
        printable = VM_UNKNOWN
    status: Obj = copy.deepcopy(dict(vm.get("status") or {}))
    status["created"] = mine is not None
    status["ready"] = mine is not None and vmi_runs(mine)
    status["printableStatus"] = printable
    return VMStep(status, create=create, delete_vmi=delete)


def abandon_migration(status: Mapping[str, Any], migrations: Iterable[str], now: float) -> Obj:
    """The VMI status ``status`` once a migration it was handed off to is gone (deleted
    before completing: ``migrations`` are the uids of the migrations that still exist): its
    ``migrationState`` aborted (``abortStatus: Succeeded``, ``failed``, ``completed``), as
    virt-handler aborts it. Anything else is returned as it is."""
    out: Obj = copy.deepcopy(dict(status))
    state = cast("Mapping[str, Any]", out.get("migrationState") or {})
    uid = state.get("migrationUid")
    if not uid or state.get("completed") or uid in set(migrations):
        return out
    out["migrationState"] = _failed_state(state, now, "Live migration has been aborted", abort=True)
    return out


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
#: The simulator's work queues: VMI keys (and the sweep), migration keys, VM keys.
VMI_QUEUE: Final = "vmis"
MIGRATION_QUEUE: Final = "migrations"
VM_QUEUE: Final = "vms"
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
#: subset): VMIs read, written (status through the main resource, as the stand-in CRD
#: has no status subresource), made and removed for VMs; migrations and VMs read, their
#: status written, a migration of a gone VMI removed; Events made; launcher and target
#: pods made and removed, the KubeVirt CR read; the
#: launcher pod's ownerReference blocks its VMI's deletion, which needs update on the VMI's
#: finalizers.
CONTROLLER_RULES: Final = (
    {
        "apiGroups": ["kubevirt.io"],
        "resources": ["virtualmachineinstances"],
        "verbs": ["get", "list", "watch", "update", "create", "delete"],
    },
    {
        "apiGroups": ["kubevirt.io"],
        "resources": ["virtualmachineinstancemigrations", "virtualmachines"],
        "verbs": ["get", "list", "watch", "delete"],
    },
    {
        "apiGroups": ["kubevirt.io"],
        "resources": ["virtualmachineinstancemigrations/status", "virtualmachines/status"],
        "verbs": ["update"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
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

    def __init__(
        self,
        api: pykube.HTTPClient,
        *,
        unschedulable_timeout: float = UNSCHEDULABLE_TIMEOUT_SECONDS,
        pending_timeout: float = PENDING_TIMEOUT_SECONDS,
    ) -> None:
        #: A migration's target pod pending this long (unschedulable, or for any reason)
        #: fails it, unless the migration's own annotations say otherwise.
        self.unschedulable_timeout = unschedulable_timeout
        self.pending_timeout = pending_timeout
        self._config = api.config
        self._timeout = float(api.timeout)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        #: Uids of VMIs this simulator created a launcher pod for.
        self._launched: set[str] = set()
        #: VMI uid → the pod created for it that the pod cache has not shown yet.
        self._expected: dict[str, _Expectation] = {}
        #: Migration uid → when its target pod was created, until the pod cache shows it.
        self._expected_targets: dict[str, float] = {}
        #: VM uid → when its VMI was created, until the VMI cache shows it.
        self._expected_vmis: dict[str, float] = {}
        #: Syncs started so far, and per (queue, key) the number of the latest one that
        #: succeeded.
        self._started = 0
        self._finished: dict[tuple[str, Key], int] = {}
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
        #: Migrations and VMs have queues of their own, as virt-controller's migration and VM
        #: controllers do; keys are (namespace, name) of the migration or VM.
        self._migration_queue: WorkQueue[Key] = WorkQueue(
            "kubevirt-simulator-migrations",
            ItemExponentialFailureRateLimiter[Key](base_delay=0.005, max_delay=BACKOFF_CAP),
            registry=self.registry,
        )
        self._vm_queue: WorkQueue[Key] = WorkQueue(
            "kubevirt-simulator-vms",
            ItemExponentialFailureRateLimiter[Key](base_delay=0.005, max_delay=BACKOFF_CAP),
            registry=self.registry,
        )
        self._migrations = _Cache(
            VirtualMachineInstanceMigration,
            None,
            self._config,
            self._on_migration,
            self._stopping,
        )
        self._vms = _Cache(VirtualMachine, None, self._config, self._on_vm, self._stopping)
        self._caches = (self._vmis, self._pods, self._kubevirts, self._migrations, self._vms)
        self._queues: dict[str, tuple[WorkQueue[Key], Callable[[pykube.HTTPClient, Key], None]]]
        self._queues = {
            VMI_QUEUE: (self._queue, self._sync),
            MIGRATION_QUEUE: (self._migration_queue, self._sync_migration),
            VM_QUEUE: (self._vm_queue, self._sync_vm),
        }

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
        self._threads += [
            threading.Thread(
                target=self._work, args=(name,), name=f"kubevirt-sim-{name}", daemon=True
            )
            for name in (MIGRATION_QUEUE, VM_QUEUE)
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
        for queue, _sync in self._queues.values():
            queue.shutdown()
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

        That is: the caches hold what the API server lists now (every VMI, launcher pod,
        KubeVirt CR, migration and VM at that version or newer, and none it no longer
        lists), and after that every VMI key in them, every launcher pod's VMI key, the
        orphan sweep, every migration and every VM have been synced by a worker,
        successfully. Raises ``TimeoutError`` after ``timeout`` seconds.
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
        vmi_keys = {*self._vmis.all_keys(), *map(vmi_key_of_pod, self._pods.values()), SWEEP}
        keys = {(VMI_QUEUE, k) for k in vmi_keys}
        keys |= {(MIGRATION_QUEUE, k) for k in self._migrations.all_keys()}
        keys |= {(VM_QUEUE, k) for k in self._vms.all_keys()}
        for name, key in keys:
            self._queues[name][0].add(key)

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
        vmi = cast("Obj", new or old)
        key = _key(vmi)
        self._queue.add(key)
        with self._lock:  # the cache shows (or showed) the VMI a VM created
            for ref in _meta(vmi).get("ownerReferences") or []:
                self._expected_vmis.pop(str(ref.get("uid") or ""), None)
        self._queue_migrations_of(key)
        self._vm_queue.add(key)  # a VM's VMI has the VM's name

    def _on_pod(self, old: Obj | None, new: Obj | None) -> None:
        pod = cast("Obj", new or old)
        with self._lock:  # the cache shows (or showed) this pod: the expectation is met
            self._expected.pop(_owner_uid(pod), None)
            self._expected_targets.pop(
                str((_meta(pod).get("labels") or {}).get(MIGRATION_JOB_LABEL) or ""), None
            )
        key = vmi_key_of_pod(pod)
        self._queue.add(key)
        self._queue_migrations_of(key)

    def _on_kubevirt(self, old: Obj | None, new: Obj | None) -> None:
        for key in self._vmis.all_keys():
            self._queue.add(key)

    def _on_migration(self, old: Obj | None, new: Obj | None) -> None:
        migration = cast("Obj", new or old)
        self._migration_queue.add(_key(migration))
        vmi = str((migration.get("spec") or {}).get("vmiName") or "")
        if vmi:  # a migration gone: its VMI's sync removes what it left
            self._queue.add((str(_meta(migration).get("namespace") or ""), vmi))

    def _on_vm(self, old: Obj | None, new: Obj | None) -> None:
        self._vm_queue.add(_key(cast("Obj", new or old)))

    def _queue_migrations_of(self, vmi_key: Key) -> None:
        for migration in self._migrations.in_namespace(vmi_key[0]):
            if (migration.get("spec") or {}).get("vmiName") == vmi_key[1]:
                self._migration_queue.add(_key(migration))

    def _resync(self) -> None:
        while not self._stopping.wait(RESYNC_SECONDS):
            for key in [*self._vmis.all_keys(), SWEEP]:
                self._queue.add(key)
            for key in self._migrations.all_keys():
                self._migration_queue.add(key)
            for key in self._vms.all_keys():
                self._vm_queue.add(key)

    # ---- workers -----------------------------------------------------------------------
    def _work(self, name: str = "vmis") -> None:
        """A worker of the queue ``name`` (VMI_QUEUE, MIGRATION_QUEUE or VM_QUEUE)."""
        queue, sync = self._queues[name]
        client = pykube.HTTPClient(self._config, timeout=self._timeout)
        for cache in self._caches:
            while not cache.synced.wait(0.1):
                if self._stopping.is_set():
                    return
        while not self._stopping.is_set():
            key = queue.get(timeout=0.5)
            if key is None:
                if queue.shutting_down:
                    return
                continue
            try:
                if self._stopping.is_set():
                    continue
                with self._lock:
                    self._started += 1
                    number = self._started
                sync(client, key)
            except Exception as exc:
                _log_failure(exc, f"syncing {name} key %s/%s failed", *key)
                queue.add_rate_limited(key)
            else:
                queue.forget(key)
                with self._lock:
                    done = (name, key)
                    self._finished[done] = max(self._finished.get(done, 0), number)
            finally:
                queue.done(key)

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
        # A migration deleted before it completed leaves its target pod: KubeVirt removes it.
        known = {str(_meta(m).get("uid")) for m in self._migrations.in_namespace(key[0])}
        current = find_launcher_pod(vmi, pods)
        for pod in pods:
            job = (_meta(pod).get("labels") or {}).get(MIGRATION_JOB_LABEL)
            if job and job not in known and pod is not current:
                self._tear_down(client, pod)
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
            known = [str(_meta(m).get("uid")) for m in self._migrations.in_namespace(key[0])]
            status = abandon_migration(status, known, time.time())
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

    # ---- migrations ---------------------------------------------------------------------
    def _busy(self, migration: Mapping[str, Any], vmi: Mapping[str, Any] | None) -> bool:
        """Whether another unfinished migration of the VMI goes first: an older one, or the
        one the VMI's ``migrationState`` names."""
        meta = _meta(migration)
        vmi_name = (migration.get("spec") or {}).get("vmiName")
        owner = _migration_state(vmi).get("migrationUid") if vmi is not None else None
        mine = (str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""))
        for other in self._migrations.in_namespace(str(meta.get("namespace") or "")):
            o = _meta(other)
            if (
                o.get("uid") == meta.get("uid")
                or (other.get("spec") or {}).get("vmiName") != vmi_name
            ):
                continue
            if (other.get("status") or {}).get("phase") in MIGRATION_FINAL:
                continue
            theirs = (str(o.get("creationTimestamp") or ""), str(o.get("name") or ""))
            if theirs < mine or o.get("uid") == owner:
                return True
        return False

    def _sync_migration(self, client: pykube.HTTPClient, key: Key) -> None:
        migration = self._migrations.get(key)
        if migration is None:
            return
        meta = _meta(migration)
        uid = str(meta["uid"])
        vmi_key = (key[0], str((migration.get("spec") or {}).get("vmiName") or ""))
        vmi = self._vmis.get(vmi_key)
        if vmi is None:  # the cache may lag behind a VMI just created: ask the API server
            found = VirtualMachineInstance.objects(client, namespace=key[0]).get_or_none(
                name=vmi_key[1]
            )
            vmi = cast("Obj", found.obj) if found is not None else None
        pods = [p for p in self._pods.in_namespace(key[0]) if vmi_key_of_pod(p) == vmi_key]
        with self._lock:
            since = self._expected_targets.get(uid)
        if since is not None and vmi is not None and target_pod(vmi, uid, pods) is None:
            left = EXPECTATION_SECONDS - (time.monotonic() - since)
            if left > 0:  # created, not shown by the pod cache yet
                self._migration_queue.add_after(key, left + 0.1)
                return
            with self._lock:
                self._expected_targets.pop(uid, None)
        step = migration_step(
            migration,
            vmi,
            pods,
            kubevirts=self._kubevirts.values(),
            busy=self._busy(migration, vmi),
            now=time.time(),
            unschedulable_timeout=self.unschedulable_timeout,
            pending_timeout=self.pending_timeout,
        )
        if step.vmi is not None and vmi is not None:
            updated = copy.deepcopy(vmi)
            updated["status"] = step.vmi["status"]
            updated["metadata"]["labels"] = step.vmi["labels"]
            if not self._write_status(client, updated):
                self._migration_queue.add_rate_limited(key)  # decide again on fresh caches
                return
        if step.create_target and vmi is not None:
            self._create_target(client, key, vmi, migration)
        if step.delete_migration:
            self._delete(client, VirtualMachineInstanceMigration, migration)
            return
        if step.status != (migration.get("status") or {}):
            updated = copy.deepcopy(migration)
            updated["status"] = step.status
            if not self._write_subresource(client, VirtualMachineInstanceMigration, updated):
                self._migration_queue.add_rate_limited(key)
                return
        for kind, reason, message in step.events:
            self._event(client, migration, MIGRATION_KIND, kind, reason, message)
        for name in step.delete_pods:
            pod = next((p for p in pods if _meta(p).get("name") == name), None)
            if pod is not None:
                self._tear_down(client, pod)
        if step.delete_pods or step.events:
            log.info(
                "migration %s/%s of VMI %s: %s",
                key[0],
                key[1],
                vmi_key[1],
                "; ".join(message for _kind, _reason, message in step.events) or "pods removed",
            )
        if step.recheck_after is not None:
            self._migration_queue.add_after(key, max(step.recheck_after, 0.0) + 0.1)

    def _create_target(self, client: pykube.HTTPClient, key: Key, vmi: Obj, migration: Obj) -> None:
        rendered = render_target_pod(vmi, migration, permitted_devices(self._kubevirts.values()))
        if isinstance(rendered, SyncError):
            log.info("migration %s/%s: no target pod: %s", key[0], key[1], rendered.message)
            return
        uid = str(_meta(migration)["uid"])
        with self._lock:
            self._expected_targets[uid] = time.monotonic()
        pod, error = self._create_pod(client, rendered)
        if pod is None:
            with self._lock:
                self._expected_targets.pop(uid, None)
            reason = error.message if error is not None else "no answer"
            self._event(client, migration, MIGRATION_KIND, "Warning", FAILED_CREATE, reason)
            self._migration_queue.add_rate_limited(key)
            return
        self._migration_queue.add_after(key, EXPECTATION_SECONDS + 0.1)

    # ---- VirtualMachines ----------------------------------------------------------------
    def _sync_vm(self, client: pykube.HTTPClient, key: Key) -> None:
        vm = self._vms.get(key)
        vmi = self._vmis.get(key)
        if vm is None:
            # The VM is gone: so is the VMI it controlled (as the garbage collector would).
            refs = _meta(vmi).get("ownerReferences") or [] if vmi is not None else []
            if vmi is not None and any(
                r.get("controller") and r.get("kind") == VM_KIND for r in refs
            ):
                self._delete(client, VirtualMachineInstance, vmi)
            return
        uid = str(_meta(vm)["uid"])
        with self._lock:
            since = self._expected_vmis.get(uid)
        launched = since is not None and time.monotonic() - since < EXPECTATION_SECONDS
        if since is not None and not launched:
            with self._lock:
                self._expected_vmis.pop(uid, None)
        step = vm_step(vm, vmi, launched=launched)
        if step.create is not None:
            with self._lock:
                self._expected_vmis[uid] = time.monotonic()
            try:
                VirtualMachineInstance(client, step.create).create()
            except pykube.exceptions.HTTPError as exc:
                with self._lock:
                    self._expected_vmis.pop(uid, None)
                log.info("VM %s/%s: creating its VMI: %s", key[0], key[1], exc)
                self._event(client, vm, VM_KIND, "Warning", FAILED_CREATE, str(exc))
                self._vm_queue.add_rate_limited(key)
                return
            log.info("VM %s/%s: started its VMI", key[0], key[1])
            self._vm_queue.add_after(key, EXPECTATION_SECONDS + 0.1)
        if step.delete_vmi and vmi is not None:
            self._delete(client, VirtualMachineInstance, vmi)
            log.info("VM %s/%s: stopped its VMI (%s)", key[0], key[1], run_strategy(vm))
        if step.status != (vm.get("status") or {}):
            updated = copy.deepcopy(vm)
            updated["status"] = step.status
            if not self._write_subresource(client, VirtualMachine, updated):
                self._vm_queue.add_rate_limited(key)

    # ---- writes -------------------------------------------------------------------------
    @staticmethod
    def _delete(client: pykube.HTTPClient, kind: type[Any], obj: Mapping[str, Any]) -> None:
        """Delete ``obj`` under its uid (a namesake made since is left alone); gone is done."""
        meta = _meta(obj)
        if meta.get("deletionTimestamp"):
            return
        target = kind(client, dict(obj))
        body = {"preconditions": {"uid": meta.get("uid")}, "propagationPolicy": "Background"}
        response = client.delete(**target.api_kwargs(data=json.dumps(body)))
        if response.status_code in (404, 409):
            return
        client.raise_for_status(response)

    @staticmethod
    def _write_subresource(client: pykube.HTTPClient, kind: type[Any], obj: Obj) -> bool:
        """Replace ``obj``'s status through its status subresource, under its
        resourceVersion; False on 409."""
        target = kind(client, obj)
        response = client.put(**target.api_kwargs(operation="status", data=json.dumps(obj)))
        if response.status_code == 409:
            return False
        client.raise_for_status(response)
        return True

    @staticmethod
    def _event(
        client: pykube.HTTPClient,
        obj: Mapping[str, Any],
        kind: str,
        type_: str,
        reason: str,
        message: str,
    ) -> None:
        """An Event about ``obj`` from virt-controller; one that cannot be written is
        logged, never retried (as client-go's recorder)."""
        meta = _meta(obj)
        now = _now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": KUBEVIRT_API_VERSION,
                "kind": kind,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": "virt-controller"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            pykube.Event(client, event).create()
        except pykube.exceptions.HTTPError as exc:
            log.info("event %s on %s %s/%s: %s", reason, kind, meta["namespace"], meta["name"], exc)

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
