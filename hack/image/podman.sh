#!/usr/bin/env bash
# podman with this repository's containers.conf (runc, cgroupfs, no ulimits of its own):
# `hack/image/podman.sh <podman args>`. The user's own podman configuration is not read.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CONTAINERS_CONF="$here/containers.conf"
exec podman "$@"
