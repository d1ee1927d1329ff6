#!/usr/bin/env bash
# Build the local test image without any registry (none is reachable here):
#   debootstrap a minimal bookworm rootfs with python3 -> `docker import` as the base image ->
#   `docker build` FROM it with COPY'd project files (containers have no network, so no pip/apt).
# Usage: images/build.sh [--rebuild-base]
set -euo pipefail
cd "$(dirname "$0")/.."
source images/lib.sh

TEST_TAG="${INTELLECT_TEST_IMAGE:-intellect-test:latest}"
ensure_base "$([ "${1:-}" = "--rebuild-base" ] && echo --rebuild || true)"

CONTEXT="$(mktemp -d /tmp/intellect-image.XXXXXX)"
trap 'rm -rf "$CONTEXT"' EXIT
mkdir -p "$CONTEXT/opt/intellect/workloads"
cp workloads/bridge_client.py "$CONTEXT/opt/intellect/workloads/bridge_client.py"
: > "$CONTEXT/opt/intellect/workloads/__init__.py"
cp images/test/workload.py "$CONTEXT/opt/intellect/workload.py"
cp images/test/Dockerfile "$CONTEXT/Dockerfile"
log "docker build $TEST_TAG (FROM $BASE_TAG)"
docker_build "$TEST_TAG" "$CONTEXT" --build-arg "BASE=$BASE_TAG"
