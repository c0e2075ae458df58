"""Operator settings (docs/design.md §4): the ``gpu-operator-settings`` ConfigMap in the
operator's namespace, overridden by environment variables, overridden by flags.

Every value is validated by pydantic; a bad one is a single clear startup error that names
the setting, the value, where it came from and what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuoperator import names

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?$")

#: setting (ConfigMap key) → (environment variable, command-line flag) that override it.
OVERRIDES = {
    "licenseNamespace": ("GPUOP_LICENSE_NAMESPACE", "license-namespace"),
    "placementPolicy": ("GPUOP_PLACEMENT_POLICY", "placement-policy"),
    "refusalTTL": ("GPUOP_REFUSAL_TTL", "refusal-ttl"),
    "operatorServiceAccount": ("GPUOP_OPERATOR_SERVICE_ACCOUNT", "operator-service-account"),
    "gpuForVMs": ("GPUOP_GPU_FOR_VMS", "gpu-for-vms"),
    "drainMoves": ("GPUOP_DRAIN_MOVES", "drain-moves"),
    "statusInterval": ("GPUOP_STATUS_INTERVAL", "status-interval"),
    "kubevirtServiceAccount": ("GPUOP_KUBEVIRT_SERVICE_ACCOUNT", "kubevirt-service-account"),
    "exemptNamespaces": ("GPUOP_EXEMPT_NAMESPACES", "exempt-namespaces"),
    "webhookClientCA": ("GPUOP_WEBHOOK_CLIENT_CA", "webhook-client-ca"),
    "gpuHoursSeries": ("GPUOP_GPU_HOURS_SERIES", "gpu-hours-series"),
    "preemptionGrace": ("GPUOP_PREEMPTION_GRACE", "preemption-grace"),
}


def parse_duration(value: object) -> float:
    """Seconds from a Go-style duration (``10m``, ``1h30m``, ``45s``) or a number of
    seconds (``45``, as a ConfigMap value is always a string)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif re.fullmatch(r"\d+(\.\d+)?", str(value).strip()):
        seconds = float(str(value).strip())
    else:
        text = str(value).strip()
        m = _DURATION.match(text)
        if not text or m is None or not any(m.groups()):
            raise ValueError(f"{value!r} is not a duration such as 10m, 90s or 1h30m")
        h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        seconds = h * 3600 + mi * 60 + s
    if seconds <= 0:
        raise ValueError(f"{value!r} must be a positive duration")
    return seconds


class Settings(BaseModel):
    """What the operator's behaviour depends on (the settings ConfigMap's keys)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    license_namespace: str = Field(
        names.DEFAULT_LICENSE_NAMESPACE,
        alias="licenseNamespace",
        description="namespace of the vGPU license source Secrets (never the operator's own)",
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    )
    placement_policy: Literal["binpack", "spread"] = Field("binpack", alias="placementPolicy")
    refusal_ttl: float = Field(
        600.0, alias="refusalTTL", description="seconds a node that refused a pinned pod is skipped"
    )
    operator_service_account: str = Field(
        "",
        alias="operatorServiceAccount",
        description="the operator's service account (system:serviceaccount:<ns>:<name>)",
    )
    gpu_for_vms: bool = Field(True, alias="gpuForVMs")
    drain_moves: bool = Field(
        True,
        alias="drainMoves",
        description="move the idle holds of a cordoned node to other eligible nodes",
    )
    status_interval: float = Field(
        1.0,
        alias="statusInterval",
        description="the least seconds between two status writes of one GPUNode or GPUClass "
        "(their figures change with every binding; 0 writes every change)",
    )

    kubevirt_service_account: str = Field(
        "system:serviceaccount:kubevirt:kubevirt-controller",
        alias="kubevirtServiceAccount",
        description="KubeVirt's controller (virt-controller) username: the only one that may "
        "create pods requesting a class's resource, for a VMI that controls them",
        pattern=r"^system:serviceaccount:[a-z0-9]([-a-z0-9]*[a-z0-9])?:[a-z0-9]([-.a-z0-9]*[a-z0-9])?$",
    )
    exempt_namespaces: tuple[str, ...] = Field(
        (),
        alias="exemptNamespaces",
        description="namespaces the admission policies on GPU resources leave alone (the "
        "hoster's own), comma-separated",
    )
    webhook_client_ca: str = Field(
        "",
        alias="webhookClientCA",
        description="a PEM file of the CA that signs the API server's client certificate: with "
        "it, the webhook server requires and verifies that certificate (empty: no client "
        "certificate is asked for)",
        max_length=4096,
    )
    gpu_hours_series: Literal["claim", "namespace"] = Field(
        "claim",
        alias="gpuHoursSeries",
        description="the GPU-hours metrics' series: one per claim (namespace, claim, class) or "
        "one per namespace and class",
    )

    @field_validator("exempt_namespaces", mode="before")
    @classmethod
    def _namespace_list(cls, value: object) -> tuple[str, ...]:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ValueError(f"{value!r} is not a comma-separated list of namespaces")
        out = tuple(sorted({str(item).strip() for item in items if str(item).strip()}))
        for item in out:
            if not _DNS_LABEL.fullmatch(item):
                raise ValueError(f"{item!r} is not a namespace name (a DNS label)")
        return out

    preemption_grace: float = Field(
        120.0,
        alias="preemptionGrace",
        description="seconds a running VM on a preemptible hold is told before it is stopped "
        "for a guaranteed order",
    )

    @field_validator("refusal_ttl", "preemption_grace", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return parse_duration(value)

    @field_validator("status_interval", mode="before")
    @classmethod
    def _interval(cls, value: object) -> float:
        if str(value).strip() in ("0", "0s", "0.0"):
            return 0.0
        return parse_duration(value)


class SettingsError(ValueError):
    """One line: which setting, which value, from where, and what is allowed."""


def load(
    configmap: Mapping[str, str] | None,
    env: Mapping[str, str],
    flags: Mapping[str, Any],
    *,
    configmap_ref: str = f"ConfigMap {names.SETTINGS_CONFIGMAP}",
) -> Settings:
    """Merge the sources (flags > environment > ConfigMap > defaults) and validate."""
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    for key, value in (configmap or {}).items():
        merged[key], source[key] = value, configmap_ref
    for key, (var, _) in OVERRIDES.items():
        if var in env:
            merged[key], source[key] = env[var], f"environment variable {var}"
    for key, value in flags.items():
        if value is not None:
            merged[key], source[key] = value, f"flag --{OVERRIDES[key][1]}"
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else "?"
            where = source.get(key, "default")
            if err["type"] == "extra_forbidden":
                allowed = ", ".join(OVERRIDES)
                problems.append(f"unknown setting {key!r} in {where} (known: {allowed})")
            else:
                msg = err["msg"].removeprefix("Value error, ")
                problems.append(f"{key}={err.get('input')!r} from {where}: {msg}")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
