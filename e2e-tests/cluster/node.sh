# A real node for the control plane of control-plane.sh (sourced by it):
# kubelet, kube-scheduler and kube-proxy from the same Kubernetes module,
# Debian's containerd, runc and CNI plugins, a bridge of its own, and a
# local registry (the CNCF Distribution registry, Debian's docker-registry)
# holding the images the node runs, built here from files and pushed with
# crane: no container engine, no image pulled from outside.
#
# Everything lives in the state directory, but for what Linux keeps
# globally, which `node_down` removes whatever state the run ended in: the
# bridge, the pods' network namespaces, kube-proxy's iptables rules, and
# the mounts under the state directory.
#
# Pods run on a CNI bridge (BRIDGE, POD_NET.0/24), each in a network
# namespace of its own; the Service network is kube-proxy's (iptables).
# kube-apiserver listens beyond loopback so that pods reach it at its
# advertise address on the bridge, and reaches webhooks and kubelets
# through endpoints (--enable-aggregator-routing): Services route by
# endpoints, as kube-proxy would route them, without DNS on the host.

BRIDGE=csbr0
POD_NET=10.244.7
NODE_NAME=node-1
PAUSE_TAG=3.10
BUSYBOX_TAG=1.35
CRANE_VERSION=v0.22.1
CRANE_DIR="$ROOT/tools/crane-$CRANE_VERSION"
# The attacker of docs/security.md's round 3 (e2e-tests/cluster/attack),
# static Go, cached by its source's hash.
ATTACK_DIR="$ROOT/tools/attack-$(cat "$HERE/attack/go.mod" "$HERE/attack/main.go" | sha256sum | cut -c1-12)"

# The binaries the node adds to the control plane's cache.
node_build() { # node_build
  for b in kubelet kube-scheduler kube-proxy; do
    if [ ! -x "$CACHE/$b" ]; then
      log "building $b $K8S_VERSION"
      (cd "$HERE/go/kubernetes" && go build -trimpath -ldflags "$K8S_LDFLAGS" \
        -o "$CACHE/$b.tmp" "k8s.io/kubernetes/cmd/$b") && mv "$CACHE/$b.tmp" "$CACHE/$b"
    fi
  done
  if [ ! -x "$CACHE/pause" ]; then
    # The pause container's program, from the Kubernetes module's own
    # source (build/pause), static so that its image needs nothing else.
    log "building pause from k8s.io/kubernetes $K8S_VERSION"
    local src
    src=$(cd "$HERE/go/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
    gcc -Os -static -DVERSION="$PAUSE_TAG" -o "$CACHE/pause.tmp" "$src/build/pause/linux/pause.c" && mv "$CACHE/pause.tmp" "$CACHE/pause"
  fi
  if [ ! -x "$ATTACK_DIR/attack" ]; then
    log "building the attacker (e2e-tests/cluster/attack)"
    mkdir -p "$ATTACK_DIR"
    (cd "$HERE/attack" && CGO_ENABLED=0 go build -trimpath -o "$ATTACK_DIR/attack.tmp" .) && mv "$ATTACK_DIR/attack.tmp" "$ATTACK_DIR/attack"
  fi
  if [ ! -x "$CRANE_DIR/crane" ]; then
    log "building crane $CRANE_VERSION"
    mkdir -p "$CRANE_DIR"
    (cd "$HERE/go/crane" && go build -trimpath -o "$CRANE_DIR/crane.tmp" github.com/google/go-containerregistry/cmd/crane) \
      && mv "$CRANE_DIR/crane.tmp" "$CRANE_DIR/crane"
  fi
}

node_cached() {
  for b in kubelet kube-scheduler kube-proxy pause; do [ -x "$CACHE/$b" ] || return 1; done
  [ -x "$CRANE_DIR/crane" ] && [ -x "$ATTACK_DIR/attack" ]
}

# The distribution's packages the node runs on (as root, installed when
# missing; .ci/run installs them up front).
NODE_PACKAGES="containerd runc containernetworking-plugins iptables conntrack docker-registry busybox-static"
node_packages() {
  local missing=""
  command -v containerd >/dev/null || missing="$missing containerd"
  command -v runc >/dev/null || missing="$missing runc"
  [ -x /usr/lib/cni/bridge ] || missing="$missing containernetworking-plugins"
  command -v iptables >/dev/null || missing="$missing iptables"
  command -v conntrack >/dev/null || missing="$missing conntrack"
  command -v docker-registry >/dev/null || missing="$missing docker-registry"
  [ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q static || missing="$missing busybox-static"
  [ -z "$missing" ] && return 0
  [ "$(id -u)" = 0 ] || { log "the node needs:$missing (as root: apt-get install $NODE_PACKAGES)"; return 1; }
  log "installing$missing"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $NODE_PACKAGES >/dev/null
}

# Client certificates of the node's components, and the kubelet's serving
# certificate (the API server checks it for `kubectl logs` and `exec`).
node_certs() { # node_certs DIR
  local d=$1
  client_cert "$d" node "/O=system:nodes/CN=system:node:$NODE_NAME"
  client_cert "$d" scheduler "/CN=system:kube-scheduler"
  client_cert "$d" proxy "/CN=system:kube-proxy"
  client_cert "$d" apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  printf 'subjectAltName=IP:127.0.0.1,IP:%s.1,DNS:%s\n' "$POD_NET" "$NODE_NAME" > "$d/kubelet-san.ext"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$NODE_NAME" -keyout "$d/kubelet-serving.key" -out "$d/kubelet-serving.csr" 2>/dev/null
  openssl x509 -req -in "$d/kubelet-serving.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -extfile "$d/kubelet-san.ext" -out "$d/kubelet-serving.crt" 2>/dev/null
}

# Removes what a node run left in the machine's global state: the
# bridge, the pods' network namespaces, kube-proxy's rules. Safe to run
# when there is nothing.
node_sweep() { # node_sweep DIR
  local d=$1
  if [ -d "$d/runc" ]; then
    for root in "$d"/runc/*; do
      [ -d "$root" ] || continue
      for id in $(runc --root "$root" list -q 2>/dev/null); do
        runc --root "$root" delete --force "$id" >/dev/null 2>&1 || true
      done
    done
  fi
  pkill -9 -f "containerd-shim-runc-v2 .*-address $d/containerd.sock" 2>/dev/null || true
  # Mounts under the state directory, deepest first (the kubelet's
  # volumes, containerd's root filesystems and shm).
  { grep " $d/" /proc/mounts || true; } | awk '{print $2}' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  if [ -f "$d/netns.before" ] && [ -d /var/run/netns ]; then
    for ns in $(ls /var/run/netns 2>/dev/null || true); do
      case "$ns" in cni-*) ;; *) continue ;; esac
      grep -qx "$ns" "$d/netns.before" || ip netns delete "$ns" 2>/dev/null || true
    done
  fi
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE" 2>/dev/null || true
  if [ -x "$CACHE/kube-proxy" ] && [ -f "$d/node" ]; then
    "$CACHE/kube-proxy" --cleanup >/dev/null 2>&1 || true
  fi
  # Whatever KUBE-* chain is left (kube-proxy's, if its cleanup missed one):
  # the jumps to them from the built-in chains, then the chains.
  for cmd in iptables ip6tables; do
    command -v "$cmd" >/dev/null || continue
    for table in filter nat mangle; do
      "$cmd" -t "$table" -S 2>/dev/null | { grep -E '^-A [A-Z]+ .*-j KUBE-' || true; } | while read -r rule; do
        # shellcheck disable=SC2086
        "$cmd" -t "$table" ${rule/-A/-D} 2>/dev/null || true
      done
      for chain in $("$cmd" -t "$table" -S 2>/dev/null | awk '/^-N KUBE-/ {print $2}'); do
        "$cmd" -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$cmd" -t "$table" -S 2>/dev/null | awk '/^-N KUBE-/ {print $2}'); do
        "$cmd" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
  if [ -f "$d/ip_forward.before" ]; then
    sysctl -qw net.ipv4.ip_forward="$(cat "$d/ip_forward.before")" 2>/dev/null || true
  fi
}

# An image of `layer` (a directory) pushed as `ref`, with its entrypoint
# and user (crane: no container engine).
push_image() { # push_image LAYER_DIR REF ENTRYPOINT [USER]
  local dir=$1 ref=$2 entrypoint=$3 user=${4:-}
  local tar="$dir.tar"
  tar --numeric-owner --owner=0 --group=0 -C "$dir" -cf "$tar" .
  "$CRANE_DIR/crane" append --insecure --platform linux/amd64 --oci-empty-base -f "$tar" -t "$ref" >/dev/null 2>>"$dir.log"
  local args=(mutate --insecure "$ref" -t "$ref")
  [ -n "$entrypoint" ] && args+=(--entrypoint "$entrypoint")
  [ -n "$user" ] && args+=(--user "$user")
  "$CRANE_DIR/crane" "${args[@]}" >/dev/null 2>>"$dir.log"
}

node_images() { # node_images DIR REGISTRY
  local d=$1 registry=$2
  rm -rf "$d/images" && mkdir -p "$d/images/pause" "$d/images/busybox/bin"
  install -m 0755 "$CACHE/pause" "$d/images/pause/pause"
  push_image "$d/images/pause" "$registry/pause:$PAUSE_TAG" /pause
  # The app image: Debian's busybox-static and its applets.
  install -m 0755 /bin/busybox "$d/images/busybox/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$d/images/busybox/bin/$applet"
  done
  mkdir -p "$d/images/busybox/tmp" "$d/images/busybox/etc"
  chmod 1777 "$d/images/busybox/tmp"
  echo 'root:x:0:0:root:/:/bin/sh' > "$d/images/busybox/etc/passwd"
  echo 'nobody:x:65534:65534:nobody:/:/bin/false' >> "$d/images/busybox/etc/passwd"
  push_image "$d/images/busybox" "$registry/busybox:$BUSYBOX_TAG" ""
  # The attacker: one static binary.
  mkdir -p "$d/images/attack"
  install -m 0755 "$ATTACK_DIR/attack" "$d/images/attack/attack"
  push_image "$d/images/attack" "$registry/attack:v1" /attack 65534
}

node_up() { # node_up DIR BIN URL
  local d=$1 bin=$2 url=$3
  # The registry.
  local registry_port registry
  registry_port=$(free_port); registry="127.0.0.1:$registry_port"
  mkdir -p "$d/registry"
  cat > "$d/registry.yml" <<EOF
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $d/registry}, delete: {enabled: true}}
http: {addr: $registry}
EOF
  docker-registry serve "$d/registry.yml" > "$d/registry.log" 2>&1 &
  echo $! >> "$d/pids"
  wait_for registry 30 curl -sf "http://$registry/v2/"
  node_images "$d" "$registry"

  # containerd, with its root, state, socket and runc's root in DIR.
  mkdir -p "$d/cni-conf" "$d/ipam" "$d/runc"
  cat > "$d/containerd.toml" <<EOF
version = 2
root = "$d/ctr-root"
state = "$d/ctr-state"
[grpc]
  address = "$d/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$registry/pause:$PAUSE_TAG"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$d/cni-conf"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      Root = "$d/runc"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."$registry"]
    endpoint = ["http://$registry"]
EOF
  cat > "$d/cni-conf/10-csnet.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "csnet", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "isDefaultGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_NET.0/24", "gateway": "$POD_NET.1"}]], "dataDir": "$d/ipam"}},
  {"type": "loopback"}]}
EOF
  containerd --config "$d/containerd.toml" > "$d/containerd.log" 2>&1 &
  echo $! >> "$d/pids"
  wait_for containerd 30 test -S "$d/containerd.sock"

  # The node's components, each with its identity.
  kubeconfig "$d" node "$url"
  kubeconfig "$d" scheduler "$url"
  kubeconfig "$d" proxy "$url"
  local kubelet_port
  kubelet_port=$(free_port)
  cat > "$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$d/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$d/ca.crt"}
authorization: {mode: AlwaysAllow}
address: $POD_NET.1
port: $kubelet_port
readOnlyPort: 0
healthzPort: 0
tlsCertFile: "$d/kubelet-serving.crt"
tlsPrivateKeyFile: "$d/kubelet-serving.key"
cgroupsPerQOS: false
enforceNodeAllocatable: []
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: ""
serializeImagePulls: false
# No iptables chains of the kubelet's own: kube-proxy's are the node's, and
# down removes them.
makeIPTablesUtilChains: false
podLogsDir: "$d/pod-logs"
EOF
  "$bin/kubelet" --config "$d/kubelet.yaml" --kubeconfig "$d/node.kubeconfig" \
    --hostname-override "$NODE_NAME" --node-ip "$POD_NET.1" \
    --root-dir "$d/kubelet-root" --cert-dir "$d/kubelet-pki" --v 1 > "$d/kubelet.log" 2>&1 &
  echo $! >> "$d/pids"
  "$bin/kube-scheduler" --kubeconfig "$d/scheduler.kubeconfig" \
    --authentication-kubeconfig "$d/scheduler.kubeconfig" --authorization-kubeconfig "$d/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" --leader-elect=false --v 1 > "$d/kube-scheduler.log" 2>&1 &
  echo $! >> "$d/pids"
  "$bin/kube-proxy" --kubeconfig "$d/proxy.kubeconfig" --hostname-override "$NODE_NAME" \
    --proxy-mode iptables --cluster-cidr "$POD_NET.0/24" --conntrack-max-per-core 0 \
    --iptables-localhost-nodeports=false --bind-address 127.0.0.1 \
    --metrics-bind-address "127.0.0.1:$(free_port)" --healthz-bind-address "127.0.0.1:$(free_port)" \
    --v 1 > "$d/kube-proxy.log" 2>&1 &
  echo $! >> "$d/pids"
  local k=("$bin/kubectl" --kubeconfig "$d/admin.kubeconfig")
  wait_for "node $NODE_NAME" 120 "${k[@]}" wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
  # The node lifecycle controller lifts the not-ready taint once the node
  # is Ready.
  wait_for "the not-ready taint to go" 120 bash -c \
    "! ${k[*]} get node $NODE_NAME -o jsonpath='{.spec.taints[*].key}' | grep -q not-ready"
  cat >> "$d/env" <<EOF
export REGISTRY="$registry"
export NODE_IMAGES="pause=$registry/pause:$PAUSE_TAG,busybox=$registry/busybox:$BUSYBOX_TAG,attack=$registry/attack:v1"
export NODE="$NODE_NAME"
export CRANE="$CRANE_DIR/crane"
EOF
  log "node $NODE_NAME ready; registry $registry"
}
