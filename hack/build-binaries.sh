#!/usr/bin/env bash
# Build the local control plane's binaries from Go modules into a cache outside the repo.
#
#   hack/build-binaries.sh            # build what is missing, print the bin directory last
#
# Binaries land in $GPUOP_CACHE/bin/<name>-<version> (GPUOP_CACHE defaults to
# ${XDG_CACHE_HOME:-~/.cache}/gpuoperator), so a second run finds them and returns at once.
# A binary already on PATH or in $KUBEBUILDER_ASSETS is reused when its version fits.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${GPUOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuoperator}
bindir="$cache/bin"
workdir="$cache/build"
mkdir -p "$bindir" "$workdir"

t0=$SECONDS
say() { printf '[build %4ds] %s\n' $((SECONDS - t0)) "$*" >&2; }
die() { printf 'build-binaries: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "Go is not installed (need Go >= 1.26 on PATH to build the control plane)"

# One build at a time: a second caller waits for the first, then finds everything cached.
exec 9>"$bindir/.build-binaries.lock"
flock 9 || die "could not lock $bindir/.build-binaries.lock"

kminor=$(echo "$KUBE_VERSION" | cut -d. -f2)
stage_version="v0.${KUBE_VERSION#v1.}"

# reuse NAME VERSION-PATTERN: link a fitting binary from KUBEBUILDER_ASSETS or PATH into the cache.
reuse() {
  local name=$1 want=$2 target=$3 cand
  for cand in ${KUBEBUILDER_ASSETS:+"$KUBEBUILDER_ASSETS/$name"} "$(command -v "$name" 2>/dev/null || true)"; do
    [ -n "$cand" ] && [ -x "$cand" ] || continue
    if "$cand" --version 2>/dev/null | grep -qF "$want"; then
      ln -sf "$cand" "$target"
      say "$name: reusing $cand ($want)"
      return 0
    fi
  done
  return 1
}

build_kube() {
  local missing=()
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    local target="$bindir/$c-$KUBE_VERSION"
    [ -x "$target" ] && continue
    reuse "$c" "$KUBE_VERSION" "$target" && continue
    missing+=("$c")
  done
  [ ${#missing[@]} -eq 0 ] && { say "kubernetes $KUBE_VERSION: cached"; return; }
  local mod="$workdir/kubernetes-$KUBE_VERSION"
  mkdir -p "$mod"
  if [ ! -f "$mod/go.mod" ]; then
    say "kubernetes $KUBE_VERSION: writing wrapper module (staging modules at $stage_version)"
    {
      echo "module gpuoperator.local/kubewrapper"
      echo
      echo "go 1.26.0"
      echo
      echo "require k8s.io/kubernetes $KUBE_VERSION"
      echo
      echo "replace ("
      for s in api apiextensions-apiserver apimachinery apiserver cli-runtime client-go \
        cloud-provider cluster-bootstrap code-generator component-base component-helpers \
        controller-manager cri-api cri-client cri-streaming csi-translation-lib \
        dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator \
        kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils \
        pod-security-admission sample-apiserver streaming; do
        echo "	k8s.io/$s => k8s.io/$s $stage_version"
      done
      echo ")"
    } >"$mod/go.mod.tmp"
    mv "$mod/go.mod.tmp" "$mod/go.mod"
  fi
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kminor -X k8s.io/component-base/version.gitTreeState=clean"
  say "kubernetes $KUBE_VERSION: downloading modules (first time only)"
  (cd "$mod" && GOFLAGS=-mod=mod go mod download k8s.io/kubernetes) || die "go mod download k8s.io/kubernetes@$KUBE_VERSION failed"
  for c in "${missing[@]}"; do
    local pkg="k8s.io/kubernetes/cmd/$c"
    say "kubernetes $KUBE_VERSION: building $c (a cold build takes several minutes)"
    local s=$SECONDS
    (cd "$mod" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bindir/$c-$KUBE_VERSION.tmp" "$pkg") \
      || die "building $c $KUBE_VERSION failed (see the go output above)"
    mv "$bindir/$c-$KUBE_VERSION.tmp" "$bindir/$c-$KUBE_VERSION"
    say "kubernetes $KUBE_VERSION: $c built in $((SECONDS - s))s"
  done
}

build_etcd() {
  local target="$bindir/etcd-$ETCD_VERSION"
  [ -x "$target" ] && { say "etcd $ETCD_VERSION: cached"; return; }
  reuse etcd "${ETCD_VERSION#v}" "$target" && return
  local mod="$workdir/etcd-$ETCD_VERSION"
  mkdir -p "$mod"
  if [ ! -f "$mod/go.mod" ]; then
    printf 'module gpuoperator.local/etcdwrapper\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$mod/go.mod"
  fi
  say "etcd $ETCD_VERSION: building"
  local s=$SECONDS
  (cd "$mod" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$target.tmp" go.etcd.io/etcd/server/v3) \
    || die "building etcd $ETCD_VERSION failed (see the go output above)"
  mv "$target.tmp" "$target"
  say "etcd $ETCD_VERSION: built in $((SECONDS - s))s"
}

build_kwok() {
  local target="$bindir/kwok-$KWOK_VERSION"
  [ -x "$target" ] && { say "kwok $KWOK_VERSION: cached"; return; }
  reuse kwok "$KWOK_VERSION" "$target" && return
  say "kwok $KWOK_VERSION: building"
  local s=$SECONDS gobin="$workdir/kwok-$KWOK_VERSION"
  mkdir -p "$gobin"
  GOBIN="$gobin" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" \
    || die "building kwok $KWOK_VERSION failed (see the go output above)"
  mv "$gobin/kwok" "$target"
  say "kwok $KWOK_VERSION: built in $((SECONDS - s))s"
}

build_etcd
build_kwok
build_kube
say "all binaries ready in $bindir"
echo "$bindir"
