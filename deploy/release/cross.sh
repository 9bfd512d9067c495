#!/usr/bin/env bash
# The config-snapshot binary for one Linux target, static (musl), from an
# x86_64 or arm64 Debian machine:
#
#   deploy/release/cross.sh x86_64-unknown-linux-musl|aarch64-unknown-linux-musl
#
# Static so that one file runs on any distribution (no glibc to match) and
# the image needs no libraries: Kubewarden's policy-server ships the same
# way. The C parts (ring, zstd) are compiled by Debian's musl-gcc for the
# machine's own architecture and by Debian's cross gcc for the other. gcc
# links (musl-gcc as the linker would make a dynamic binary that needs
# musl's loader), with Rust's own musl start files and libc
# (link-self-contained), so no musl sysroot for the other architecture is
# needed. Prints the binary's path. Installs what it lacks with apt-get
# (as root; the release workflows install the same packages first).
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${1:?a target: x86_64-unknown-linux-musl or aarch64-unknown-linux-musl}
toolchain=$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)

need() { # need COMMAND DEBIAN_PACKAGE...
  command -v "$1" >/dev/null && return 0
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${@:2}" >/dev/null
}

# musl-gcc for the build machine's own architecture, Debian's cross gcc for
# the other (the Dockerfile's build stage runs on either).
case "$target/$(uname -m)" in
  x86_64-unknown-linux-musl/x86_64 | aarch64-unknown-linux-musl/aarch64)
    need musl-gcc musl-tools
    cc=musl-gcc ar=ar linker=gcc ;;
  aarch64-unknown-linux-musl/*)
    need aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu
    cc=aarch64-linux-gnu-gcc ar=aarch64-linux-gnu-ar linker=$cc ;;
  x86_64-unknown-linux-musl/*)
    need x86_64-linux-gnu-gcc gcc-x86-64-linux-gnu binutils-x86-64-linux-gnu
    cc=x86_64-linux-gnu-gcc ar=x86_64-linux-gnu-ar linker=$cc ;;
  *) echo "cross.sh: no recipe for $target on $(uname -m)" >&2; exit 2 ;;
esac
rustup target list --installed --toolchain "$toolchain" | grep -qx "$target" \
  || rustup target add "$target" --toolchain "$toolchain" >&2

var=$(echo "$target" | tr 'a-z-' 'A-Z_')
env_target=$(echo "$target" | tr '-' '_')
export "CARGO_TARGET_${var}_LINKER=$linker" "CC_${env_target}=$cc" "AR_${env_target}=$ar"
export "CARGO_TARGET_${var}_RUSTFLAGS=-C target-feature=+crt-static -C link-self-contained=yes"
# A cross gcc compiles against glibc's headers; where it fortifies by default
# (Ubuntu's does), the C parts would call glibc's __memcpy_chk and friends,
# which musl lacks.
if [ "$linker" != gcc ]; then export "CFLAGS_${env_target}=-U_FORTIFY_SOURCE"; fi
cargo build --release --locked --target "$target" -p config-snapshot --bin config-snapshot >&2
echo "target/$target/release/config-snapshot"
