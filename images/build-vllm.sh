#!/usr/bin/env bash
# Build intellect-workload-vllm:<hash> offline (no registry is reachable here): the inference workload
# image (images/build-rl.sh, built first if missing) with vLLM's CPU build on top. Only the packages
# where requirements-vllm.lock differs from requirements.lock are added (torch and the rest are the
# workload image's own), into /opt/vllm-site, first on PYTHONPATH. Tag = hash of the workload image
# and the vLLM lock; also tagged :latest. Idempotent. Usage: images/build-vllm.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."
source images/lib.sh

PIP="${PIP:-.venv/bin/pip}"
FORCE="${1:-}"
docker image inspect intellect-workload:latest >/dev/null 2>&1 || images/build-rl.sh
WORKLOAD_ID="$(docker image inspect -f '{{.Id}}' intellect-workload:latest)"
HASH="$( (echo "$WORKLOAD_ID"; cat requirements-vllm.lock images/vllm/Dockerfile images/build-vllm.sh) \
  | sha256sum | cut -c1-12)"
TAG="intellect-workload-vllm:$HASH"
if [ "$FORCE" != "--force" ] && docker image inspect "$TAG" >/dev/null 2>&1; then
  log "$TAG is up to date"
else
  started=$(date +%s)
  WORK="$(mktemp -d /tmp/intellect-vllm-image.XXXXXX)"
  trap 'rm -rf "$WORK"' EXIT
  # the vLLM lock's lines the workload image does not hold exactly (name==version, case-insensitive):
  # requirements.lock less what images/rl/exclude.txt leaves out of the runtime image (pillow, ...)
  grep -v '^#' images/rl/exclude.txt | sed '/^$/d' > "$WORK/exclude"
  awk -F'==' 'NR==FNR {skip[tolower($1)]=1; next} !(tolower($1) in skip)' "$WORK/exclude" requirements.lock \
    > "$WORK/have"
  grep -v '^#' requirements-vllm.lock | sed '/^$/d' \
    | awk 'NR==FNR {have[tolower($0)]=1; next} !(tolower($0) in have)' "$WORK/have" - > "$WORK/requirements.txt"
  log "installing $(wc -l < "$WORK/requirements.txt") packages for $TAG (host wheels, no network in the build)"
  mkdir -p "$WORK/ctx/lib"
  "$PIP" install --quiet --no-deps --no-compile --target "$WORK/ctx/site" -r "$WORK/requirements.txt" \
    2> >(grep -v "^WARNING: Location 'file:" >&2)
  numa="$(ldconfig -p | awk '/libnuma.so.1 /{print $NF; exit}')"
  [ -n "$numa" ] || { log "ERROR: libnuma.so.1 not found on this host (apt-get install libnuma1)"; exit 1; }
  cp -L "$numa" "$WORK/ctx/lib/libnuma.so.1"
  cp images/vllm/Dockerfile "$WORK/ctx/Dockerfile"
  docker_build "$TAG" "$WORK/ctx" --build-arg "WORKLOAD=$WORKLOAD_ID"
  log "vLLM layer built in $(( $(date +%s) - started )) s"
fi
docker tag "$TAG" intellect-workload-vllm:latest
log "image: $TAG (also :latest)"
