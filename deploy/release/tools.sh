#!/usr/bin/env bash
# The release's tools, each built once into a cache keyed by its version:
#
#   deploy/release/tools.sh cosign|krew|cyclonedx   # prints the binary's path
#
# cosign and krew are built from their Go modules (deploy/release/go/*,
# pinned by go.sum), cargo-cyclonedx from crates.io (--locked). The release
# workflow and `make release-dry-run` both take them from here, so the
# steps a dry run proves are the steps a tag runs.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT="${CONFIG_SNAPSHOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/config-snapshot}/tools"
COSIGN_VERSION=v2.6.2
KREW_VERSION=v0.4.3
CYCLONEDX_VERSION=0.5.9

go_tool() { # go_tool NAME VERSION PACKAGE
  local dir="$ROOT/$1-$2"
  if [ ! -x "$dir/$1" ]; then
    command -v go >/dev/null || { echo "tools.sh: Go is not installed" >&2; exit 3; }
    grep -q "$3 $2" "$HERE/go/$1/go.mod" || { echo "tools.sh: go/$1/go.mod does not pin $2" >&2; exit 3; }
    mkdir -p "$dir"
    (cd "$HERE/go/$1" && go build -trimpath -o "$dir/$1.tmp" "$3/cmd/$1") >&2
    mv "$dir/$1.tmp" "$dir/$1"
  fi
  echo "$dir/$1"
}

case "${1:-}" in
  cosign) go_tool cosign "$COSIGN_VERSION" github.com/sigstore/cosign/v2 ;;
  krew) go_tool krew "$KREW_VERSION" sigs.k8s.io/krew ;;
  cyclonedx)
    dir="$ROOT/cargo-cyclonedx-$CYCLONEDX_VERSION"
    if [ ! -x "$dir/bin/cargo-cyclonedx" ]; then
      cargo install cargo-cyclonedx --version "$CYCLONEDX_VERSION" --locked --root "$dir.tmp" >&2
      rm -rf "$dir" && mv "$dir.tmp" "$dir"
    fi
    echo "$dir/bin/cargo-cyclonedx" ;;
  *) echo "usage: tools.sh cosign|krew|cyclonedx" >&2; exit 2 ;;
esac
