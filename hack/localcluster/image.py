"""``python -m localcluster.image --name N``: the operator as replicas of the built image.

``make up OPERATOR=image`` runs this as a process of the local cluster instead of the
operator from this checkout: ``--replicas`` (default 2) podman containers of the image
(``IMAGE``, as for ``make image``), each with the rendered Deployment's settings mapped
to podman's flags and a TokenRequest token of its ServiceAccount mounted where the kubelet
mounts it (``harness.containers``), and the endpoints thread that keeps the webhook
configurations pointed at a ready one (``harness.replicas``): the same replicas the e2e
suite's ``E2E_OPERATOR=podman`` mode runs. The names of the containers go to
``<state>/image-replicas.json`` as they start, so ``make down`` can remove them even if
this process is gone. SIGTERM stops every replica as a pod is deleted (each must exit 0
within its grace period), unregisters the webhooks and exits.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import threading
import time

from harness.containers import Launcher, MissingPrerequisiteError, image_name, require_image
from harness.replicas import Replicas
from localcluster import deployment
from localcluster.cluster import LocalCluster, kubectl_binary

#: The file of the containers' names, under the cluster's state directory.
NAMES_FILE = "image-replicas.json"
#: The prefix of the containers' names (as the Deployment's pods are named).
PREFIX = "gpu-operator"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster.image", description=__doc__)
    parser.add_argument("--name", required=True, help="the local cluster's name")
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        image = require_image(image_name())
    except MissingPrerequisiteError as exc:
        logging.error("%s", exc)
        return 1
    cluster = LocalCluster(args.name)
    rendered = deployment.render(kubectl_binary())
    work = cluster.dir / "image"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    launcher = Launcher(
        image, cluster, rendered, work, prefix=PREFIX, record=cluster.dir / NAMES_FILE
    )
    replicas = Replicas(launcher, cluster.kubeconfig, rendered, args.replicas)
    started = time.monotonic()
    try:
        with replicas.serving():
            logging.info(
                "serving: %d replicas of %s (%s), webhooks on %s, ready after %.1fs",
                len(replicas.replicas),
                image,
                ", ".join(r.name for r in replicas.replicas),
                replicas.endpoint(),
                time.monotonic() - started,
            )
            while not stop.wait(1):
                replicas.check()
    except Exception:
        logging.exception("the replicas failed")
        return 1
    logging.info("stopped: every replica exited 0, webhooks unregistered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
