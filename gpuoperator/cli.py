"""The ``gpuoperator`` command: the composition root that wires the operator together."""

from __future__ import annotations

import argparse
import sys

from gpuoperator import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuoperator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version")
    args = parser.parse_args(argv)
    if args.command == "version":
        print(f"gpuoperator {__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
