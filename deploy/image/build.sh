#!/usr/bin/env bash
# serve's image without a container engine: the same contents as the
# Dockerfile's, assembled from files and pushed with crane.
#
#   deploy/image/build.sh POLICY_WASM REF PLATFORM=BINARY...        # `make image`
#   deploy/image/build.sh root POLICY_WASM DIR PLATFORM=BINARY...   # DIR/linux-ARCH.tar only
#   deploy/image/build.sh push REF PLATFORM=ROOT_TAR...             # push roots made before
#
#   deploy/image/build.sh policy.wasm 127.0.0.1:5000/config-snapshot:0.1.0 \
#     linux/amd64=target/x86_64-unknown-linux-musl/release/config-snapshot \
#     linux/arm64=target/aarch64-unknown-linux-musl/release/config-snapshot
#
# The release assembles the roots in a job that builds and holds no
# credentials, and pushes them in one that only pushes and signs
# (deploy/release/release.sh). One platform pushes an image at REF;
# several push one image per platform at REF-ARCH and an index of them at
# REF, the multi-arch image a node of any of these architectures pulls.
#
# Each root holds its binary, the policy and the policy's module
# precompiled by that binary: a module is machine code, so an arm64 node
# needs one compiled for arm64. A binary for another architecture runs
# under Debian's qemu-user (qemu-aarch64), which also proves it starts. A
# static binary (deploy/release/cross.sh) needs nothing else; a dynamic one
# gets the libraries it links (the glibc of this Debian 12 machine, the
# distroless base's own release). Either way the root has CA certificates
# and a passwd with the nonroot user. The values below are the
# Dockerfile's: host/tests/packaging.rs checks that they agree. Pushing
# prints the digest of REF. A registry on loopback is reached over plain
# HTTP; any other only over TLS.
set -euo pipefail

BINARY_PATH=/usr/bin/config-snapshot
POLICY_DIR=/usr/share/config-snapshot
USER_ID=65532:65532
ENTRYPOINT=/usr/bin/config-snapshot
SOURCE=https://github.com/config-snapshot/config-snapshot

# run ARCH BINARY ARGS...: the binary, natively or under the emulator.
run() {
  local arch=$1 emulator
  shift
  case "$arch/$(uname -m)" in
    amd64/x86_64 | arm64/aarch64) "$@"; return ;;
    arm64/*) emulator=qemu-aarch64 ;;
    amd64/*) emulator=qemu-x86_64 ;;
    *) echo "build.sh: no way to run a $arch binary here" >&2; exit 3 ;;
  esac
  command -v "$emulator" >/dev/null \
    || { echo "build.sh: a $arch binary needs $emulator here (apt-get install qemu-user)" >&2; exit 3; }
  "$emulator" "$@"
}

# root PLATFORM BINARY WASM OUT_TAR: one platform's root, as a tar.
root() {
  local platform=$1 binary=$2 wasm=$3 out=$4 arch=${1#linux/} dir
  dir=$(mktemp -d)
  install -D -m 0755 "$binary" "$dir$BINARY_PATH"
  install -D -m 0644 "$wasm" "$dir$POLICY_DIR/policy.wasm"
  # serve --precompiled starts from it, or compiles the wasm if this node's
  # CPU or the binary differ from the build's.
  run "$arch" "$binary" precompile "$wasm" -o "$dir$POLICY_DIR/policy.cwasm" >/dev/null
  chmod 0644 "$dir$POLICY_DIR/policy.cwasm"
  # A dynamic binary's shared libraries, at their paths, and the loader.
  if [ "$arch/$(uname -m)" = amd64/x86_64 ] && ldd "$binary" >/dev/null 2>&1; then
    ldd "$binary" | awk '/=> \// {print $3} /^\t\/lib/ {print $1}' | while read -r lib; do
      install -D -m 0755 "$(readlink -f "$lib")" "$dir$lib"
    done
  fi
  install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/ca-certificates.crt"
  mkdir -p "$dir/tmp" "$dir/etc" "$dir/home/nonroot"
  chmod 1777 "$dir/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$dir/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$dir/etc/group"
  chown 65532:65532 "$dir/home/nonroot" 2>/dev/null || true
  # Fixed order and times (the commit's): the same files make the same layer.
  local when=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
  tar --sort=name --mtime="@$when" --numeric-owner --owner=0 --group=0 -C "$dir" -cf "$out" .
  rm -rf "$dir"
}

crane_bin() { echo "${CRANE:?the crane binary (e2e-tests/cluster/control-plane.sh crane makes one)}"; }

# crane ARGS...: its output alone, its errors only if it fails; plain HTTP
# for a loopback registry only.
crane() {
  local out errors flags=()
  case "$ref" in 127.0.0.1:* | localhost:* | \[::1\]:*) flags=(--insecure) ;; esac
  errors=$(mktemp)
  out=$("$(crane_bin)" ${flags[@]+"${flags[@]}"} "$@" 2>"$errors") \
    || { echo "build.sh: crane $1 failed: $(cat "$errors")" >&2; rm -f "$errors"; exit 1; }
  rm -f "$errors"
  printf '%s' "$out"
}

# push REF PLATFORM=ROOT_TAR...
push() {
  ref=$1
  shift
  local pair platform tag manifests=()
  for pair in "$@"; do
    platform=${pair%%=*}
    tag=$ref
    [ $# -gt 1 ] && tag="$ref-${platform#linux/}"
    crane append --platform "$platform" --oci-empty-base -f "${pair#*=}" -t "$tag" >/dev/null
    crane mutate "$tag" -t "$tag" --set-platform "$platform" --entrypoint "$ENTRYPOINT" --user "$USER_ID" \
      -l "org.opencontainers.image.source=$SOURCE" >/dev/null
    manifests+=(-m "$tag")
  done
  [ $# -gt 1 ] && crane index append "${manifests[@]}" -t "$ref" >/dev/null
  crane digest "$ref"
  echo
}

# roots WASM DIR PLATFORM=BINARY...: each platform's root as DIR/linux-ARCH.tar.
roots() {
  local wasm=$1 dir=$2 pair platform
  shift 2
  [ $# -gt 0 ] || { echo "build.sh: name at least one PLATFORM=BINARY" >&2; exit 2; }
  mkdir -p "$dir"
  for pair in "$@"; do
    platform=${pair%%=*}
    root "$platform" "${pair#*=}" "$wasm" "$dir/${platform//\//-}.tar"
  done
}

case "${1:-}" in
  root) shift; roots "${1:?the policy wasm}" "${2:?a directory}" "${@:3}" ;;
  push) shift; push "${1:?where to push: HOST:PORT/REPO:TAG}" "${@:2}" ;;
  *)
    wasm=${1:?the policy wasm}
    ref=${2:?where to push: HOST:PORT/REPO:TAG}
    shift 2
    staged=$(mktemp -d)
    trap 'rm -rf "$staged"' EXIT
    roots "$wasm" "$staged" "$@"
    pairs=()
    for pair in "$@"; do platform=${pair%%=*}; pairs+=("$platform=$staged/${platform//\//-}.tar"); done
    push "$ref" "${pairs[@]}" ;;
esac
