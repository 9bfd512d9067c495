#!/usr/bin/env bash
# Every artifact of a release, built, signed, and verified again as a user
# would (deploy/release/verify.sh):
#
#   deploy/release/release.sh [build|publish]     # both by default: `make release-dry-run`
#
# build: the tools; static binaries for linux/amd64 and linux/arm64 (the
#   arm64 one run under qemu-aarch64); the policy; the CLI archives (and
#   the macOS ones from DARWIN_DIR's darwin-amd64 and darwin-arm64, built on
#   the workflow's macOS runner); the chart; CycloneDX SBOMs; serve's image
#   roots for both platforms, each with the module its own binary
#   precompiled; SHA256SUMS and the krew manifest. Into RELEASE_DIR
#   (default target/release-dry-run): dist/ (the release's files), image/
#   (the roots), bin/ (the tools). Needs no credentials.
# publish: pushes the image (one index), the policy and the chart, signs
#   each (the image with its per-platform images, and its SBOM as an
#   attestation) and SHA256SUMS, then verifies every piece as a user would;
#   the dry run also checks that verification refuses tampered files and
#   another key, runs the arm64 image under qemu, and installs the kubectl
#   plugin with krew. Runs no compiler.
#
# The dry run publishes to a local registry it starts and signs with a
# local cosign key. The release workflow runs `build` in a job without
# credentials and `publish` in a job that has them, with REGISTRY (where to
# push), KEYLESS=1 (cosign signs with the workflow's OIDC identity) and
# VERIFY_IDENTITY (the identity users check); so a green dry run proves a
# tag's steps before the tag is pushed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mkdir -p "${RELEASE_DIR:-target/release-dry-run}" && cd "${RELEASE_DIR:-target/release-dry-run}" && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
dist="$out/dist"
bin="$out/bin"
step() { echo "== $*"; }
# quietly COMMAND...: its output only if it fails.
quietly() {
  local log
  log=$("$@" 2>&1) || { echo "failed: $*" >&2; echo "$log" >&2; return 1; }
}
need() { # need COMMAND DEBIAN_PACKAGE
  command -v "$1" >/dev/null && return 0
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
arch_of() { case "$(uname -m)" in aarch64) echo arm64 ;; *) echo amd64 ;; esac; }

build() {
  need qemu-aarch64 qemu-user
  need file file
  step "tools"
  rm -rf "$dist" "$bin" "$out/image"
  mkdir -p "$dist" "$bin" "$out/image"
  ln -s "$(deploy/release/tools.sh cosign)" "$bin/cosign"
  ln -s "$(deploy/release/tools.sh krew)" "$bin/krew"
  ln -s "$(deploy/release/tools.sh cyclonedx)" "$bin/cargo-cyclonedx"
  ln -s "$(e2e-tests/cluster/control-plane.sh crane)" "$bin/crane"
  ln -s "$(e2e-tests/cluster/control-plane.sh helm)" "$bin/helm"
  ln -s "$(e2e-tests/cluster/control-plane.sh kubectl)" "$bin/kubectl"

  step "static binaries for linux/amd64 and linux/arm64"
  local arch kind said
  declare -A binary
  binary[amd64]=$(deploy/release/cross.sh x86_64-unknown-linux-musl)
  binary[arm64]=$(deploy/release/cross.sh aarch64-unknown-linux-musl)
  for arch in amd64 arm64; do
    kind=$(file -b "${binary[$arch]}")
    case "$kind" in *static*) ;; *) echo "the $arch binary is not static: $kind" >&2; exit 1 ;; esac
    case "$arch/$kind" in amd64/*x86-64* | arm64/*aarch64*) ;; *) echo "the $arch binary is for another machine: $kind" >&2; exit 1 ;; esac
    install -m 0755 "${binary[$arch]}" "$bin/config-snapshot-linux-$arch"
  done
  said=$(qemu-aarch64 "${binary[arm64]}" --version)
  [ "$said" = "config-snapshot $version" ] || { echo "under qemu-aarch64 the arm64 binary said: $said" >&2; exit 1; }
  echo "under qemu-aarch64: $said"

  step "the policy, the CLI archives and the chart"
  quietly make --no-print-directory annotated-policy.wasm
  cp annotated-policy.wasm "$dist/policy.wasm"
  for arch in amd64 arm64; do
    deploy/release/archive.sh pack "${binary[$arch]}" linux "$arch" "$dist" >/dev/null
    if [ -n "${DARWIN_DIR:-}" ]; then deploy/release/archive.sh pack "$DARWIN_DIR/darwin-$arch" darwin "$arch" "$dist" >/dev/null; fi
  done
  quietly "$bin/helm" package deploy/helm/config-snapshot -d "$dist"

  step "SBOMs (CycloneDX)"
  deploy/release/sbom.sh "$bin/cargo-cyclonedx" "$version" "$dist"

  step "serve's image roots for linux/amd64 and linux/arm64 (each module precompiled by its own binary)"
  deploy/image/build.sh root policy.wasm "$out/image" "linux/amd64=${binary[amd64]}" "linux/arm64=${binary[arm64]}"
  local module
  for arch in amd64 arm64; do
    # After its one-line header (what it was made from), the module is an ELF object.
    module=$(tar -xOf "$out/image/linux-$arch.tar" ./usr/share/config-snapshot/policy.cwasm | tail -n +2 | file -b -)
    case "$arch/$module" in amd64/*x86-64* | arm64/*aarch64*) echo "linux/$arch module: ${module%%,*}" ;;
      *) echo "the linux/$arch root's module is: $module" >&2; exit 1 ;; esac
  done

  step "SHA256SUMS and the krew manifest"
  sums
  deploy/release/archive.sh krew "$version" "$dist" > "$out/config-snapshot.krew.yaml"
  mv "$out/config-snapshot.krew.yaml" "$dist/"
  sums
}

# SHA256SUMS over every file in dist/ (the manifest included once it exists).
sums() {
  (cd "$dist" && rm -f SHA256SUMS SHA256SUMS.bundle && sha256sum -- * > "$out/SHA256SUMS" && mv "$out/SHA256SUMS" SHA256SUMS)
}

publish() {
  [ -f "$dist/SHA256SUMS" ] && [ -f "$out/image/linux-arm64.tar" ] || { echo "publish: run build first" >&2; exit 2; }
  # The dry run uses the tools its build made. The workflow's publish job
  # holds credentials, so it runs nothing the build job made: its cosign,
  # crane, helm and kwctl come from their own pinned installers, on PATH.
  if [ -z "${KEYLESS:-}" ]; then export PATH="$bin:$PATH"; fi
  local key=() check=() plain=() insecure=() http=() reg said
  if [ -n "${KEYLESS:-}" ]; then
    check=(--identity "${VERIFY_IDENTITY:?the identity users verify}")
  else
    step "a local signing key (the workflow signs keyless instead)"
    rm -rf "$out/keys" && mkdir -p "$out/keys"
    (cd "$out/keys" && COSIGN_PASSWORD='' quietly cosign generate-key-pair)
    key=(--key "$out/keys/cosign.key" --tlog-upload=false)
    check=(--key "$out/keys/cosign.pub")
    export COSIGN_PASSWORD=''
  fi
  if [ -n "${REGISTRY:-}" ]; then
    reg=$REGISTRY
  else
    step "a local registry"
    need docker-registry docker-registry
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    reg="127.0.0.1:$port"
    rm -rf "$out/registry" && mkdir -p "$out/registry"
    printf 'version: 0.1\nlog: {level: error}\nstorage:\n  filesystem: {rootdirectory: %s}\nhttp:\n  addr: %s\n' \
      "$out/registry/data" "$reg" > "$out/registry/config.yml"
    docker-registry serve "$out/registry/config.yml" > "$out/registry/log" 2>&1 &
    registry_pid=$!
    trap 'kill "$registry_pid" 2>/dev/null || true' EXIT
    for _ in $(seq 100); do curl -fs "http://$reg/v2/" >/dev/null && break; sleep 0.1; done
    curl -fs "http://$reg/v2/" >/dev/null || { echo "the local registry did not start: $(cat "$out/registry/log")" >&2; exit 1; }
    plain=(--allow-http-registry --allow-insecure-registry)
    insecure=(--insecure-registry "$reg")
    http=(--plain-http)
  fi

  step "serve's image (one index), signed with its per-platform images, its SBOM attested"
  local digest image
  digest=$(CRANE="$(command -v crane)" deploy/image/build.sh push "$reg/config-snapshot:$version" \
    "linux/amd64=$out/image/linux-amd64.tar" "linux/arm64=$out/image/linux-arm64.tar")
  image="$reg/config-snapshot@$digest"
  quietly cosign sign ${key[@]+"${key[@]}"} ${plain[@]+"${plain[@]}"} --yes --recursive "$image"
  quietly cosign attest ${key[@]+"${key[@]}"} ${plain[@]+"${plain[@]}"} --yes --type cyclonedx \
    --predicate "$dist/config-snapshot-image-$version.cdx.json" "$image"

  step "the policy and the chart, signed"
  local policy chart chart_digest
  # Where the metadata says the policy lives, under this REGISTRY.
  local oci_url
  oci_url=$(sed -n 's/^ *io.kubewarden.policy.ociUrl: *//p' policy-metadata.yml)
  if [ -n "${KEYLESS:-}" ]; then
    policy=$(kwctl push "$dist/policy.wasm" "registry://$reg/${oci_url#*/*/}:v$version" -o json | jq -r .immutable_ref)
  else
    policy=$("$bin/config-snapshot-linux-$(arch_of)" push "$dist/policy.wasm" \
      "registry://$reg/${oci_url#*/*/}:v$version" ${insecure[@]+"${insecure[@]}"})
  fi
  policy=${policy#registry://}
  quietly cosign sign ${key[@]+"${key[@]}"} ${plain[@]+"${plain[@]}"} --yes "$policy"
  chart_digest=$(helm push "$dist/config-snapshot-$version.tgz" "oci://$reg/charts" ${http[@]+"${http[@]}"} 2>&1 \
    | sed -n 's/^Digest: //p')
  [ -n "$chart_digest" ] || { echo "helm push gave no digest" >&2; exit 1; }
  chart="$reg/charts/config-snapshot@$chart_digest"
  quietly cosign sign ${key[@]+"${key[@]}"} ${plain[@]+"${plain[@]}"} --yes "$chart"

  step "SHA256SUMS signed"
  quietly cosign sign-blob ${key[@]+"${key[@]}"} --yes --bundle "$dist/SHA256SUMS.bundle" "$dist/SHA256SUMS"

  step "verify, as a user would"
  deploy/release/verify.sh "$version" "$dist" "$reg/config-snapshot:$version" "$policy" "$chart" "${check[@]}"
  if [ -z "${KEYLESS:-}" ]; then
    step "verify refuses what is not the release"
    refuses() { # refuses WHAT VERIFY_ARGS...: verify.sh must fail
      if deploy/release/verify.sh "${@:2}" >/dev/null 2>&1; then echo "verify.sh accepted $1" >&2; exit 1; fi
      echo "refused: $1"
    }
    local other
    other=$(mktemp -d)
    (cd "$other" && COSIGN_PASSWORD='' quietly cosign generate-key-pair)
    refuses "signatures by another key" "$version" "$dist" "$reg/config-snapshot:$version" "$policy" "$chart" --key "$other/cosign.pub"
    cp -r "$dist" "$other/dist"
    printf 'x' >> "$other/dist/config-snapshot-$version-linux-arm64.tar.gz"
    refuses "an archive changed after signing" "$version" "$other/dist" "$reg/config-snapshot:$version" "$policy" "$chart" "${check[@]}"
    cp "$dist/SHA256SUMS" "$other/dist/SHA256SUMS"
    (cd "$other/dist" && sha256sum -- config-snapshot-*.tar.gz > SHA256SUMS)
    refuses "a SHA256SUMS rewritten to match" "$version" "$other/dist" "$reg/config-snapshot:$version" "$policy" "$chart" "${check[@]}"
    rm -rf "$other"
    step "the arm64 image, pulled back, runs"
    local pulled
    pulled=$(mktemp -d)
    crane export --insecure --platform linux/arm64 "$image" - | tar -xf - -C "$pulled" usr/bin/config-snapshot
    said=$(qemu-aarch64 "$pulled/usr/bin/config-snapshot" --version)
    [ "$said" = "config-snapshot $version" ] || { echo "the arm64 image's binary said: $said" >&2; exit 1; }
    echo "linux/arm64 image, under qemu-aarch64: $said"
    rm -rf "$pulled"
  fi
  # krew installs the plugin from the archive; kubectl then finds it. (The
  # workflow does this in a job without credentials.)
  if [ -n "${KEYLESS:-}" ]; then
    echo "image digest: $digest"
    return
  fi
  rm -rf "$out/krew"
  KREW_ROOT="$out/krew" quietly krew install --manifest="$dist/config-snapshot.krew.yaml" \
    --archive="$dist/config-snapshot-$version-linux-$(arch_of).tar.gz"
  said=$(PATH="$out/krew/bin:$PATH" kubectl config-snapshot --version)
  [ "$said" = "config-snapshot $version" ] || { echo "kubectl config-snapshot said: $said" >&2; exit 1; }
  echo "verified: krew installed the plugin; kubectl config-snapshot --version: $said"
  echo "release: $(ls "$dist" | wc -l) files in $dist, the image at $reg/config-snapshot:$version"
  echo "image digest: $digest"
}

case "${1:-all}" in
  build) build ;;
  publish) publish ;;
  all) build; publish ;;
  *) echo "usage: release.sh [build|publish]" >&2; exit 2 ;;
esac
