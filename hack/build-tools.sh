#!/usr/bin/env bash
# Build a static-check tool from the Go module proxy into the cache outside the repo and
# print its path (the last line of stdout).
#
#   hack/build-tools.sh promtool      # Prometheus' rule checker and rule unit-test runner
#   hack/build-tools.sh actionlint    # the GitHub Actions workflow linter
#   hack/build-tools.sh nullwebhook   # the benchmarks' webhook that allows every review
#
# Binaries land in $GPUOP_CACHE/bin/<name>-<version> (GPUOP_CACHE defaults to
# ${XDG_CACHE_HOME:-~/.cache}/gpuoperator, shared with hack/build-binaries.sh); a cached
# binary is returned at once. A cold build prints its progress on stderr.
#
# promtool is built with `go build` inside a small wrapper module that requires the
# Prometheus module: that works for every release, also those whose go.mod carries replace
# directives (`go install module@version` refuses those). nullwebhook is this repository's
# own Go source (hack/bench/nullwebhook, standard library only); its binary is named after a
# hash of that source, so an edit builds a new one.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools.env
source "$here/tools.env"
cache=${GPUOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuoperator}
bindir="$cache/bin"
workdir="$cache/build"
mkdir -p "$bindir" "$workdir"

t0=$SECONDS
say() { printf '[tools %4ds] %s\n' $((SECONDS - t0)) "$*" >&2; }
die() { printf 'build-tools: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "Go is not installed (need Go >= 1.26 on PATH to build $1)"

build_promtool() {
  local target="$bindir/promtool-$PROMTOOL_VERSION"
  if [ ! -x "$target" ]; then
    local mod="$workdir/promtool-$PROMTOOL_VERSION"
    mkdir -p "$mod"
    if [ ! -f "$mod/go.mod" ]; then
      say "promtool $PROMTOOL_VERSION: writing wrapper module"
      printf 'module gpuoperator.local/promtoolwrapper\n\ngo 1.26.0\n\nrequire github.com/prometheus/prometheus %s\n' \
        "$PROMTOOL_VERSION" >"$mod/go.mod.tmp"
      mv "$mod/go.mod.tmp" "$mod/go.mod"
    fi
    say "promtool $PROMTOOL_VERSION: downloading modules (first time only)"
    (cd "$mod" && GOFLAGS=-mod=mod go mod download github.com/prometheus/prometheus) \
      || die "go mod download github.com/prometheus/prometheus@$PROMTOOL_VERSION failed"
    say "promtool $PROMTOOL_VERSION: building (a cold build takes several minutes)"
    (cd "$mod" && GOFLAGS=-mod=mod go build -trimpath -ldflags '-s -w' -o "$target.tmp" \
      github.com/prometheus/prometheus/cmd/promtool) || die "building promtool failed"
    mv "$target.tmp" "$target"
    say "promtool $PROMTOOL_VERSION: built"
  fi
  echo "$target"
}

build_actionlint() {
  local target="$bindir/actionlint-$ACTIONLINT_VERSION"
  if [ ! -x "$target" ]; then
    local gobin="$workdir/actionlint-$ACTIONLINT_VERSION"
    say "actionlint $ACTIONLINT_VERSION: go install from the module proxy"
    GOBIN="$gobin" go install -trimpath -ldflags '-s -w' \
      "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" \
      || die "go install actionlint@$ACTIONLINT_VERSION failed"
    mv "$gobin/actionlint" "$target"
    say "actionlint $ACTIONLINT_VERSION: built"
  fi
  echo "$target"
}

build_nullwebhook() {
  local src="$here/bench/nullwebhook"
  local digest
  digest=$(cat "$src/go.mod" "$src/main.go" | sha256sum | cut -c1-12)
  local target="$bindir/nullwebhook-$digest"
  if [ ! -x "$target" ]; then
    say "nullwebhook $digest: building from hack/bench/nullwebhook (standard library only)"
    (cd "$src" && GOFLAGS=-mod=mod go build -trimpath -ldflags '-s -w' -o "$target.tmp" .) \
      || die "building nullwebhook failed"
    mv "$target.tmp" "$target"
    say "nullwebhook $digest: built"
  fi
  echo "$target"
}

# One build of a tool at a time: a second caller (another make, a parallel test run) waits
# for the first and then finds the binary cached, instead of both writing the same
# "$target.tmp" and one of them failing to move it.
lock() {
  exec 9>"$bindir/.$1.lock"
  flock 9 || die "could not lock $bindir/.$1.lock"
}

case "${1:-}" in
  promtool) lock promtool && build_promtool ;;
  actionlint) lock actionlint && build_actionlint ;;
  nullwebhook) lock nullwebhook && build_nullwebhook ;;
  *) die "usage: $0 promtool|actionlint|nullwebhook" ;;
esac
