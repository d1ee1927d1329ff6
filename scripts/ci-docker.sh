#!/usr/bin/env bash
# Make a Docker engine available and build the local test image. Idempotent: each step is skipped
# when already done, so `.ci/run` can call it on every run.
#   1. install docker.io (+ debootstrap for the base image, docker-compose) via apt when missing
#   2. start dockerd in the background when the engine does not answer, and wait for it
#   3. build the test image (images/build.sh caches the base image)
# Exits non-zero with a message naming the failed step; the Docker tests then skip loudly.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[ci-docker] $*"; }
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

need_pkgs=()
command -v dockerd >/dev/null 2>&1 || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_pkgs+=(debootstrap)
# Debian's compose (1.29) for docker-compose.yml and its CI test; `docker compose` works too where present.
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || need_pkgs+=(docker-compose)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  log "installing ${need_pkgs[*]} via apt"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

engine_up() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if ! engine_up; then
  if pgrep -x dockerd >/dev/null 2>&1; then
    log "dockerd is running but not answering yet; waiting"
  else
    log "starting dockerd in the background (log: /var/log/dockerd.log)"
    # Plain nohup rather than systemd: CI containers and VMs here have no init system.
    $SUDO setsid sh -c 'nohup dockerd >/var/log/dockerd.log 2>&1 &' </dev/null
  fi
  for _ in $(seq 1 60); do
    engine_up && break
    sleep 0.5
  done
  if ! engine_up; then
    log "ERROR: the Docker engine did not come up in 30 s; see /var/log/dockerd.log"
    tail -n 20 /var/log/dockerd.log 2>/dev/null || true
    exit 1
  fi
fi
log "engine $(docker version --format '{{.Server.Version}}') is up"

images/build.sh
