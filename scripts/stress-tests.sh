#!/usr/bin/env bash
# Runs the tests RUNS times in a row while a CPU hog keeps every core busy, and says per run
# whether it passed, how long it took and which tests failed. Exits non-zero on any failure.
#
#   scripts/stress-tests.sh [RUNS] [-- CARGO TEST ARGS]
#
#   scripts/stress-tests.sh                  # 3 runs of the README's test command (scripts/test.sh)
#   scripts/stress-tests.sh 10 -- --test client --test middleware --test flood --test checker
#   scripts/stress-tests.sh 5 -- --test client wake   # one binary, a name filter
#
# With arguments after `--`, each run is `cargo test --all-features --locked -p tower-redlock
# ARGS` (add `-p tower-redlock-cli` yourself for the command line's tests); without, it is
# scripts/test.sh, exactly what CI runs. The tests are built once before the hog starts, so
# a run's time is the tests' time. The hog is one busy loop per core (`nproc`), started here
# and killed by its pids when the script ends, however it ends. Logs are kept in a folder the
# script names at the end. Run it before resolving anything that touches timing: a test that
# fails once here either found a bug or depends on timing luck (CONTRIBUTING.md).
set -uo pipefail
cd "$(dirname "$0")/.."

runs=3
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  runs=$1
  shift
fi
case "$runs" in
  '' | *[!0-9]* | 0)
    echo "usage: scripts/stress-tests.sh [RUNS] [-- CARGO TEST ARGS] (RUNS: a whole number >= 1)" >&2
    exit 2
    ;;
esac
if [ $# -gt 0 ]; then
  if [ "$1" != "--" ]; then
    echo "usage: scripts/stress-tests.sh [RUNS] [-- CARGO TEST ARGS]" >&2
    exit 2
  fi
  shift
fi
args=("$@")

. scripts/ensure-redis.sh
. scripts/ensure-postgres.sh
ensure_redis || exit 1
ensure_postgres || exit 1

run_tests() {
  if [ ${#args[@]} -gt 0 ]; then
    cargo test --all-features --locked -p tower-redlock "${args[@]}" "$@"
  else
    bash scripts/test.sh "$@"
  fi
}

logs=$(mktemp -d "${TMPDIR:-/tmp}/stress-tests.XXXXXX")
echo "building the tests once (log: $logs/build.log)..."
if ! run_tests --no-run >"$logs/build.log" 2>&1; then
  tail -n 30 "$logs/build.log"
  echo "the build failed: nothing was run" >&2
  exit 1
fi

# Each run in a process group of its own (job control), so that an interrupted script
# stops the run it started, then its hog, at once.
set -m
hogs=()
test_pid=
stop_run() {
  if [ -n "$test_pid" ]; then
    kill -TERM -- "-$test_pid" 2>/dev/null
    wait "$test_pid" 2>/dev/null
    test_pid=
  fi
}
stop_hogs() {
  for pid in "${hogs[@]}"; do
    kill "$pid" 2>/dev/null
  done
  for pid in "${hogs[@]}"; do
    wait "$pid" 2>/dev/null
  done
  hogs=()
}
trap 'stop_run; stop_hogs' EXIT
trap 'stop_run; stop_hogs; exit 130' INT TERM
cores=$(nproc 2>/dev/null || echo 2)
for _ in $(seq "$cores"); do
  sh -c 'while :; do :; done' &
  hogs+=("$!")
done
echo "CPU hog: $cores busy loop(s), pids ${hogs[*]}"

failed=0
summary=()
for i in $(seq "$runs"); do
  log="$logs/run-$i.log"
  start=$(date +%s)
  run_tests >"$log" 2>&1 &
  test_pid=$!
  wait "$test_pid"
  rc=$?
  test_pid=
  took=$(($(date +%s) - start))
  if [ $rc -eq 0 ]; then
    line="run $i/$runs: passed in ${took}s"
  else
    failed=$((failed + 1))
    # libtest prints "test NAME ... FAILED" per failing test; a binary that did not finish
    # (a crash, a timeout) is named by the last "Running" line before the end.
    names=$(grep -E '^test .* \.\.\. FAILED$' "$log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/' | sort -u | tr '\n' ' ')
    [ -n "$names" ] || names="(no failing test named: see the log; last binary: $(grep -E '^ +Running ' "$log" | tail -n 1 | sed -E 's/^ +//'))"
    line="run $i/$runs: FAILED (exit $rc) in ${took}s: $names"
  fi
  echo "$line   [log: $log]"
  summary+=("$line")
done
stop_hogs

echo
echo "stress runs under a $cores-core CPU hog: $((runs - failed)) of $runs passed"
for line in "${summary[@]}"; do echo "  $line"; done
echo "logs: $logs"
[ "$failed" -eq 0 ]
