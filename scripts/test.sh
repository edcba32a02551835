#!/usr/bin/env bash
# The test command: installs redis-server and PostgreSQL when they are missing, then runs every
# test (unit, integration against real redis-server masters and PostgreSQL servers that the
# tests start themselves, doc tests) with all features on, for the library and the `redlock`
# command line (`cli/`, whose tests run its binary against real masters).
#
# Without arguments: scripts/ops-check.sh (the checks of ops/), `cargo test --tests`, then the
# doc tests — every test `cargo test` runs,
# without building the examples that have no tests (clippy's `--all-targets` checks that they
# compile; `scripts/demo.sh` builds the ones it runs): their link time kept CI past 15
# minutes. With arguments (`--no-run`, a filter, `--test NAME`), one plain `cargo test`.
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
# ops/ (the Grafana dashboard, the Prometheus alerts): promtool's checks and unit tests, their
# metric names against the crate's, the dashboard JSON against its generator (some 10 s on a
# fresh machine, installing promtool and the generator; 2-3 s after).
bash scripts/ops-check.sh
# Eight tests at once per binary (unless RUST_TEST_THREADS says otherwise): the integration
# binaries mostly wait — on redis-server, on timers, on paused masters — and leave the cores
# idle at four (the middleware and voters binaries used a third of a core: 165 s at four,
# 100 s at eight, and 3 of 3 runs passed at eight under a 2-core CPU hog). The CPU-bound tests
# take turns inside their binary whatever this says: the floods one at a time, the checker's
# multi-process runs two at a time.
RUST_TEST_THREADS=${RUST_TEST_THREADS:-8} "${test[@]}" -p tower-redlock -p tower-redlock-cli --tests
exec "${test[@]}" -p tower-redlock --doc
