#!/usr/bin/env bash
# The test command: installs redis-server and PostgreSQL when they are missing, then runs every
# test (unit, integration against real redis-server masters and PostgreSQL servers that the
# tests start themselves, doc tests) with all features on, for the library and the `redlock`
# command line (`cli/`, whose tests run its binary against real masters).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-redis.sh
. scripts/ensure-postgres.sh
ensure_redis
ensure_postgres
exec cargo test --all-features --locked -p tower-redlock -p tower-redlock-cli "$@"
