#!/usr/bin/env bash
# `make unit-tests`: every test binary of the workspace, and every bench
# once. The real control plane's and the real node's tests
# (host/tests/real_cluster.rs) wait on Kubernetes far more than they
# compute, so once everything is built they run in the background beside
# the rest, instead of after it. Each part's time is printed at the end;
# the real-cluster log is printed whole when it fails, its tail otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p target
log=target/real-cluster.log
started=$SECONDS
lap() { printf '[tests] %-34s %5d s\n' "$1" "$((SECONDS - $2))"; }

t=$SECONDS
cargo test --workspace --no-run || exit 1
cargo test -p config-snapshot --benches --no-run || exit 1
lap "build" "$t"

t_real=$SECONDS
(cargo test -p config-snapshot --test real_cluster -- --nocapture > "$log" 2>&1; echo $? > "$log.rc") &
real=$!

# Checks that need no cluster (TESTS_BESIDE, make targets: `make test` gives
# "lint deny") run here too, while the real cluster's tests mostly wait:
# niced, so Kubernetes and serve keep the CPU their deadlines need, and in
# a target directory of their own, so they never wait on this build's lock.
beside_log=target/beside.log
(
  for step in ${TESTS_BESIDE:-}; do
    s=$SECONDS
    CARGO_TARGET_DIR=target/beside nice -n 10 make --no-print-directory "$step" || { echo "[beside] $step failed"; exit 1; }
    echo "[beside] $step: $((SECONDS - s)) s"
  done
) > "$beside_log" 2>&1 &
beside=$!

status=0
t=$SECONDS
host_tests=$(ls host/tests/*.rs | xargs -n1 basename | sed 's/\.rs$//' | grep -vx real_cluster | sed 's/^/--test /')
# shellcheck disable=SC2086
cargo test -p config-snapshot --lib --bins $host_tests || status=1
cargo test --workspace --exclude config-snapshot || status=1
cargo test --workspace --doc || status=1
lap "unit and integration tests" "$t"
t=$SECONDS
# Every benchmark once, unoptimised: a bench that no longer runs fails
# here, not on the day of a measurement.
cargo test -p config-snapshot --benches || status=1
lap "benches, once" "$t"

if ! wait "$beside"; then
  cat "$beside_log"
  echo "[tests] ${TESTS_BESIDE:-} failed (log: $beside_log)" >&2
  status=1
else
  grep '^\[beside\]' "$beside_log" || true
fi

wait "$real"
real_status=$(cat "$log.rc" 2>/dev/null || echo 1)
lap "real control plane and node" "$t_real"
if [ "$real_status" != 0 ]; then
  cat "$log"
  echo "[tests] the real-cluster tests failed (log: $log)" >&2
  status=1
else
  grep -E '^real (control plane|node)( \([a-z]+\))?: |^test result|SKIPPED' "$log" || true
fi
lap "all tests" "$started"
exit "$status"
