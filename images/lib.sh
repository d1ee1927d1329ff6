# Shared by the image scripts: the debootstrap base image, imported without any registry.
# The base image is cached twice: in the engine (tag $BASE_TAG) and as a tarball in
# $INTELLECT_IMAGE_CACHE (default ~/.cache/intellect/images), so repeated runs take seconds.

BASE_TAG="${INTELLECT_BASE_IMAGE:-intellect-base:bookworm}"
CACHE_DIR="${INTELLECT_IMAGE_CACHE:-$HOME/.cache/intellect/images}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
TARBALL="$CACHE_DIR/bookworm-minbase-python3.tar"
log() { echo "[images] $*"; }

# ensure_base [--rebuild]: the base image exists in the engine afterwards.
ensure_base() {
  if [ "${1:-}" = "--rebuild" ]; then
    docker image rm -f "$BASE_TAG" >/dev/null 2>&1 || true
    rm -f "$TARBALL"
  fi
  docker image inspect "$BASE_TAG" >/dev/null 2>&1 && return 0
  mkdir -p "$CACHE_DIR"
  if [ ! -s "$TARBALL" ]; then
    command -v debootstrap >/dev/null || { log "ERROR: debootstrap missing: apt-get install debootstrap"; return 1; }
    local rootfs
    rootfs="$(mktemp -d /tmp/intellect-rootfs.XXXXXX)"
    log "debootstrap bookworm minbase + python3 into $rootfs (about a minute)"
    debootstrap --variant=minbase --include=python3 bookworm "$rootfs" "$MIRROR" >/dev/null
    # Smaller image, faster start: drop apt lists, docs and caches the tasks never need.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/usr/share/doc/* \
           "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
    tar -C "$rootfs" -cf "$TARBALL.part" .
    mv "$TARBALL.part" "$TARBALL"
    rm -rf "$rootfs"
  fi
  log "docker import $TARBALL as $BASE_TAG"
  docker import --change 'CMD ["/bin/bash"]' "$TARBALL" "$BASE_TAG" >/dev/null
}

# docker_build TAG CONTEXT [build args...]: the legacy builder on purpose (BuildKit may be absent
# and would try to resolve the base image remotely).
docker_build() {
  local tag="$1" context="$2"
  shift 2
  DOCKER_BUILDKIT=0 docker build --quiet "$@" -t "$tag" "$context" 2> >(grep -v -e DEPRECATED -e BuildKit -e 'environment-variable' >&2) >/dev/null
  log "built $tag ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
}
