#!/usr/bin/env bash
# Builds the current upstream servers that the compatibility tests run beside Debian's: each from
# the Go module pinned in scripts/servers/<server>/go.mod (go.sum holds its checksums), into a
# cache outside the repository keyed by version, so a second run builds nothing.
#
#   scripts/build-servers.sh            build what is missing, print where the binaries are
#   FLOPWATCH_SERVER_CACHE=DIR          cache root (default ~/.cache/flopwatch/servers)
#
# A server that fails to build is named with the last lines of its build, and the script exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${FLOPWATCH_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flopwatch/servers}
command -v go >/dev/null 2>&1 || {
  echo "build-servers: 'go' not found: install Go 1.26 or newer (the Go toolchain, golang.org/dl)" >&2
  exit 1
}
# A module whose go.mod asks for a newer Go than the local one gets it from the module proxy.
export GOTOOLCHAIN=${FLOPWATCH_GOTOOLCHAIN:-auto} GOFLAGS=-mod=readonly CGO_ENABLED=0

# server | upstream module | packages to build (their last path element is the binary) | tags | version variable
SERVERS=(
  "prometheus|github.com/prometheus/prometheus|cmd/prometheus cmd/promtool|netgo,remove_all_sd|github.com/prometheus/common/version.Version"
  "alertmanager|github.com/prometheus/alertmanager|cmd/alertmanager cmd/amtool|netgo|github.com/prometheus/common/version.Version"
  "victoriametrics|github.com/VictoriaMetrics/VictoriaMetrics|app/victoria-metrics app/vmalert app/vmagent|netgo|github.com/VictoriaMetrics/VictoriaMetrics/lib/buildinfo.Version"
)

# The version go.mod pins for `module`, without the leading v, in the server's own numbering
# (Prometheus 3.x is the module's v0.3xx.y).
pinned_version() {
  local gomod=$1 module=$2 tag
  tag=$(awk -v m="$module" '$1 == m { print $2 } $1 == "require" && $2 == m { print $3 }' "$gomod")
  [ -n "$tag" ] || { echo "build-servers: $gomod does not require $module" >&2; exit 1; }
  tag=${tag#v}
  if [[ $module == github.com/prometheus/prometheus && $tag == 0.* ]]; then
    local minor=${tag#0.}; minor=${minor%%.*}
    tag="$((minor / 100)).$((minor % 100)).${tag##*.}"
  fi
  echo "$tag"
}

mkdir -p "$CACHE"
for entry in "${SERVERS[@]}"; do
  IFS='|' read -r server module packages tags version_var <<<"$entry"
  dir=scripts/servers/$server
  version=$(pinned_version "$dir/go.mod" "$module")
  dest=$CACHE/$server-$version
  if [ -f "$dest/.built" ]; then
    continue
  fi
  echo "build-servers: building $server $version from its Go module (first run only; a few minutes)" >&2
  tmp=$(mktemp -d "$CACHE/.$server-$version.XXXXXX")
  targets=()
  for package in $packages; do targets+=("$module/$package"); done
  version_string=$version
  [ "$server" = victoriametrics ] && version_string="victoria-metrics-v$version"
  started=$SECONDS
  if ! (cd "$dir" && go build -trimpath -tags "$tags" -ldflags "-s -X $version_var=$version_string" \
          -o "$tmp/" "${targets[@]}") >"$tmp/build.log" 2>&1; then
    echo "build-servers: building $server $version failed; the last lines of its build:" >&2
    tail -n 20 "$tmp/build.log" >&2
    rm -rf "$tmp"
    exit 1
  fi
  printf 'server=%s\nversion=%s\nseconds=%s\ngo=%s\n' "$server" "$version" "$((SECONDS - started))" \
    "$(cd "$dir" && go env GOVERSION)" >"$tmp/.built"
  rm -f "$tmp/build.log"
  rm -rf "$dest"
  mv "$tmp" "$dest"
  echo "build-servers: $server $version built in $((SECONDS - started)) s into $dest" >&2
done
