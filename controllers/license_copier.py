"""License copier: a vGPU class's license Secret, copied into every namespace that uses it
(DESIGN.md §5 "Licenses").

Key: a class name. For a ``vgpu`` class with ``spec.license`` whose source Secret exists in
the license namespace (``Settings.license_namespace``, else the operator's own), the copier
keeps one Secret ``gpu-license-<class>`` in every namespace that holds a claim of the class
(not being deleted): created when missing, rewritten when the source (its resourceVersion or
data) or the featureType changed. Copies no longer needed are deleted: no claim left in
their namespace, the class gone, no longer licensed, or the source gone.

It never touches a Secret it did not make:

* it lists and watches only Secrets labelled ``gpu.cozystack.io/license-of`` (a dedicated
  informer, so the rest of the cluster's Secrets are never cached), and counts one as its
  copy only when the label names the class and the name is ``gpu-license-<class>``;
* when a Secret of that name exists WITHOUT the label (found when a create is refused as
  AlreadyExists), it is left alone: a Warning Event ``LicenseCopyConflict`` on the class
  says so, and the namespace is looked at again after ``conflict_recheck`` seconds (the
  copier cannot watch an unlabelled Secret go away). Labelling that Secret
  ``gpu.cozystack.io/license-of=<class>`` hands it over to the copier;
* deletes carry the copy's uid as a precondition, so a Secret re-made under the same name
  in between is not removed.

With ``gpuForVMs`` off the copier makes and rewrites nothing (no new VM may use a GPU); it
still deletes copies no longer needed, and leaves the needed ones as they are for VMs that
already run.

Events on the class: ``LicenseCopied`` (Normal) when a copy is created or rewritten,
``LicenseCopyRemoved`` (Normal) when one is deleted while the class exists,
``LicenseCopyConflict``, ``LicenseSourceMissing`` and ``LicenseCopyFailed`` (Warning: the
API server refused a copy, e.g. a Secret quota in the namespace; retried with backoff, and
other namespaces are not held up). Log lines carry the same reasons.
"""

from __future__ import annotations

import pykube
import structlog

from gpuoperator import caches as cachesmod
from gpuoperator import names
from gpuoperator.caches import Caches, class_of_claim, own_key
from gpuoperator.model import classes, licensing
from gpuoperator.runtime import errors, informing
from gpuoperator.runtime.client import Client, Obj
from gpuoperator.runtime.controlling import Controller, Result
from gpuoperator.runtime.informing import Informer, InformerOptions, Key
from gpuoperator.runtime.managing import Manager
from gpuoperator.runtime.recording import Recorder
from gpuoperator.settings import Settings

log = structlog.get_logger(__name__)

NAME = "license-copier"
COPIES_INFORMER = "license-copies"
SOURCES_INFORMER = "license-sources"
#: Index of the copies informer: the class a copy serves (its label value).
BY_CLASS = "license-of"

COPIED = "LicenseCopied"
REMOVED = "LicenseCopyRemoved"
CONFLICT = "LicenseCopyConflict"
SOURCE_MISSING = "LicenseSourceMissing"
FAILED = "LicenseCopyFailed"

#: Seconds before a copy that raced the cache (it exists but is not cached yet) is looked
#: at again; its watch event usually comes first.
CACHE_LAG_RECHECK = 1.0


class LicenseCopier:
    def __init__(
        self,
        caches: Caches,
        copies: Informer,
        sources: Informer,
        writer: Client,
        recorder: Recorder,
        *,
        license_namespace: str,
        make_copies: bool = True,
        conflict_recheck: float = 60.0,
    ) -> None:
        self.caches = caches
        self.copies = copies
        self.sources = sources
        self.writer = writer
        self.recorder = recorder
        self.license_namespace = license_namespace
        self.make_copies = make_copies
        self.conflict_recheck = conflict_recheck

    def reconcile(self, key: Key) -> Result | None:
        class_name = key[1]
        cls = self.caches.classes.store.get(("", class_name))
        copies = {
            str(s["metadata"].get("namespace") or ""): s
            for s in self.copies.store.by_index(BY_CLASS, class_name)
            if licensing.is_copy(s, class_name)
        }
        source: Obj | None = None
        wanted: set[str] = set()
        if cls is None:
            why = "ClassGone"
        elif not licensing.licensed(cls):
            why = "NotLicensed"
        else:
            claims = self.caches.claims.store.by_index(cachesmod.BY_CLASS, class_name)
            needing = licensing.namespaces_needing(cls, claims)
            source = self.sources.store.get((self.license_namespace, licensing.secret_name(cls)))
            if source is None:
                why = "SourceGone"
                if needing:
                    self._source_missing(cls, needing)
            else:
                why, wanted = "NoClaims", needing

        for namespace in sorted(set(copies) - wanted):
            self._delete(cls, copies[namespace], why)
        if cls is None or source is None or not wanted:
            return None
        if not self.make_copies:
            log.info(
                "license copies not made or updated",
                reason="GPUForVMsOff",
                gpuclass=class_name,
                namespaces=len(wanted),
            )
            return None

        requeue: float | None = None
        failed: list[errors.ApiError] = []
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
        if failed:
            raise failed[0]  # retried with backoff; the others are done
        return Result(requeue_after=requeue) if requeue is not None else None

    def _sync(self, cls: Obj, source: Obj, namespace: str, existing: Obj | None) -> float | None:
        """Bring one namespace's copy up to date; the seconds after which to look again."""
        desired = licensing.desired_copy(cls, source, namespace)
        if existing is None:
            return self._create(cls, desired)
        if not licensing.copy_outdated(existing, desired):
            return None
        if licensing.replaceable(existing, desired):
            self._replace(cls, existing, desired)
        else:
            # type or immutability cannot change in place: delete, and its delete event
            # brings the class back here to make it again.
            self._delete(cls, existing, "NotReplaceable")
        return None

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

    def _replace(self, cls: Obj, existing: Obj, desired: Obj) -> None:
        self.writer.replace(pykube.Secret, licensing.updated_copy(existing, desired))
        self._copied(cls, desired, "updated")

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

    def _source_missing(self, cls: Obj, needing: set[str]) -> None:
        where = f"{self.license_namespace}/{licensing.secret_name(cls)}"
        log.warning(
            "license source missing",
            reason=SOURCE_MISSING,
            gpuclass=classes.name(cls),
            source=where,
            namespaces=len(needing),
        )
        self.recorder.event(
            cls,
            "Warning",
            SOURCE_MISSING,
            f"license Secret {where} (spec.license.secretName) not found: "
            f"{len(needing)} namespace(s) with claims of this class get no license copy",
            kind=names.GPU_CLASS,
        )


_WHY = {
    "ClassGone": "the class is gone",
    "NotLicensed": "the class no longer has spec.license",
    "SourceGone": "the license source Secret is gone",
    "NoClaims": "no claim of the class is left in the namespace",
}


def _copy_class(secret: Obj) -> list[Key]:
    class_name = ((secret.get("metadata") or {}).get("labels") or {}).get(names.LICENSE_OF_LABEL)
    return [("", class_name)] if class_name else []


def register(
    manager: Manager,
    caches: Caches,
    recorder: Recorder,
    settings: Settings,
    operator_namespace: str,
    workers: int = 1,
) -> Controller[Key]:
    """Wire the copier: its two Secret informers (labelled copies cluster-wide, sources in
    the license namespace) and the class, claim, copy and source events that enqueue a
    class."""
    license_namespace = settings.license_namespace or operator_namespace
    copies = manager.informer(
        pykube.Secret,
        InformerOptions(
            label_selector=names.LICENSE_OF_LABEL,
            indexers={BY_CLASS: informing.by_label(names.LICENSE_OF_LABEL)},
        ),
        name=COPIES_INFORMER,
    )
    sources = manager.informer(
        pykube.Secret, InformerOptions(namespace=license_namespace), name=SOURCES_INFORMER
    )
    reconciler = LicenseCopier(
        caches,
        copies,
        sources,
        manager.writer,
        recorder,
        license_namespace=license_namespace,
        make_copies=settings.gpu_for_vms,
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
            (copies, _copy_class),
            (sources, by_source),
        ],
    )
    return controller
