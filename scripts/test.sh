#!/usr/bin/env bash
# The test command: installs redis-server and PostgreSQL when they are missing, then runs every
# test (unit, integration against real redis-server masters and PostgreSQL servers that the
# tests start themselves, doc tests) with all features on, for the library and the `redlock`
# command line (`cli/`, whose tests run its binary against real masters).
#
# Without arguments, the `checker` binary (about 3 minutes of its own worker processes and
# masters, the longest binary) runs beside the others instead of after them: one build, then
# the checker in the background (its output printed when it ends) while every other target
# runs as `cargo test` would run it. The suite passes with every core busy (the stress runner
# proves it), so running two binaries at once costs no trust and keeps CI under 15 minutes.
# With arguments (`--no-run`, a filter, `--test NAME`), it is one plain `cargo test` with them.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-redis.sh
. scripts/ensure-postgres.sh
ensure_redis
ensure_postgres
test=(cargo test --all-features --locked)
if [ $# -gt 0 ]; then
  exec "${test[@]}" -p tower-redlock -p tower-redlock-cli "$@"
fi

"${test[@]}" -p tower-redlock -p tower-redlock-cli --no-run
# Every test target of the crate but the checker: the files under tests/ and the [[test]]
# entries of Cargo.toml (a new one is picked up without editing this).
targets=()
while read -r name; do
  [ "$name" = checker ] || targets+=(--test "$name")
done < <({
  for f in tests/*.rs tests/*/main.rs; do
    [ -e "$f" ] || continue
    case "$f" in
      */main.rs) basename "$(dirname "$f")" ;;
      *) basename "$f" .rs ;;
    esac
  done
} | sort -u)

checker_log=$(mktemp "${TMPDIR:-/tmp}/tower-redlock-checker-log.XXXXXX")
"${test[@]}" -p tower-redlock --test checker >"$checker_log" 2>&1 &
checker=$!
trap 'kill "$checker" 2>/dev/null || true' EXIT

status=0
# What `cargo test` runs besides the test targets: unit tests, binaries, the examples marked
# `test = true`, doc tests; then the command line's package.
examples=()
while read -r name; do examples+=(--example "$name"); done < <(
  awk '/^\[/ {example = ($0 == "[[example]]"); name = ""}
       example && /^name *=/ {gsub(/[" ]/, ""); sub(/name=/, ""); name = $0}
       example && /^test *= *true/ && name != "" {print name}' Cargo.toml)
"${test[@]}" -p tower-redlock --lib --bins "${examples[@]}" "${targets[@]}" || status=1
"${test[@]}" -p tower-redlock --doc || status=1
"${test[@]}" -p tower-redlock-cli || status=1

checker_status=0
wait "$checker" || checker_status=$?
trap - EXIT
echo
echo "---- the checker binary (run beside the others) ----"
cat "$checker_log"
rm -f "$checker_log"
[ "$checker_status" -eq 0 ] || status=1
exit "$status"
