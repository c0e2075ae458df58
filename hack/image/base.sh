#!/usr/bin/env bash
# A base for the image made from Debian packages, for machines that reach no image registry
# (so `FROM python:3.11-slim` cannot be pulled): mmdebstrap's minbase with Python and venv,
# imported into podman. Prints the image's name on stdout; progress goes to stderr.
#
#   hack/image/base.sh            # -> localhost/gpuoperator-base:bookworm-<key>
#
# Cached by a key of what it is made of (suite, variant, packages, mirror): the tar under
# $GPUOP_CACHE/image-base/ and the podman image of the same name. A second run, or a run
# after `podman rmi`, costs seconds; changing the package list makes a new base.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

SUITE=${IMAGE_BASE_SUITE:-bookworm}
VARIANT=minbase
# python3 is Debian's 3.11 (/usr/bin/python3); python3-venv brings ensurepip's wheels, so the
# Dockerfile makes the same /opt/gpuoperator venv on this base as on python:3.11-slim.
PACKAGES=python3,python3-venv
MIRROR=${IMAGE_BASE_MIRROR:-http://deb.debian.org/debian}

cache=${GPUOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuoperator}/image-base
key=$(printf '%s\n' "$SUITE" "$VARIANT" "$PACKAGES" "$MIRROR" | sha256sum | cut -c1-12)
name=localhost/gpuoperator-base:$SUITE-$key
tar=$cache/$SUITE-$key.tar
podman=("$here/podman.sh")

if "${podman[@]}" image exists "$name"; then
  echo "$name"
  exit 0
fi
if [ ! -s "$tar" ]; then
  command -v mmdebstrap >/dev/null || {
    echo "image base: mmdebstrap is not installed (apt-get install mmdebstrap)" >&2
    exit 1
  }
  mkdir -p "$cache"
  echo "image base: mmdebstrap $VARIANT $SUITE with $PACKAGES (a few minutes, once)" >&2
  start=$SECONDS
  # Written next to the cache entry and renamed, so an interrupted run leaves no half tar
  # (mmdebstrap picks the output's format from its name: it must end in .tar).
  mmdebstrap --quiet --variant="$VARIANT" --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$SUITE" "$tar.part.tar" "$MIRROR" >&2
  mv "$tar.part.tar" "$tar"
  echo "image base: built in $((SECONDS - start))s ($(du -h "$tar" | cut -f1))" >&2
fi
"${podman[@]}" import --quiet \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' "$tar" "$name" >/dev/null
echo "$name"
