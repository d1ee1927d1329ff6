#!/usr/bin/env bash
# Build the RL images offline (no registry is reachable here):
#   intellect-runtime:<hash>   base + the locked dependencies (CPU torch), installed on the host from
#                              its wheels into a folder and copied in; tag = hash of the lock.
#   intellect-workload:<hash>  + the project: inference, trainer, broadcast relay (WORKDIR /data, the
#                              bridge's data dir, so relative outputs land where the worker reads them)
#   intellect-service:<hash>   + the project: orchestrator, discovery, validator, worker, dashboard,
#                              and the pinned anvil (the compose chain service)
# Both app images are also tagged :latest. Idempotent: an image whose content hash exists is kept.
# Usage: images/build-rl.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."
source images/lib.sh

PIP="${PIP:-.venv/bin/pip}"
FORCE="${1:-}"
ensure_base

hash_of() { cat "$@" | sha256sum | cut -c1-12; }

RUNTIME_HASH="$(hash_of requirements.lock images/rl/exclude.txt images/rl/Dockerfile.runtime)"
RUNTIME_TAG="intellect-runtime:$RUNTIME_HASH"
WORK="$(mktemp -d /tmp/intellect-rl-image.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

if [ "$FORCE" = "--force" ] || ! docker image inspect "$RUNTIME_TAG" >/dev/null 2>&1; then
  log "installing the locked dependencies for $RUNTIME_TAG (host wheels, no network in the build)"
  grep -v '^#' images/rl/exclude.txt | sed '/^$/d' > "$WORK/exclude"
  grep -v '^#' requirements.lock \
    | awk -F'==' 'NR==FNR {skip[tolower($1)]=1; next} !(tolower($1) in skip)' "$WORK/exclude" - \
    > "$WORK/requirements.txt"
  mkdir -p "$WORK/runtime"
  # (pip's notes about missing local index folders are noise here; real errors still fail the build)
  "$PIP" install --quiet --no-deps --no-compile --target "$WORK/runtime/site" -r "$WORK/requirements.txt" \
    2> >(grep -v "^WARNING: Location 'file:" >&2)
  cp images/rl/Dockerfile.runtime "$WORK/runtime/Dockerfile"
  docker_build "$RUNTIME_TAG" "$WORK/runtime" --build-arg "BASE=$BASE_TAG"
fi

PACKAGES=()
for pkg in intellect ledger discovery orchestrator worker validator workloads devnet dashboard contracts; do
  [ -d "$pkg" ] && PACKAGES+=("$pkg")
done
APP_HASH="$( (echo "$RUNTIME_HASH"; cat images/rl/Dockerfile.app pyproject.toml package-lock.json;
  find "${PACKAGES[@]}" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' | sort | xargs sha256sum) \
  | sha256sum | cut -c1-12)"

for role in workload service; do
  tag="intellect-$role:$APP_HASH"
  if [ "$FORCE" != "--force" ] && docker image inspect "$tag" >/dev/null 2>&1; then
    log "$tag is up to date"
  else
    ctx="$WORK/app-$role"
    mkdir -p "$ctx/intellect" "$ctx/bin"
    for pkg in "${PACKAGES[@]}"; do
      # tar, not rsync: part of every base system (a fresh CI machine has no rsync)
      tar --exclude '__pycache__' --exclude '*.pyc' -cf - "$pkg" | tar -xf - -C "$ctx/intellect/"
    done
    # Console scripts of pyproject.toml as small launchers (the image has no pip to make them).
    .venv/bin/python - "$ctx/bin" <<'PY'
import sys, tomllib, pathlib
out = pathlib.Path(sys.argv[1])
for name, target in tomllib.load(open("pyproject.toml", "rb"))["project"]["scripts"].items():
    module, func = target.split(":")
    path = out / name
    path.write_text(f"#!/usr/bin/python3\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
    path.chmod(0o755)
PY
    # The project's entry points (workload plug-ins, `intellect.workloads`) as pip would record them,
    # in a dist-info folder on the image's path (/opt/intellect), where importlib.metadata finds them.
    .venv/bin/python - "$ctx/intellect" <<'PY'
import sys, tomllib, pathlib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
info = pathlib.Path(sys.argv[1]) / f"{project['name']}-{project['version']}.dist-info"
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
lines = []
for group, entries in project.get("entry-points", {}).items():
    lines.append(f"[{group}]")
    lines += [f"{name} = {target}" for name, target in entries.items()]
(info / "entry_points.txt").write_text("\n".join(lines) + "\n")
PY
    if [ "$role" = service ]; then  # the compose chain service runs the project's pinned anvil
      cp node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil "$ctx/bin/anvil"
    fi
    cp images/rl/Dockerfile.app "$ctx/Dockerfile"
    docker_build "$tag" "$ctx" --build-arg "RUNTIME=$RUNTIME_TAG" --build-arg "ROLE=$role"
  fi
  docker tag "$tag" "intellect-$role:latest"
done
log "images: intellect-workload:$APP_HASH intellect-service:$APP_HASH (also :latest)"
