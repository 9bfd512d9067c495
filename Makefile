# config-snapshot — every target installs what it needs first (`setup`).
# The toolchain is pinned in rust-toolchain.toml; wasmtime 49 needs rustc 1.96.

TOOLCHAIN := 1.96.0
WASM_TARGET := wasm32-wasip1
POLICY_BUILD := target/$(WASM_TARGET)/policy/config_snapshot_policy.wasm
HOST := cargo run --quiet -p config-snapshot --
SCENARIOS := $(sort $(wildcard e2e-tests/*.yaml))

PHONY_QUICK := quick story
.PHONY: $(PHONY_QUICK) release-dry-run image wasm-opt soak soak-cluster bench bench-cluster load tools deny deny-tool fuzz fuzz-host setup demo test unit-tests e2e-tests fmt fmt-check lint clean policy.wasm annotated-policy.wasm

## setup: install the pinned toolchain, its wasm target, rustfmt and clippy (idempotent)
setup:
	@rustup toolchain list | grep -q "^$(TOOLCHAIN)" && rustup target list --installed --toolchain $(TOOLCHAIN) | grep -q $(WASM_TARGET) \
	  || rustup toolchain install $(TOOLCHAIN) --profile minimal --component rustfmt,clippy --target $(WASM_TARGET)

## policy.wasm: the policy, built for wasm32-wasip1 with the size-tuned `policy` profile, then
## optimised by binaryen's wasm-opt: 14% smaller and a few percent faster than rustc's output
## (docs/BENCHMARKS.md, "Size"). Tests, benches, replay and serve all run this file.
WASM_OPT_FLAGS := -O3 --enable-bulk-memory --enable-sign-ext --enable-nontrapping-float-to-int \
  --enable-mutable-globals --enable-reference-types --enable-multivalue
policy.wasm: setup wasm-opt
	cargo build --profile policy --target $(WASM_TARGET) -p config-snapshot-policy
	wasm-opt $(WASM_OPT_FLAGS) $(POLICY_BUILD) -o policy.wasm

## wasm-opt: binaryen, from the distribution's packages when it is missing
wasm-opt:
	@command -v wasm-opt > /dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq binaryen > /dev/null)

## image: serve's image without a container engine: the release binary, the policy and its
## precompiled module on a minimal root (deploy/image/build.sh), pushed to $(REGISTRY) with crane
## (built into the tool cache). The Dockerfile builds the same image where Docker runs.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
REGISTRY ?= 127.0.0.1:5000
IMAGE ?= $(REGISTRY)/config-snapshot:$(VERSION)
IMAGE_PROFILE ?= release
HOST_ARCH := $(if $(filter aarch64,$(shell uname -m)),arm64,amd64)
IMAGE_DIR := $(if $(filter dev,$(IMAGE_PROFILE)),debug,$(IMAGE_PROFILE))
image: policy.wasm
	cargo build --profile $(IMAGE_PROFILE) -p config-snapshot --bin config-snapshot
	CRANE=$${CRANE:-$$(e2e-tests/cluster/control-plane.sh crane)} \
	  deploy/image/build.sh policy.wasm $(IMAGE) linux/$(HOST_ARCH)=target/$(IMAGE_DIR)/config-snapshot

## release-dry-run: every artifact of a release for linux/amd64 and linux/arm64 (static CLI archives,
## serve's multi-arch image, policy, chart, CycloneDX SBOMs, SHA256SUMS, krew manifest), built into
## target/release-dry-run and a local registry, signed with a local cosign key and verified as a user
## would (deploy/release/release.sh, which the release workflow runs on a tag). Not part of `test`:
## two static release builds take about 35 min on two cores.
release-dry-run: policy.wasm
	deploy/release/release.sh

## annotated-policy.wasm: the policy with its Kubewarden metadata embedded
annotated-policy.wasm: policy.wasm
	@if command -v kwctl >/dev/null 2>&1; then \
	  kwctl annotate -m policy-metadata.yml -u README.md -o annotated-policy.wasm policy.wasm; \
	else \
	  $(HOST) annotate -m policy-metadata.yml -u README.md -o annotated-policy.wasm policy.wasm; \
	fi

## demo: replay KEP user story 1 on the in-memory cluster and print the timeline
demo: policy.wasm
	$(HOST) replay e2e-tests/kep-story-configmap.yaml e2e-tests/kep-story-watch.yaml
	@echo; echo "Which config does each revision run? (config-snapshot history, on the cluster the story left)"
	$(HOST) history deploy/web --scenario e2e-tests/kep-story-configmap.yaml
	$(HOST) diff deploy/web 3 4 --scenario e2e-tests/kep-story-configmap.yaml || true

## test: everything CI runs — format, lint, supply chain, unit tests, e2e scenarios. Lint and
## cargo deny need no cluster, so they run beside the real cluster's tests (TESTS_BESIDE), which
## mostly wait on Kubernetes, instead of before the build they do not need
test:
	@start=$$(date +%s); for step in fmt-check unit-tests e2e-tests; do \
	  t=$$(date +%s); TESTS_BESIDE="lint deny" $(MAKE) --no-print-directory $$step || exit 1; \
	  echo "[make test] $$step: $$(( $$(date +%s) - t )) s"; \
	done; echo "[make test] all: $$(( $$(date +%s) - start )) s"

## unit-tests: every test binary and every bench once (testing/run-tests.sh); the real
## control plane's and node's tests run in the background beside the rest
unit-tests: policy.wasm
	testing/run-tests.sh

## quick: what most changes need, in a few minutes on a warm build: both crates' unit tests,
## every scenario under replay, the scenarios again with serve as host over the stand-in API
## server, serve's own tests over HTTPS, and the docs' checks. No real control plane.
QUICK_TESTS := serve_lifecycle serve attacks reliability one_driver docs deploy packaging
quick: policy.wasm
	cargo test -p config-snapshot-policy
	cargo test -p config-snapshot --lib $(addprefix --test ,$(QUICK_TESTS))
	$(HOST) replay $(SCENARIOS)

## story: one real-cluster story by name (STORY=contained; `make story` lists them): a part of
## the real control plane's test (REAL_CLUSTER_PART), or a node story (NODE_STORIES)
CONTROL_PLANE_PARTS := stories scenarios attacks contained trust plan tools jobs rollouts undo outage histories fleet monitoring policy-server memory bench latency revoke intake identity
NODE_STORY_NAMES := quickstart deployment trickle revisions jobs helm storm outlive watch rotation reinstall kustomize release elsewhere revoke
story: policy.wasm
	@if [ -z "$(STORY)" ]; then echo "make story STORY=NAME; control plane: $(CONTROL_PLANE_PARTS); node: $(NODE_STORY_NAMES)"; exit 2; fi
	@if echo " $(CONTROL_PLANE_PARTS) " | grep -q " $(STORY) "; then \
	  CI=true REAL_CLUSTER_PART=$(STORY) cargo test -p config-snapshot --test real_cluster serve_on_a_real_control_plane -- --nocapture; \
	elif echo " $(NODE_STORY_NAMES) " | grep -q " $(STORY) "; then \
	  CI=true REAL_CLUSTER_PART=node NODE_STORIES=$(STORY) cargo test -p config-snapshot --test real_cluster pods_on_a_real_node -- --nocapture; \
	else echo "no story $(STORY): control plane: $(CONTROL_PLANE_PARTS); node: $(NODE_STORY_NAMES)"; exit 2; fi

## e2e-tests: every scenario in e2e-tests/
e2e-tests: policy.wasm
	$(HOST) replay $(SCENARIOS)

## soak: the random-history lifecycle test for SOAK_SECONDS (default 30 min; not part of `test`)
SOAK_SECONDS ?= 1800
soak: policy.wasm
	MODEL_SECONDS=$(SOAK_SECONDS) MODEL_CASES=500 cargo test -p config-snapshot --test lifecycle_model random_histories -- --nocapture

## soak-cluster: random user histories with faults (serve killed, kube-apiserver restarted, etcd
## paused, the leader of two replicas killed mid-storm) on the real control plane,
## for SOAK_SECONDS (default 30 min; not part of `test`, which runs a short version)
soak-cluster: policy.wasm
	CI=true REAL_CLUSTER_PART=histories SOAK_SECONDS=$(SOAK_SECONDS) HISTORY_STEPS=$${HISTORY_STEPS:-20} \
	  cargo test -p config-snapshot --test real_cluster -- --nocapture

bench: policy.wasm
	cargo bench -p config-snapshot --bench admission --bench serve

## bench-cluster: webhook latency as kube-apiserver records it, on the real control plane, optimised
## build (BENCH_SAMPLES per group, default 1000; BENCH_CLIENTS, default 1,8,32); writes the table into
## docs/BENCHMARKS.md. Not part of `test`, which runs a short version as a regression guard.
bench-cluster: policy.wasm
	CI=true REAL_CLUSTER_PART=bench BENCH_WRITE_DOCS=1 \
	  cargo test --profile bench -p config-snapshot --test real_cluster -- --nocapture
	# A tenant's busy source at the issue's size: 1,000 watchers, four writers for a minute.
	CI=true REAL_CLUSTER_PART=contained CONTAINED_WATCHERS=$${CONTAINED_WATCHERS:-1000} CONTAINED_SECONDS=$${CONTAINED_SECONDS:-60} \
	  cargo test --profile bench -p config-snapshot --test real_cluster serve_on_a_real_control_plane -- --nocapture

## tools: the load generator oha, pinned, built once into a cache keyed by its version
## and linked under target/tools (for `load` and the suite's smoke)
OHA_VERSION := 1.16.0
OHA_ROOT := $(HOME)/.cache/config-snapshot/tools/oha-$(OHA_VERSION)
tools: setup target/tools/bin/oha
target/tools/bin/oha: $(OHA_ROOT)/bin/oha
	mkdir -p target/tools/bin && ln -sf $(OHA_ROOT)/bin/oha $@
$(OHA_ROOT)/bin/oha:
	cargo install oha --version $(OHA_VERSION) --locked --root $(OHA_ROOT).tmp
	rm -rf $(OHA_ROOT) && mv $(OHA_ROOT).tmp $(OHA_ROOT)

## deny: cargo deny over the lock file (deny.toml): bans, licenses and sources always;
## advisories when the RustSec database can be fetched (github.com; not from every machine)
DENY_VERSION := 0.20.2
DENY_ROOT := $(HOME)/.cache/config-snapshot/tools/cargo-deny-$(DENY_VERSION)
DENY := $(DENY_ROOT)/bin/cargo-deny
deny-tool: setup $(DENY)
# Under a lock: CI starts this install in the background and `make test` may ask for the tool
# before it is done; the second caller waits, then finds it installed.
$(DENY):
	@mkdir -p $(dir $(DENY_ROOT))
	flock $(DENY_ROOT).lock sh -c '[ -x $(DENY) ] || { \
	  cargo install cargo-deny --version $(DENY_VERSION) --locked --root $(DENY_ROOT).tmp \
	  && rm -rf $(DENY_ROOT) && mv $(DENY_ROOT).tmp $(DENY_ROOT); }'
deny: deny-tool
	$(DENY) --log-level error check bans licenses sources
	@if $(DENY) fetch db > target/deny-fetch.log 2>&1; then \
	  $(DENY) check advisories; \
	else \
	  echo "deny: the RustSec advisory database is unreachable from here (target/deny-fetch.log): advisories NOT checked"; \
	fi

## load: serve over TLS under oha at 1, 16 and 64 connections (LOAD_SECONDS each), optimised build
LOAD_SECONDS ?= 10
load: policy.wasm tools
	LOAD_SECONDS=$(LOAD_SECONDS) cargo test --profile bench -p config-snapshot --test load load_table -- --ignored --nocapture

## fuzz: each cargo-fuzz target for FUZZ_SECONDS (nightly toolchain; not part of `test`)
FUZZ_SECONDS ?= 600
FUZZ_TARGETS := validate_raw validate_structured annotations settings
fuzz:
	rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	command -v cargo-fuzz >/dev/null || cargo +nightly install cargo-fuzz --locked
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  mkdir -p corpus/$$t; seeds=seeds/$$t; [ -d $$seeds ] || seeds=; \
	  cargo +nightly fuzz run -O $$t corpus/$$t $$seeds -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

## fuzz-host: the host's boundary targets (config_snapshot::fuzz) for FUZZ_SECONDS each
## (nightly toolchain; not part of `test`, where host/tests/fuzz_bodies.rs runs the same bodies)
HOST_FUZZ_TARGETS := capability_call admission_request forged_labels
fuzz-host:
	rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	command -v cargo-fuzz >/dev/null || cargo +nightly install cargo-fuzz --locked
	cd host/fuzz && for t in $(HOST_FUZZ_TARGETS); do \
	  mkdir -p corpus/$$t; \
	  cargo +nightly fuzz run -O $$t corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

fmt: setup
	cargo fmt --all

fmt-check: setup
	cargo fmt --all -- --check

## lint: clippy with warnings denied, natively and for the wasm target
lint: setup
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --target $(WASM_TARGET) -p config-snapshot-policy -- -D warnings

clean:
	cargo clean
	rm -f policy.wasm annotated-policy.wasm
