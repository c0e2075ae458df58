"""The references annotation (docs/design.md §2 GPUClaim, §4 names, §5 "VMs"): how a VM names
its GPU claims, parsed once for the VMI webhook, the pod webhook, the template controller and
the placement controller.

A VMI labelled ``gpu.cozystack.io/claims: "true"`` names its GPUs in the annotation
``gpu.cozystack.io/claims``: a JSON list of 1 to 16 references, each either a **held** claim
(``{"claim": "hold-a"}``, a GPUClaim the tenant ordered) or a **claim template**
(``{"claimTemplate": {"className": "a10", "count": 2}}``, a claim the operator orders for as
long as the VMI exists, :mod:`gpuoperator.model.templates`). KubeVirt copies every VMI label
and annotation onto the launcher pod and the temporary WaitForFirstConsumer pod, so the same
parser reads pods.

:func:`parse` is the annotation's grammar: every error (:class:`AnnotationError`) names the
annotation, the 1-based item and what is allowed.

Choices where docs/design.md is silent:

* Items are numbered from 1 in messages (``item 2`` is the second reference).
* ``parse(None)`` (the label without the annotation) is an error, not "no references": the
  label promises references.
* JSON objects with a repeated key, ``NaN``/``Infinity`` and non-integer counts (``2.0``,
  ``"2"``, ``true``) are refused rather than guessed at. A template's ``count`` is capped at
  :data:`MAX_TEMPLATE_COUNT` (the VMI webhook writes one ``gpus`` entry per unit, so an
  unbounded count would be an unbounded response); the class's maxCount is checked
  separately (:func:`gpuoperator.model.orders.max_count_refusal`).
* A held claim may be referenced once per VMI; the same template may appear twice (two claims).
* The value is at most :data:`MAX_ANNOTATION_LENGTH` characters. The longest list the grammar
  accepts takes 1,745 in compact JSON (16 templates of a 63-character class and count 64) and
  2,658 indented by four spaces; JSON allows any amount of whitespace, so without this bound a
  valid value would have no size limit, and the operator keeps this annotation of every VMI
  in memory (:mod:`gpuoperator.model.slimming`).

Every function is pure and idempotent: no I/O, plain dicts in and out (inputs are never
mutated), the same inputs give the same answer.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, NoReturn

from gpuoperator import names
from gpuoperator.model import objects, orders

Obj = dict[str, Any]

#: At most this many references on one VMI.
MAX_REFERENCES: Final = 16
#: At most this many units one claimTemplate may order (see the module docstring).
MAX_TEMPLATE_COUNT: Final = 64
#: At most this many characters in the annotation's value (see the module docstring).
MAX_ANNOTATION_LENGTH: Final = 4096

CLAIM_KEY: Final = "claim"
TEMPLATE_KEY: Final = "claimTemplate"
CLASS_NAME_KEY: Final = "className"
COUNT_KEY: Final = "count"
EXAMPLE: Final = '[{"claim":"hold-a"},{"claimTemplate":{"className":"a10","count":2}}]'

_DNS_LABEL: Final = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_DNS_LABEL_MAX: Final = 63
_SHOWN_MAX: Final = 80


@dataclasses.dataclass(frozen=True)
class HeldRef:
    """A reference to a GPUClaim the tenant ordered and holds (``{"claim": name}``)."""

    claim: str


@dataclasses.dataclass(frozen=True)
class TemplateRef:
    """A claim template (``{"claimTemplate": {"className": c, "count": n}}``): the template
    controller orders a marked claim owned by the VMI (:func:`template_claim`)."""

    class_name: str
    count: int


Reference = HeldRef | TemplateRef


class AnnotationError(ValueError):
    """The annotation is malformed; the message names the annotation, the item and what is
    allowed, ready to be returned by a webhook."""


class _DuplicateKeyError(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> Obj:
    out: Obj = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def _no_constants(constant: str) -> NoReturn:
    raise ValueError(f"{constant} is not a JSON number")


def field() -> str:
    """The field every message about the annotation names first."""
    return f"annotation {names.CLAIMS_ANNOTATION}"


def item_field(index: int) -> str:
    """The message prefix naming the ``index``-th (0-based) reference as ``item <index+1>``."""
    return f"{field()}: item {index + 1}"


def shown(value: Any) -> str:
    """A JSON value as the tenant wrote it, shortened for a message."""
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= _SHOWN_MAX else text[: _SHOWN_MAX - 3] + "..."


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return shown(value)


def _is_dns_label(value: Any) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= _DNS_LABEL_MAX
        and _DNS_LABEL.fullmatch(value) is not None
    )


_DNS_LABEL_TEXT: Final = "a DNS label: lowercase letters, digits and '-', at most 63 characters"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_template(at: str, template: Any) -> TemplateRef:
    if not isinstance(template, dict):
        raise AnnotationError(
            f"{at}: {TEMPLATE_KEY} must be an object "
            f'{{"{CLASS_NAME_KEY}": <class>, "{COUNT_KEY}": <integer >= 1>}}, '
            f"got {_kind(template)}"
        )
    unknown = sorted(set(template) - {CLASS_NAME_KEY, COUNT_KEY})
    if unknown:
        raise AnnotationError(
            f"{at}: {TEMPLATE_KEY} has unknown key {', '.join(map(shown, unknown))}; "
            f"allowed: {CLASS_NAME_KEY}, {COUNT_KEY}"
        )
    if CLASS_NAME_KEY not in template:
        raise AnnotationError(
            f"{at}: {TEMPLATE_KEY}.{CLASS_NAME_KEY} is required (a class name, {_DNS_LABEL_TEXT})"
        )
    class_name = template[CLASS_NAME_KEY]
    if not _is_dns_label(class_name):
        raise AnnotationError(
            f"{at}: {TEMPLATE_KEY}.{CLASS_NAME_KEY} must be a class name ({_DNS_LABEL_TEXT}), "
            f"got {shown(class_name)}"
        )
    if COUNT_KEY not in template:
        raise AnnotationError(f"{at}: {TEMPLATE_KEY}.{COUNT_KEY} is required (an integer >= 1)")
    count = template[COUNT_KEY]
    if not _is_count(count) or count < 1:
        raise AnnotationError(
            f"{at}: {TEMPLATE_KEY}.{COUNT_KEY} must be an integer >= 1, got {shown(count)}"
        )
    if count > MAX_TEMPLATE_COUNT:
        raise AnnotationError(
            f"{at}: {TEMPLATE_KEY}.{COUNT_KEY} must be at most {MAX_TEMPLATE_COUNT}, got {count}"
        )
    return TemplateRef(class_name=class_name, count=count)


def parse(annotation_value: str | None) -> list[Reference]:
    """The references of the annotation ``gpu.cozystack.io/claims``, in order.

    Raises :class:`AnnotationError` when the value is missing, longer than
    :data:`MAX_ANNOTATION_LENGTH` characters, not JSON, not a list, empty, longer than
    :data:`MAX_REFERENCES`, or an item is not an object with exactly one of
    ``claim`` (a DNS label) or ``claimTemplate`` (``{className: DNS label, count: 1..64}``),
    has unknown keys, or names a held claim already named by an earlier item.
    """
    where = field()
    if annotation_value is None:
        raise AnnotationError(
            f"{where}: missing; an object labelled {names.CLAIMS_LABEL}={names.TRUE} must list "
            f"its GPU claim references here, e.g. {EXAMPLE}"
        )
    if len(annotation_value) > MAX_ANNOTATION_LENGTH:
        raise AnnotationError(
            f"{where}: longer than {MAX_ANNOTATION_LENGTH} characters; allowed: at most "
            f"{MAX_ANNOTATION_LENGTH} characters of JSON such as {EXAMPLE}"
        )
    try:
        data = json.loads(
            annotation_value, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants
        )
    except _DuplicateKeyError as error:
        raise AnnotationError(
            f"{where}: the key {shown(error.key)} appears twice in one object; "
            "each key is allowed once"
        ) from None
    except (ValueError, RecursionError) as error:
        reason = error.msg if isinstance(error, json.JSONDecodeError) else str(error)
        raise AnnotationError(
            f"{where}: not valid JSON ({reason or 'nested too deeply'}); "
            f"allowed: a JSON list such as {EXAMPLE}"
        ) from None
    if not isinstance(data, list):
        raise AnnotationError(
            f"{where}: must be a JSON list of references, got {_kind(data)}; "
            f"allowed: a list such as {EXAMPLE}"
        )
    if not data:
        raise AnnotationError(
            f"{where}: the list is empty; allowed: 1 to {MAX_REFERENCES} references (a VM "
            f"without GPU claims carries neither this annotation nor the label "
            f"{names.CLAIMS_LABEL})"
        )
    if len(data) > MAX_REFERENCES:
        raise AnnotationError(
            f"{where}: {len(data)} references, at most {MAX_REFERENCES} are allowed"
        )
    refs: list[Reference] = []
    held_at: dict[str, int] = {}
    for index, item in enumerate(data):
        at = item_field(index)
        if not isinstance(item, dict):
            raise AnnotationError(
                f"{at}: must be an object with exactly one of {CLAIM_KEY} or {TEMPLATE_KEY}, "
                f"got {_kind(item)}"
            )
        unknown = sorted(set(item) - {CLAIM_KEY, TEMPLATE_KEY})
        if unknown:
            raise AnnotationError(
                f"{at}: unknown key {', '.join(map(shown, unknown))}; "
                f"allowed: {CLAIM_KEY} or {TEMPLATE_KEY}"
            )
        if len(item) != 1:
            got = "both" if item else "neither"
            raise AnnotationError(
                f"{at}: must have exactly one of {CLAIM_KEY} or {TEMPLATE_KEY}, got {got}"
            )
        if TEMPLATE_KEY in item:
            refs.append(_parse_template(at, item[TEMPLATE_KEY]))
            continue
        claim = item[CLAIM_KEY]
        if not _is_dns_label(claim):
            raise AnnotationError(
                f"{at}: {CLAIM_KEY} must be a GPUClaim name ({_DNS_LABEL_TEXT}), got {shown(claim)}"
            )
        if claim in held_at:
            raise AnnotationError(
                f"{at}: {CLAIM_KEY} {claim} is already referenced by item {held_at[claim] + 1}; "
                "each held claim may be referenced once"
            )
        held_at[claim] = index
        refs.append(HeldRef(claim=claim))
    return refs


def dump(refs: Iterable[Reference]) -> str:
    """The annotation value for ``refs`` (compact JSON); ``parse(dump(refs)) == refs`` for
    any list :func:`parse` accepts."""
    items: list[Obj] = [
        {CLAIM_KEY: ref.claim}
        if isinstance(ref, HeldRef)
        else {TEMPLATE_KEY: {CLASS_NAME_KEY: ref.class_name, COUNT_KEY: ref.count}}
        for ref in refs
    ]
    return json.dumps(items, separators=(",", ":"))


def has_references(obj: Mapping[str, Any]) -> bool:
    """Whether a VMI or pod carries the label ``gpu.cozystack.io/claims: "true"`` (what the
    webhooks' objectSelectors match). An annotation without the label is ignored by every
    component: KubeVirt does not read it either."""
    return objects.labels(obj).get(names.CLAIMS_LABEL) == names.TRUE


def from_object(obj: Mapping[str, Any]) -> list[Reference]:
    """:func:`parse` of a VMI's or pod's annotation (raises :class:`AnnotationError`)."""
    value = objects.annotations(obj).get(names.CLAIMS_ANNOTATION)
    return parse(value if isinstance(value, str) else None)


def held_claims(refs: Iterable[Reference]) -> list[str]:
    """The names of the held claims, in reference order."""
    return [ref.claim for ref in refs if isinstance(ref, HeldRef)]


def class_names(refs: Iterable[Reference], claims: Mapping[str, Obj]) -> list[str]:
    """The classes the references use (a held claim's ``spec.className``, a template's
    className), first occurrence first, without repeats. Unknown held claims are skipped."""
    seen: dict[str, None] = {}
    for ref in refs:
        if isinstance(ref, TemplateRef):
            seen.setdefault(ref.class_name)
        elif ref.claim in claims:
            name = orders.ordered_class(claims[ref.claim])
            if name:
                seen.setdefault(name)
    return list(seen)
