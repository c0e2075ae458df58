"""License copier: a vGPU class's license, copied into the namespaces whose VMs use it.

Key: a class name. For a ``vgpu`` class with ``spec.license`` whose source is acceptable
(``licensing.source_refusal``: a Secret of the license namespace, ``Settings.license_namespace``,
labelled ``gpu.cozystack.io/license-source: "true"``, with the token key), the copier keeps one
Secret ``gpu-license-<class>`` in every namespace that is entitled to vGPU and holds a Bound
claim of the class (``licensing.namespaces_needing``), carrying the token key and the
generated ``gridd.conf`` only: created when missing, rewritten when the source, the
featureType or what a copy must hold changed. Copies no longer needed are deleted: no Bound
claim left in their namespace, the entitlement removed, the class gone or no longer
licensed, its source gone or refused, or ``gpuForVMs`` switched off.

The class's condition ``LicenseReady`` says whether its source is copied and, when not, why
(the refusal names the field, the value and what is allowed), with a Warning Event
``LicenseSourceRefused`` when it turns so. The copier writes only that condition of the
class's status, with the class's resourceVersion as precondition, so it never clobbers the
class-status controller's conditions (nor they its). A class without a license has no such
condition.

What it reads: the license namespace's labelled Secrets (an informer on that namespace and
label only; a class naming any other Secret is diagnosed by one GET of that name in the
license namespace), and the Secrets labelled ``gpu.cozystack.io/license-of`` anywhere
(an informer that caches their metadata only, ``licensing.slim_copy``, in small pages: any
tenant can make such Secrets, and their data must not fill the operator's memory). A copy
is judged from its annotations; its data is read (a GET of the exact copy) only to rewrite
it.

It never touches a Secret it did not make:

* it counts one as its copy only when the label names the class and the name is
  ``gpu-license-<class>``;
* when a Secret of that name exists WITHOUT the label (found when a create is refused as
  AlreadyExists), it is left alone: a Warning Event ``LicenseCopyConflict`` on the class
  says so, and the namespace is looked at again after ``conflict_recheck`` seconds (the
  copier cannot watch an unlabelled Secret go away). Labelling that Secret
  ``gpu.cozystack.io/license-of=<class>`` hands it over to the copier;
* deletes carry the copy's uid as a precondition, so a Secret re-made under the same name
  in between is not removed.

Events on the class: ``LicenseCopied`` (Normal) when a copy is created or rewritten,
``LicenseCopyRemoved`` (Normal) when one is deleted while the class exists,
``LicenseCopyConflict``, ``LicenseSourceRefused`` and ``LicenseCopyFailed`` (Warning: the
API server refused a copy, e.g. a Secret quota in the namespace; retried with backoff, and
other namespaces are not held up). Log lines carry the same reasons.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import pykube
import structlog

from gpuoperator import caches as cachesmod
from gpuoperator import names
from gpuoperator.caches import Caches, class_of_claim, lean, own_key
from gpuoperator.kinds import GPUClass
from gpuoperator.model import classes, conditions, licensing, tenants
from gpuoperator.runtime import errors, indexing, managing, protocols
from gpuoperator.runtime.client import Obj
from gpuoperator.runtime.clock import SYSTEM, Clock
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.indexing import Key
from gpuoperator.runtime.informing import Informer, InformerOptions
from gpuoperator.runtime.own_writes import OwnWrites
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "license-copier"
COPIES_INFORMER = "license-copies"
SOURCES_INFORMER = "license-sources"
#: Index of the copies informer: the class a copy serves (its label value).
BY_CLASS = "license-of"
#: Page size of the copies' list: a labelled Secret may be 1 MiB, and a page of them is
#: held whole while it is read.
COPIES_PAGE = 16

#: The class condition the copier owns.
LICENSE_READY = "LicenseReady"

COPIED = "LicenseCopied"
REMOVED = "LicenseCopyRemoved"
CONFLICT = "LicenseCopyConflict"
SOURCE_REFUSED = "LicenseSourceRefused"
FAILED = "LicenseCopyFailed"

#: Seconds before a copy that raced the cache (it exists but is not cached yet) is looked
#: at again; its watch event usually comes first.
CACHE_LAG_RECHECK = 1.0


class ApiAccess(
    protocols.Gets,
    protocols.Creates,
    protocols.Replaces,
    protocols.ReplacesStatus,
    protocols.Deletes,
    Protocol,
):
    """What the copier asks of the API server: a live read of a Secret, a copy created,
    rewritten or deleted, and the class's status replaced."""


class ManagerAccess(managing.Informs, managing.Controls, managing.Clocked, Protocol):
    """What ``register`` uses of the manager: its two Secret informers and fenced writer."""

    @property
    def writer(self) -> ApiAccess: ...


class LicenseCopier:
    def __init__(
        self,
        caches: Caches,
        copies: Informer,
        sources: Informer,
        writer: ApiAccess,
        recorder: protocols.RecordsEvents,
        *,
        license_namespace: str,
        make_copies: bool = True,
        conflict_recheck: float = 60.0,
        clock: Clock = SYSTEM,
    ) -> None:
        self.caches = caches
        self.copies = copies
        self.sources = sources
        self.writer = writer
        self.recorder = recorder
        self.license_namespace = license_namespace
        self.make_copies = make_copies
        self.conflict_recheck = conflict_recheck
        self.clock = clock
        #: class name -> the GPUClass as this controller last wrote its status (newer than
        #: the cache until the cache delivers it)
        self._written: OwnWrites[str] = OwnWrites()

    def reconcile(self, key: Key) -> Result | None:
        class_name = key[1]
        cls = self.caches.classes.store.get(("", class_name))
        copies = {
            str(s["metadata"].get("namespace") or ""): s
            for s in self.copies.store.by_index(BY_CLASS, class_name)
            if licensing.is_copy(s, class_name)
        }
        source: Obj | None = None
        refusal: licensing.SourceRefusal | None = None
        wanted: set[str] = set()
        if cls is None:
            self._written.forget(class_name)
            why = "ClassGone"
        elif not licensing.licensed(cls):
            why = "NotLicensed"
        else:
            source = self._source(cls)
            refusal = licensing.source_refusal(
                cls, source, license_namespace=self.license_namespace
            )
            if refusal is not None:
                why, source = "SourceRefused", None
            elif not self.make_copies:
                why, source = "GPUForVMsOff", None
            else:
                claims = self.caches.claims.store.by_index(cachesmod.BY_CLASS, class_name)
                why = "NotNeeded"
                wanted = licensing.namespaces_needing(cls, claims, self._namespace)

        for namespace in sorted(set(copies) - wanted):
            self._delete(cls, copies[namespace], self._why(why, namespace))
        requeue: float | None = None
        failed: list[errors.ApiError] = []
        if cls is not None and source is not None:
            for namespace in sorted(wanted):
                try:
                    after = self._sync(cls, source, namespace, copies.get(namespace))
                except errors.ApiError as exc:
                    # One namespace's failure (a Secret quota, say) holds up no other.
                    failed.append(exc)
                    if not isinstance(exc, errors.ConflictError):  # a stale cache is routine
                        self._failed(cls, namespace, exc)
                    continue
                if after is not None:
                    requeue = after if requeue is None else min(requeue, after)
        if cls is not None and not cls["metadata"].get("deletionTimestamp"):
            self._condition(cls, refusal)
        if failed:
            raise failed[0]  # retried with backoff; the others are done
        return Result(requeue_after=requeue) if requeue is not None else None

    def _namespace(self, name: str) -> Obj | None:
        return self.caches.namespaces.store.get(("", name))

    def _why(self, why: str, namespace: str) -> str:
        """Why a copy in ``namespace`` is not needed (the class-wide reason, or the
        namespace's own)."""
        if why != "NotNeeded":
            return why
        return (
            "NoBoundClaim" if tenants.vgpu_entitled(self._namespace(namespace)) else "NotEntitled"
        )

    def _source(self, cls: Obj) -> Obj | None:
        """The Secret the class names, in the license namespace: from the labelled sources'
        cache, else (to say why it is refused) as the API server has it there."""
        name = licensing.secret_name(cls)
        cached = self.sources.store.get((self.license_namespace, name))
        if cached is not None:
            return cached
        return self.writer.get_or_none(pykube.Secret, name, self.license_namespace)

    def _sync(self, cls: Obj, source: Obj, namespace: str, existing: Obj | None) -> float | None:
        """Bring one namespace's copy up to date; the seconds after which to look again."""
        desired = licensing.desired_copy(cls, source, namespace)
        if existing is None:
            return self._create(cls, desired)
        if not licensing.copy_outdated(existing, desired):
            return None
        if licensing.replaceable(existing, desired):
            return self._replace(cls, existing, desired)
        # type or immutability cannot change in place: delete, and its delete event
        # brings the class back here to make it again.
        self._delete(cls, existing, "NotReplaceable")
        return None

    def _condition(self, cls: Obj, refusal: licensing.SourceRefusal | None) -> None:
        """Keep ``LicenseReady`` current (absent on a class without a license); only that
        condition is changed, under the class's resourceVersion."""
        name = classes.name(cls)
        cls = self._written.current(name, cls) or cls
        status = dict(cls.get("status") or {})
        current = status.get("conditions")
        old = conditions.find(current, LICENSE_READY)
        generation = cls["metadata"].get("generation")
        if not licensing.licensed(cls):
            if old is None:
                return
            updated = [c for c in current or [] if c.get("type") != LICENSE_READY]
        else:
            if refusal is None:
                ready, reason = True, licensing.SOURCE_READY
                message = licensing.source_ready_message(cls, self.license_namespace)
            else:
                ready, reason, message = False, refusal.reason, refusal.message
            if (
                old is not None
                and old.get("status") == ("True" if ready else "False")
                and old.get("reason") == reason
                and old.get("message") == message
                and old.get("observedGeneration") == generation
            ):
                return
            updated = conditions.set_condition(
                current,
                LICENSE_READY,
                ready,
                reason,
                message,
                now=self.clock.now(),
                observed_generation=generation,
            )
        self._written.wrote(
            name,
            self.writer.replace_status(
                GPUClass, {**cls, "status": {**status, "conditions": updated}}
            ),
        )
        if refusal is None:
            log.info(
                "license source accepted"
                if licensing.licensed(cls)
                else "license condition removed",
                reason=licensing.SOURCE_READY if licensing.licensed(cls) else "NotLicensed",
                gpuclass=name,
            )
            return
        log.warning(
            "license source refused", reason=refusal.reason, gpuclass=name, error=refusal.message
        )
        if old is None or old.get("reason") != refusal.reason or old.get("status") != "False":
            self.recorder.event(
                cls, "Warning", SOURCE_REFUSED, refusal.message, kind=names.GPU_CLASS
            )

    # ---- pieces ---------------------------------------------------------------------
    def _create(self, cls: Obj, desired: Obj) -> float | None:
        """Create a copy; the seconds after which to look again, if the name is taken."""
        meta = desired["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        class_name = classes.name(cls)
        try:
            self.writer.create(pykube.Secret, desired)
        except errors.AlreadyExistsError:
            current = self.writer.get_or_none(pykube.Secret, name, namespace)
            if current is not None and not licensing.is_copy(current, class_name):
                self._conflict(cls, namespace, name)
                return self.conflict_recheck
            return CACHE_LAG_RECHECK  # ours, not cached yet (or just deleted): look again
        except (errors.NotFoundError, errors.NamespaceTerminatingError):
            # The namespace is gone or going; its claims' deletion brings us back.
            log.info(
                "license copy not created",
                reason="NamespaceTerminating",
                gpuclass=class_name,
                namespace=namespace,
            )
            return None
        self._copied(cls, desired, "created")
        return None

    def _replace(self, cls: Obj, existing: Obj, desired: Obj) -> float | None:
        """Rewrite a copy: the cache holds no data, so the exact copy is read first (and
        written back with its resourceVersion as precondition, other labels and annotations
        kept)."""
        meta = existing["metadata"]
        current = self.writer.get_or_none(pykube.Secret, meta["name"], meta["namespace"])
        if current is None or current["metadata"].get("uid") != meta.get("uid"):
            return CACHE_LAG_RECHECK  # gone or re-made meanwhile: its event brings us back
        self.writer.replace(pykube.Secret, licensing.updated_copy(current, desired))
        self._copied(cls, desired, "updated")
        return None

    def _copied(self, cls: Obj, desired: Obj, verb: str) -> None:
        meta = desired["metadata"]
        annotations = meta["annotations"]
        source = annotations[licensing.SOURCE_ANNOTATION]
        feature = annotations[licensing.FEATURE_TYPE_ANNOTATION]
        log.info(
            f"license copy {verb}",
            reason=COPIED,
            gpuclass=classes.name(cls),
            namespace=meta["namespace"],
            secret=meta["name"],
            source=source,
            source_version=annotations[licensing.SOURCE_VERSION_ANNOTATION],
            feature_type=feature,
        )
        self.recorder.event(
            cls,
            "Normal",
            COPIED,
            f"license copy {meta['namespace']}/{meta['name']} {verb} from Secret {source} "
            f"(FeatureType={feature})",
            kind=names.GPU_CLASS,
        )

    def _delete(self, cls: Obj | None, copy: Obj, why: str) -> None:
        meta = copy["metadata"]
        namespace, name = meta.get("namespace"), meta["name"]
        try:
            self.writer.delete(pykube.Secret, name, namespace, uid=meta.get("uid"))
        except errors.NotFoundError:
            return
        log.info(
            "license copy deleted",
            reason=why,
            gpuclass=(meta.get("labels") or {}).get(names.LICENSE_OF_LABEL),
            namespace=namespace,
            secret=name,
        )
        if cls is not None and why != "NotReplaceable":
            self.recorder.event(
                cls,
                "Normal",
                REMOVED,
                f"license copy {namespace}/{name} deleted: {_WHY[why]}",
                kind=names.GPU_CLASS,
            )

    def _conflict(self, cls: Obj, namespace: str, name: str) -> None:
        class_name = classes.name(cls)
        label = f"{names.LICENSE_OF_LABEL}={class_name}"
        log.warning(
            "license copy blocked by a foreign Secret",
            reason=CONFLICT,
            gpuclass=class_name,
            namespace=namespace,
            secret=name,
        )
        self.recorder.event(
            cls,
            "Warning",
            CONFLICT,
            f"Secret {namespace}/{name} exists without the label {label}: gpuoperator did not "
            f"make it and leaves it alone, so namespace {namespace} gets no license copy; "
            f"remove or rename it, or label it {label} to let gpuoperator manage it",
            kind=names.GPU_CLASS,
        )

    def _failed(self, cls: Obj, namespace: str, exc: errors.ApiError) -> None:
        name = names.license_secret_name(classes.name(cls))
        log.warning(
            "license copy not written",
            reason=FAILED,
            error_reason=exc.reason,
            gpuclass=classes.name(cls),
            namespace=namespace,
            error=exc.message,
        )
        self.recorder.event(
            cls,
            "Warning",
            FAILED,
            f"license copy {namespace}/{name} not written: {exc.code} {exc.reason}: {exc.message}",
            kind=names.GPU_CLASS,
        )


_WHY = {
    "ClassGone": "the class is gone",
    "NotLicensed": "the class no longer has spec.license",
    "SourceRefused": "the license source is gone or refused (see condition LicenseReady)",
    "GPUForVMsOff": "gpuForVMs is off",
    "NoBoundClaim": "no Bound claim of the class is left in the namespace",
    "NotEntitled": f"the namespace is not entitled to vGPU (label {names.VGPU_ENTITLED_LABEL})",
}


def _copy_class(secret: Obj) -> list[Key]:
    class_name = ((secret.get("metadata") or {}).get("labels") or {}).get(names.LICENSE_OF_LABEL)
    return [("", class_name)] if class_name else []


def _classes_in_namespace(caches: Caches) -> Callable[[Obj], list[Key]]:
    """A Namespace's change (its entitlement label) concerns the classes of its claims."""

    def mapper(namespace: Obj) -> list[Key]:
        name = str((namespace.get("metadata") or {}).get("name") or "")
        claims = caches.claims.store.by_index(cachesmod.BY_NAMESPACE, name)
        return sorted({k for c in claims for k in class_of_claim(c)})

    return mapper


def register(
    manager: ManagerAccess,
    caches: Caches,
    recorder: protocols.RecordsEvents,
    settings: Settings,
    operator_namespace: str,
    workers: int = 1,
) -> Controller[Key]:
    """Wire the copier: its two Secret informers (labelled copies cluster-wide, as metadata;
    labelled sources in the license namespace) and the class, claim, namespace, copy and
    source events that enqueue a class.

    Raises ``ValueError`` (a startup error) when the license namespace is the operator's
    own."""
    license_namespace = settings.license_namespace
    refusal = licensing.license_namespace_refusal(license_namespace, operator_namespace)
    if refusal is not None:
        raise ValueError(refusal)
    copies = manager.informer(
        pykube.Secret,
        InformerOptions(
            label_selector=names.LICENSE_OF_LABEL,
            transform=licensing.slim_copy,
            page_size=COPIES_PAGE,
            indexers={BY_CLASS: indexing.by_label(names.LICENSE_OF_LABEL)},
        ),
        name=COPIES_INFORMER,
    )
    sources = manager.informer(
        pykube.Secret,
        InformerOptions(
            namespace=license_namespace,
            label_selector=f"{names.LICENSE_SOURCE_LABEL}={names.TRUE}",
            transform=lean,
        ),
        name=SOURCES_INFORMER,
    )
    reconciler = LicenseCopier(
        caches,
        copies,
        sources,
        manager.writer,
        recorder,
        license_namespace=license_namespace,
        make_copies=settings.gpu_for_vms,
        clock=manager.clock,
    )
    controller = manager.controller(
        NAME,
        reconciler,
        workers=workers,
        seed=lambda: sorted(
            set(caches.class_keys()) | {("", c) for c in copies.store.index_values(BY_CLASS)}
        ),
    )

    def by_source(secret: Obj) -> list[Key]:
        secret_name = (secret.get("metadata") or {}).get("name")
        return [
            ("", classes.name(c))
            for c in caches.classes.store.values()
            if secret_name and licensing.secret_name(c) == secret_name
        ]

    manager.add_controller(
        controller,
        [
            (caches.classes, own_key),
            (caches.claims, class_of_claim),
            (caches.namespaces, _classes_in_namespace(caches)),
            (copies, _copy_class),
            (sources, by_source),
        ],
    )
    return controller
