"""The manager Deployment, its disruption budget, its settings and the image it runs, as
rendered: args `gpuoperator run` accepts, probes, the downward API, the restricted security
context and writable paths the Dockerfile's user fits."""

from __future__ import annotations

import argparse
import copy
import re
import tomllib
from typing import Any

import pytest
from unit.config.manifests import (
    DEPLOYMENT,
    NAMESPACE,
    PDB,
    REPO,
    SERVICE_ACCOUNT,
    VARIANTS,
    Obj,
    find,
    manager_container,
    render,
)

from gpuoperator import cli, names, settings


def _run_args(container: Obj) -> argparse.Namespace:
    """Parse the container's command line with the real `gpuoperator` parser; argparse exits
    (SystemExit) on any flag `gpuoperator run` does not accept."""
    assert container["command"] == ["gpuoperator", "run"]
    try:
        return cli.parser().parse_args(["run", *container["args"]])
    except SystemExit:
        pytest.fail(f"gpuoperator run refuses the args {container['args']}")


def _pod_spec(variant: str) -> Obj:
    spec: Obj = find(render(variant), "Deployment", DEPLOYMENT)["spec"]["template"]["spec"]
    return spec


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_arg_is_a_flag_gpuoperator_run_accepts(variant: str) -> None:
    args = _run_args(manager_container(render(variant)))
    assert args.leader_elect is True
    assert args.log_format == "json"


def test_the_arg_check_catches_a_flag_run_does_not_accept() -> None:
    bad = {"command": ["gpuoperator", "run"], "args": ["--leader-elect=true", "--no-such-flag"]}
    with pytest.raises(pytest.fail.Exception):
        _run_args(bad)


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", ["default", "overlays/dev", "overlays/kind"])
def test_default_manages_its_own_certificates(variant: str) -> None:
    args = _run_args(manager_container(render(variant)))
    assert args.certificates == "self-managed"
    assert args.cert_secret == names.WEBHOOK_CERT_SECRET
    assert args.webhook_service == names.WEBHOOK_SERVICE
    assert args.webhook_configurations == [
        names.VALIDATING_WEBHOOK_CONFIGURATION,
        names.MUTATING_WEBHOOK_CONFIGURATION,
    ]
    # The Secret it fills ships empty: no create verb needed.
    secret = find(render(variant), "Secret", names.WEBHOOK_CERT_SECRET)
    assert not secret.get("data") and not secret.get("stringData")


@pytest.mark.needs_tools
def test_dev_certificate_also_names_the_loopback_address_the_api_server_dials() -> None:
    args = _run_args(manager_container(render("overlays/dev")))
    assert args.cert_extra_sans == ["127.0.0.1"]


@pytest.mark.needs_tools
def test_cert_manager_mode_reads_the_mounted_secret() -> None:
    objs = render("overlays/production")
    container = manager_container(objs)
    args = _run_args(container)
    assert args.certificates == "mounted"
    assert str(args.webhook_cert_dir) == names.WEBHOOK_CERT_DIR
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod_spec("overlays/production")["volumes"]}
    (cert_volume,) = [
        n
        for n, v in volumes.items()
        if v.get("secret", {}).get("secretName") == names.WEBHOOK_CERT_SECRET
    ]
    assert mounts[cert_volume]["mountPath"] == names.WEBHOOK_CERT_DIR
    assert mounts[cert_volume]["readOnly"] is True
    certificate = find(objs, "Certificate", "gpu-operator-webhook")
    assert certificate["spec"]["secretName"] == names.WEBHOOK_CERT_SECRET


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_ports_the_args_name_are_the_container_ports_the_services_target(variant: str) -> None:
    objs = render(variant)
    container = manager_container(objs)
    args = _run_args(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.webhook_address == f":{ports['webhook']}" == ":9443"
    assert args.metrics_address == f":{ports['metrics']}" == ":8443"
    assert args.health_address == f":{ports['health']}"
    webhook = find(objs, "Service", names.WEBHOOK_SERVICE)["spec"]["ports"]
    assert webhook == [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    metrics = find(objs, "Service", "gpu-operator-metrics")["spec"]["ports"]
    assert metrics == [
        {"name": "metrics", "port": 8443, "targetPort": "metrics", "protocol": "TCP"}
    ]


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_services_and_pdb_select_the_deployment_pods(variant: str) -> None:
    objs = render(variant)
    labels = find(objs, "Deployment", DEPLOYMENT)["spec"]["template"]["metadata"]["labels"]
    selectors = [
        find(objs, "Service", names.WEBHOOK_SERVICE)["spec"]["selector"],
        find(objs, "Service", "gpu-operator-metrics")["spec"]["selector"],
        find(objs, "PodDisruptionBudget", PDB)["spec"]["selector"]["matchLabels"],
    ]
    for selector in selectors:
        assert selector.items() <= labels.items()


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_probes_health_and_readiness_on_the_health_port(variant: str) -> None:
    container = manager_container(render(variant))
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_pod_namespace_comes_from_the_downward_api(variant: str) -> None:
    env = {e["name"]: e for e in manager_container(render(variant))["env"]}
    assert env["POD_NAMESPACE"] == {
        "name": "POD_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    }


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", ["default", "overlays/kind", "overlays/production"])
def test_two_replicas_spread_over_nodes_and_one_kept_through_disruptions(variant: str) -> None:
    objs = render(variant)
    deployment = find(objs, "Deployment", DEPLOYMENT)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == SERVICE_ACCOUNT
    (spread,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["maxSkew"] == 1
    assert spread["labelSelector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    want = "DoNotSchedule" if variant == "overlays/production" else "ScheduleAnyway"
    assert spread["whenUnsatisfiable"] == want
    assert find(objs, "PodDisruptionBudget", PDB)["spec"]["minAvailable"] == 1


@pytest.mark.needs_tools
def test_dev_keeps_the_deployment_for_its_args_but_runs_no_pod() -> None:
    assert find(render("overlays/dev"), "Deployment", DEPLOYMENT)["spec"]["replicas"] == 0


#: Pod Security "restricted" (docs/design.md §9, the production overlay), as (path, value).
POD_SECURITY = {("runAsNonRoot",): True, ("seccompProfile", "type"): "RuntimeDefault"}
CONTAINER_SECURITY = {
    ("runAsNonRoot",): True,
    ("allowPrivilegeEscalation",): False,
    ("readOnlyRootFilesystem",): True,
    ("capabilities", "drop"): ["ALL"],
    ("seccompProfile", "type"): "RuntimeDefault",
}


def _missing(context: Obj, required: dict[tuple[str, ...], Any]) -> list[str]:
    problems = []
    for path, want in required.items():
        value: Any = context
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value != want:
            problems.append(f"{'.'.join(path)} is {value!r}, must be {want!r}")
    return problems


def _security_problems(pod: Obj) -> list[str]:
    problems = _missing(pod.get("securityContext") or {}, POD_SECURITY)
    for c in pod["containers"] + pod.get("initContainers", []):
        found = _missing(c.get("securityContext") or {}, CONTAINER_SECURITY)
        problems += [f"container {c['name']}: {p}" for p in found]
        added = (c.get("securityContext") or {}).get("capabilities", {}).get("add")
        if added:
            problems.append(f"container {c['name']} adds capabilities {added}")
        for key in ("runAsUser", "runAsGroup"):
            if (c.get("securityContext") or {}).get(key) == 0:
                problems.append(f"container {c['name']}: {key} 0")
    for volume in pod.get("volumes", []):
        if "hostPath" in volume:
            problems.append(f"volume {volume['name']} is a hostPath")
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
        problems.append("host namespaces")
    return problems


@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_pod_is_restricted(variant: str) -> None:
    assert _security_problems(_pod_spec(variant)) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("containers", 0, "securityContext", "readOnlyRootFilesystem"), None),
        (("containers", 0, "securityContext", "allowPrivilegeEscalation"), None),
        (("containers", 0, "securityContext", "capabilities"), None),
        (("securityContext", "seccompProfile"), None),
        (("securityContext", "runAsNonRoot"), False),
    ],
)
@pytest.mark.needs_tools
def test_the_security_check_fails_on_a_missing_or_wrong_field(
    path: tuple[Any, ...], value: Any
) -> None:
    pod = copy.deepcopy(_pod_spec("default"))
    parent: Any = pod
    for part in path[:-1]:
        parent = parent[part]
    if value is None:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    assert _security_problems(pod) != []


# ---- the image the Deployment runs -------------------------------------------------------
DOCKERFILE = (REPO / "Dockerfile").read_text()


def _final_stage() -> list[str]:
    """The final stage's instructions, one a line (continuation lines joined)."""
    stages = re.split(r"(?m)^FROM ", DOCKERFILE.replace("\\\n", " "))
    return [line.strip() for line in stages[-1].splitlines() if line.strip()]


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    """runAsNonRoot without runAsUser: the kubelet then needs a numeric USER in the image to
    prove it is not root ("non-numeric user" is refused)."""
    users = [line.split(None, 1)[1] for line in _final_stage() if line.startswith("USER ")]
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]} must be a numeric non-root uid"
    assert not gid or (gid.isdigit() and int(gid) != 0)


@pytest.mark.needs_tools
def test_the_image_writes_only_to_the_emptydir() -> None:
    """Read-only root filesystem: no bytecode caches, temporary files in the emptyDir."""
    env = dict(
        re.findall(
            r"(\w+)=(\S+)", " ".join(line for line in _final_stage() if line.startswith("ENV "))
        )
    )
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    pod = _pod_spec("default")
    (container,) = pod["containers"]
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    assert writable == {env["TMPDIR"]}
    assert {
        m["name"] for m in container["volumeMounts"] if m["mountPath"] in writable
    } <= empty_dirs
    assert env.get("HOME", "").startswith(env["TMPDIR"])


@pytest.mark.needs_tools
def test_the_image_entrypoint_is_the_deployment_command() -> None:
    stage = _final_stage()
    entrypoint = [line for line in stage if line.startswith("ENTRYPOINT ")]
    assert entrypoint == ['ENTRYPOINT ["gpuoperator"]']
    assert manager_container(render("default"))["command"][0] == "gpuoperator"


# ---- settings ------------------------------------------------------------------------------
@pytest.mark.needs_tools
@pytest.mark.parametrize("variant", VARIANTS)
def test_settings_write_out_every_setting_with_its_default(variant: str) -> None:
    data = find(render(variant), "ConfigMap", names.SETTINGS_CONFIGMAP)["data"]
    assert set(data) == {f.alias for f in settings.Settings.model_fields.values()}
    loaded = settings.load(data, {}, {})
    defaults = settings.Settings.model_validate({})
    operator = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
    expected = defaults.model_copy(update={"operator_service_account": operator})
    if variant == "overlays/dev":
        # The test cluster's hoster namespace, exempt from the policies that enforce holds.
        expected = expected.model_copy(update={"exempt_namespaces": ("gpu-hoster",)})
    assert loaded == expected


@pytest.mark.needs_tools
def test_the_deployment_runs_the_image_of_this_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert manager_container(render("default"))["image"] == f"gpuoperator:{version}"
    assert manager_container(render("overlays/kind"))["image"] == "gpuoperator:e2e"
    assert manager_container(render("overlays/kind"))["imagePullPolicy"] == "Never"


def test_the_build_stage_copies_everything_the_wheel_is_built_from() -> None:
    """Statically (make image-test builds and runs it): the build context holds what
    pyproject.toml packages (its packages, its readme) and .dockerignore keeps none of it
    out."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    build = re.split(r"(?m)^FROM ", DOCKERFILE)[1]
    copied = {
        src.rstrip("/")
        for line in build.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for src in line.split()[1:-1]
    }
    assert packages | {"pyproject.toml", project["project"]["readme"]} <= copied
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert not copied & ignored
    assert re.search(r"(?m)^RUN \S*pip wheel ", build)
