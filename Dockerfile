# The `config-snapshot serve` image for linux/amd64 and linux/arm64:
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t REF --push .
#
# The binary is cross-compiled on the build machine's own platform, static
# (deploy/release/cross.sh: musl, as Kubewarden's policy-server ships), so
# the base is distroless static (non-root, no libc). The policy's
# precompiled module is machine code for the target's CPU, so the target's
# own binary makes it (under buildx's emulator when cross-building). `make
# image` and `make release-dry-run` build the same image without a
# container engine (deploy/image/build.sh); host/tests/packaging.rs keeps
# the two equal.
FROM --platform=$BUILDPLATFORM rust:1.96-bookworm AS build
ARG TARGETARCH
WORKDIR /src
COPY . .
RUN make policy.wasm \
 && case "$TARGETARCH" in amd64) t=x86_64-unknown-linux-musl ;; arm64) t=aarch64-unknown-linux-musl ;; \
      *) echo "no build for $TARGETARCH" >&2; exit 1 ;; esac \
 && cp "$(deploy/release/cross.sh "$t")" /config-snapshot

FROM gcr.io/distroless/static-debian12 AS module
COPY --from=build /config-snapshot /usr/bin/config-snapshot
COPY --from=build /src/policy.wasm /policy.wasm
RUN ["/usr/bin/config-snapshot", "precompile", "/policy.wasm", "-o", "/policy.cwasm"]

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /config-snapshot /usr/bin/config-snapshot
COPY --from=build /src/policy.wasm /usr/share/config-snapshot/policy.wasm
# serve --precompiled starts from it, or compiles the wasm if this node's
# CPU or the binary differ from the build's.
COPY --from=module /policy.cwasm /usr/share/config-snapshot/policy.cwasm
USER 65532:65532
ENTRYPOINT ["/usr/bin/config-snapshot"]
