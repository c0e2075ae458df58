"""The migrations controller on the product's caches, a real ``Ledger`` and the API double
with resourceVersion and UID preconditions (docs/design.md §5 "Live migration"): a
migration of a vGPU VM gets one transient hold per claim on one node by the placement
policy, a migration with no target is deleted and each claim says why, a completed
migration moves the claims to the target in one write, a failed, aborted or deleted one (or
one whose target pod is gone) clears the holds and the claims stay, and a new leader
finishes what the last one left.

The oracle is what the double stores (claims, migrations), the Events recorded and the
e2e harness's own arithmetic of used units (``harness.ledger.used_units``), never the
ledger under test.
"""

from __future__ import annotations

import copy
from typing import Any

from prometheus_client import CollectorRegistry

from controllers import migrations as controller
from gpuoperator.claim_status import ClaimStatus
from gpuoperator.kinds import GPUClaim, VirtualMachineInstanceMigration
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.settings import Settings
from harness import ledger as oracle
from harness import objects
from harness.offline import OfflineCluster

Obj = dict[str, Any]
NS = objects.NS
RES = "nvidia.com/NVIDIA_A10-4Q"
VGPU = objects.gpuclass("v", mode="vgpu", resource=RES)
KEY = (NS, "vm1")
T0 = "2026-01-01T00:00:10Z"


def held(name: str, node: str = "n1", count: int = 1, created: str = T0, **status: Any) -> Obj:
    """A held claim of class v attached to vm1, Bound on ``node``."""
    return objects.claim(
        name,
        class_name="v",
        count=count,
        phase="Bound",
        node=node,
        attached={"vmi": "vm1", "uid": "uid-vm1"},
        created=created,
        status=status or None,
    )


def running_vmi(claim_names: list[str], node: str = "n1", **spec: Any) -> Obj:
    vmi = objects.vmi(refs=[{"claim": n} for n in claim_names], phase="Running", **spec)
    vmi["status"]["nodeName"] = node
    return vmi


def pod_of(name: str, node: str, units: int, job: str = "") -> Obj:
    """A running pod of vm1 on ``node`` (the target pod of migration ``job`` when given)."""
    pod = objects.launcher_pod(name, refs=[], units=units, resource=RES, gated=False)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    if job:
        pod["metadata"]["labels"]["kubevirt.io/migrationJobUID"] = job
    return pod


class World(OfflineCluster):
    def __init__(
        self,
        frees: dict[str, int],
        claims: list[Obj],
        *,
        vmi: Obj | None = None,
        cls: Obj = VGPU,
        policy: str = "binpack",
        api: Any = None,
    ) -> None:
        super().__init__(FakeClock())
        if api is not None:
            self.api = api  # a new leader on the cluster the last one wrote to
        self.registry = CollectorRegistry()
        statuses = ClaimStatus(self.api, self.ledger, self.recorder, registry=self.registry)
        self.controller = controller.Migrations(
            self.caches,
            self.ledger,
            statuses,
            self.api,
            Settings.model_validate({"placementPolicy": policy}),
            clock=self.clock,
            registry=self.registry,
        )
        self.deliver(self.caches.classes, cls)
        for name, units in frees.items():
            self.deliver(self.caches.nodes, objects.node(name, {RES: units}))
        for claim in claims:
            self.put_claim(claim)
        if vmi is not None:
            self.deliver(self.caches.vmis, vmi)

    def put_claim(self, claim: Obj) -> None:
        if api_has := self.api.stored(GPUClaim, claim["metadata"]["name"], NS):
            self.deliver(self.caches.claims, api_has)
        else:
            self.put(self.caches.claims, claim)

    def migrate(self, phase: str | None = "Pending", uid: str = "uid-mig1") -> Obj:
        obj = objects.vmim(uid=uid, phase=phase)
        if self.api.stored(VirtualMachineInstanceMigration, "mig1", NS) is not None:
            self.api.remove(VirtualMachineInstanceMigration, "mig1", NS)
        return self.put(self.caches.migrations, obj)

    def reconcile(self) -> object:
        result = self.controller.reconcile(KEY)
        for (kind, _, name), _obj in list(self.api.objects.items()):
            if kind == "GPUClaim":
                self.sync(self.caches.claims, name, NS)
        self.sync(self.caches.migrations, "mig1", NS)
        return result

    def stored(self, name: str) -> Obj:
        found = self.api.stored(GPUClaim, name, NS)
        assert found is not None
        return found

    def used(self, node: str) -> int:
        claims = [o for (k, _, _), o in self.api.objects.items() if k == "GPUClaim"]
        pods = list(self.caches.pods.store.values())
        return oracle.used_units(claims, {"v": VGPU}, pods).get((node, RES), 0)

    def condition(self, name: str, type_: str = "Migrating") -> tuple[str, str, str]:
        found = next(c for c in self.stored(name)["status"]["conditions"] if c["type"] == type_)
        return found["status"], found["reason"], found["message"]

    def outcomes(self, outcome: str) -> float:
        value = self.registry.get_sample_value(
            "gpuoperator_migrations_total", {"gpuclass": "v", "outcome": outcome}
        )
        return value or 0.0


def migrating_world(**kwargs: Any) -> World:
    """vm1 on n1 with one claim, n2 (2 free) and n3 (1 free), migration mig1 pending."""
    world = World({"n1": 1, "n2": 2, "n3": 1}, [held("c1")], vmi=running_vmi(["c1"]), **kwargs)
    world.deliver(world.caches.pods, pod_of("virt-launcher-vm1-src", "n1", 1))
    world.migrate()
    return world


# ---- holding ---------------------------------------------------------------------------------


def test_a_migration_gets_a_transient_hold_by_the_placement_policy() -> None:
    world = migrating_world()
    assert world.reconcile() is None
    claim = world.stored("c1")
    assert claim["status"]["migration"] == {"uid": "uid-mig1", "targetNode": "n3"}
    assert (claim["status"]["phase"], claim["status"]["nodeName"]) == ("Bound", "n1")
    assert world.condition("c1")[:2] == ("True", "Migrating")
    assert world.recorder.reasons("c1") == ["Migrating"]
    # The target pod is covered by the transient hold: n3's one unit is used once.
    world.deliver(world.caches.pods, pod_of("virt-launcher-vm1-tgt", "n3", 1, "uid-mig1"))
    assert world.used("n3") == 1


def test_spread_takes_the_node_with_the_most_free() -> None:
    world = migrating_world(policy="spread")
    world.reconcile()
    assert world.stored("c1")["status"]["migration"]["targetNode"] == "n2"


def test_a_written_transient_hold_counts_on_the_target_at_once() -> None:
    """A second VM's migration, decided right after, does not get the units the first one's
    transient hold took (the ledger counts the write before the watch delivers it)."""
    world = World(
        {"n1": 2, "n2": 1},
        [held("c1"), objects.claim("c9", class_name="v", phase="Bound", node="n1")],
        vmi=running_vmi(["c1"]),
    )
    world.migrate()
    world.controller.reconcile(KEY)  # no sync: the watch has not delivered the write
    counted = world.ledger.claim((NS, "c1"))
    assert counted is not None
    assert counted["status"]["migration"]["targetNode"] == "n2"
    figures = world.ledger.node("n2")
    assert figures is not None and figures.devices[0]["free"] == 0


def test_all_the_vms_claims_get_one_node() -> None:
    world = World(
        {"n1": 2, "n2": 1, "n3": 2},
        [held("c1"), held("c2")],
        vmi=running_vmi(["c1", "c2"]),
    )
    world.migrate()
    world.reconcile()
    targets = {world.stored(n)["status"]["migration"]["targetNode"] for n in ("c1", "c2")}
    assert targets == {"n3"}


def test_no_target_deletes_the_migration_and_each_claim_says_why() -> None:
    world = World({"n1": 1, "n2": 0}, [held("c1")], vmi=running_vmi(["c1"]))
    world.migrate()
    assert world.reconcile() is None
    assert world.api.stored(VirtualMachineInstanceMigration, "mig1", NS) is None
    deletes = [c for c in world.api.calls if c[0] == "delete"]
    assert deletes == [("delete", "VirtualMachineInstanceMigration", "mig1", {"uid": "uid-mig1"})]
    status, reason, message = world.condition("c1")
    assert (status, reason) == ("False", "NoTargetCapacity")
    assert "1 unit of nvidia.com/NVIDIA_A10-4Q" in message
    assert "class v" in message and "source n1" in message
    assert "migration" not in world.stored("c1")["status"]
    assert [e["type"] for e in world.recorder.events] == ["Warning"]
    assert world.outcomes("NoTargetCapacity") == 1
    # Looked at again before the deletion is watched: nothing is said twice.
    world.migrate()
    world.reconcile()
    assert world.recorder.reasons("c1") == ["NoTargetCapacity"]


def test_a_passthrough_vm_gets_no_transient_hold() -> None:
    passthrough = objects.gpuclass("v", mode="passthrough", resource=RES)
    world = World({"n1": 1, "n2": 2}, [held("c1")], vmi=running_vmi(["c1"]), cls=passthrough)
    world.migrate()
    assert world.reconcile() is None
    assert "migration" not in world.stored("c1")["status"]
    assert world.api.writes() == []


def test_a_vm_with_host_devices_gets_no_transient_hold() -> None:
    vmi = running_vmi(["c1"], devices={"hostDevices": [{"name": "nic", "deviceName": "x/nic"}]})
    world = World({"n1": 1, "n2": 2}, [held("c1")], vmi=vmi)
    world.migrate()
    world.reconcile()
    assert world.api.writes() == []


def test_an_older_waiting_claims_nomination_is_not_taken_by_a_migration() -> None:
    # "older" needs 2 and fits nowhere; n2 (1 free of 2) is where it fits soonest.
    older = objects.claim("older", class_name="v", count=2, phase="Pending", created=at(0))
    other = objects.claim("other", class_name="v", count=1, phase="Bound", node="n2")
    world = World({"n1": 1, "n2": 2, "n3": 1}, [held("c1"), older, other], vmi=running_vmi(["c1"]))
    world.migrate()
    world.controller.settings = Settings.model_validate({"placementPolicy": "spread"})
    world.reconcile()
    assert world.stored("c1")["status"]["migration"]["targetNode"] == "n3"


def at(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}Z"


# ---- ending ----------------------------------------------------------------------------------


def held_world(**kwargs: Any) -> World:
    world = migrating_world(**kwargs)
    world.reconcile()
    assert world.stored("c1")["status"]["migration"]["targetNode"] == "n3"
    world.recorder.events.clear()
    return world


def test_a_completed_migration_moves_the_claim_to_the_target_in_one_write() -> None:
    world = held_world()
    world.migrate("Succeeded")
    vmi = running_vmi(["c1"], node="n3")
    vmi["status"]["migrationState"] = objects.migration_state(target="n3", completed=True)
    world.deliver(world.caches.vmis, vmi)
    before = len(world.api.writes())
    world.reconcile()
    assert len(world.api.writes()) == before + 1
    status = world.stored("c1")["status"]
    assert (status["phase"], status["nodeName"]) == ("Bound", "n3")
    assert "migration" not in status
    assert world.condition("c1", "Bound")[:2] == ("True", "Migrated")
    [event] = world.recorder.events
    assert event["reason"] == "Migrated" and "n1" in event["message"] and "n3" in event["message"]
    assert world.outcomes("Migrated") == 1
    # The source's unit is free again; the target's is held once.
    assert world.used("n1") == 1  # the source pod, until KubeVirt removes it
    world.sync(world.caches.pods, "virt-launcher-vm1-src", NS)  # KubeVirt removed it
    assert world.used("n1") == 0
    world.reconcile()  # nothing more to do
    assert len(world.api.writes()) == before + 1


def clears(world: World, reason: str) -> None:
    world.reconcile()
    status = world.stored("c1")["status"]
    assert "migration" not in status
    assert (status["phase"], status["nodeName"]) == ("Bound", "n1")
    assert world.condition("c1")[:2] == ("False", reason)
    assert [(e["type"], e["reason"]) for e in world.recorder.events] == [("Warning", reason)]
    assert world.used("n3") == 0
    assert world.outcomes(reason) == 1


def test_a_failed_migration_clears_the_transient_hold_and_the_claim_stays() -> None:
    world = held_world()
    world.migrate("Failed")
    clears(world, "MigrationFailed")


def test_an_aborted_migration_clears_the_transient_hold() -> None:
    world = held_world()
    vmi = running_vmi(["c1"])
    vmi["status"]["migrationState"] = objects.migration_state(target="n3", aborted=True)
    world.deliver(world.caches.vmis, vmi)
    clears(world, "MigrationAborted")


def test_a_deleted_migration_clears_the_transient_hold() -> None:
    world = held_world()
    world.api.remove(VirtualMachineInstanceMigration, "mig1", NS)
    world.sync(world.caches.migrations, "mig1", NS)  # the watch says it is gone
    clears(world, "MigrationGone")


def test_a_target_pod_gone_before_completion_clears_the_transient_hold() -> None:
    world = held_world()
    world.migrate("Running")
    world.deliver(world.caches.pods, pod_of("virt-launcher-vm1-tgt", "n3", 1, "uid-mig1"))
    world.reconcile()
    assert world.stored("c1")["status"]["migration"]["targetNode"] == "n3"  # kept
    world.sync(world.caches.pods, "virt-launcher-vm1-tgt", NS)  # the pod is gone
    clears(world, "TargetPodGone")


# ---- a leader change -------------------------------------------------------------------------


def test_a_new_leader_finishes_a_migration_the_last_one_held() -> None:
    first = held_world()
    first.migrate("Succeeded")
    # The first leader stops; the next one starts from the API server's objects.
    second = World({"n1": 1, "n2": 2, "n3": 1}, [], vmi=None, api=first.api)
    second.put_claim(first.stored("c1"))
    vmi = running_vmi(["c1"], node="n3")
    vmi["status"]["migrationState"] = objects.migration_state(target="n3", completed=True)
    second.deliver(second.caches.vmis, vmi)
    stored_mig = first.api.stored(VirtualMachineInstanceMigration, "mig1", NS)
    assert stored_mig is not None
    second.deliver(second.caches.migrations, stored_mig)
    second.reconcile()
    assert second.stored("c1")["status"]["nodeName"] == "n3"
    assert "migration" not in second.stored("c1")["status"]


def test_a_new_leader_clears_a_transient_hold_whose_migration_went_meanwhile() -> None:
    first = held_world()
    first.api.remove(VirtualMachineInstanceMigration, "mig1", NS)
    second = World({"n1": 1, "n2": 2, "n3": 1}, [], vmi=running_vmi(["c1"]), api=first.api)
    second.put_claim(first.stored("c1"))
    second.reconcile()
    assert "migration" not in second.stored("c1")["status"]
    assert second.condition("c1")[:2] == ("False", "MigrationGone")


def test_a_new_leader_holds_the_rest_of_a_vms_claims_on_the_node_the_last_one_chose() -> None:
    # The last leader wrote c1's transient hold on n2 and stopped before c2's; binpack
    # would now choose n3 for a fresh migration, but the set stays together.
    first = World(
        {"n1": 2, "n2": 3, "n3": 2},
        [held("c1", migration={"uid": "uid-mig1", "targetNode": "n2"}), held("c2")],
        vmi=running_vmi(["c1", "c2"]),
    )
    first.migrate()
    second = World({"n1": 2, "n2": 3, "n3": 2}, [], vmi=running_vmi(["c1", "c2"]), api=first.api)
    for name in ("c1", "c2"):
        second.put_claim(copy.deepcopy(first.stored(name)))
    stored_mig = first.api.stored(VirtualMachineInstanceMigration, "mig1", NS)
    assert stored_mig is not None
    second.deliver(second.caches.migrations, stored_mig)
    second.reconcile()
    assert second.stored("c2")["status"]["migration"] == {"uid": "uid-mig1", "targetNode": "n2"}
    assert second.stored("c1")["status"]["migration"] == {"uid": "uid-mig1", "targetNode": "n2"}
