"""``python -m localcluster up|down|status``: the local control plane for development."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from localcluster import deployment, profile
from localcluster.cluster import KUBEVIRT_CRDS, REPO, SAMPLES, LocalCluster, kubectl_binary
from localcluster.processes import ClusterError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster", description=__doc__)
    parser.add_argument("--name", default="dev", help="cluster name (default: dev)")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "up",
        help="build (once) and start the cluster with simulated nodes, deploy config/overlays/dev, "
        "run the operator, the KubeVirt stand-in and (for nodes with DRA GPUs) the DRA driver "
        "stand-in",
    )
    up.add_argument("--profile", type=Path, default=REPO / "hack" / "profiles" / "dev.yaml")
    up.add_argument(
        "--crds",
        type=Path,
        action="append",
        default=None,
        help="more CRD manifests to apply first (default: the KubeVirt CRDs the stand-in serves)",
    )
    up.add_argument(
        "--apply",
        type=Path,
        action="append",
        default=None,
        help="manifests to apply after the deployment (default: config/samples)",
    )
    up.add_argument(
        "--operator",
        choices=("process", "image"),
        default="process",
        help="how the operator runs: a process of this checkout (default) or two replicas of "
        "the built image under podman with the Deployment's settings (make image first)",
    )
    up.add_argument(
        "--no-operator",
        dest="run_operator",
        action="store_false",
        help="deploy the overlay but run neither the operator nor the KubeVirt stand-in",
    )
    sub.add_parser("down", help="stop the cluster's processes (only those it started)")
    sub.add_parser("status", help="which components run")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.name)
    try:
        if args.command == "up":
            started = time.monotonic()
            cluster.up(args.profile, crds=args.crds or [KUBEVIRT_CRDS])
            rendered = deployment.render(kubectl_binary())
            cluster.deploy(rendered)
            cluster.apply([], args.apply or [SAMPLES])
            operator_log = cluster.operator.log
            if args.run_operator and args.operator == "image":
                cluster.run_image_operator()
                operator_log = cluster.image_operator.log
                cluster.run_kubevirt_standin()
            elif args.run_operator:
                cluster.run_operator(rendered=rendered)
                cluster.run_kubevirt_standin()
            if args.run_operator and profile.dra_nodes(profile.load(args.profile)):
                cluster.run_dra_standin(args.profile)
            print(
                f"cluster {args.name!r} is up ({time.monotonic() - started:.1f}s); "
                f"operator log: {operator_log}\n"
                f"Point kubectl (the pinned one) at it with:\n"
                f"  export KUBECONFIG={cluster.kubeconfig} PATH={cluster.dir / 'bin'}:$PATH\n"
                f"  kubectl get nodes,gpuclasses,gpunodes\n"
                f"Stop it with: make down{'' if args.name == 'dev' else f' CLUSTER={args.name}'}"
            )
        elif args.command == "down":
            if not cluster.down():
                print(f"cluster {args.name!r} was not running")
        else:
            states = {
                **cluster.running(),
                "gpuoperator": cluster.operator.running(),
                "gpuoperator (image)": cluster.image_operator.running(),
                "kubevirt-standin": cluster.kubevirt.running(),
                "dra-standin": cluster.dra.running(),
            }
            for name, running in states.items():
                print(f"{name:26} {'running' if running else 'stopped'}")
            print(f"kubeconfig: {cluster.kubeconfig}")
    except (ClusterError, ValueError) as exc:
        print(f"localcluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
