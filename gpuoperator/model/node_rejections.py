"""Node rejections: a node rejecting a launcher pod the placement controller pinned to it
(kube-scheduler reports the pinned pod ``Unschedulable``), as opposed to an order the budget
or the catalog refuses.

A rejection is taken (the pod deleted, the node recorded on the set's claims) unless it may
be transient. It waits, within a settle time the caller counts, while one of three things
may still pass, checked in this order:

* **the node's lifecycle taints lag behind its state** (``NodeTaintsLag``): a node that just
  became Ready (or was uncordoned) keeps ``node.kubernetes.io/not-ready`` (or
  ``unschedulable``) until the node lifecycle controller removes it; eligibility skips those
  taints (Ready and cordon decide them), so a set may be pinned there meanwhile and be
  rejected for the taint alone (``eligibility.lagging_taints``);
* **kube-scheduler's view of the node lags** (``SchedulerViewLags``): node affinity is the
  scheduler's only reason for rejecting every node although the pinned node, as the API
  shows it, satisfies the pod's node selection (``node_selection.scheduler_view_lags``): the
  scheduler does not know the node yet (its node informer is catching up, after an API
  server restart for instance) or still sees its old labels. A rejection for the pod's own
  node selection is taken at once;
* **the node is still releasing GPUs** (``NodeReleasing``): pods being deleted on the pinned
  node still request one of the claims' resources (a restarted VM's old launcher pod, for
  instance); kube-scheduler tries the pinned pod again as soon as they are gone.

The strings ``NodeTaintsLag``, ``SchedulerViewLags`` and ``NodeReleasing`` are log reasons.

Every function is pure: no I/O, plain dicts in, nothing mutated.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable
from typing import Any

from gpuoperator.model import conditions, eligibility, node_selection, objects, pods

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A node's rejection of a pinned pod, taken (the pod is deleted) and still to be
    recorded on the set's claims: each skips ``node`` until ``until``."""

    pod: Obj
    node: str
    #: what kube-scheduler said (``Unschedulable`` when it said nothing)
    detail: str
    now: datetime.datetime
    until: datetime.datetime
    vmi_name: str
    vmi_uid: str
    claim_names: tuple[str, ...]
    #: the UID of the migration whose target pod was refused (``""``: a launcher or temporary
    #: pod). A refused target never unbinds a claim: the VM still runs on its source.
    migration: str = ""


@dataclasses.dataclass(frozen=True)
class Deferral:
    """Why a rejection waits: a log ``message``, its ``reason`` and the log fields that say
    what it waits for."""

    message: str
    reason: str
    fields: dict[str, Any]


def taints_lag(node: Obj | None) -> Deferral | None:
    """The rejection waits because ``node`` (``None``: not known) still carries lifecycle
    taints its state no longer calls for."""
    lagging = eligibility.lagging_taints(node) if node is not None else []
    if not lagging:
        return None
    return Deferral(
        "refusal deferred: the node still carries taints its state no longer calls for",
        "NodeTaintsLag",
        {"taints": lagging},
    )


def scheduler_view_lags(pod: Obj, node: Obj | None, said: str) -> Deferral | None:
    """The rejection waits because kube-scheduler, which ``said`` so of ``pod``, rejected
    every node for node affinity alone while ``node`` (``None``: not known) satisfies it."""
    if node is None or not node_selection.scheduler_view_lags(pod, node, said):
        return None
    return Deferral(
        "refusal deferred: kube-scheduler rejected every node for node affinity alone, "
        "which the node satisfies; its view of the node lags behind",
        "SchedulerViewLags",
        {"scheduler": said},
    )


def releasing(resources: set[str], node_pods: Iterable[Obj]) -> Deferral | None:
    """The rejection waits because pods of ``node_pods`` (the pods on the node) are being
    deleted, have not terminated, and still request one of ``resources`` (the claims')."""
    leaving = sorted(
        "{}/{}".format(*objects.key(p))
        for p in node_pods
        if objects.meta(p).get("deletionTimestamp")
        and not pods.is_terminated(p)
        and resources & set(pods.requests(p))
    )
    if not leaving:
        return None
    return Deferral(
        "refusal deferred: pods being deleted still hold GPUs there",
        "NodeReleasing",
        {"pods": leaving},
    )


def deferral(
    pod: Obj,
    said: str,
    node: Obj | None,
    resources: set[str],
    node_pods: Iterable[Obj],
) -> Deferral | None:
    """Why the rejection of ``pod`` (kube-scheduler ``said`` why) by ``node`` may still pass,
    the first of :func:`taints_lag`, :func:`scheduler_view_lags` and :func:`releasing` that
    applies; ``None``: it is the node's last word."""
    return (
        taints_lag(node) or scheduler_view_lags(pod, node, said) or releasing(resources, node_pods)
    )


def said(pod: Obj) -> str:
    """kube-scheduler's message on the pod's ``PodScheduled`` condition (``""``: none)."""
    status = pod.get("status")
    found = status.get("conditions") if isinstance(status, dict) else None
    scheduled = conditions.find(found, "PodScheduled") or {}
    return str(scheduled.get("message") or "")
