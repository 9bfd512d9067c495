#!/usr/bin/env bash
# KEP user story 1 on a real cluster: kind + deploy/serve.
# Needs docker (with an engine), kind and kubectl. Not part of `make test`:
# CI machines here have no Docker engine.
#
#   e2e-tests/cluster/run.sh            # creates and deletes its kind cluster
#   KEEP=1 e2e-tests/cluster/run.sh     # leaves the cluster for inspection
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=config-snapshot-e2e
IMAGE=ghcr.io/config-snapshot/config-snapshot:0.1.0
NS=shop

step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# Retries a command until it succeeds or 120 s pass.
retry() { for _ in $(seq 60); do "$@" && return 0; sleep 2; done; fail "timed out: $*"; }
# The MODE the running pods of deployment/web see.
mode() { kubectl -n "$NS" exec deploy/web -- printenv MODE; }
expect_mode() {
  kubectl -n "$NS" rollout status deploy/web --timeout=120s >/dev/null
  retry sh -c "[ \"\$(kubectl -n $NS exec deploy/web -- printenv MODE)\" = '$1' ]"
  echo "pods see MODE=$(mode)"
}

step "kind cluster and image"
kind create cluster --name "$CLUSTER" --wait 120s
[ -n "${KEEP:-}" ] || trap 'kind delete cluster --name "$CLUSTER"' EXIT
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

step "config-snapshot serve"
kubectl apply -k deploy/serve
kubectl -n config-snapshot wait --for=condition=Available deployment/config-snapshot --timeout=180s
# serve writes its CA into the webhook configuration; wait until it has.
retry sh -c '[ -n "$(kubectl get mutatingwebhookconfiguration config-snapshot -o jsonpath="{.webhooks[0].clientConfig.caBundle}")" ]'

step "a Deployment that watches its ConfigMap"
kubectl create namespace "$NS"
kubectl -n "$NS" create configmap app-config --from-literal=mode=blue
kubectl -n "$NS" apply -f e2e-tests/cluster/web.yaml
ref=$(kubectl -n "$NS" get deploy web -o jsonpath='{.spec.template.spec.containers[0].env[0].valueFrom.configMapKeyRef.name}')
case "$ref" in app-config-??????????) echo "pinned to snapshot $ref" ;; *) fail "not pinned: $ref" ;; esac
[ "$(kubectl -n "$NS" get configmap "$ref" -o jsonpath='{.immutable}')" = true ] || fail "$ref is not immutable"
expect_mode blue

step "edit the ConfigMap: the Deployment rolls out"
kubectl -n "$NS" patch configmap app-config -p '{"data":{"mode":"green"}}'
expect_mode green

step "rollout undo: the old config comes back with the old revision"
kubectl -n "$NS" rollout undo deploy/web
expect_mode blue
sleep 40   # longer than watchMinInterval: nothing may roll it forward again
[ "$(mode)" = blue ] || fail "undo did not stick"

step "snapshots are owned by the revisions and collected with them"
owners=$(kubectl -n "$NS" get configmap "$ref" -o jsonpath='{.metadata.ownerReferences[*].kind}')
case "$owners" in *ReplicaSet*) echo "$ref owned by: $owners" ;; *) fail "$ref has no ReplicaSet owner" ;; esac
kubectl -n "$NS" patch configmap app-config -p '{"data":{"mode":"red"}}'
expect_mode red
kubectl -n "$NS" patch configmap app-config -p '{"data":{"mode":"white"}}'
expect_mode white
# revisionHistoryLimit 2: the oldest revision and its snapshot go.
retry sh -c "[ \"\$(kubectl -n $NS get configmap -l app.kubernetes.io/managed-by=config-snapshot -o name | wc -l)\" -le 3 ]"
kubectl -n "$NS" get configmap -l app.kubernetes.io/managed-by=config-snapshot

step "metrics"
kubectl -n config-snapshot port-forward svc/config-snapshot 18080:8080 >/dev/null & pf=$!
sleep 2
curl -fsS localhost:18080/metrics | grep -E '^config_snapshot_(snapshots_created|watch_rollouts|snapshot_adoptions)_total'
kill $pf

echo; echo "PASS"
