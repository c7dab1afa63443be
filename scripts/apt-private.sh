# shellcheck shell=bash
# Sourced by scripts/kube-control-plane.sh and scripts/build-image.sh: apt-get on a private
# sources list, state and archive folder under "$CACHE/apt", so the system's apt configuration
# is untouched (the caller sets CACHE and writes "$CACHE/apt/sources.list").
apt_private() {
  local apt="$CACHE/apt"
  apt-get -q \
    -o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null \
    -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" \
    -o Dir::Cache::Archives="$apt/archives" -o Debug::NoLocking=1 "$@"
}
