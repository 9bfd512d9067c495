#!/usr/bin/env bash
# One CLI archive of a release, and the krew manifest that installs them:
#
#   deploy/release/archive.sh pack BINARY OS ARCH DIR   # prints the archive's path
#   deploy/release/archive.sh krew VERSION DIR [BASE_URL] # the manifest, from DIR's SHA256SUMS
#
# An archive holds the binary as `config-snapshot`, the LICENSE and the
# README, under fixed owners and times, so one binary always makes the same
# bytes. macOS binaries are built on the release workflow's macOS runner
# and packed here on Linux, with the same GNU tar.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=https://github.com/config-snapshot/config-snapshot
PLATFORMS="linux/amd64 linux/arm64 darwin/amd64 darwin/arm64"

pack() {
  local binary=$1 os=$2 arch=$3 dir=$4 version stage name
  version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
  name="config-snapshot-$version-$os-$arch"
  stage=$(mktemp -d)
  install -m 0755 "$binary" "$stage/config-snapshot"
  install -m 0644 LICENSE README.md "$stage/"
  mkdir -p "$dir"
  # The commit's time, not the clock's: the same commit packs the same bytes.
  local when=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
  tar --sort=name --mtime="@$when" --owner=0 --group=0 --numeric-owner -C "$stage" \
    -cf - config-snapshot LICENSE README.md \
    | gzip -n > "$dir/$name.tar.gz"
  rm -rf "$stage"
  echo "$dir/$name.tar.gz"
}

# The krew manifest (kubectl krew install --manifest=… [--archive=…]):
# one platform per archive that DIR's SHA256SUMS lists.
krew() {
  local version=$1 dir=$2 base=${3:-$REPO/releases/download/v$1}
  cat <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: config-snapshot
spec:
  version: v$version
  homepage: $REPO
  shortDescription: Roll ConfigMaps and Secrets back with their workloads
  description: |
    The config-snapshot CLI, as a kubectl plugin: status, plan, history,
    diff, approve, release and keys for the config-snapshot webhook, which
    makes Deployments and other workloads roll forward and back together
    with the ConfigMaps and Secrets they use.
  platforms:
YAML
  local p os arch file sum
  for p in $PLATFORMS; do
    os=${p%/*} arch=${p#*/}
    file="config-snapshot-$version-$os-$arch.tar.gz"
    sum=$(awk -v f="$file" '$2 == f || $2 == "*" f { print $1 }' "$dir/SHA256SUMS")
    [ -n "$sum" ] || continue
    cat <<YAML
  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $base/$file
    sha256: $sum
    bin: config-snapshot
YAML
  done
}

case "${1:-}" in
  pack) pack "${2:?binary}" "${3:?os}" "${4:?arch}" "${5:?directory}" ;;
  krew) krew "${2:?version}" "${3:?directory}" "${4:-}" ;;
  *) echo "usage: archive.sh pack BINARY OS ARCH DIR | krew VERSION DIR [BASE_URL]" >&2; exit 2 ;;
esac
