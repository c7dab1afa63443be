#!/usr/bin/env bash
# Builds the Planaria image from the Dockerfile without a Docker engine or a registry, and checks
# that its entrypoints start as the chart runs them: uid 10001, read-only root filesystem, only
# /tmp and /dev/shm writable.
#
#   scripts/build-image.sh build     build or reuse the CPU image; prints its name
#   scripts/build-image.sh name      prints the built image's name (exit 1 if not built)
#   scripts/build-image.sh check     runs the entrypoints in the built image (exit 1 on a failure)
#   scripts/build-image.sh size      prints the built image's size in bytes
#   scripts/build-image.sh run [--bind DIR] [--bind-rw DIR] [--env NAME=VALUE] [--pass-env] -- ARGS...
#                                    runs `planaria ARGS` in the image as check does, with DIR
#                                    (under /tmp) bound read-only (--bind-rw: writable, handed to
#                                    uid 10001), NAME set (--pass-env: the caller's environment
#                                    but for this host's PATH, HOME, PYTHON*, ...)
#
# buildah (Debian bookworm's package, unpacked into the cache with its one missing library, run
# with --isolation chroot on private storage) builds the Dockerfile; the base of both stages is
# `debootstrap --variant=minbase bookworm` with python3, python3-venv and ca-certificates,
# imported as an image, since no registry is reachable. apt runs on a private sources list and
# state folder, so the system's apt configuration is untouched. It needs root (debootstrap,
# chroot, mounts). Everything lives under ~/.cache/planaria/image; the image is reused while
# its inputs (Dockerfile, pyproject.toml, README.md, operator/, agent/, protos/, the build
# arguments and the base) hash the same. The Dockerfile's dependencies stage is kept (tagged
# localhost/planaria-deps:cpu-HASH) as the layer cache: a change to the code alone rebuilds only
# Planaria's own layers (about 30 s here), not the venv (minutes).
#
# pip in the build stage uses this machine's pip configuration unless told otherwise: its
# find-links folders and file:// indexes are mounted read-only into the build. Overrides:
# PLANARIA_IMAGE_INDEX_URL, PLANARIA_IMAGE_EXTRA_INDEX_URL, PLANARIA_IMAGE_FIND_LINKS,
# PLANARIA_IMAGE_TORCH_INDEX_URL (`none`: find-links only), PLANARIA_IMAGE_CA_BUNDLE (a PEM file),
# PLANARIA_DEBIAN_MIRROR.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${PLANARIA_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/planaria/image}"
MIRROR="${PLANARIA_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates
TOOLS="$CACHE/tools"
REPO=localhost/planaria

die() {
  echo "build-image: $*" >&2
  exit 2
}

log() { echo "build-image: [${SECONDS}s] $*" >&2; }

# shellcheck source=scripts/apt-private.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-private.sh"

# buildah and debootstrap from Debian packages, unpacked into $TOOLS (not installed).
tools() {
  [ -e "$TOOLS/ready" ] && return
  command -v apt-get >/dev/null || die "apt-get is needed to download the Debian packages"
  [ "$(id -u)" = 0 ] || die "building the image needs root (debootstrap, chroot, mounts)"
  local apt="$CACHE/apt" debs="$CACHE/debs"
  rm -rf "$TOOLS" "$debs"
  mkdir -p "$apt/lists/partial" "$apt/cache" "$apt/archives/partial" "$debs"
  cat >"$apt/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $SUITE main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $SUITE-updates main
EOF
  log "downloading buildah and debootstrap (Debian $SUITE)"
  apt_private update >&2
  # buildah's libraries that a bookworm system may lack (libgpgme11 at least); the others it
  # links (libc, libseccomp2, libdevmapper, libassuan, libgpg-error) are in every base system.
  (cd "$debs" && apt_private download buildah golang-github-containers-common libgpgme11 \
    libdevmapper1.02.1 debootstrap patchelf >&2)
  mkdir -p "$TOOLS"
  for deb in "$debs"/*.deb; do dpkg -x "$deb" "$TOOLS"; done
  # buildah runs its RUN steps by re-executing itself with a clean environment (no
  # LD_LIBRARY_PATH; from a copy of itself, so not $ORIGIN either): it finds its unpacked
  # libraries through an absolute run path.
  "$TOOLS/usr/bin/patchelf" --set-rpath "$TOOLS/usr/lib/x86_64-linux-gnu" "$TOOLS/usr/bin/buildah"
  "$TOOLS/usr/bin/buildah" --version >&2
  rm -rf "$debs" "$apt"
  touch "$TOOLS/ready"
}

buildah() {
  mkdir -p "$CACHE/storage" "$CACHE/run"
  CONTAINERS_REGISTRIES_CONF=/dev/null \
    CONTAINERS_CONF="$TOOLS/usr/share/containers/containers.conf" BUILDAH_ISOLATION=chroot \
    "$TOOLS/usr/bin/buildah" --root "$CACHE/storage" --runroot "$CACHE/run" \
    --storage-driver "${PLANARIA_IMAGE_STORAGE_DRIVER:-overlay}" "$@"
}

POLICY() { echo "$TOOLS/etc/containers/policy.json"; }

exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# The base of both stages: a minimal bookworm with Python, imported from a debootstrapped folder
# (named after its packages, mirror and this recipe).
base() {
  local key name
  key="$({ printf '%s %s %s\n' "$SUITE" "$BASE_PACKAGES" "$MIRROR"; declare -f base; } | sha256sum | cut -c1-12)"
  name="$REPO-base:$SUITE-$key"
  if exists "$name"; then
    echo "$name"
    return
  fi
  local dir="$CACHE/base-root"
  rm -rf "$dir"
  log "debootstrap --variant=minbase $SUITE (about a minute)"
  DEBOOTSTRAP_DIR="$TOOLS/usr/share/debootstrap" "$TOOLS/usr/sbin/debootstrap" \
    --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$dir" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
    die "debootstrap failed; see $CACHE/debootstrap.log"
  # apt's downloads and lists, documentation, manual pages and message translations: nothing
  # in the image reads them (about 50 MB).
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/var/log/*.log \
    "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/locale/* "$dir"/usr/share/info/*
  local ctr mnt
  ctr="$(buildah from --signature-policy "$(POLICY)" scratch)"
  mnt="$(buildah mount "$ctr")"
  cp -a "$dir/." "$mnt/"
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/bash "$ctr"
  buildah commit --quiet --signature-policy "$(POLICY)" --rm "$ctr" "$name" >/dev/null
  rm -rf "$dir"
  echo "$name"
}

pip_setting() { # the host pip's value of a global setting, empty if none
  python3 -m pip config get "global.$1" 2>/dev/null || true
}

# Build arguments (one per line, KEY=VALUE) and volumes for pip in the build stage.
build_args() {
  local index extra links torch_index
  index="${PLANARIA_IMAGE_INDEX_URL-$(pip_setting index-url)}"
  extra="${PLANARIA_IMAGE_EXTRA_INDEX_URL-$(pip_setting extra-index-url)}"
  links="${PLANARIA_IMAGE_FIND_LINKS-${PIP_FIND_LINKS:-$(pip_setting find-links)}}"
  # With local wheels (find-links), torch==2.13.0+cpu comes from them and the CPU index is not
  # asked; the +cpu pin keeps a CUDA build out either way.
  if [ -n "$links" ]; then torch_index="${PLANARIA_IMAGE_TORCH_INDEX_URL-${index:-https://pypi.org/simple}}"; else
    torch_index="${PLANARIA_IMAGE_TORCH_INDEX_URL-}"; fi
  [ -z "$index" ] || echo "INDEX_URL=$index"
  echo "EXTRA_INDEX_URL=$(echo "$extra" | tr '\n' ' ' | sed 's/ *$//')"
  echo "FIND_LINKS=$(echo "$links" | tr '\n' ' ' | sed 's/ *$//')"
  echo "TORCH_INDEX_URL=$torch_index"
}

# The CA bundle file for the CA_BUNDLE argument (PLANARIA_IMAGE_CA_BUNDLE, else the CAs this
# machine's pip trusts beyond the base's), or nothing.
ca_file() {
  local ca="${PLANARIA_IMAGE_CA_BUNDLE:-$CACHE/host-cas.pem}"
  if [ -n "${PLANARIA_IMAGE_CA_BUNDLE:-}" ]; then
    [ -r "$ca" ] || die "PLANARIA_IMAGE_CA_BUNDLE=$ca is not a readable file"
  fi
  [ -s "$ca" ] || return 0
  # A build argument is an environment variable, at most 128 KiB: the CAs the base lacks, not
  # a whole system bundle.
  [ "$(wc -c <"$ca")" -lt 120000 ] || die "the CA bundle $ca is over 120 kB (a build argument is an environment variable): pass only the CAs the base image lacks"
  echo "$ca"
}

# The CAs that this machine's pip trusts (PIP_CERT, its cert setting) and the base image does
# not (an intercepting proxy's, a mirror's), into $CACHE/host-cas.pem: the CA_BUNDLE argument.
host_cas() {
  local base=$1 cert ctr mnt
  cert="${PIP_CERT:-$(pip_setting cert)}"
  : >"$CACHE/host-cas.pem"
  [ -n "$cert" ] && [ -r "$cert" ] || return 0
  ctr="$(buildah from --pull-never --signature-policy "$(POLICY)" "$base")"
  mnt="$(buildah mount "$ctr")"
  python3 - "$cert" "$mnt/etc/ssl/certs/ca-certificates.crt" >"$CACHE/host-cas.pem" <<'EOF'
import pathlib, re, sys
def blocks(path):
    text = pathlib.Path(path).read_text() if pathlib.Path(path).exists() else ""
    return re.findall(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", text, re.S)
known = {"".join(b.split()) for b in blocks(sys.argv[2])}
print("\n".join(b for b in blocks(sys.argv[1]) if "".join(b.split()) not in known))
EOF
  buildah rm "$ctr" >/dev/null
  [ -n "$(tr -d '[:space:]' <"$CACHE/host-cas.pem")" ] || : >"$CACHE/host-cas.pem"
}

# Local folders that pip in the build reads (find-links folders, file:// indexes): mounted as is.
local_paths() {
  local value
  for value in $(build_args | sed -n 's/^\(EXTRA_INDEX_URL\|FIND_LINKS\|INDEX_URL\|TORCH_INDEX_URL\)=//p'); do
    case "$value" in
    # A file:// index: its pages link to files beside it (../../files/...), so its parent.
    file:///*) value="$(dirname "${value#file://}")" ;;
    esac
    case "$value" in /*) [ -e "$value" ] && echo "$value" ;; esac
  done | sort -u
}

inputs_hash() {
  local base=$1 ca
  (
    cd "$ROOT"
    {
      echo "$base"
      build_args | sha256sum
      ca="$(ca_file)"
      [ -z "$ca" ] || sha256sum <"$ca"
      find Dockerfile .dockerignore pyproject.toml README.md operator agent protos -type f \
        -not -path '*/__pycache__/*' -not -name '*.pyc' -not -path '*.egg-info/*' | LC_ALL=C sort |
        xargs sha256sum
    } | sha256sum | cut -c1-12
  )
}

built_name() { # the name the current inputs build, if built
  local tag
  tag="$REPO:cpu-$(inputs_hash "$(cat "$CACHE/base-name" 2>/dev/null || echo none)")"
  exists "$tag" && echo "$tag"
}

build() {
  tools
  local base tag
  base="$(base)"
  echo "$base" >"$CACHE/base-name"
  host_cas "$base"
  tag="$REPO:cpu-$(inputs_hash "$base")"
  if exists "$tag"; then
    log "reusing $tag"
    echo "$tag"
    return
  fi
  local -a args=(--build-arg "PYTHON_IMAGE=$base" --build-arg TORCH=cpu)
  local line path ca
  while IFS= read -r line; do args+=(--build-arg "$line"); done < <(build_args)
  ca="$(ca_file)"
  [ -z "$ca" ] || args+=(--build-arg "CA_BUNDLE=$(cat "$ca")")
  while IFS= read -r path; do args+=(-v "$path:$path:ro"); done < <(local_paths)
  # Working containers that an interrupted build or check left behind.
  buildah rm --all >/dev/null 2>&1 || true
  # Two runs of one build: the dependencies stage (`deps`: the venv, torch, the hf extra), tagged
  # so that the prune below keeps its layers for the next build's cache, then the image, which
  # reuses them. A change to the code rebuilds only Planaria's own layer (seconds); a change to
  # the dependency list, a build argument or the Dockerfile, the dependencies too (minutes).
  local deps="$REPO-deps:cpu-${tag##*:cpu-}"
  local -a bud=(buildah bud --layers --pull-never --signature-policy "$(POLICY)" --isolation chroot
    "${args[@]}" -f "$ROOT/Dockerfile")
  log "building $tag"
  { "${bud[@]}" --target deps -t "$deps" "$ROOT" && "${bud[@]}" -t "$tag" "$ROOT"; } >"$CACHE/build.log" 2>&1 ||
    { tail -n 30 "$CACHE/build.log" >&2; die "the build failed; its log: $CACHE/build.log"; }
  # Earlier builds of the image and of its dependencies stage, and the intermediate layers
  # nothing tagged keeps (Planaria's own, the build stage's): one image and its dependencies
  # stage are kept.
  local old
  for old in $(buildah images --format '{{.Name}}:{{.Tag}}' | grep -e "^$REPO:cpu-" -e "^$REPO-deps:cpu-" |
    grep -vx -e "$tag" -e "$deps" || true); do
    buildah rmi "$old" >/dev/null 2>&1 || true
  done
  buildah rmi --prune >/dev/null 2>&1 || true
  log "built $tag: $(size_of "$tag") bytes"
  echo "$tag"
}

# The image's size in bytes: the sum of its layers (uncompressed, as stored).
size_of() {
  buildah inspect --type image "$1" | python3 -c '
import json, sys
manifest = json.loads(json.load(sys.stdin)["Manifest"])
print(sum(layer["size"] for layer in manifest["layers"]))'
}

name() {
  [ -e "$TOOLS/ready" ] || exit 1
  built_name || exit 1
}

# The working containers of runs whose script is gone (killed before it could remove them: a
# kubelet's SIGKILL after the grace period).
sweep() {
  local name pid
  for name in $(buildah containers --noheading --format '{{.ContainerName}}' 2>/dev/null); do
    case "$name" in planaria-run-*) ;; *) continue ;; esac
    pid="${name#planaria-run-}"
    pid="${pid%%-*}"
    kill -0 "$pid" 2>/dev/null || buildah rm "$name" >/dev/null 2>&1 || true
  done
}

# Runs ARGS... in a view of the image as the chart runs it: its root bind-mounted read-only,
# tmpfs on /tmp, /dev (null, zero, random, urandom from the host) and /dev/shm, a fresh /proc in
# a new PID namespace; as the image's user, with its environment, working directory and
# entrypoint (SHELL_ENTRY=1: `/bin/sh -c` instead of the entrypoint). BINDS: host folders (one a
# line, under /tmp) bound read-only at the same path; EXTRA_ENV: NAME=VALUE lines set on top.
run_in() {
  local image=$1
  shift
  local ctr mnt config rc=0
  sweep
  ctr="$(buildah from --pull-never --signature-policy "$(POLICY)" --name "planaria-run-$$-$RANDOM" "$image")"
  mnt="$(buildah mount "$ctr")"
  config="$(buildah inspect --type image "$image" | python3 -c '
import json, sys
print(json.dumps(json.load(sys.stdin)["OCIv1"]["config"]))')"
  set +e
  # shellcheck disable=SC2016 # the script runs in the new namespaces, expanding there
  unshare --mount --pid --fork -- bash -eu -c '
    root=$1 config=$2 shell=$3 binds=$4 extra_env=$5; shift 5
    mount --make-rprivate /
    mount --bind "$root" "$root"
    mount -o remount,bind,ro "$root"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
    mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"
    mkdir "$root/dev/shm"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
    for dev in null zero random urandom; do
      touch "$root/dev/$dev"
      mount --bind "/dev/$dev" "$root/dev/$dev"
    done
    mount -t proc proc "$root/proc"
    # Host folders the caller asked for, read-only at the same path (under /tmp: the only place
    # a mount point can be made on the read-only root).
    while read -r mode path; do
      [ -n "$path" ] || continue
      mkdir -p "$root$path"
      mount --bind "$path" "$root$path"
      [ "$mode" = rw ] || mount -o remount,bind,ro "$root$path"
    done <<<"$binds"
    eval "$(python3 -c "
import json, shlex, sys
c = json.loads(sys.argv[1])
q = lambda items: \" \".join(shlex.quote(a) for a in items)
print(\"user=\" + shlex.quote(c.get(\"User\") or \"0\"))
print(\"workdir=\" + shlex.quote(c.get(\"WorkingDir\") or \"/\"))
print(\"entrypoint=(\" + q(c.get(\"Entrypoint\") or []) + \")\")
print(\"environment=(\" + q(c.get(\"Env\") or []) + \")\")
" "$config")"
    [ "$shell" = 1 ] && entrypoint=(/bin/sh -c)
    while IFS= read -r variable; do
      [ -n "$variable" ] && environment+=("$variable")
    done <<<"$extra_env"
    exec chroot --userspec="$user" "$root" /usr/bin/env -i "${environment[@]}" \
      /bin/sh -c "cd \"\$0\" && exec \"\$@\"" "$workdir" "${entrypoint[@]}" "$@"
  ' run-in "$mnt" "$config" "${SHELL_ENTRY:-0}" "${BINDS:-}" "${EXTRA_ENV:-}" "$@" &
  # SIGTERM or SIGINT here goes to the image's process (PID 1 of its namespace, unshare's
  # child), as a container runtime's stop does; its mounts and container go when it ends.
  local child=$!
  trap 'kill -TERM $(pgrep -P '"$child"') 2>/dev/null || true' TERM INT
  wait "$child"
  rc=$?
  while kill -0 "$child" 2>/dev/null; do
    wait "$child"
    rc=$?
  done
  trap - TERM INT
  set -e
  buildah rm "$ctr" >/dev/null 2>&1 || true
  return "$rc"
}

check() {
  local image failed=0 out argv
  image="$(name)" || die "the image is not built: run 'scripts/build-image.sh build' first"
  log "checking $image: uid 10001, read-only root, /tmp and /dev/shm writable"
  # The user and the root's read-only state, seen from inside.
  out="$(SHELL_ENTRY=1 run_in "$image" \
    'id -u; touch /opt/planaria/x 2>&1 || true; touch /tmp/x /dev/shm/x && echo writable' 2>&1)" || true
  case "$out" in
  10001*"Read-only file system"*writable)
    echo "== uid 10001, read-only root, writable /tmp and /dev/shm: ok"
    ;;
  *)
    echo "== uid 10001, read-only root, writable /tmp and /dev/shm: FAILED" >&2
    echo "$out" | tail -n 20 >&2
    failed=1
    ;;
  esac
  # The agent really started: it serves (insecure, loopback), makes its snapshot store under
  # /dev/shm, writes its ready file, and stops on SIGTERM.
  # shellcheck disable=SC2016 # a script for the image's shell
  out="$(SHELL_ENTRY=1 run_in "$image" '
    planaria agent --worker 0 --job check --insecure --ready-file /tmp/ready >/tmp/agent.log 2>&1 &
    for _ in $(seq 1 600); do [ -s /tmp/ready ] && break; kill -0 $! 2>/dev/null || break; sleep 0.1; done
    if [ -s /tmp/ready ]; then echo "serving on $(cat /tmp/ready)"; ls /dev/shm; fi
    kill -TERM $!; wait $!; echo "exit $?"; tail -n 5 /tmp/agent.log' 2>&1)" || true
  case "$out" in
  "serving on 127.0.0.1:"*"exit 0"*)
    echo "== planaria agent (started, serving, SIGTERM): ok ($(echo "$out" | head -n 1))"
    ;;
  *)
    echo "== planaria agent (started, serving, SIGTERM): FAILED" >&2
    echo "$out" | tail -n 20 >&2
    failed=1
    ;;
  esac
  # The entrypoints: each command's help (its imports), the version, and a short training run
  # in one process (torch, the model code, writes under /tmp only).
  for argv in "--help" "operator --help" "agent --help" "version" "reference --model tiny --steps 20"; do
    # shellcheck disable=SC2086
    if out="$(run_in "$image" $argv 2>&1)"; then
      echo "== planaria $argv: ok ($(echo "$out" | head -n 1 | cut -c1-80))"
    else
      echo "== planaria $argv: FAILED" >&2
      echo "$out" | tail -n 20 >&2
      failed=1
    fi
  done
  [ "$failed" = 0 ] || exit 1
  echo "build-image: every entrypoint starts in $image as uid 10001"
}

# `run [--bind PATH]... [--env NAME=VALUE]... [--] ARGS...`: the image's entrypoint with ARGS in
# the view that check uses, in the foreground (for tests that drive a real start).
run() {
  local image binds="" extra=""
  image="$(name)" || die "the image is not built: run 'scripts/build-image.sh build' first"
  while [ $# -gt 0 ]; do
    case "$1" in
    --bind | --bind-rw)
      { [ $# -ge 2 ] && [ -d "$2" ]; } || die "$1 needs an existing folder"
      case "$2" in /tmp/*) ;; *) die "$1 $2: only folders under /tmp can be bound" ;; esac
      if [ "$1" = --bind-rw ]; then
        # Writable for the image's user, as a kubelet makes an emptyDir for the pod's fsGroup.
        chown -R 10001:10001 "$2"
        binds+="rw $2"$'\n'
      else
        binds+="ro $2"$'\n'
      fi
      shift 2
      ;;
    --pass-env)
      # The caller's environment on top of the image's, except what describes this host.
      while IFS= read -r -d '' variable; do
        case "${variable%%=*}" in
        PATH | HOME | PWD | OLDPWD | SHELL | USER | LOGNAME | TMPDIR | VIRTUAL_ENV | SHLVL | _) ;;
        XDG_* | PYTHON* | LD_* | PIP_* | BASH* | SUDO_* | CONDA* | PYENV*) ;;
        *) extra+="$variable"$'\n' ;;
        esac
      done < <(env -0)
      shift
      ;;
    --env)
      { [ $# -ge 2 ] && [[ "$2" == *=* ]]; } || die "--env needs NAME=VALUE"
      extra+="$2"$'\n'
      shift 2
      ;;
    --)
      shift
      break
      ;;
    *) break ;;
    esac
  done
  BINDS="$binds" EXTRA_ENV="$extra" run_in "$image" "$@"
}

case "${1:-}" in
build) build ;;
run)
  shift
  run "$@"
  ;;
name) name ;;
check) check ;;
size)
  image="$(name)" || die "the image is not built: run 'scripts/build-image.sh build' first"
  size_of "$image"
  ;;
*) die "usage: scripts/build-image.sh build|name|check|size|run [--bind DIR] [--bind-rw DIR] [--env NAME=VALUE] [--pass-env] -- ARGS" ;;
esac
