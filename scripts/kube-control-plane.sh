#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for the operator's tests: etcd, kube-apiserver
# (token authentication, RBAC enforced) and kube-controller-manager (garbage collection,
# service-account tokens). The binaries come from Debian packages only and are built once,
# then reused from the cache (keyed on the version).
#
#   scripts/kube-control-plane.sh build          build or reuse the binaries; prints their folder
#   scripts/kube-control-plane.sh path           prints the binaries' folder if built (exit 1 if not)
#   scripts/kube-control-plane.sh start DIR      starts the three servers with their state in DIR;
#                                                DIR/env holds the connection (KUBE_SERVER, KUBE_CA,
#                                                KUBE_TOKEN, KUBECONFIG)
#   scripts/kube-control-plane.sh stop DIR       stops the servers started in DIR
#
# Kubernetes v1.20.2 is Debian bookworm's `kubernetes` source package (the full tree with its
# vendor/ folder); it is built with Debian bullseye's golang-1.15-go, the toolchain of that release
# (newer Go miscompiles it). etcd is Debian bookworm's etcd-server. apt runs on a private sources
# list and state folder, so the system's apt configuration is untouched.
set -euo pipefail

KUBE_VERSION=1.20.2
CACHE="${PLANARIA_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/planaria/kube-$KUBE_VERSION}"
BIN="$CACHE/bin"
MIRROR="${PLANARIA_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

die() {
  echo "kube-control-plane: $*" >&2
  exit 2
}

built() {
  [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/etcd" ]
}

# shellcheck source=scripts/apt-private.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-private.sh"

build() {
  if built; then
    echo "$BIN"
    return
  fi
  command -v apt-get >/dev/null || die "apt-get is needed to download the Debian packages"
  command -v dpkg-source >/dev/null || die "dpkg-source (package dpkg-dev) is needed to unpack the kubernetes source package"
  local apt="$CACHE/apt" work="$CACHE/work"
  rm -rf "$work"
  mkdir -p "$apt/lists/partial" "$apt/cache" "$apt/archives/partial" "$work/debs" "$work/go" "$BIN"
  cat >"$apt/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR bullseye main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR bookworm main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR bookworm main
EOF
  echo "kube-control-plane: [${SECONDS}s] downloading the Debian packages" >&2
  apt_private update >&2
  (cd "$work/debs" && apt_private download golang-1.15-go/bullseye golang-1.15-src/bullseye etcd-server/bookworm >&2)
  (cd "$work" && apt_private source --download-only kubernetes/bookworm >&2)
  for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/go"; done
  (cd "$work" && dpkg-source -x --no-check kubernetes_*.dsc src >&2)
  local goroot="$work/go/usr/lib/go-1.15"
  [ -x "$goroot/bin/go" ] || die "golang-1.15-go did not unpack to $goroot"
  mkdir -p "$work/gopath/src/k8s.io"
  ln -s "$work/src" "$work/gopath/src/k8s.io/kubernetes"
  # The build places its binaries with `rsync -pc FILE DIR` (hack/lib/golang.sh), its only use of
  # rsync; where rsync is not installed, a copy does the same.
  mkdir -p "$work/shim"
  if ! command -v rsync >/dev/null; then
    printf '#!/bin/sh\n[ "$1" = -pc ] && exec cp -p "$2" "$3/"\necho "rsync shim: unexpected use: $*" >&2; exit 1\n' >"$work/shim/rsync"
    chmod +x "$work/shim/rsync"
  fi
  echo "kube-control-plane: [${SECONDS}s] building kube-apiserver and kube-controller-manager (minutes)" >&2
  (
    cd "$work/gopath/src/k8s.io/kubernetes"
    export GOROOT="$goroot" GOPATH="$work/gopath" GOCACHE="$work/gocache" GOFLAGS=-mod=vendor \
      GO111MODULE=on CGO_ENABLED=0 PATH="$goroot/bin:$work/shim:$PATH" KUBE_GIT_VERSION="v$KUBE_VERSION" \
      KUBE_GIT_TREE_STATE=clean
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >&2
  )
  local out="$work/src/_output/local/bin/linux/amd64"
  [ -d "$out" ] || out="$(dirname "$(find "$work/src/_output" -name kube-apiserver -type f | head -n1)")"
  install -m 755 "$out/kube-apiserver" "$out/kube-controller-manager" "$BIN/"
  install -m 755 "$(find "$work/go" -path '*/bin/etcd' -type f | head -n1)" "$BIN/etcd"
  rm -rf "$work" "$apt"
  echo "kube-control-plane: [${SECONDS}s] built in $BIN" >&2
  built || die "the build finished without the three binaries in $BIN"
  echo "$BIN"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for() { # what, pid, command...
  local what=$1 pid=$2
  shift 2
  for _ in $(seq 1 600); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    kill -0 "$pid" 2>/dev/null || die "$what exited while starting; see its log in $DIR"
    sleep 0.2
  done
  die "$what did not become ready within 120 s; see its log in $DIR"
}

start() {
  built || die "the binaries are not built: run 'scripts/kube-control-plane.sh build' first"
  mkdir -p "$DIR"
  DIR="$(cd "$DIR" && pwd)"
  [ ! -e "$DIR/apiserver.pid" ] || die "$DIR already holds a running control plane (stop it first)"
  local pki="$DIR/pki"
  mkdir -p "$pki"
  # Self-made certificates: a CA, the API server's serving certificate for the loopback address,
  # and the key pair that signs and checks service-account tokens.
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=planaria-test-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' >"$pki/san.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 30 -extfile "$pki/san.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  local token
  token="$(openssl rand -hex 24)"
  printf '%s,planaria-admin,planaria-admin,system:masters\n' "$token" >"$pki/tokens.csv"

  local etcd_port etcd_peer api_port
  etcd_port="$(free_port)"
  etcd_peer="$(free_port)"
  api_port="${PLANARIA_KUBE_PORT:-$(free_port)}"
  "$BIN/etcd" --name planaria --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "planaria=http://127.0.0.1:$etcd_peer" --log-level warn \
    >"$DIR/etcd.log" 2>&1 &
  echo $! >"$DIR/etcd.pid"
  wait_for etcd "$(cat "$DIR/etcd.pid")" curl -fsS "http://127.0.0.1:$etcd_port/health"

  "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" --insecure-port 0 \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
    --authorization-mode RBAC --anonymous-auth=false \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --api-audiences https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=false \
    >"$DIR/apiserver.log" 2>&1 &
  echo $! >"$DIR/apiserver.pid"
  local server="https://127.0.0.1:$api_port"
  wait_for kube-apiserver "$(cat "$DIR/apiserver.pid")" \
    curl -fsS --cacert "$pki/ca.crt" -H "Authorization: Bearer $token" "$server/readyz"

  cat >"$DIR/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: planaria-test
  cluster: {server: "$server", certificate-authority: "$pki/ca.crt"}
users:
- name: planaria-admin
  user: {token: "$token"}
contexts:
- name: planaria-test
  context: {cluster: planaria-test, user: planaria-admin, namespace: default}
current-context: planaria-test
EOF
  # No Node objects exist (the tests' kubelet harness binds pods to made-up node names without
  # registering nodes), so the pod garbage collector, which deletes pods bound to a node that does
  # not exist after 40 s, is off; so are the controllers needing a CA key or a pod CIDR.
  "$BIN/kube-controller-manager" --kubeconfig "$DIR/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --port 0 --leader-elect=false \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --controllers '*,-podgc,-csrsigning,-csrapproving,-csrcleaner,-nodeipam' \
    >"$DIR/controller-manager.log" 2>&1 &
  echo $! >"$DIR/controller-manager.pid"
  sleep 0.5
  kill -0 "$(cat "$DIR/controller-manager.pid")" 2>/dev/null ||
    die "kube-controller-manager exited while starting; see $DIR/controller-manager.log"

  cat >"$DIR/env" <<EOF
KUBE_SERVER=$server
KUBE_CA=$pki/ca.crt
KUBE_TOKEN=$token
KUBECONFIG=$DIR/kubeconfig
KUBE_VERSION=$KUBE_VERSION
EOF
  echo "kube-control-plane: Kubernetes v$KUBE_VERSION at $server (RBAC), admin token in $DIR/env"
  cat "$DIR/env"
}

stop() {
  [ -d "$DIR" ] || die "no control plane state in $DIR"
  local name pid
  for name in controller-manager apiserver etcd; do
    [ -f "$DIR/$name.pid" ] || continue
    pid="$(cat "$DIR/$name.pid")"
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$DIR/$name.pid"
  done
}

case "${1:-}" in
build) build ;;
path)
  built || exit 1
  echo "$BIN"
  ;;
start | stop)
  [ $# -eq 2 ] || die "usage: $0 $1 DIR"
  DIR=$2
  "$1"
  ;;
*) die "usage: $0 build | path | start DIR | stop DIR" ;;
esac
