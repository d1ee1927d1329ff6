#!/usr/bin/env bash
# Build the local test image without any registry (none is reachable here):
#   debootstrap a minimal bookworm rootfs with python3 -> `docker import` as the base image ->
#   `docker build` FROM it with COPY'd project files (containers have no network, so no pip/apt).
# The base image is cached twice: in the engine (tag intellect-base:bookworm) and as a tarball in
# $INTELLECT_IMAGE_CACHE (default ~/.cache/intellect/images), so repeated runs take seconds.
# Usage: images/build.sh [--rebuild-base]
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_TAG="${INTELLECT_BASE_IMAGE:-intellect-base:bookworm}"
TEST_TAG="${INTELLECT_TEST_IMAGE:-intellect-test:latest}"
CACHE_DIR="${INTELLECT_IMAGE_CACHE:-$HOME/.cache/intellect/images}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
TARBALL="$CACHE_DIR/bookworm-minbase-python3.tar"
log() { echo "[images] $*"; }

if [ "${1:-}" = "--rebuild-base" ]; then
  docker image rm -f "$BASE_TAG" >/dev/null 2>&1 || true
  rm -f "$TARBALL"
fi

if ! docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
  mkdir -p "$CACHE_DIR"
  if [ ! -s "$TARBALL" ]; then
    command -v debootstrap >/dev/null || { log "ERROR: debootstrap missing: apt-get install debootstrap"; exit 1; }
    ROOTFS="$(mktemp -d /tmp/intellect-rootfs.XXXXXX)"
    trap 'rm -rf "$ROOTFS"' EXIT
    log "debootstrap bookworm minbase + python3 into $ROOTFS (about a minute)"
    debootstrap --variant=minbase --include=python3 bookworm "$ROOTFS" "$MIRROR" >/dev/null
    # Smaller image, faster start: drop apt lists, docs and caches the tasks never need.
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/* "$ROOTFS"/usr/share/doc/* \
           "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/*
    tar -C "$ROOTFS" -cf "$TARBALL.part" .
    mv "$TARBALL.part" "$TARBALL"
  fi
  log "docker import $TARBALL as $BASE_TAG"
  docker import --change 'CMD ["/bin/bash"]' "$TARBALL" "$BASE_TAG" >/dev/null
fi

CONTEXT="$(mktemp -d /tmp/intellect-image.XXXXXX)"
trap 'rm -rf "$CONTEXT" ${ROOTFS:-}' EXIT
mkdir -p "$CONTEXT/opt/intellect/workloads"
cp workloads/bridge_client.py "$CONTEXT/opt/intellect/workloads/bridge_client.py"
: > "$CONTEXT/opt/intellect/workloads/__init__.py"
cp images/test/workload.py "$CONTEXT/opt/intellect/workload.py"
cp images/test/Dockerfile "$CONTEXT/Dockerfile"
log "docker build $TEST_TAG (FROM $BASE_TAG)"
# Legacy builder on purpose: BuildKit may be absent and would try to resolve the base remotely.
DOCKER_BUILDKIT=0 docker build --quiet --build-arg "BASE=$BASE_TAG" -t "$TEST_TAG" "$CONTEXT" >/dev/null
log "built $TEST_TAG ($(docker image inspect -f '{{.Size}}' "$TEST_TAG" | awk '{printf "%.0f MB", $1/1e6}'))"
