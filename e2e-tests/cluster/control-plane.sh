#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, without Docker: etcd,
# kube-apiserver and kube-controller-manager, built from their Go modules
# (pinned in e2e-tests/cluster/go/), plus kubectl. Without --node there is
# no kubelet and no scheduler: Pods stay Pending, and everything
# config-snapshot depends on is real (the Deployment, ReplicaSet,
# StatefulSet and DaemonSet controllers, ControllerRevisions, the garbage
# collector, admission webhooks, RBAC, server-side dry run). With --node a
# real node runs pods too (node.sh).
#
#   control-plane.sh build        builds the binaries into the cache (reused), prints its path
#   control-plane.sh cached       succeeds if they are built already
#   control-plane.sh up DIR       starts a control plane with its state in DIR; writes DIR/env
#   control-plane.sh up DIR --node   and a real node (kubelet, kube-scheduler, kube-proxy,
#                                 containerd, a CNI bridge, a local registry: node.sh)
#   control-plane.sh down DIR     stops it (by pid) and removes what the node left
#                                 (with CONTROL_PLANE_OWNER=PID set at `up`, this also
#                                 runs by itself once that process is gone)
#   control-plane.sh packages     installs the Debian packages the node runs on (as root)
#
# DIR/env sets KUBECONFIG (cluster admin), BIN (the binaries), APISERVER (its
# URL), HELM (the helm CLI, cached beside them) and ARGO_ROLLOUTS (a
# directory with rollouts-controller, the kubectl-argo-rollouts plugin and
# the CRDs, installed by the test that uses them), PROMTOOL; with --node also
# REGISTRY (the local registry, HOST:PORT, plain HTTP), NODE_IMAGES (the
# images built for the node, name=reference,...), NODE and CRANE.
set -euo pipefail

K8S_VERSION=v1.34.4
ETCD_VERSION=v3.6.16
# The helm CLI the chart tests drive (deploy/helm, and a user's chart).
HELM_VERSION=v3.22.0
# Argo Rollouts: its controller, kubectl plugin and CRDs. Its module needs
# Go >= 1.26.10, so it is built with the approved go1.27.3 toolchain, which
# the go command fetches from the module proxy (only for this build).
ARGO_VERSION=v1.10.2
ARGO_TOOLCHAIN=go1.27.3
# promtool, from the Prometheus module: checks the chart's alerting rules
# and runs their unit tests.
PROMETHEUS_VERSION=v0.316.0
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="${CONFIG_SNAPSHOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/config-snapshot}"
# -v2: the Kubernetes binaries carry their version (K8S_LDFLAGS); v1 builds
# said v0.0.0-master, which `helm install` of a chart with kubeVersion refuses.
CACHE="$ROOT/control-plane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-v2"
# The version a release build stamps (hack/lib/version.sh does it there):
# /version and `kubectl version` report it, and clients such as helm check
# charts' kubeVersion against it.
K8S_MINOR=${K8S_VERSION#v1.}; K8S_MINOR=${K8S_MINOR%%.*}
K8S_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 \
-X k8s.io/component-base/version.gitMinor=$K8S_MINOR -X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 \
-X k8s.io/client-go/pkg/version.gitMinor=$K8S_MINOR"
HELM_DIR="$ROOT/tools/helm-$HELM_VERSION"
ARGO_DIR="$ROOT/tools/argo-rollouts-$ARGO_VERSION"
PROMTOOL_DIR="$ROOT/tools/promtool-$PROMETHEUS_VERSION"

log() { printf '[control-plane %s] %s\n' "$(date +%T)" "$*" >&2; }
# Where the node that is up keeps its state (one node per machine).
NODE_MARK=/run/config-snapshot-node

# shellcheck source=e2e-tests/cluster/node.sh
. "$HERE/node.sh"

build() {
  mkdir -p "$CACHE"
  # One build at a time: CI starts one in the background while Rust
  # compiles, and the tests' `up` waits for it here.
  exec 9>"$CACHE/.lock"
  flock 9
  if cached; then echo "$CACHE"; return 0; fi
  command -v go >/dev/null || { log "Go is not installed"; exit 3; }
  local started=$SECONDS
  if [ ! -x "$CACHE/etcd" ]; then
    log "building etcd $ETCD_VERSION"
    (cd "$HERE/go/etcd" && go build -trimpath -o "$CACHE/etcd.tmp" go.etcd.io/etcd/server/v3) && mv "$CACHE/etcd.tmp" "$CACHE/etcd"
  fi
  for b in kube-apiserver kube-controller-manager kubectl; do
    if [ ! -x "$CACHE/$b" ]; then
      log "building $b $K8S_VERSION"
      (cd "$HERE/go/kubernetes" && go build -trimpath -ldflags "$K8S_LDFLAGS" -o "$CACHE/$b.tmp" "k8s.io/kubernetes/cmd/$b") \
        && mv "$CACHE/$b.tmp" "$CACHE/$b"
    fi
  done
  if [ ! -x "$HELM_DIR/helm" ]; then
    log "building helm $HELM_VERSION"
    mkdir -p "$HELM_DIR"
    (cd "$HERE/go/helm" && go build -trimpath -o "$HELM_DIR/helm.tmp" helm.sh/helm/v3/cmd/helm) && mv "$HELM_DIR/helm.tmp" "$HELM_DIR/helm"
  fi
  if [ ! -x "$ARGO_DIR/rollouts-controller" ] || [ ! -x "$ARGO_DIR/kubectl-argo-rollouts" ] || [ ! -f "$ARGO_DIR/crds/rollout-crd.yaml" ]; then
    log "building argo-rollouts $ARGO_VERSION"
    mkdir -p "$ARGO_DIR/crds"
    (
      cd "$HERE/go/argo-rollouts"
      export GOTOOLCHAIN=$ARGO_TOOLCHAIN
      for b in rollouts-controller kubectl-argo-rollouts; do
        go build -trimpath -o "$ARGO_DIR/$b.tmp" "github.com/argoproj/argo-rollouts/cmd/$b"
        mv "$ARGO_DIR/$b.tmp" "$ARGO_DIR/$b"
      done
      src=$(go list -m -f '{{.Dir}}' github.com/argoproj/argo-rollouts)
      for f in "$src"/manifests/crds/*-crd.yaml; do install -m 0644 "$f" "$ARGO_DIR/crds/"; done
    )
  fi
  if [ ! -x "$PROMTOOL_DIR/promtool" ]; then
    log "building promtool (prometheus $PROMETHEUS_VERSION)"
    mkdir -p "$PROMTOOL_DIR"
    # Without service discovery (remove_all_sd): rules need none, and the
    # build takes half the time.
    (cd "$HERE/go/promtool" && go build -tags remove_all_sd -trimpath -o "$PROMTOOL_DIR/promtool.tmp" github.com/prometheus/prometheus/cmd/promtool) \
      && mv "$PROMTOOL_DIR/promtool.tmp" "$PROMTOOL_DIR/promtool"
  fi
  node_build
  log "binaries ready in $CACHE, $HELM_DIR, $ARGO_DIR and $CRANE_DIR ($((SECONDS - started)) s)"
  echo "$CACHE"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_for() { # wait_for WHAT SECONDS CMD...
  local what=$1 limit=$2; shift 2
  for _ in $(seq $((limit * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  log "$what did not come up within ${limit}s"; return 1
}

client_cert() { # client_cert DIR NAME SUBJECT: a client certificate from the cluster's CA
  local d=$1 name=$2 subject=$3
  openssl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$d/$name.key" -out "$d/$name.csr" 2>/dev/null
  openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -extfile "$d/client.ext" -out "$d/$name.crt" 2>/dev/null
}

certs() { # certs DIR [EXTRA_SAN]
  local d=$1 extra=${2:-}
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=config-snapshot-e2e-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc,IP:10.96.0.1%s\n' "$extra" > "$d/san.ext"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$d/apiserver.key" -out "$d/apiserver.csr" 2>/dev/null
  openssl x509 -req -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -extfile "$d/san.ext" -out "$d/apiserver.crt" 2>/dev/null
  # Client certificates are X.509 v3 with clientAuth (an extension file
  # makes openssl write v3): rustls, and so serve run with the admin
  # kubeconfig as docs/serve.md shows, refuses v1 certificates.
  printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n' > "$d/client.ext"
  # Cluster admin (system:masters) and the controller manager's identity.
  for name in admin controller-manager; do
    client_cert "$d" "$name" "/O=system:masters/CN=$name"
  done
  # The certificate kube-apiserver shows the webhooks it calls (mTLS, the
  # kustomize component deploy/components/mtls), from a CA of its own, so
  # that no other client certificate of this cluster passes serve's check.
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=config-snapshot-e2e-webhook-client-ca" \
    -keyout "$d/webhook-ca.key" -out "$d/webhook-ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver-webhook-client" \
    -keyout "$d/webhook-client.key" -out "$d/webhook-client.csr" 2>/dev/null
  openssl x509 -req -in "$d/webhook-client.csr" -CA "$d/webhook-ca.crt" -CAkey "$d/webhook-ca.key" -CAcreateserial \
    -days 2 -extfile "$d/client.ext" -out "$d/webhook-client.crt" 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
}

kubeconfig() { # kubeconfig DIR NAME URL
  local d=$1 name=$2 url=$3
  cat > "$d/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: "$url", certificate-authority: "$d/ca.crt"}}]
users: [{name: $name, user: {client-certificate: "$d/$name.crt", client-key: "$d/$name.key"}}]
contexts: [{name: e2e, context: {cluster: e2e, user: $name}}]
current-context: e2e
EOF
}

# kube-apiserver shows its webhook client certificate to every webhook it
# calls (the kubeconfig's user "*"), as an operator sets it up for mTLS.
admission_config() { # admission_config DIR
  local d=$1
  cat > "$d/webhook-client.kubeconfig" <<EOF
apiVersion: v1
kind: Config
users: [{name: "*", user: {client-certificate: "$d/webhook-client.crt", client-key: "$d/webhook-client.key"}}]
EOF
  cat > "$d/admission.yaml" <<EOF
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: MutatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: "$d/webhook-client.kubeconfig"
  - name: ValidatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: "$d/webhook-client.kubeconfig"
EOF
}

# Starts kube-apiserver with what `up` saved (also `restart-apiserver`).
start_apiserver() { # start_apiserver DIR
  local d=$1 bin etcd_client api_port node=""
  # shellcheck disable=SC1091
  . "$d/apiserver.env"
  # With a node, pods reach the API server at the bridge's address, and it
  # reaches webhooks and kubelets by endpoint (node.sh).
  local address=(--bind-address 127.0.0.1 --advertise-address 127.0.0.1)
  if [ -n "$node" ]; then
    address=(--bind-address 0.0.0.0 --advertise-address "$POD_NET.1" --enable-aggregator-routing=true
      --kubelet-preferred-address-types InternalIP --kubelet-certificate-authority "$d/ca.crt"
      --kubelet-client-certificate "$d/apiserver-kubelet-client.crt" --kubelet-client-key "$d/apiserver-kubelet-client.key")
  fi
  "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_client" \
    "${address[@]}" --secure-port "$api_port" \
    --tls-cert-file "$d/apiserver.crt" --tls-private-key-file "$d/apiserver.key" \
    --client-ca-file "$d/ca.crt" \
    --service-account-key-file "$d/sa.pub" --service-account-signing-key-file "$d/sa.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-cluster-ip-range 10.96.0.0/16 \
    --authorization-mode Node,RBAC \
    --admission-control-config-file "$d/admission.yaml" \
    --cert-dir "$d/apiserver-certs" \
    --v 1 >> "$d/kube-apiserver.log" 2>&1 &
  echo $! >> "$d/pids"
  echo $! > "$d/apiserver.pid"
}

# A fault for the reliability tests: kube-apiserver killed and started
# again; returns once it is ready.
restart_apiserver() { # restart_apiserver DIR
  local d=$1
  kill "$(cat "$d/apiserver.pid")" 2>/dev/null || true
  while kill -0 "$(cat "$d/apiserver.pid")" 2>/dev/null; do sleep 0.2; done
  start_apiserver "$d"
  # shellcheck disable=SC1091
  . "$d/apiserver.env"
  wait_for kube-apiserver 120 "$bin/kubectl" --kubeconfig "$d/admin.kubeconfig" get --raw /readyz
  log "kube-apiserver restarted"
}

# A fault for the reliability tests: etcd unavailable (stopped, SIGSTOP)
# for SECONDS, then resumed.
pause_etcd() { # pause_etcd DIR SECONDS
  local d=$1 pid
  pid=$(head -1 "$d/pids")
  kill -STOP "$pid"
  sleep "$2"
  kill -CONT "$pid"
  log "etcd resumed after $2 s"
}

up() { # up DIR [--node]
  local d=$1 node=${2:-} bin
  bin=$(build)
  mkdir -p "$d"
  d=$(cd "$d" && pwd)
  local san=""
  # A test that is killed rather than unwound still leaves nothing behind:
  # a reaper runs `down` once the process that owns the cluster is gone.
  if [ -n "${CONTROL_PLANE_OWNER:-}" ]; then
    setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 2; done; exec "$2" down "$3"' \
      reaper "$CONTROL_PLANE_OWNER" "$HERE/control-plane.sh" "$d" > "$d/reaper.log" 2>&1 < /dev/null &
  fi
  if [ "$node" = --node ]; then
    node_packages
    # One node per machine (one bridge, the kubelet's ports): a node still
    # up, or left by a run killed with its reaper, is taken down first.
    local previous
    previous=$(cat "$NODE_MARK" 2>/dev/null || true)
    if [ -n "$previous" ] && [ "$previous" != "$d" ]; then
      log "taking down the node left in $previous (one node per machine)"
      down "$previous"
    fi
    echo "$d" > "$NODE_MARK"
    : > "$d/node"
    node_sweep "$d"
    ls /var/run/netns 2>/dev/null > "$d/netns.before" || : > "$d/netns.before"
    sysctl -n net.ipv4.ip_forward > "$d/ip_forward.before"
    sysctl -qw net.ipv4.ip_forward=1
    ip link add "$BRIDGE" type bridge
    ip addr add "$POD_NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    san=",IP:$POD_NET.1"
  fi
  certs "$d" "$san"
  [ "$node" = --node ] && node_certs "$d"
  admission_config "$d"
  local etcd_client etcd_peer api_port
  etcd_client=$(free_port); etcd_peer=$(free_port); api_port=$(free_port)
  local url="https://127.0.0.1:$api_port"
  kubeconfig "$d" admin "$url"
  kubeconfig "$d" controller-manager "$url"
  : > "$d/pids"

  "$bin/etcd" --data-dir "$d/etcd" --name e2e \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "e2e=http://127.0.0.1:$etcd_peer" --log-level warn > "$d/etcd.log" 2>&1 &
  echo $! >> "$d/pids"
  wait_for etcd 30 curl -sf "http://127.0.0.1:$etcd_client/health"

  printf 'bin=%s\netcd_client=%s\napi_port=%s\nnode=%s\n' "$bin" "$etcd_client" "$api_port" "${node:+1}" > "$d/apiserver.env"
  start_apiserver "$d"
  wait_for kube-apiserver 120 "$bin/kubectl" --kubeconfig "$d/admin.kubeconfig" get --raw /readyz

  # With a node, its lifecycle controller lifts the not-ready taint.
  local lifecycle="-nodelifecycle,"
  [ "$node" = --node ] && lifecycle=""
  "$bin/kube-controller-manager" \
    --kubeconfig "$d/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$d/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$d/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" \
    --leader-elect=false \
    --service-account-private-key-file "$d/sa.key" --root-ca-file "$d/ca.crt" \
    --cluster-signing-cert-file "$d/ca.crt" --cluster-signing-key-file "$d/ca.key" \
    --controllers "*,-nodeipam,$lifecycle-cloud-node-lifecycle,-route,-service,-persistentvolume-binder" \
    --v 1 > "$d/kube-controller-manager.log" 2>&1 &
  echo $! >> "$d/pids"
  # The default service account appears once the controllers run.
  wait_for kube-controller-manager 120 "$bin/kubectl" --kubeconfig "$d/admin.kubeconfig" -n default get serviceaccount default

  cat > "$d/env" <<EOF
export KUBECONFIG="$d/admin.kubeconfig"
export BIN="$bin"
export APISERVER="$url"
export HELM="$HELM_DIR/helm"
export ARGO_ROLLOUTS="$ARGO_DIR"
export PROMTOOL="$PROMTOOL_DIR/promtool"
EOF
  log "up: $url (state in $d)"
  if [ "$node" = --node ]; then node_up "$d" "$bin" "$url"; fi
}

# Idempotent: a second `down` of the same DIR (the reaper's, after the
# test's own) finds nothing to do, and so never touches a node started
# since.
down() {
  local d=$1
  [ -f "$d/pids" ] || [ -f "$d/node" ] || return 0
  if [ -f "$d/pids" ]; then
    tac "$d/pids" | while read -r pid; do kill "$pid" 2>/dev/null || true; done
    sleep 1
    tac "$d/pids" | while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done
    rm -f "$d/pids"
  fi
  if [ -f "$d/node" ]; then
    node_sweep "$d"
    rm -f "$d/node"
    [ "$(cat "$NODE_MARK" 2>/dev/null)" = "$d" ] && rm -f "$NODE_MARK"
  fi
  log "down"
}

cached() {
  for b in etcd kube-apiserver kube-controller-manager kubectl; do [ -x "$CACHE/$b" ] || return 1; done
  [ -x "$HELM_DIR/helm" ] && [ -x "$ARGO_DIR/rollouts-controller" ] && [ -x "$ARGO_DIR/kubectl-argo-rollouts" ] \
    && [ -f "$ARGO_DIR/crds/rollout-crd.yaml" ] && [ -x "$PROMTOOL_DIR/promtool" ] && node_cached
}

case "${1:-}" in
  build) build ;;
  cached) cached ;;
  crane) build >/dev/null && echo "$CRANE_DIR/crane" ;;
  helm) build >/dev/null && echo "$HELM_DIR/helm" ;;
  kubectl) build >/dev/null && echo "$CACHE/kubectl" ;;
  packages) node_packages ;;
  up) up "${2:?state directory}" "${3:-}" ;;
  down) down "${2:?state directory}" ;;
  restart-apiserver) restart_apiserver "${2:?state directory}" ;;
  pause-etcd) pause_etcd "${2:?state directory}" "${3:?seconds}" ;;
  *) echo "usage: $0 build | crane | helm | kubectl | packages | up DIR [--node] | down DIR | restart-apiserver DIR | pause-etcd DIR SECONDS" >&2; exit 2 ;;
esac
