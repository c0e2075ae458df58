"""The devices of a DRA class, per node, from what the DRA API holds (docs/design.md §5
"DRA classes").

A DRA class (``spec.source.dra``) names a DeviceClass. Its units are the devices that the
drivers publish in ResourceSlices (``resource.k8s.io/v1``) and that every CEL selector of the
DeviceClass accepts; a unit is free when no allocated ResourceClaim holds it and no
``NoSchedule`` or ``NoExecute`` taint is on it (the slice's own or a DeviceTaintRule's). This
module computes that, purely, from the kinds of objects as the API server returns them:

* **ResourceSlices.** Devices are grouped by pool (``spec.driver`` + ``spec.pool.name``).
  As kube-scheduler's allocator does, only a pool's newest ``generation`` counts, and only
  when all ``resourceSliceCount`` slices of it are present: a pool being republished is left
  out (with a reason) rather than half counted. Only node-local slices (``spec.nodeName``)
  are placed on a node; slices with ``nodeSelector``, ``allNodes`` or per-device node
  selection serve several nodes, which a per-node count would count twice, so they are left
  out with a reason.
* **The DeviceClass.** Its ``spec.selectors[].cel.expression`` are evaluated with
  cel-python (``celpy``), on the variable ``device`` shaped as Kubernetes shapes it:
  ``device.driver``, ``device.attributes[<domain>].<name>`` (a name without a domain is in
  the driver's domain; an unknown domain reads as an empty map, as in Kubernetes) and
  ``device.capacity[<domain>].<name>`` (the quantity as its string). Out of scope:
  Kubernetes' CEL extensions ``quantity()``, ``semver()`` (a ``version`` attribute is its
  string) and ``cel.bind()``; a selector using them fails to evaluate.
* **DeviceTaintRules** (``resource.k8s.io/v1beta2``, where the cluster serves them): a
  rule's ``spec.taint`` applies to every device its ``spec.deviceSelector`` selects (by
  ``driver``, ``pool`` and ``device``, each when set: Kubernetes 1.35 dropped the
  selector's DeviceClass and CEL fields), counted as the slice's own device taint is.
* **ResourceClaims.** Every ``status.allocation.devices.results[]`` entry holds its
  ``(driver, pool, device)``, whoever wrote it (kube-scheduler or an outside allocator).

A selector that does not compile, or fails to evaluate on a device or returns a non-bool,
makes that device not match, and the inventory says so in :attr:`Inventory.reasons`.
kube-scheduler is stricter (an evaluation error aborts the allocation attempt), so these
figures are an upper bound on what it would allocate whenever a reason is given.

Pure: no I/O; celpy parses and evaluates in memory. Evaluating a selector costs about a
millisecond per device (celpy interprets the parse tree), and the inventory is computed on
every binder pass and class-status reconcile, so what the selectors made of a stored
slice's devices is remembered by the slice's uid and ``resourceVersion`` and the
selectors' expressions (:func:`_judged`): a stored version of an object never changes, so
the result is the same as evaluating again, and a slice is judged once per version.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NamedTuple

import celpy
from celpy import celparser, celtypes, evaluation

Obj = dict[str, Any]

#: Device taint effects that keep a device from being allocated (a claim that tolerates
#: them is not modelled: the class's units are what an untolerating claim gets).
BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
#: The most selector failures kept as reasons, so a broken class cannot grow status.
MAX_REASONS: Final = 16
_MESSAGE_CHARS: Final = 200


class DeviceRef(NamedTuple):
    """A device as DRA names it in allocation results and in ``GPUClaim.status.devices``."""

    driver: str
    pool: str
    device: str


@dataclasses.dataclass(frozen=True)
class Device:
    """A device of the class on a node; ``topology`` is the value of the class's
    ``topologyAttribute`` (its string form), ``None`` when unset or absent."""

    ref: DeviceRef
    node: str
    topology: str | None
    held: bool
    tainted: bool

    @property
    def free(self) -> bool:
        return not self.held and not self.tainted


@dataclasses.dataclass(frozen=True)
class NodeDevices:
    """The class's devices on one node, sorted by reference."""

    node: str
    devices: tuple[Device, ...]

    @property
    def free(self) -> int:
        return sum(1 for d in self.devices if d.free)

    def free_by_topology(self) -> dict[str | None, int]:
        """Free devices counted per topology value (``None``: the attribute is absent)."""
        counts: dict[str | None, int] = {}
        for d in self.devices:
            if d.free:
                counts[d.topology] = counts.get(d.topology, 0) + 1
        return counts


@dataclasses.dataclass(frozen=True)
class Inventory:
    """Per node (by name), the class's devices; ``reasons`` say what was left out and why;
    ``pools`` are the ``(driver, pool)`` counted whole (node-local, every slice of the newest
    generation present): a device of such a pool that is not listed is not published now."""

    nodes: Mapping[str, NodeDevices]
    reasons: tuple[str, ...]
    pools: frozenset[tuple[str, str]] = frozenset()

    @property
    def free(self) -> int:
        return sum(n.free for n in self.nodes.values())


# ---- the DeviceClass's selectors -----------------------------------------------------------


class _Domains(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map, as
    Kubernetes defines it, so ``"model" in device.attributes["other.com"]`` is false."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


@dataclasses.dataclass(frozen=True)
class Selector:
    """One compiled ``spec.selectors[i].cel.expression``; ``error`` when it does not
    compile (it then matches no device)."""

    index: int
    expression: str
    program: celpy.Runner | None
    error: str | None


def _short(exc: BaseException) -> str:
    """celpy's message without the activation it appends (which can be long)."""
    text = str(exc.args[0]) if exc.args else type(exc).__name__
    text = text.split(" (in activation", 1)[0]
    if text.startswith("undeclared reference"):
        text += (
            " (Kubernetes' CEL extensions quantity(), semver() and cel.bind() "
            "are not evaluated here)"
        )
    return text[:_MESSAGE_CHARS]


@functools.cache
def _environment() -> celpy.Environment:
    """One CEL environment for the process. ``celpy.Environment()`` raises the interpreter's
    recursion limit to 2500 for every thread; that would change behaviour far from here
    (how deeply nested JSON the annotation parsers accept), so the limit is put back. A
    selector too deep for it fails as any other selector does (:class:`RecursionError`)."""
    limit = sys.getrecursionlimit()
    try:
        return celpy.Environment()
    finally:
        sys.setrecursionlimit(limit)


def selectors(device_class: Obj) -> list[Selector]:
    """Compile the DeviceClass's CEL selectors (entries without ``cel`` are skipped)."""
    env = _environment()
    spec = device_class.get("spec")
    items = spec.get("selectors") if isinstance(spec, dict) else None
    out: list[Selector] = []
    for index, item in enumerate(items if isinstance(items, list) else []):
        cel = item.get("cel") if isinstance(item, dict) else None
        if not isinstance(cel, dict):
            continue
        expression = str(cel.get("expression") or "")
        try:
            out.append(Selector(index, expression, env.program(env.compile(expression)), None))
        except (celparser.CELParseError, RecursionError) as exc:
            out.append(Selector(index, expression, None, _short(exc)))
    return out


def _domain_and_id(qualified: str, driver: str) -> tuple[str, str]:
    domain, _, ident = qualified.rpartition("/")
    return (domain or driver, ident)


def _attribute_value(value: Any) -> Any:
    """A ``DeviceAttribute`` (exactly one of string, int, bool, version) as a CEL value."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("bool"), bool):
        return celtypes.BoolType(value["bool"])
    if isinstance(value.get("int"), int):
        return celtypes.IntType(value["int"])
    for kind in ("string", "version"):
        if isinstance(value.get(kind), str):
            return celtypes.StringType(value[kind])
    return None


def _grouped(entries: Any, driver: str, convert: Any) -> _Domains:
    domains: dict[str, dict[celtypes.StringType, Any]] = {}
    for qualified, raw in (entries if isinstance(entries, dict) else {}).items():
        value = convert(raw)
        if value is None:
            continue
        domain, ident = _domain_and_id(str(qualified), driver)
        domains.setdefault(domain, {})[celtypes.StringType(ident)] = value
    return _Domains({celtypes.StringType(d): celtypes.MapType(v) for d, v in domains.items()})


def _capacity_value(raw: Any) -> Any:
    value = raw.get("value") if isinstance(raw, dict) else None
    return celtypes.StringType(str(value)) if value is not None else None


def _cel_device(driver: str, device: Obj) -> celtypes.MapType:
    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(driver),
            celtypes.StringType("attributes"): _grouped(
                device.get("attributes"), driver, _attribute_value
            ),
            celtypes.StringType("capacity"): _grouped(
                device.get("capacity"), driver, _capacity_value
            ),
        }
    )


def _matches(compiled: list[Selector], driver: str, device: Obj, failures: dict[int, str]) -> bool:
    """Whether every selector is true for the device; the first failure of each selector
    is recorded in ``failures``."""
    activation = {"device": _cel_device(driver, device)}
    for sel in compiled:
        if sel.program is None:
            return False
        result: object
        try:
            result = sel.program.evaluate(activation)
        except (evaluation.CELEvalError, RecursionError) as exc:
            result = exc
        if isinstance(result, celtypes.BoolType):
            if not result:
                return False
            continue
        what = _short(result) if isinstance(result, BaseException) else f"returned {result!r}"
        failures.setdefault(
            sel.index,
            f"on device {driver}/{device.get('name')}: {what}",
        )
        return False
    return True


#: What the selectors made of a stored slice's devices (:func:`_judged`), oldest first.
_JUDGED: collections.OrderedDict[
    tuple[tuple[str, ...], str, str], tuple[tuple[bool, ...], dict[int, str]]
] = collections.OrderedDict()
_JUDGED_LOCK = threading.Lock()
#: Slice versions remembered: many more than a cluster's slices (one per node and driver).
JUDGED_MAX: Final = 50_000


def _judged(
    compiled: list[Selector], driver: str, slice_: Obj, devices: list[Any]
) -> tuple[tuple[bool, ...], dict[int, str]]:
    """For each of the slice's ``devices``, whether every selector accepts it, and each
    selector's first failure; remembered for a slice the API server stored (uid and
    resourceVersion set), judged anew otherwise."""
    meta = slice_.get("metadata") or {}
    key = (
        tuple(sel.expression for sel in compiled),
        str(meta.get("uid") or ""),
        str(meta.get("resourceVersion") or ""),
    )
    stored = bool(key[1] and key[2])
    if stored:
        with _JUDGED_LOCK:
            hit = _JUDGED.get(key)
            if hit is not None:
                _JUDGED.move_to_end(key)
                return hit
    failures: dict[int, str] = {}
    matched = tuple(
        isinstance(d, dict) and _matches(compiled, driver, d, failures) for d in devices
    )
    if stored:
        with _JUDGED_LOCK:
            _JUDGED[key] = (matched, failures)
            while len(_JUDGED) > JUDGED_MAX:
                _JUDGED.popitem(last=False)
    return matched, failures


# ---- slices and allocations ----------------------------------------------------------------


def held_devices(resource_claims: Iterable[Obj]) -> set[DeviceRef]:
    """The devices that allocated ResourceClaims hold (``status.allocation``)."""
    held: set[DeviceRef] = set()
    for claim in resource_claims:
        status = claim.get("status")
        allocation = status.get("allocation") if isinstance(status, dict) else None
        devices = allocation.get("devices") if isinstance(allocation, dict) else None
        results = devices.get("results") if isinstance(devices, dict) else None
        for r in results if isinstance(results, list) else []:
            if isinstance(r, dict):
                held.add(DeviceRef(str(r.get("driver")), str(r.get("pool")), str(r.get("device"))))
    return held


def _complete_slices(slices: Iterable[Obj], reasons: list[str]) -> list[Obj]:
    """The slices of each pool's newest generation, for pools whose slices are all there."""
    pools: dict[tuple[str, str], list[Obj]] = {}
    for s in slices:
        spec = s.get("spec")
        if not isinstance(spec, dict) or not isinstance(spec.get("pool"), dict):
            continue
        pools.setdefault((str(spec.get("driver")), str(spec["pool"].get("name"))), []).append(s)
    kept: list[Obj] = []
    for (driver, pool), members in sorted(pools.items()):
        newest = max(int(m["spec"]["pool"].get("generation") or 0) for m in members)
        current = [m for m in members if int(m["spec"]["pool"].get("generation") or 0) == newest]
        want = int(current[0]["spec"]["pool"].get("resourceSliceCount") or 1)
        if len(current) < want:
            reasons.append(
                f"pool {driver}/{pool} generation {newest} has {len(current)} of {want} "
                "ResourceSlices; its devices are left out until it is complete"
            )
            continue
        kept.extend(current)
    return kept


def _blocking_taint(device: Obj) -> bool:
    taints = device.get("taints")
    return any(
        isinstance(t, dict) and t.get("effect") in BLOCKING_EFFECTS
        for t in (taints if isinstance(taints, list) else [])
    )


def _selects(selector: Any, ref: DeviceRef) -> bool:
    """Whether a DeviceTaintRule's ``spec.deviceSelector`` selects ``ref``: every field it
    sets (``driver``, ``pool``, ``device``) equals the device's; the empty selector selects
    every device, a rule without one none."""
    if not isinstance(selector, dict):
        return False
    return all(
        selector.get(field) in (None, value)
        for field, value in (("driver", ref.driver), ("pool", ref.pool), ("device", ref.device))
    )


def rule_tainted(taint_rules: Iterable[Obj]) -> Callable[[DeviceRef], bool]:
    """``ref -> whether a DeviceTaintRule puts a blocking (NoSchedule/NoExecute) taint on
    it``: the rules' ``spec.taint`` applies to the devices ``spec.deviceSelector`` selects,
    as a slice's own device taint does."""
    blocking = [
        spec.get("deviceSelector")
        for spec in (r.get("spec") for r in taint_rules)
        if isinstance(spec, dict)
        and isinstance(spec.get("taint"), dict)
        and spec["taint"].get("effect") in BLOCKING_EFFECTS
    ]
    return lambda ref: any(_selects(selector, ref) for selector in blocking)


def _topology(device: Obj, driver: str, attribute: str | None) -> str | None:
    if attribute is None:
        return None
    domain, ident = _domain_and_id(attribute, driver)
    for qualified, raw in (device.get("attributes") or {}).items():
        if _domain_and_id(str(qualified), driver) == (domain, ident) and isinstance(raw, dict):
            for kind in ("string", "int", "bool", "version"):
                if kind in raw:
                    return str(raw[kind]).lower() if kind == "bool" else str(raw[kind])
    return None


def inventory(
    slices: Iterable[Obj],
    device_class: Obj,
    resource_claims: Iterable[Obj],
    *,
    topology_attribute: str | None = None,
    taint_rules: Iterable[Obj] = (),
) -> Inventory:
    """The devices of ``device_class`` on each node, which are free, and their topology
    values (``topology_attribute``, the class's ``spec.source.dra.topologyAttribute``); a
    device is tainted by its slice's own blocking taint or by a DeviceTaintRule's
    (``taint_rules``, :func:`rule_tainted`)."""
    reasons: list[str] = []
    ruled = rule_tainted(taint_rules)
    compiled = selectors(device_class)
    class_name = str((device_class.get("metadata") or {}).get("name") or "")
    for sel in compiled:
        if sel.error is not None:
            reasons.append(
                f"DeviceClass {class_name} spec.selectors[{sel.index}].cel.expression does "
                f"not compile ({sel.error}); it matches no device"
            )
    held = held_devices(resource_claims)
    failures: dict[int, str] = {}
    per_node: dict[str, list[Device]] = {}
    pools: set[tuple[str, str]] = set()
    for s in _complete_slices(slices, reasons):
        spec = s["spec"]
        driver, pool = str(spec.get("driver")), str(spec["pool"].get("name"))
        node = spec.get("nodeName")
        if not isinstance(node, str) or not node:
            reasons.append(
                f"ResourceSlice {(s.get('metadata') or {}).get('name')} of pool {driver}/{pool} "
                "is not local to one node (nodeSelector, allNodes or per-device nodes); "
                "its devices are left out"
            )
            continue
        pools.add((driver, pool))
        devices = list(spec.get("devices") or [])
        matched, failed = _judged(compiled, driver, s, devices)
        for index, failure in failed.items():
            failures.setdefault(index, failure)
        for device, accepted in zip(devices, matched, strict=True):
            if not accepted:
                continue
            ref = DeviceRef(driver, pool, str(device.get("name")))
            per_node.setdefault(node, []).append(
                Device(
                    ref=ref,
                    node=node,
                    topology=_topology(device, driver, topology_attribute),
                    held=ref in held,
                    tainted=_blocking_taint(device) or ruled(ref),
                )
            )
    for index, failure in sorted(failures.items()):
        reasons.append(
            f"DeviceClass {class_name} spec.selectors[{index}].cel.expression failed to "
            f"evaluate {failure}; such devices are counted as not matching"
        )
    return Inventory(
        nodes={
            node: NodeDevices(node, tuple(sorted(devices, key=lambda d: d.ref)))
            for node, devices in sorted(per_node.items())
        },
        reasons=tuple(reasons[:MAX_REASONS]),
        pools=frozenset(pools),
    )
