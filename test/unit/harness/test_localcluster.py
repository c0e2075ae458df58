"""The local control plane's own pieces that need no cluster: PKI, profiles, process
identity."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from localcluster import pki, profile
from localcluster.cluster import REPO, admission_configuration, free_ports, port_free
from localcluster.processes import ClusterError, Process, wait_until


def test_pki_chains_to_its_ca_with_the_names_the_apiserver_needs(tmp_path: Path) -> None:
    p = pki.ensure_pki(tmp_path / "pki")
    ca = x509.load_pem_x509_certificate(p.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(p.server_cert.read_bytes())
    admin = x509.load_pem_x509_certificate(p.admin_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    admin.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1", "::1"}
    orgs = admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [o.value for o in orgs] == ["system:masters"]
    usage = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage


def test_the_webhook_client_certificate_has_a_ca_of_its_own(tmp_path: Path) -> None:
    p = pki.ensure_webhook_client(pki.ensure_pki(tmp_path / "pki"))
    own = x509.load_pem_x509_certificate(p.webhook_client_ca.read_bytes())
    client = x509.load_pem_x509_certificate(p.webhook_client_cert.read_bytes())
    client.verify_directly_issued_by(own)
    cluster = x509.load_pem_x509_certificate(p.ca_cert.read_bytes())
    admin = x509.load_pem_x509_certificate(p.admin_cert.read_bytes())
    # A webhook server trusting this CA admits the API server, not the cluster's users.
    with pytest.raises(ValueError):
        admin.verify_directly_issued_by(own)
    assert own.subject != cluster.subject
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
    assert (p.webhook_client_key.stat().st_mode & 0o777) == 0o600


def test_the_admission_configuration_gives_both_webhook_plugins_the_kubeconfig() -> None:
    config = admission_configuration(Path("/x/webhook-client.kubeconfig"))
    assert config["kind"] == "AdmissionConfiguration"
    assert [p["name"] for p in config["plugins"]] == [
        "ValidatingAdmissionWebhook",
        "MutatingAdmissionWebhook",
    ]
    for plugin in config["plugins"]:
        assert plugin["configuration"]["kind"] == "WebhookAdmissionConfiguration"
        assert plugin["configuration"]["kubeConfigFile"] == "/x/webhook-client.kubeconfig"


def test_private_keys_are_readable_by_the_owner_only(tmp_path: Path) -> None:
    p = pki.ensure_pki(tmp_path / "pki")
    for key in (p.ca_key, p.server_key, p.admin_key, p.sa_key):
        assert key.stat().st_mode & 0o077 == 0, key


def test_pki_is_reused_once_written(tmp_path: Path) -> None:
    first = pki.ensure_pki(tmp_path / "pki").ca_cert.read_bytes()
    assert pki.ensure_pki(tmp_path / "pki").ca_cert.read_bytes() == first


def test_the_default_profile_has_passthrough_and_vgpu_nodes() -> None:
    nodes = profile.manifests(profile.load(REPO / "hack" / "profiles" / "default.yaml"))
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert set(by_name) == {"a10-0", "a10-1", "l40s-0", "l40s-1", "cpu-0"}
    assert by_name["a10-1"]["status"]["allocatable"]["nvidia.com/GA102GL_A10"] == "8"
    assert by_name["l40s-0"]["status"]["capacity"]["nvidia.com/L40S-24Q"] == "4"
    assert by_name["a10-0"]["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    assert by_name["cpu-0"]["spec"]["taints"] == []
    for node in nodes:
        assert (
            node["metadata"]["annotations"][profile.KWOK_ANNOTATION]
            == profile.KWOK_ANNOTATION_VALUE
        )


def test_the_dev_profile_adds_dra_nodes_whose_gpus_only_the_driver_publishes() -> None:
    dev = profile.load(REPO / "hack" / "profiles" / "dev.yaml")
    dra = profile.dra_nodes(dev)
    assert sorted(dra) == ["dra-a10-0", "dra-a10-1"]
    [group] = dra["dra-a10-0"]
    assert (group.model, group.count, group.pcie_roots) == ("A10", 4, 2)
    by_name = {n["metadata"]["name"]: n for n in profile.manifests(dev)}
    # Their kubelet announces no extended resource: DRA serves the GPUs.
    capacity = by_name["dra-a10-0"]["status"]["capacity"]
    assert set(capacity) == {"cpu", "memory", "pods"}
    # Every node of the default profile is there as it is.
    default = profile.manifests(profile.load(REPO / "hack" / "profiles" / "default.yaml"))
    assert all(by_name[n["metadata"]["name"]] == n for n in default)
    assert profile.dra_nodes(profile.load(REPO / "hack" / "profiles" / "default.yaml")) == {}


def test_a_bad_profile_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("nodes:\n  - name: x\n    count: 0\n")
    with pytest.raises(ValueError, match=r"(?s)p\.yaml.*count"):
        profile.load(bad)


def test_free_ports_are_distinct_and_free() -> None:
    ports = free_ports(6)
    assert len(set(ports)) == 6
    assert all(port_free(p) for p in ports)


def test_stop_signals_only_the_process_it_started(tmp_path: Path) -> None:
    proc = Process("sleeper", tmp_path)
    pid = proc.start([sys.executable, "-c", "import time; time.sleep(60)"])
    assert proc.pid() == pid
    # A pid file whose start time does not match (a reused pid) is not ours.
    good = proc.pidfile.read_text()
    proc.pidfile.write_text(f"{pid} 1\n")
    assert proc.pid() is None
    assert not proc.stop(), "must not signal a process it cannot prove it started"
    proc.pidfile.write_text(good)
    assert proc.stop()
    assert not proc.running()


def test_an_exiting_process_fails_the_wait_with_its_log(tmp_path: Path) -> None:
    proc = Process("crasher", tmp_path)
    proc.start([sys.executable, "-c", "print('bad flag --nope'); raise SystemExit(2)"])
    with pytest.raises(ClusterError, match=r"(?s)crasher exited.*bad flag --nope"):
        wait_until("never", lambda: False, timeout=30, process=proc)


def test_a_wait_that_times_out_says_what_it_waited_for(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="timed out after 0s waiting for the moon"):
        wait_until("the moon", lambda: False, timeout=0.2)


def test_build_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(REPO / "hack" / "build-binaries.sh")], check=True)
