#!/usr/bin/env bash
# The release's SBOMs, CycloneDX 1.5 JSON, into DIR:
#
#   deploy/release/sbom.sh CARGO_CYCLONEDX VERSION DIR
#
# - config-snapshot-VERSION-OS-ARCH.cdx.json: the CLI for each platform it
#   ships on (the crates that target compiles, without build-only ones);
# - config-snapshot-policy-VERSION.cdx.json: the policy module (wasm32-wasip1);
# - config-snapshot-image-VERSION.cdx.json: serve's image, which holds the
#   linux CLI's crates, the policy's, and this distribution's CA certificates; the
#   release attaches it to the image as a signed attestation.
# cargo-cyclonedx reads Cargo.lock, so each lists exactly what was built.
set -euo pipefail
cd "$(dirname "$0")/../.."
cyclonedx=${1:?cargo-cyclonedx (deploy/release/tools.sh cyclonedx)}
version=${2:?version}
dir=${3:?directory}
mkdir -p "$dir"
PATH="$(dirname "$cyclonedx"):$PATH"
export PATH

# bom PACKAGE_DIR TARGET OUT: one package's SBOM for one target.
bom() {
  local name=cs-sbom-$$
  cargo cyclonedx --manifest-path "$1/Cargo.toml" -q -f json --spec-version 1.5 \
    --target "$2" --all --no-build-deps --override-filename "$name" >&2
  mv "$1/$name.json" "$3"
  find . -name "$name.json" -not -path './target/*' -delete
}

for t in x86_64-unknown-linux-musl:linux-amd64 aarch64-unknown-linux-musl:linux-arm64 \
         x86_64-apple-darwin:darwin-amd64 aarch64-apple-darwin:darwin-arm64; do
  bom host "${t%%:*}" "$dir/config-snapshot-$version-${t##*:}.cdx.json"
done
bom . wasm32-wasip1 "$dir/config-snapshot-policy-$version.cdx.json"

# The image's CA bundle is this machine's (deploy/image/build.sh): name
# the package of this machine's distribution.
ca=$(dpkg-query -W -f='${Version}' ca-certificates)
distro=$(. /etc/os-release && echo "$ID")
distro_version=$(. /etc/os-release && echo "$VERSION_ID")
jq -n --arg v "$version" --arg ca "$ca" --arg distro "$distro" --arg dv "$distro_version" \
  --slurpfile amd64 "$dir/config-snapshot-$version-linux-amd64.cdx.json" \
  --slurpfile arm64 "$dir/config-snapshot-$version-linux-arm64.cdx.json" \
  --slurpfile policy "$dir/config-snapshot-policy-$version.cdx.json" '
  {bomFormat: "CycloneDX", specVersion: "1.5", version: 1,
   metadata: {component: {type: "container", name: "config-snapshot", version: $v,
                          "bom-ref": "config-snapshot-image"}},
   components: (
     [$amd64[0].metadata.component, $policy[0].metadata.component]
     + $amd64[0].components + $arm64[0].components + $policy[0].components
     + [{type: "library", name: "ca-certificates", version: $ca,
         purl: ("pkg:deb/" + $distro + "/ca-certificates@" + $ca + "?distro=" + $distro + "-" + $dv),
         "bom-ref": "ca-certificates"}]
     | map(del(.components)) | unique_by(."bom-ref"))}' \
  > "$dir/config-snapshot-image-$version.cdx.json"
