#!/usr/bin/env bash
# `make test`: lint, then the whole pytest suite, then one line giving the wall time against the
# suite's budget (docs/testing.md), and a warning line when over it. A warning, not a failure: these
# machines are noisy, and a slow suite must be seen the day it appears, not when CI stops landing.
#   TEST_BUDGET_MINUTES  the budget (default 25)
#   TEST_WORKERS         pytest-xdist workers (default 3; 0 runs everything in this process, about
#                        twice as long). Whole modules go to a worker, longest first.
#   TEST_PROFILE         where the run's timing record goes (default .test-profile.json; see
#                        `python -m tests.support.timing`)
# Extra arguments go to pytest (e.g. `scripts/timed-tests.sh tests/ledger`).
set -uo pipefail
cd "$(dirname "$0")/.."

BUDGET_MINUTES="${TEST_BUDGET_MINUTES:-25}"
WORKERS="${TEST_WORKERS:-3}"
PROFILE="${TEST_PROFILE:-.test-profile.json}"
BIN=.venv/bin

started=$(date +%s)
report() {
  local rc=$1 now elapsed
  now=$(date +%s)
  elapsed=$((now - started))
  printf 'make test: %dm%02ds wall (lint and pytest) of a %d min budget, exit %d\n' \
    $((elapsed / 60)) $((elapsed % 60)) "$BUDGET_MINUTES" "$rc"
  if [ "$elapsed" -gt $((BUDGET_MINUTES * 60)) ]; then
    echo "WARNING: make test ran past its ${BUDGET_MINUTES} min budget: see 'The budget' in docs/testing.md" \
      "(the record of where the time went: $PROFILE)"
  fi
}

"$BIN/ruff" check . && "$BIN/mypy" && "$BIN/lint-imports" --no-logo --no-cache
rc=$?
if [ "$rc" -ne 0 ]; then
  report "$rc"
  exit "$rc"
fi

xdist=()
if [ "$WORKERS" != "0" ]; then
  xdist=(-n "$WORKERS" --dist loadscope --no-loadscope-reorder)  # whole modules, longest first
  # One torch thread for every process the tests start (a process that asks for more, as the demo's
  # trainer does, still gets them): dozens of torch processes share two cores, and a thread per core
  # each only makes them spin against each other (the items' summed time fell 15 % with it).
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
"$BIN/pytest" "${xdist[@]}" --profile "$PROFILE" --profile-top 25 "$@"
rc=$?
report "$rc"
exit "$rc"
