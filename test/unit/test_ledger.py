"""The ledger's assumed claims: a local write-back is counted ahead of the watch and only
a newer version from the watch supersedes it; older snapshots never roll a hold back; a
refused write is forgotten and a write with an unknown outcome expires."""

from __future__ import annotations

from typing import Any

from gpuoperator.ledger import Ledger
from gpuoperator.runtime.clock import FakeClock
from gpuoperator.runtime.informing import Handlers
from harness import objects

Obj = dict[str, Any]
RESOURCE = "nvidia.com/GA102GL_A10"
KEY = ("t", "hold")


def claim(rv: int, phase: str | None = None, node_name: str = "n1", count: int = 3) -> Obj:
    """The claim t/hold at resourceVersion ``rv``; a Bound one on ``node_name``."""
    node = node_name if phase == "Bound" else None
    return objects.claim(namespace="t", rv=rv, count=count, phase=phase, node=node, status={})


def free(ledger: Ledger, name: str = "n1") -> int:
    view = ledger.node(name)
    assert view is not None
    [entry] = view.classes
    return entry["free"]


def world() -> tuple[Ledger, FakeClock]:
    clock = FakeClock()
    ledger = Ledger(clock=clock)
    ledger.apply_class(objects.gpuclass(resource=RESOURCE))
    ledger.apply_node(objects.node())
    ledger.apply_claim(claim(10))
    return ledger, clock


def test_an_assumed_bind_holds_its_units_before_the_write_lands() -> None:
    ledger, _ = world()
    ledger.assume(claim(10, "Bound"))  # rv 10 is the write's precondition
    assert free(ledger) == 1
    assert ledger.claim(KEY)["status"]["phase"] == "Bound"  # type: ignore[index]


def test_a_relist_older_than_a_confirmed_bind_does_not_roll_the_hold_back() -> None:
    ledger, _ = world()
    ledger.assume(claim(10, "Bound"))
    ledger.confirm(claim(12, "Bound"))
    ledger.apply_claim(claim(10))  # a snapshot from before the bind
    ledger.apply_claim(claim(11))  # another writer's event from before ours
    assert free(ledger) == 1
    assert ledger.claims_of_class("a10")[0]["status"]["phase"] == "Bound"


def test_the_watch_delivering_the_written_version_ends_the_assumption() -> None:
    ledger, _ = world()
    ledger.assume(claim(10, "Bound"))
    ledger.confirm(claim(12, "Bound"))
    ledger.apply_claim(claim(12, "Bound"))
    assert ledger.assumed_keys() == set()
    ledger.apply_claim(claim(13))  # released later: the watch is the truth again
    assert free(ledger) == 4


def test_a_newer_version_from_the_watch_supersedes_an_assumption_in_flight() -> None:
    ledger, _ = world()
    ledger.assume(claim(10, "Bound"))
    ledger.apply_claim(claim(10))  # the same version again: the assumption stands
    assert free(ledger) == 1
    ledger.apply_claim(claim(11, "Bound", node_name="n1", count=1))  # someone else won
    assert ledger.assumed_keys() == set()
    assert free(ledger) == 3


def test_a_confirm_after_the_watch_was_quicker_keeps_the_watchs_version() -> None:
    ledger, _ = world()
    ledger.assume(claim(10, "Bound"))
    ledger.apply_claim(claim(13))  # our write (12) and a release (13) already arrived
    ledger.confirm(claim(12, "Bound"))
    assert ledger.assumed_keys() == set()
    assert free(ledger) == 4


def test_a_refused_write_is_forgotten() -> None:
    ledger, _ = world()
    ledger.assume(claim(10, "Bound"))
    ledger.forget(KEY)
    assert free(ledger) == 4
    assert ledger.claim(KEY)["status"] == {}  # type: ignore[index]


def test_a_write_with_an_unknown_outcome_expires_when_the_watch_never_confirms_it() -> None:
    ledger, clock = world()
    ledger.assume(claim(10, "Bound"))
    ledger.expire_after(KEY, 90)
    clock.advance(89)
    ledger.expire()
    assert free(ledger) == 1
    clock.advance(1)
    assert ledger.claims_of_class("a10")[0]["status"] == {}
    assert free(ledger) == 4


def test_without_an_assumption_an_older_version_is_never_counted_over_a_newer_one() -> None:
    ledger, _ = world()
    ledger.apply_claim(claim(20, "Bound"))
    ledger.apply_claim(claim(15))
    assert free(ledger) == 1


def test_assumptions_tell_the_controllers_which_nodes_and_classes_changed() -> None:
    ledger, _ = world()
    notices: list[Obj] = []
    ledger.changes.add_handlers(Handlers(on_add=notices.append))
    ledger.assume(claim(10, "Bound"))
    ledger.forget(KEY)
    assert notices == [{"nodes": ["n1"], "classes": ["a10"]}] * 2


def test_a_deleted_claim_drops_its_assumption() -> None:
    ledger, _ = world()
    ledger.assume(claim(10, "Bound"))
    ledger.delete_claim(claim(10))
    assert ledger.assumed_keys() == set()
    assert ledger.claim(KEY) is None
    assert free(ledger) == 4


def test_a_fresh_list_at_leadership_counts_a_bind_the_watch_has_not_delivered() -> None:
    ledger, _ = world()
    ledger.catch_up([claim(12, "Bound")])
    assert free(ledger) == 1
    ledger.apply_claim(claim(11))  # the watch, still behind
    assert free(ledger) == 1


def test_a_write_confirmed_after_the_claims_deletion_holds_nothing() -> None:
    ledger, _ = world()
    ledger.assume(claim(10, "Bound"))
    ledger.delete_claim(claim(10))  # the delete event overtook the write's reply
    ledger.confirm(claim(12, "Bound"))
    assert ledger.assumed_keys() == set()
    assert free(ledger) == 4


def test_an_unconfirmed_unbind_frees_the_units_only_once_confirmed() -> None:
    ledger, _ = world()
    ledger.apply_claim(claim(11, "Bound"))
    ledger.assume(claim(11, "Pending"))  # a node refusal: back to Pending
    assert free(ledger) == 1, "the stored claim still holds its units"
    assert ledger.unconfirmed(KEY)
    ledger.confirm(claim(12, "Pending"))
    assert free(ledger) == 4
    assert not ledger.unconfirmed(KEY)


def test_an_unconfirmed_move_holds_units_on_both_nodes_until_forgotten() -> None:
    ledger, _ = world()
    ledger.apply_node(objects.node("n2"))
    ledger.apply_claim(claim(11, "Bound"))
    ledger.assume(claim(11, "Bound", node_name="n2"))
    assert (free(ledger, "n1"), free(ledger, "n2")) == (1, 1)
    ledger.forget(KEY)
    assert (free(ledger, "n1"), free(ledger, "n2")) == (1, 4)
    assert not ledger.unconfirmed(KEY)


def migrating(rv: int, node_name: str = "n1", target: str | None = "n2", count: int = 3) -> Obj:
    """t/hold Bound on ``node_name`` with a transient hold on ``target`` (None: none)."""
    obj = claim(rv, "Bound", node_name=node_name, count=count)
    if target is not None:
        obj["status"]["migration"] = {"uid": "uid-mig", "targetNode": target}
    return obj


def two_nodes() -> Ledger:
    ledger, _ = world()
    ledger.apply_node(objects.node("n2"))
    ledger.apply_claim(claim(11, "Bound"))
    return ledger


def test_a_transient_hold_counts_on_the_target_as_well_as_the_claims_node() -> None:
    ledger = two_nodes()
    ledger.assume(migrating(11))
    assert (free(ledger, "n1"), free(ledger, "n2")) == (1, 1)
    ledger.confirm(migrating(12))
    ledger.apply_claim(migrating(12))
    assert (free(ledger, "n1"), free(ledger, "n2")) == (1, 1)


def test_an_unconfirmed_end_of_a_transient_hold_frees_the_target_only_once_confirmed() -> None:
    ledger = two_nodes()
    ledger.apply_claim(migrating(12))
    ledger.assume(migrating(12, target=None))  # the migration failed: the hold goes
    assert free(ledger, "n2") == 1  # the stored version still holds it
    ledger.confirm(migrating(13, target=None))
    assert free(ledger, "n2") == 4


def test_an_unconfirmed_move_with_the_migration_holds_both_nodes_until_confirmed() -> None:
    ledger = two_nodes()
    ledger.apply_claim(migrating(12))
    ledger.assume(migrating(12, node_name="n2", target=None))  # migrated
    assert (free(ledger, "n1"), free(ledger, "n2")) == (1, 1)
    ledger.forget(KEY)  # the write did not land: the stored version is what counts
    assert (free(ledger, "n1"), free(ledger, "n2")) == (1, 1)
    ledger.assume(migrating(12, node_name="n2", target=None))
    ledger.confirm(migrating(13, node_name="n2", target=None))
    assert (free(ledger, "n1"), free(ledger, "n2")) == (4, 1)
