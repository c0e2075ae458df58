"""``python -m localcluster.drastandin --kubeconfig K --profile P``: the DRA driver stand-in as
a process, for ``make up``.

A DRA driver's kubelet plugin publishes each node's devices in a ResourceSlice; no driver
runs on the local control plane, so this publishes, for every node of the profile with
``dra`` GPUs, what the driver stand-in of the tests publishes (``test/harness/dra_driver.py``:
one pool per node, the device attributes a GPU driver sets). It acts as the driver's own
ServiceAccount (``gpu-dra-driver/dra-driver``, ``hack/localcluster/dra-driver.yaml``: it may
manage ResourceSlices only). Started again, it takes over the slices it published before
(their pool generation goes up). SIGTERM stops it; the slices stay, as a driver's do until
its node goes.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

import pykube

from gpuoperator.kinds import ResourceSlice
from harness import dra_driver
from localcluster import profile

NAMESPACE = "gpu-dra-driver"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster.drastandin", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--profile", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    nodes = profile.dra_nodes(profile.load(args.profile))
    api = pykube.HTTPClient(pykube.KubeConfig.from_file(args.kubeconfig), timeout=30)
    driver = dra_driver.DraDriver(dra_driver.driver_client(api, NAMESPACE))
    for node, groups in sorted(nodes.items()):
        gpus = dra_driver.gpus_of(node, groups)
        published = ResourceSlice.objects(driver.client).get_or_none(name=driver.slice_name(node))
        if published is not None:  # published before: republished at the next generation
            driver.gpus[node] = gpus
            driver.generation[node] = int(published.obj["spec"]["pool"].get("generation") or 0)
        driver.publish(node, gpus)
        logging.info("published %d DRA device(s) of node %s", len(gpus), node)
    logging.info("dra driver stand-in running (%d node(s) with DRA GPUs)", len(nodes))
    stop.wait()
    logging.info("dra driver stand-in stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
