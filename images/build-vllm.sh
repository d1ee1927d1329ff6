#!/usr/bin/env bash
# Build intellect-workload-vllm:<hash> offline (no registry is reachable here), in two steps
# (images/vllm/Dockerfile): intellect-runtime-vllm:<hash of the runtime image's lock and the vLLM lock>,
# the runtime image with vLLM's CPU build on top (only the packages where requirements-vllm.lock
# differs from requirements.lock: torch and the rest are the runtime's own), into /opt/vllm-site, first
# on PYTHONPATH; built once per lock. Then the app: the current workload image's code on top (seconds).
# Tag = hash of the runtime-vllm image and the workload image; also tagged :latest. Idempotent.
# Usage: images/build-vllm.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."
source images/lib.sh

PIP="${PIP:-.venv/bin/pip}"
FORCE="${1:-}"
docker image inspect intellect-workload:latest >/dev/null 2>&1 || images/build-rl.sh
RUNTIME_TAG="intellect-runtime:$(cat requirements.lock images/rl/exclude.txt images/rl/Dockerfile.runtime \
  | sha256sum | cut -c1-12)"  # the runtime image build-rl.sh made (the same hash)
docker image inspect "$RUNTIME_TAG" >/dev/null 2>&1 || images/build-rl.sh
WORKLOAD_ID="$(docker image inspect -f '{{.Id}}' intellect-workload:latest)"
VLLM_RUNTIME="intellect-runtime-vllm:$( (echo "$RUNTIME_TAG"; cat requirements-vllm.lock images/vllm/Dockerfile \
  images/rl/exclude.txt) | sha256sum | cut -c1-12)"
if [ "$FORCE" != "--force" ] && docker image inspect "$VLLM_RUNTIME" >/dev/null 2>&1; then
  log "$VLLM_RUNTIME is up to date"
else
  started=$(date +%s)
  WORK="$(mktemp -d /tmp/intellect-vllm-image.XXXXXX)"
  trap 'rm -rf "$WORK"' EXIT
  # the vLLM lock's lines the runtime image does not hold exactly (name==version, case-insensitive):
  # requirements.lock less what images/rl/exclude.txt leaves out of the runtime image (pillow, ...)
  grep -v '^#' images/rl/exclude.txt | sed '/^$/d' > "$WORK/exclude"
  awk -F'==' 'NR==FNR {skip[tolower($1)]=1; next} !(tolower($1) in skip)' "$WORK/exclude" requirements.lock \
    > "$WORK/have"
  grep -v '^#' requirements-vllm.lock | sed '/^$/d' \
    | awk 'NR==FNR {have[tolower($0)]=1; next} !(tolower($0) in have)' "$WORK/have" - > "$WORK/requirements.txt"
  log "installing $(wc -l < "$WORK/requirements.txt") packages for $VLLM_RUNTIME (host wheels, no network in the build)"
  mkdir -p "$WORK/ctx/lib"
  "$PIP" install --quiet --no-deps --no-compile --target "$WORK/ctx/site" -r "$WORK/requirements.txt" \
    2> >(grep -v "^WARNING: Location 'file:" >&2)
  # awk reads to the end: leaving early would kill ldconfig with SIGPIPE, a failed pipeline (status 141)
  # under pipefail whenever ldconfig was still writing (seen: one build in three on a loaded machine)
  numa="$(ldconfig -p | awk '/libnuma.so.1 / && !found {print $NF; found = 1}')"
  [ -n "$numa" ] || { log "ERROR: libnuma.so.1 not found on this host (apt-get install libnuma1)"; exit 1; }
  cp -L "$numa" "$WORK/ctx/lib/libnuma.so.1"
  cp images/vllm/Dockerfile "$WORK/ctx/Dockerfile"
  docker_build "$VLLM_RUNTIME" "$WORK/ctx" --build-arg "RUNTIME=$RUNTIME_TAG"
  log "vLLM runtime layer built in $(( $(date +%s) - started )) s"
fi
TAG="intellect-workload-vllm:$( (echo "$VLLM_RUNTIME"; echo "$WORKLOAD_ID"; cat images/vllm/Dockerfile.app) \
  | sha256sum | cut -c1-12)"
if [ "$FORCE" != "--force" ] && docker image inspect "$TAG" >/dev/null 2>&1; then
  log "$TAG is up to date"
else
  APP="$(mktemp -d /tmp/intellect-vllm-app.XXXXXX)"
  cp images/vllm/Dockerfile.app "$APP/Dockerfile"
  docker_build "$TAG" "$APP" --build-arg "RUNTIME_VLLM=$VLLM_RUNTIME" --build-arg "WORKLOAD_ID=$WORKLOAD_ID"
  rm -rf "$APP"
fi
docker tag "$TAG" intellect-workload-vllm:latest
log "image: $TAG (also :latest)"
