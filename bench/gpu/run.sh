#!/usr/bin/env bash
# The GPU bench on a lent machine (docs/performance.md): generation and validation tokens/s of the
# project's own code on Qwen2-0.5B/1.5B shapes, TOPLOC's cost, and the honest calibration on the GPU
# and the CPU. Arguments go to bench/gpu/bench.py (`--quick`: toy sizes on the CPU, under a minute).
#
# Such a machine has torch, transformers, numpy, safetensors, pyarrow and tokenizers but not the rest
# of what the bench imports (pydantic and friends), and it cannot download: `make gpu-wheels` fetches
# those wheels into .whl/ here; carry .whl with the working tree and this script installs them into
# $INTELLECT_GPU_SITE (default /tmp/site), offline. Wheels built for another Python are left out (a
# 3.11 test venv installs its own pydantic_core). The run is stopped with SIGINT after
# $GPU_BENCH_TIMEOUT seconds (default 470, under 8 minutes); it then writes what it measured.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
SITE=${INTELLECT_GPU_SITE:-/tmp/site}
echo "run.sh: $($PY --version 2>&1) at $(command -v "$PY"); $(nproc) cores" >&2
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 || true

if compgen -G ".whl/*.whl" >/dev/null; then
  # Only the wheels whose tags this interpreter accepts (pip's own rule, through `packaging`).
  mapfile -t wheels < <($PY - .whl <<'PYEOF'
import sys
from pathlib import Path
try:
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename
except ImportError:  # packaging ships with transformers; pip vendors a copy
    from pip._vendor.packaging.tags import sys_tags
    from pip._vendor.packaging.utils import parse_wheel_filename
accepted = set(sys_tags())
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    if accepted & set(parse_wheel_filename(wheel.name)[3]):
        print(wheel)
    else:
        print(f"run.sh: {wheel.name} is not for this Python, left out", file=sys.stderr)
PYEOF
  )
  mkdir -p "$SITE"
  if [ ${#wheels[@]} -eq 0 ]; then
    :
  elif $PY -m pip --version >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}"
  else  # no pip: a wheel is a zip laid out for site-packages
    $PY -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' "$SITE" "${wheels[@]}"
  fi
  echo "run.sh: ${#wheels[@]} wheels from .whl installed into $SITE" >&2
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

if ! missing=$($PY -c 'import pydantic, pydantic_settings, structlog, py_ecc, dotenv' 2>&1); then
  echo "run.sh: the bench cannot import its dependencies: ${missing##*$'\n'}" >&2
  echo "run.sh: run 'make gpu-wheels' on a machine with network access and carry .whl here" >&2
  exit 2
fi
exec timeout -s INT -k 20 "${GPU_BENCH_TIMEOUT:-470}" $PY bench/gpu/bench.py "$@"
