#!/usr/bin/env bash
# `make test`: lint, then the whole pytest suite, then one line giving the wall time against the
# suite's budget (docs/testing.md), and a warning line when over it. A warning, not a failure: these
# machines are noisy, and a slow suite must be seen the day it appears, not when CI stops landing.
#   TEST_BUDGET_MINUTES  the budget (default 25)
#   TEST_WORKERS         pytest-xdist workers (default 3; 0 runs everything in this process, about
#                        twice as long). Whole modules go to a worker, longest first.
#   TEST_PROFILE         where the run's timing record goes (default .test-profile.json; see
#                        `python -m tests.support.timing`)
#   TEST_DEADLINE_MINUTES  pytest's hard stop (default 60): past it, where every process of the run
#                        is (py-spy dump of each pytest worker and each Python child) is printed, then
#                        pytest is interrupted. A hang then fails CI with its place named, inside
#                        CI's 90 minutes, instead of being cut off there with nothing said.
# Extra arguments go to pytest (e.g. `scripts/timed-tests.sh tests/ledger`).
set -uo pipefail
cd "$(dirname "$0")/.."

BUDGET_MINUTES="${TEST_BUDGET_MINUTES:-25}"
WORKERS="${TEST_WORKERS:-3}"
PROFILE="${TEST_PROFILE:-.test-profile.json}"
DEADLINE_MINUTES="${TEST_DEADLINE_MINUTES:-60}"
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

"$BIN/ruff" check . && "$BIN/mypy" && "$BIN/lint-imports" --no-logo --no-cache && "$BIN/python" scripts/function_length.py
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
descendants() {  # every process under $1, depth first
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}

watchdog() {  # $1: this script's pid; pytest runs in the foreground (so Ctrl-C reaches it)
  sleep $((DEADLINE_MINUTES * 60))
  local pytest_pid pid
  pytest_pid=$(pgrep -P "$1" -f "bin/pytest" | head -1)
  [ -n "$pytest_pid" ] || return 0
  echo
  echo "make test: pytest still running after ${DEADLINE_MINUTES} min: where each of its processes is"
  for pid in "$pytest_pid" $(descendants "$pytest_pid"); do
    echo "--- pid $pid: $(ps -o args= -p "$pid" 2>/dev/null | cut -c1-200)"
    "$BIN/py-spy" dump --pid "$pid" 2>&1 | head -60
  done
  echo "make test: interrupting pytest (TEST_DEADLINE_MINUTES=${DEADLINE_MINUTES})"
  kill -INT "$pytest_pid" 2>/dev/null
  sleep 60
  kill -KILL "$pytest_pid" $(descendants "$pytest_pid") 2>/dev/null
}

watchdog $$ 2>/dev/null &  # its stderr: only bash's "Terminated" when its sleep is stopped below
watchdog_pid=$!
"$BIN/pytest" "${xdist[@]}" --profile "$PROFILE" --profile-top 25 "$@"
rc=$?
pkill -P "$watchdog_pid" 2>/dev/null  # its sleep
kill "$watchdog_pid" 2>/dev/null
wait "$watchdog_pid" 2>/dev/null
report "$rc"
exit "$rc"
