"""The deployed operator scaled around the e2e modules (``harness.scaled``, for kind): the
kubectl calls it makes, in order, against a fake cluster that keeps a Deployment's
replicas, its pods (which take a while to go, as terminating pods do) and the webhook
configurations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.scaled import ScaledDeployment
from localcluster import deployment

NS = "gpu-operator-system"
KUBECONFIG = Path("kind.kubeconfig")


def rendered() -> deployment.Rendered:
    labels = {"app.kubernetes.io/name": "gpu-operator", "app.kubernetes.io/component": "manager"}
    objects: list[dict[str, Any]] = [
        {
            "kind": "Deployment",
            "metadata": {"name": "gpu-operator", "namespace": NS},
            "spec": {"replicas": 2, "selector": {"matchLabels": labels}},
        },
        {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "gpu-operator-v"}},
        {"kind": "MutatingWebhookConfiguration", "metadata": {"name": "gpu-operator-m"}},
    ]
    return deployment.Rendered(tuple(objects))


class FakeCluster:
    """What kubectl would change; every call is logged as one line."""

    def __init__(self, replicas: int = 2) -> None:
        self.replicas = replicas
        self.pods = [f"pod/gpu-operator-{i}" for i in range(replicas)]
        self.webhooks = {"gpu-operator-v", "gpu-operator-m"}
        self.calls: list[str] = []
        #: How many more ``get pods`` still show the pods after a scale to 0.
        self.terminating = 0

    def __call__(self, kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
        assert kubeconfig == KUBECONFIG
        words = [a for a in args if a not in ("-n", NS)]
        self.calls.append(" ".join(words))
        match words:
            case ["get", "deployment", "gpu-operator", "-o", "json"]:
                return f'{{"spec": {{"replicas": {self.replicas}}}}}'
            case ["apply", "--server-side", "--force-conflicts", "-f", "-"]:
                assert stdin is not None
                self.webhooks |= {d["metadata"]["name"] for d in yaml.safe_load_all(stdin)}
                return ""
            case ["delete", _kind, name, "--ignore-not-found"]:
                self.webhooks.discard(name)
                return ""
            case ["scale", "deployment/gpu-operator", flag]:
                self.replicas = int(flag.removeprefix("--replicas="))
                if self.replicas == 0:
                    self.terminating = 2
                return ""
            case ["rollout", "status", "deployment/gpu-operator", _timeout]:
                assert self.replicas > 0, "rollout status of a Deployment at 0 replicas"
                self.pods = [f"pod/gpu-operator-new-{i}" for i in range(self.replicas)]
                return ""
            case ["get", "pods", "-l", selector, "-o", "name"]:
                want = "app.kubernetes.io/component=manager,app.kubernetes.io/name=gpu-operator"
                assert selector == want
                if self.replicas == 0:
                    if self.terminating:
                        self.terminating -= 1
                    else:
                        self.pods = []
                return "\n".join(self.pods)
        raise AssertionError(f"unexpected kubectl call: {words}")


def scaled(fake: FakeCluster) -> ScaledDeployment:
    return ScaledDeployment(KUBECONFIG, rendered(), fake, timeout=10)


def test_adopting_takes_the_operator_out_webhooks_first_and_waits_for_its_pods() -> None:
    fake = FakeCluster()
    s = scaled(fake)
    s.adopt()
    assert s.replicas == 2
    assert fake.replicas == 0
    assert fake.pods == []
    assert fake.webhooks == set()
    scale_at = fake.calls.index("scale deployment/gpu-operator --replicas=0")
    deletes = [i for i, c in enumerate(fake.calls) if c.startswith("delete ")]
    assert len(deletes) == 2
    assert max(deletes) < scale_at, fake.calls
    # The pods went only after being asked for three times (two still terminating).
    assert fake.calls[scale_at + 1 :].count(f"get pods -l {s.selector} -o name") == 3


def test_a_block_scales_it_back_and_waits_for_the_rollout_nested_blocks_share_it() -> None:
    fake = FakeCluster()
    s = scaled(fake)
    s.adopt()
    fake.calls.clear()
    with s.serving():
        assert fake.replicas == 2
        assert fake.webhooks == {"gpu-operator-v", "gpu-operator-m"}
        assert fake.calls == [
            "apply --server-side --force-conflicts -f -",
            "scale deployment/gpu-operator --replicas=2",
            "rollout status deployment/gpu-operator --timeout=10s",
        ]
        with s.serving():
            pass
        assert fake.replicas == 2, "the inner block's end took the operator out"
        assert len(fake.calls) == 3
    assert fake.replicas == 0
    assert fake.pods == []
    assert fake.webhooks == set()
    assert [c.replicas for c in s.changes] == [0, 2, 0]


def test_a_block_that_fails_still_takes_the_operator_out() -> None:
    fake = FakeCluster()
    s = scaled(fake)
    s.adopt()
    with pytest.raises(RuntimeError), s.serving():
        raise RuntimeError("the test failed")
    assert fake.replicas == 0
    assert s.users == 0


def test_the_session_leaves_the_deployment_as_it_found_it() -> None:
    fake = FakeCluster(replicas=3)
    s = scaled(fake)
    s.adopt()
    s.restore()
    assert fake.replicas == 3
    assert fake.webhooks == {"gpu-operator-v", "gpu-operator-m"}
    assert fake.calls[-1] == "rollout status deployment/gpu-operator --timeout=10s"


def test_a_deployment_at_zero_replicas_cannot_be_adopted() -> None:
    fake = FakeCluster(replicas=0)
    with pytest.raises(AssertionError, match=r"spec\.replicas 0"):
        scaled(fake).adopt()


def test_a_rendering_without_webhooks_applies_none() -> None:
    fake = FakeCluster()
    only_deployment = deployment.Rendered(rendered().objects[:1])
    s = ScaledDeployment(KUBECONFIG, only_deployment, fake, timeout=10)
    s.adopt()
    with s.serving():
        assert fake.replicas == 2
    assert not [c for c in fake.calls if c.startswith(("apply", "delete"))], fake.calls
