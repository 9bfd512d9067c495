# The `config-snapshot serve` image: the host binary and the policy wasm it
# evaluates, on distroless (glibc, non-root). Built by the release workflow
# and by e2e-tests/cluster/run.sh. `make image` builds the same image
# without a container engine (deploy/image/build.sh); host/tests/packaging.rs
# keeps the two equal.
FROM rust:1.96-bookworm AS build
WORKDIR /src
COPY . .
RUN make policy.wasm && cargo build --release --locked -p config-snapshot \
 && target/release/config-snapshot precompile policy.wasm -o policy.cwasm

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/config-snapshot /usr/bin/config-snapshot
COPY --from=build /src/policy.wasm /usr/share/config-snapshot/policy.wasm
# serve --precompiled starts from it, or compiles the wasm if this node's
# CPU or the binary differ from the build's.
COPY --from=build /src/policy.cwasm /usr/share/config-snapshot/policy.cwasm
USER 65532:65532
ENTRYPOINT ["/usr/bin/config-snapshot"]
