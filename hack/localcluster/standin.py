"""``python -m localcluster.standin --kubeconfig K``: the KubeVirt stand-in as a process.

No KubeVirt runs on the local control plane; ``make up`` runs this instead, so a VMI gets
a launcher pod and a status the way virt-controller would give them
(``harness.kubevirt.KubeVirtSimulator``, the same stand-in the e2e suite uses). It is a
stand-in for virt-controller only: no virt-handler, no VM ever boots. SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

import pykube

from harness.kubevirt import KubeVirtSimulator, controller_client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster.standin", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    api = pykube.HTTPClient(pykube.KubeConfig.from_file(args.kubeconfig), timeout=30)
    # As KubeVirt's controller service account (made here with the admin's kubeconfig): the
    # admission policies let only it create launcher pods.
    simulator = KubeVirtSimulator(controller_client(api))
    simulator.start()
    logging.info("kubevirt stand-in running (virt-controller's part: launcher pods, VMI status)")
    stop.wait()
    simulator.stop()
    logging.info("kubevirt stand-in stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
