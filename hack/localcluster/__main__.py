"""``python -m localcluster up|down|status``: the local control plane for development."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from localcluster.cluster import REPO, LocalCluster
from localcluster.processes import ClusterError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster", description=__doc__)
    parser.add_argument("--name", default="dev", help="cluster name (default: dev)")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build (once) and start the cluster, seed nodes and CRDs")
    up.add_argument("--profile", type=Path, default=REPO / "hack" / "profiles" / "default.yaml")
    up.add_argument(
        "--crds",
        type=Path,
        action="append",
        default=None,
        help="CRD manifests to apply first (default: config/crd)",
    )
    up.add_argument(
        "--apply",
        type=Path,
        action="append",
        default=None,
        help="manifests to apply after the CRDs (default: config/samples)",
    )
    up.add_argument(
        "--no-operator",
        dest="operator",
        action="store_false",
        help="start only the control plane, not the operator",
    )
    sub.add_parser("down", help="stop the cluster's processes (only those it started)")
    sub.add_parser("status", help="which components run")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.name)
    try:
        if args.command == "up":
            crds = args.crds or [REPO / "config" / "crd"]
            manifests = args.apply or [REPO / "config" / "samples"]
            took = cluster.up(args.profile, crds=crds, manifests=manifests)
            if args.operator:
                cluster.run_operator()
            print(
                f"cluster {args.name!r} is up ({took:.1f}s); operator log: {cluster.operator.log}\n"
                f"Point kubectl at it with:\n"
                f"  export KUBECONFIG={cluster.kubeconfig}\n"
                f"  kubectl get nodes,gpuclasses,gpunodes\n"
                f"Stop it with: make down"
            )
        elif args.command == "down":
            if not cluster.down():
                print(f"cluster {args.name!r} was not running")
        else:
            states = {**cluster.running(), "gpuoperator": cluster.operator.running()}
            for name, running in states.items():
                print(f"{name:26} {'running' if running else 'stopped'}")
            print(f"kubeconfig: {cluster.kubeconfig}")
    except (ClusterError, ValueError) as exc:
        print(f"localcluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
