#!/usr/bin/env bash
# Build gpuoperator's image: `hack/image/build.sh <name:tag>` (make image runs it).
#
# With Docker when its daemon answers: docker build, BASE defaulting to the Dockerfile's
# (python:3.11-slim). Otherwise with podman (buildah underneath) and this repository's
# containers.conf (hack/image/podman.sh); its BASE, unless given, is python:3.11-slim when
# podman already has it, else a base made here from Debian packages (hack/image/base.sh,
# cached), for machines that reach no image registry. Layers are cached by the engine, so a
# rebuild after a source change redoes only the steps from the changed COPY on.
#
#   BASE=<image>         the base (any image with python3 >= 3.11 and its venv module)
#   IMAGE_ENGINE=docker|podman   force an engine
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
image=${1:?usage: build.sh <name:tag>}

engine=${IMAGE_ENGINE:-}
if [ -z "$engine" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v podman >/dev/null; then
    engine=podman
  else
    echo "make image: neither a Docker daemon nor podman here;" \
      "install podman (apt-get install podman buildah runc mmdebstrap)" >&2
    exit 1
  fi
fi

args=()

start=$SECONDS
case $engine in
  docker)
    [ -n "${BASE:-}" ] && args+=(--build-arg "BASE=$BASE")
    docker build "${args[@]}" -t "$image" "$repo"
    ;;
  podman)
    podman=("$here/podman.sh")
    base=${BASE:-}
    if [ -z "$base" ]; then
      if "${podman[@]}" image exists docker.io/library/python:3.11-slim; then
        base=docker.io/library/python:3.11-slim
      else
        base=$("$here/base.sh")
      fi
    fi
    # pip inside the build trusts the host's CA bundle when the host sets one (a machine
    # that reaches PyPI through a proxy of its own): mounted for the build only, not kept.
    if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
      args+=(--volume "$PIP_CERT:/run/build-ca.crt:ro" --build-arg PIP_CERT=/run/build-ca.crt)
    fi
    echo "make image: podman build on $base" >&2
    # Host network: the build's pip reaches PyPI as the host does (no bridge or NAT needed).
    "${podman[@]}" build --network=host --layers --build-arg "BASE=$base" "${args[@]}" \
      -t "$image" "$repo"
    ;;
  *)
    echo "make image: IMAGE_ENGINE=$engine: docker or podman" >&2
    exit 1
    ;;
esac
echo "make image: $image built with $engine in $((SECONDS - start))s" >&2
