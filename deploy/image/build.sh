#!/usr/bin/env bash
# serve's image without a container engine (`make image`): the same
# contents as the Dockerfile's, assembled from files and pushed with crane.
#
#   deploy/image/build.sh BINARY POLICY_WASM REF
#
# BINARY is a `config-snapshot` build (the release one for `make image`),
# POLICY_WASM the optimised policy, REF where to push (a registry reached
# over plain HTTP is fine: crane --insecure). The root holds what the
# Dockerfile's base (distroless cc-debian12:nonroot) gives the binary: the
# glibc it links (copied from this Debian 12 machine, the distroless
# base's own release), CA certificates, and a passwd with the nonroot user;
# and what the Dockerfile copies. The values below are the Dockerfile's:
# host/tests/packaging.rs checks that they agree.
set -euo pipefail

BINARY_PATH=/usr/bin/config-snapshot
POLICY_DIR=/usr/share/config-snapshot
USER_ID=65532:65532
ENTRYPOINT=/usr/bin/config-snapshot

binary=${1:?a config-snapshot binary}
wasm=${2:?the policy wasm}
ref=${3:?where to push: HOST:PORT/REPO:TAG}
crane=${CRANE:?the crane binary (e2e-tests/cluster/control-plane.sh build makes one)}

root=$(mktemp -d)
trap 'rm -rf "$root" "$root.tar"' EXIT
install -D -m 0755 "$binary" "$root$BINARY_PATH"
install -D -m 0644 "$wasm" "$root$POLICY_DIR/policy.wasm"
# serve --precompiled starts from it, or compiles the wasm if this node's
# CPU or the binary differ from the build's.
"$binary" precompile "$wasm" -o "$root$POLICY_DIR/policy.cwasm"
chmod 0644 "$root$POLICY_DIR/policy.cwasm"
# The shared libraries the binary links, at their paths, and the loader.
ldd "$binary" | awk '/=> \// {print $3} /^\t\/lib/ {print $1}' | while read -r lib; do
  install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
mkdir -p "$root/tmp" "$root/etc"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
mkdir -p "$root/home/nonroot"
chown 65532:65532 "$root/home/nonroot" 2>/dev/null || true

tar --numeric-owner --owner=0 --group=0 -C "$root" -cf "$root.tar" .
"$crane" append --insecure --platform linux/amd64 --oci-empty-base -f "$root.tar" -t "$ref" >/dev/null 2>&1
"$crane" mutate --insecure "$ref" -t "$ref" --entrypoint "$ENTRYPOINT" --user "$USER_ID" \
  -l org.opencontainers.image.source=https://github.com/config-snapshot/config-snapshot >/dev/null 2>&1
"$crane" digest --insecure "$ref"
