#!/usr/bin/env bash
# Verify a release as a user would, before installing it:
#
#   deploy/release/verify.sh VERSION DIR IMAGE POLICY CHART [--key cosign.pub | --identity ID]
#
#   gh release download v0.1.0 -R config-snapshot/config-snapshot -D dist
#   deploy/release/verify.sh 0.1.0 dist ghcr.io/config-snapshot/config-snapshot:0.1.0 \
#     ghcr.io/config-snapshot/policies/config-snapshot:v0.1.0 \
#     ghcr.io/config-snapshot/charts/config-snapshot:0.1.0
#
# DIR holds the release's files (the CLI archives, policy.wasm, the chart,
# the SBOMs, the krew manifest, SHA256SUMS and SHA256SUMS.bundle); IMAGE,
# POLICY and CHART are the OCI references. Every signature must come from
# the release workflow run for this VERSION's tag, and nothing else: not
# another workflow, not another tag (an older release's signature does not
# vouch for a tag moved to it). --identity names another workflow identity
# (a fork's); `make release-dry-run` passes --key, its local key. Needs
# bash 4 or later (macOS: brew install bash), cosign, crane, jq and
# sha256sum (macOS: coreutils). A registry on loopback is reached over
# plain HTTP.
set -euo pipefail
version=${1:?the version, e.g. 0.1.0}
dir=${2:?the directory of release files}
image=${3:?the image reference}
policy=${4:?the policy reference}
chart=${5:?the chart reference}
shift 5
issuer=https://token.actions.githubusercontent.com
who=(--certificate-identity "https://github.com/config-snapshot/config-snapshot/.github/workflows/release.yml@refs/tags/v$version"
     --certificate-oidc-issuer "$issuer")
case "${1:-}" in
  --key) who=(--key "${2:?the public key}" --insecure-ignore-tlog=true) ;;  # a local key logs nothing publicly
  --identity) who=(--certificate-identity "${2:?the identity}" --certificate-oidc-issuer "$issuer") ;;
  "") ;;
  *) echo "verify.sh: unknown option $1" >&2; exit 2 ;;
esac
plain=() crane_flags=()
case "$image" in
  127.0.0.1:* | localhost:*) plain=(--allow-http-registry --allow-insecure-registry) crane_flags=(--insecure) ;;
esac
fail() { echo "NOT verified: $*" >&2; exit 1; }
ok() { echo "verified: $*"; }
signed() { # signed REF: cosign verify, quietly
  cosign verify "${who[@]}" ${plain[@]+"${plain[@]}"} "$1" >/dev/null 2>&1
}

# 1. The checksums file is this release's, and every file matches it.
cosign verify-blob "${who[@]}" --bundle "$dir/SHA256SUMS.bundle" "$dir/SHA256SUMS" >/dev/null 2>&1 \
  || fail "SHA256SUMS: its signature"
(cd "$dir" && sha256sum --quiet -c SHA256SUMS) || fail "a file does not match SHA256SUMS"
ok "SHA256SUMS's signature, and $(wc -l < "$dir/SHA256SUMS") files against it"

# 2. The image, by the digest its tag names now (printed: install by it,
#    the chart's image.digest): the index and each platform's image
#    signed, the SBOM attested. One digest for every check, so a tag moved
#    between two checks cannot pass one image on another's signature.
last=${image##*/}
case "$last" in
  *@*) repo=${image%@*} ;;
  *:*) repo=${image%:*} ;;
  *) repo=$image ;;
esac
digest=$(crane digest ${crane_flags[@]+"${crane_flags[@]}"} "$image") || fail "$image: not found"
pinned="$repo@$digest"
signed "$pinned" || fail "$pinned: its signature"
manifest=$(crane manifest ${crane_flags[@]+"${crane_flags[@]}"} "$pinned")
platforms=$(jq -r '[.manifests[].platform | "\(.os)/\(.architecture)"] | sort | join(" ")' <<< "$manifest")
[ "$platforms" = "linux/amd64 linux/arm64" ] || fail "$pinned: its platforms are '$platforms'"
for child in $(jq -r '.manifests[].digest' <<< "$manifest"); do
  signed "$repo@$child" || fail "$repo@$child (one platform's image): its signature"
done
attestations=$(cosign verify-attestation "${who[@]}" ${plain[@]+"${plain[@]}"} --type cyclonedx "$pinned" 2>/dev/null) \
  || fail "$pinned: no signed CycloneDX SBOM"
components=$(jq -rs '[.[].payload | @base64d | fromjson | .predicate.components | length] | max' <<< "$attestations")
[ "$components" -gt 0 ] || fail "$pinned: its signed SBOM lists no components"
ok "$pinned: signed, with each platform's image ($platforms); its SBOM signed ($components components)"

# 3. The policy and the chart.
for ref in "$policy" "$chart"; do
  signed "$ref" || fail "$ref: its signature"
  ok "$ref: signed"
done
